from __future__ import annotations

import math
import statistics

import pytest

from poise.errors import ConfigError
from poise.schema import build
from poise.sim.workload import ParametricWorkload, WorkloadConfig


def workload(**kw) -> ParametricWorkload:
    data = {"prompts_per_step": 64, "samples_per_prompt": 4, "pool_size": 128, "sample_sigma": 0.0,
            "phases": [{"steps": 2, "mix": [{"name": "a", "dist": "fixed", "median": 100, "prompt_len": 7}]},
                       {"steps": 3, "mix": [{"name": "b", "dist": "lognormal", "median": 1000, "sigma": 0.5,
                                             "max_len": 5000}]}]}
    data.update(kw)
    return ParametricWorkload(build(WorkloadConfig, data), seed=11)


def test_phases_and_cycling():
    w = workload()
    assert [w.phase_of(k)[0] for k in range(7)] == [0, 0, 1, 1, 1, 1, 1]  # last phase goes on
    c = workload(cycle_phases=True)
    assert [c.phase_of(k) for k in (0, 2, 5, 7)] == [(0, 0), (1, 2), (0, 5), (1, 7)]
    first = w.step(0)
    assert {s.output_length for s in first} == {100} and {s.prompt_len for s in first} == {7}
    later = [s.output_length for s in w.step(3)]
    assert max(later) <= 5000 and statistics.median(later) == pytest.approx(1000, rel=0.35)


def test_prompts_recur_once_per_epoch_and_ids_are_stable():
    w = workload(phases=[{"mix": [{"name": "a", "dist": "lognormal", "median": 300, "sigma": 1.0}]}])
    ep1 = [s.prompt.prompt_id for k in (0, 1) for s in w.step(k)[::4]]
    ep2 = [s.prompt.prompt_id for k in (2, 3) for s in w.step(k)[::4]]
    assert sorted(ep1) == sorted(ep2) and len(set(ep1)) == 128 and ep1 != ep2  # reshuffled
    assert [s.sample_id for s in w.step(5)[:5]] == [(5, 0, 0), (5, 0, 1), (5, 0, 2), (5, 0, 3), (5, 1, 0)]
    # a prompt keeps its expected length across epochs (what the history ranker learns)
    by_id = {s.prompt.prompt_id: s.output_length for s in w.step(0)[::4]}
    again = {s.prompt.prompt_id: s.output_length for k in (2, 3) for s in w.step(k)[::4]}
    assert all(again[p] == by_id[p] for p in by_id)


def test_growth_and_pareto_tail():
    g = workload(growth_per_step=0.5, phases=[{"mix": [{"name": "a", "dist": "fixed", "median": 100}]}])
    assert {s.output_length for s in g.step(2)} == {200}
    p = workload(pool_size=4096, prompts_per_step=4096, samples_per_prompt=1,
                 phases=[{"mix": [{"name": "t", "dist": "pareto", "median": 100, "alpha": 1.5,
                                   "max_len": 10 ** 6}]}])
    lengths = [s.output_length for s in p.step(0)]
    assert min(lengths) >= 99
    # Pareto(alpha=1.5): P(L > 10 x scale) = 10^-1.5 ~ 3.2%
    share = sum(1 for x in lengths if x > 1000) / len(lengths)
    assert share == pytest.approx(10 ** -1.5, abs=0.01)


def test_bad_workload_values():
    with pytest.raises(ConfigError, match="only the last phase"):
        build(WorkloadConfig, {"phases": [{"steps": None}, {"steps": 3}]})
    with pytest.raises(ConfigError, match="prompts_per_step"):
        build(WorkloadConfig, {"prompts_per_step": 0})
    with pytest.raises(ConfigError, match="median"):
        build(WorkloadConfig, {"phases": [{"mix": [{"median": 0}]}]})
    assert math.isfinite(workload().step(0)[0].output_length)


def test_dynamic_sampling_draws_one_more_group_per_dropped_one():
    plain = workload(prompts_per_step=16)
    dyn = workload(prompts_per_step=16, drop_rate=0.4)
    for k in range(3):
        samples = dyn.step(k)
        groups = {s.sample_id[1]: s.dropped for s in samples}
        assert sorted(groups) == list(range(len(groups)))  # draws 0 .. L-1
        kept = [d for d, dropped in groups.items() if not dropped]
        assert len(kept) == 16 and not groups[len(groups) - 1]  # ends at the 16th kept draw
        assert 16 < len(groups) <= 64 and all(len([s for s in samples if s.sample_id[1] == d]) == 4 for d in groups)
        # the step's own prompts are those without dynamic sampling; only extra draws are added
        assert [s.prompt for s in samples[:64]] == [s.prompt for s in plain.step(k)]
    assert dyn.step(1) == workload(prompts_per_step=16, drop_rate=0.4).step(1)  # a function of seed and step
    capped = workload(prompts_per_step=4, drop_rate=0.95)
    assert max(s.sample_id[1] for s in capped.step(0)) == 15  # 4 x prompts_per_step at most
    with pytest.raises(ConfigError, match="drop_rate"):
        workload(drop_rate=1.0)
