"""The simulator's partial rollouts (sim/partial.py): windows, forced finishes, repeat windows,
the batch rule and over-provisioning, by hand on tiny pools; then on the streamrl-pipeline
workload: staleness 1 is today's async exactly, the staleness bound holds, partial rollouts with
over-provisioning pay, and the resize controller still resizes with them."""

from __future__ import annotations

import pytest

from poise.config.policy import PipelineConfig
from poise.errors import ConfigError, PoiseError
from poise.policy.rankers import Prompt
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.partial import PartialRollouts
from poise.sim.workload import SimSample

QUIET = ["log.samples=false", "log.intervals=none"]


class Lengths:
    """A group source with lengths written by hand: step k's groups and its extra groups."""

    def __init__(self, steps: dict[int, list[list[int]]], extra: dict[tuple[int, int], list[int]]):
        self.steps, self.extra = steps, extra

    @staticmethod
    def group(k: int, i: int, lengths: list[int]) -> list[SimSample]:
        return [SimSample((k, i, j), Prompt(f"s{k}-p{i}"), 10, n) for j, n in enumerate(lengths)]

    def step(self, k: int) -> list[SimSample]:
        return [s for i, g in enumerate(self.steps[k]) for s in self.group(k, i, g)]

    def extra_groups(self, k: int, indices: list[int]) -> list[SimSample]:
        return [s for i in indices for s in self.group(k, i, self.extra[(k, i)])]


class OneTokenPerSecond:
    """Prices a window by hand: every sample on its own instance, one token a second."""

    def __init__(self) -> None:
        self.windows: list[list[tuple[tuple[int, int, int], int, int]]] = []  # (id, prompt+prefix, budget)

    def __call__(self, k: int, samples: list[SimSample], start: float):
        self.windows.append([(s.sample_id, s.prompt_len, s.output_length) for s in samples])
        return [start + s.output_length for s in samples], list(range(len(samples))), [start] * len(samples)


def pipeline(window: int, staleness: int, overprovision: int = 0) -> PipelineConfig:
    return PipelineConfig("async", partial_tokens=window, max_staleness=staleness, overprovision=overprovision)


def test_windows_forced_finish_and_batches_by_hand() -> None:
    # 1 prompt a step + 1 over-provisioned group, one sample each, window 4, staleness 2.
    source = Lengths({0: [[10]], 1: [[2]], 2: [[6]], 3: [[5]]}, {(0, 1): [3]})
    pr = PartialRollouts(pipeline(4, 2, 1), source, prompts_per_step=1)
    gen = OneTokenPerSecond()
    # step 0, version 0: (0,0) decodes its window 4 of 10, the extra (0,1) its 3 and finishes: it trains.
    p0 = pr.phase(0, 0, 0.0, gen)
    assert gen.windows[-1] == [((0, 0, 0), 10, 4), ((0, 1, 0), 10, 3)]
    assert [s.sample_id for s in p0.samples] == [(0, 0, 0)] and p0.samples[0].output_length == 3
    assert p0.samples[0].prompt.prompt_id == "s0-p1"  # the extra group, relabelled to slot 0
    assert (p0.end, p0.finish, p0.lags) == (4.0, [3.0], {0: 3})
    # no batch group from an earlier step; (0,0) waits in the pool
    assert p0.metrics == {"partial/staleness_0": 3, "partial/carried_groups": 0,
                          "partial/overprovisioned_groups": 1, "partial/windows": 1}
    # step 1, still version 0 (async): (0,0) carries on, re-prefilled with its 4 tokens; (1,0) is new and trains.
    p1 = pr.phase(1, 0, 4.0, gen)
    assert gen.windows[-1] == [((1, 0, 0), 14, 4), ((1, 1, 0), 10, 2)]
    assert p1.samples[0].prompt.prompt_id == "s1-p0" and p1.lags == {1: 2} and p1.end == 8.0
    # step 2, version 1: (0,0)'s first token is from version 0 <= 1 - (2 - 1): it runs to its end (2 left).
    p2 = pr.phase(2, 1, 8.0, gen)
    assert gen.windows[-1] == [((2, 0, 0), 18, 2), ((2, 1, 0), 10, 4)]
    assert p2.samples[0].prompt.prompt_id == "s0-p0" and p2.samples[0].output_length == 10
    assert p2.lags == {2: 8, 1: 2}  # 8 tokens of version 0 and 2 of version 1, trained at step 2
    assert p2.metrics["partial/carried_groups"] == 1 and p2.metrics["partial/overprovisioned_groups"] == 1
    assert p2.finish == [10.0]
    # step 3, version 2: (2,0) (first token version 1) is forced to its end; (3,0) takes a window.
    p3 = pr.phase(3, 2, 12.0, gen)
    assert gen.windows[-1] == [((3, 0, 0), 14, 2), ((3, 1, 0), 10, 4)]
    assert p3.samples[0].prompt.prompt_id == "s2-p0" and p3.lags == {2: 4, 1: 2}


def test_more_windows_until_a_batch_is_complete() -> None:
    # 2 prompts, no over-provisioning: the phase repeats windows at its version until both groups are done.
    source = Lengths({0: [[10, 1], [3, 3]]}, {})
    pr = PartialRollouts(pipeline(4, 2), source, prompts_per_step=2)
    gen = OneTokenPerSecond()
    p = pr.phase(0, 0, 0.0, gen)
    assert gen.windows == [[((0, 0, 0), 10, 4), ((0, 0, 1), 10, 1), ((0, 1, 0), 10, 3), ((0, 1, 1), 10, 3)],
                           [((0, 0, 0), 14, 4)], [((0, 0, 0), 18, 2)]]
    assert p.end == 10.0 and p.metrics["partial/windows"] == 3 and p.metrics["partial/carried_groups"] == 0
    assert [s.sample_id for s in p.samples] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert p.finish == [10.0, 1.0, 3.0, 3.0] and p.lags == {0: 17}


def test_more_extra_groups_than_a_step_trains_would_wait_past_max_staleness() -> None:
    """Why a scenario needs overprovision <= prompts_per_step: 1 prompt a step and 2 extra groups,
    every sample 1 token. Each step trains one complete group; the others wait, and step 3 trains
    step 1's group, made with version 0: lag 3 > max_staleness 2."""
    source = Lengths({k: [[1]] for k in range(4)}, {(0, 1): [1], (0, 2): [1]})
    pr = PartialRollouts(pipeline(4, 2, 2), source, prompts_per_step=1)
    gen = OneTokenPerSecond()
    phases = [pr.phase(k, max(k - 1, 0), float(k), gen) for k in range(4)]
    assert [p.samples[0].prompt.prompt_id for p in phases] == ["s0-p0", "s0-p1", "s0-p2", "s1-p0"]
    assert [p.lags for p in phases] == [{0: 1}, {1: 1}, {2: 1}, {3: 1}]
    with pytest.raises(ConfigError, match="pipeline.overprovision"):
        load_scenario("streamrl-pipeline", ["pipeline.mode=async", "pipeline.partial_tokens=64",
                                            "pipeline.max_staleness=2", "pipeline.overprovision=65"])


def run(overrides: list[str], scenario: str = "streamrl-pipeline"):
    sim = Simulation(load_scenario(scenario, QUIET + overrides))
    return sim, sim.run()


def test_staleness_one_is_todays_async_exactly() -> None:
    # A window far below the workload's lengths: with staleness 1 it must never cap a sample.
    _, today = run(["steps=12", "pipeline.mode=async"])
    sim, partial = run(["steps=12", "pipeline.mode=async", "pipeline.partial_tokens=64", "pipeline.max_staleness=1"])
    assert sim.partial is not None and max(s.output_length for s in sim.workload.step(3)) > 64
    assert partial.as_dict() == today.as_dict()
    assert today.tokens_by_lag.keys() == {0, 1}


@pytest.mark.parametrize("staleness,window,overprovision", [(2, 4096, 16), (2, 1024, 64), (3, 512, 64), (4, 256, 32)])
def test_no_trained_token_lags_more_than_max_staleness(staleness: int, window: int, overprovision: int) -> None:
    sim, s = run(["steps=24", "pipeline.mode=async", f"pipeline.partial_tokens={window}",
                  f"pipeline.max_staleness={staleness}", f"pipeline.overprovision={overprovision}"])
    assert max(s.tokens_by_lag) == staleness  # reached (partial rollouts happen) and never passed
    per_step = 64 * 8
    assert all(r.samples == per_step for r in sim.records)  # every step trains a whole batch
    trained = sum(s.tokens_by_lag.values())
    carried = sum(r.done for g in sim.partial.pool for r in g.members)  # type: ignore[union-attr]
    assert trained == s.output_tokens and carried > 0


@pytest.mark.parametrize("pool,window,overprovision", [
    (["cluster.devices=16"], 4096, 16),  # the scenario's pool and batch caps (the allocator picks)
    (["cluster.devices=8", "cluster.batch_cap=64", "cluster.batch_caps=[]"], 5120, 32),
])
def test_partial_rollouts_with_overprovisioning_pay_on_the_long_tail(pool: list[str], window: int,
                                                                     overprovision: int) -> None:
    _, async1 = run(pool + ["pipeline.mode=async"])
    _, stale2 = run(pool + ["pipeline.mode=async", f"pipeline.partial_tokens={window}", "pipeline.max_staleness=2",
                            f"pipeline.overprovision={overprovision}"])
    assert stale2.samples_per_s >= 1.3 * async1.samples_per_s
    assert async1.initial_split == stale2.initial_split  # the same pool: the gain is the pipeline's


def test_the_resize_controller_still_resizes_with_partial_rollouts() -> None:
    _, plain = run(["steps=40"], "dynaresize-8xh20")
    sim, partial = run(["steps=40", "pipeline.partial_tokens=1024", "pipeline.max_staleness=2",
                        "pipeline.overprovision=8"], "dynaresize-8xh20")
    assert [(r["from"], r["to"]) for r in plain.resizes] == [([6, 2], [4, 4])]
    assert [(r["from"], r["to"]) for r in partial.resizes] == [([6, 2], [4, 4])]
    assert max(partial.tokens_by_lag) == 2 and sim.split.as_list() == [4, 4]


@pytest.mark.parametrize("overrides,key", [
    (["pipeline.mode=sync", "pipeline.max_staleness=1"], "pipeline.max_staleness"),
    (["pipeline.mode=sync", "pipeline.partial_tokens=64"], "pipeline.partial_tokens"),
    (["pipeline.mode=async", "pipeline.max_staleness=2"], "pipeline.max_staleness"),
    (["pipeline.mode=async", "pipeline.overprovision=4"], "pipeline.overprovision"),
    (["pipeline.mode=async", "pipeline.partial_tokens=-1"], "pipeline.partial_tokens"),
    (["pipeline.mode=async", "pipeline.partial_tokens=64", "pipeline.max_staleness=2",
      "pipeline.overprovision=65"], "pipeline.overprovision"),
    (["pipeline.mode=async", "pipeline.partial_tokens=64", "workload.drop_rate=0.2"], "pipeline.partial_tokens"),
    (["pipeline.mode=async", "pipeline.partial_tokens=64", "resize.inflight=abort"], "resize.inflight"),
])
def test_bad_pipeline_knobs_are_one_line_config_errors(overrides: list[str], key: str) -> None:
    with pytest.raises((ConfigError, PoiseError)) as e:
        load_scenario("streamrl-pipeline", overrides)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_staleness_zero_is_the_sync_loop() -> None:
    _, sync = run(["steps=6", "pipeline.mode=sync"])
    _, zero = run(["steps=6", "pipeline.mode=async", "pipeline.max_staleness=0"])
    assert zero.as_dict() == sync.as_dict()
    assert zero.tokens_by_lag.keys() == {0}
