import pytest

from poise.data.tasks import FAMILIES, Phase, TaskSource, reward
from poise.errors import ConfigError


def test_prompts_of_a_step_are_a_function_of_seed_and_step():
    a, b = TaskSource(3), TaskSource(3)
    assert a.prompts_for_step(7, 16) == b.prompts_for_step(7, 16)
    assert a.prompts_for_step(7, 16) != a.prompts_for_step(8, 16)
    assert TaskSource(4).prompts_for_step(7, 16) != a.prompts_for_step(7, 16)
    # asking for a later step first changes nothing (no hidden cursor)
    c = TaskSource(3)
    later = c.prompts_for_step(20, 4)
    assert c.prompts_for_step(7, 16) == a.prompts_for_step(7, 16) and later == a.prompts_for_step(20, 4)


def test_each_epoch_visits_every_problem_once():
    source = TaskSource(0, pool_size=40)
    seen = [p.uid for step in range(5) for p in source.prompts_for_step(step, 8)]
    assert sorted(seen) == sorted(p.uid for p in source.pool(0))


def test_answer_lengths_differ_by_more_than_10x_between_short_and_long_families():
    pool = TaskSource(0, pool_size=2000).pool(0)
    lengths = {f: sorted(len(p.answer) for p in pool if p.family == f) for f in FAMILIES}
    short_mean = sum(lengths["arith"]) / len(lengths["arith"])
    long_p99 = max(lengths["span"][int(0.99 * len(lengths["span"]))], lengths["sort"][int(0.99 * len(lengths["sort"]))])
    assert long_p99 > 10 * short_mean


def test_phases_change_the_mix():
    source = TaskSource(0, (Phase({"arith": 1.0}, until_step=5), Phase({"sort": 1.0})), pool_size=64)
    assert {p.family for p in source.prompts_for_step(4, 16)} == {"arith"}
    assert {p.family for p in source.prompts_for_step(5, 16)} == {"sort"}


@pytest.mark.parametrize("phases, key", [
    ((Phase({"arith": 1.0}), Phase({"sort": 1.0})), "until_step"),
    ((Phase({"poetry": 1.0}),), "mix"),
    ((Phase({"arith": -1.0}),), "mix.arith"),
])
def test_bad_phases_name_the_key(phases, key):
    with pytest.raises(ConfigError, match=key):
        TaskSource(0, phases)


def test_rewards_are_exact_and_in_unit_interval():
    pool = TaskSource(1, pool_size=300).pool(0)
    for p in pool:
        assert reward(p, p.answer) == 1.0
        assert reward(p, "") == 0.0 or p.answer == ""
        assert 0.0 <= reward(p, p.answer + " 1") < 1.0
    sort = next(p for p in pool if p.family == "sort" and len(p.answer.split()) == 4)
    items = sort.answer.split()
    assert reward(sort, " ".join(items[:2] + ["x", "y"])) == 0.5
