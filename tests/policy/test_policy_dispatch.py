from __future__ import annotations

import random

import pytest

from poise.errors import ConfigError
from poise.policy.cost import CostConfig, CostModel
from poise.policy.dispatch import (InstanceInfo, RandomDispatcher, RoundRobinDispatcher,
                                   SkewAwareDispatcher, lpt_assign, make_dispatcher)
from poise.policy.rankers import OracleRanker, Prompt

PROMPTS = [Prompt(f"p{i}") for i in range(10)]
INSTANCES = [InstanceInfo(i, 4) for i in range(3)]


def test_round_robin_carries_offset():
    rr = RoundRobinDispatcher()
    first = rr.plan(PROMPTS[:4], INSTANCES)
    assert [b for _, b in first.order] == [0, 1, 2, 0]
    assert [b for _, b in rr.plan(PROMPTS[:2], INSTANCES).order] == [1, 2]


def test_random_dispatch_is_seeded():
    a = RandomDispatcher(random.Random(7)).plan(PROMPTS, INSTANCES).order
    b = RandomDispatcher(random.Random(7)).plan(PROMPTS, INSTANCES).order
    c = RandomDispatcher(random.Random(8)).plan(PROMPTS, INSTANCES).order
    assert a == b and a != c


def test_lpt_by_hand():
    lengths = [7, 5, 4, 3, 3, 2]
    # LPT on 2 bins: 7->A, 5->B, 4->B (9), 3->A (10), 3->B (12)? no: loads A=10,B=9 -> B=12; 2->A
    assert lpt_assign(lengths, range(6), ["A", "B"]) == {"A": [0, 3, 5], "B": [1, 2, 4]}


def test_skew_aware_puts_the_predicted_tail_on_small_batch_instances():
    # One very long prompt among many short ones: the tail group must isolate it on an
    # instance whose batch cap is the small tail cap, and be submitted first.
    lengths = {f"p{i}": (4000 if i == 0 else 200) for i in range(40)}
    cost = CostModel(CostConfig(decode_per_seq_s=0.002))
    prompts = [Prompt(f"p{i}") for i in range(40)]
    d = SkewAwareDispatcher(OracleRanker(lambda p: lengths[p.prompt_id]), cost, prompt_len=100,
                            long_tail_fraction=0.05, tail_batch_cap=2, tail_instances=1)
    plan = d.plan(prompts, [InstanceInfo(i, 16) for i in range(4)])
    assert len(plan.tail_instances) == 1, plan.reason
    tail = set(plan.tail_instances)
    placed = {req: inst for req, inst in plan.order}
    assert placed[0] in tail and plan.batch_caps[placed[0]] == 2
    assert plan.order[0][0] == 0  # longest first
    assert sorted(r for r, _ in plan.order) == list(range(40))  # nothing lost or duplicated


def test_skew_aware_without_information_balances_counts():
    cost = CostModel()
    d = SkewAwareDispatcher(OracleRanker(lambda p: 0.0), cost, prompt_len=100)
    plan = d.plan(PROMPTS, INSTANCES)
    counts = [sum(1 for _, b in plan.order if b == i) for i in range(3)]
    assert sorted(counts) == [3, 3, 4]


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="dispatch.policy"):
        make_dispatcher("fastest", random.Random(0), None, CostModel(), 100)
    with pytest.raises(ConfigError, match="needs a ranker"):
        make_dispatcher("skew_aware", random.Random(0), None, CostModel(), 100)


def test_skew_aware_never_predicts_worse_than_plain_lpt():
    # Left to choose, it only forms a tail group when that lowers the predicted makespan.
    lengths = {f"p{i}": (4000 if i == 0 else 200) for i in range(40)}
    d = SkewAwareDispatcher(OracleRanker(lambda p: lengths[p.prompt_id]), CostModel(), prompt_len=100)
    plan = d.plan([Prompt(f"p{i}") for i in range(40)], [InstanceInfo(i, 16) for i in range(4)])
    # LPT alone already isolates the one long prompt, so no tail group is formed.
    assert plan.tail_instances == () and "no tail group" in plan.reason
    assert sum(1 for _, b in plan.order if b == plan.order[0][1]) == 1
