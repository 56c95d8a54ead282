"""Acceptance behaviour of the built-in scenarios (relative bounds; the benchmark scripts in
benchmarks/sim_*.py print the full tables)."""

from __future__ import annotations

from poise.schema import apply_overrides, build
from poise.sim import ScenarioConfig, load_scenario, simulate
from poise.sim.scenario import pipeline_overrides, scenario_data

QUIET = ["log.samples=false", "log.intervals=none"]


def test_dynaresize_resizes_once_and_breaks_even_near_eleven_steps():
    s = simulate(load_scenario("dynaresize-8xh20", QUIET))
    assert [(r["from"], r["to"]) for r in s.resizes] == [([6, 2], [4, 4])]
    assert 8 <= s.break_even_steps <= 15
    assert 8 <= s.break_even_steps_measured <= 15
    static = simulate(load_scenario("dynaresize-8xh20", QUIET + ["resize.policy=static"]))
    assert static.total_s / s.total_s > 1.25  # vs the paper's static 6:2 baseline


def _alternating(phase_steps: int, extra: list[str]) -> ScenarioConfig:
    data = scenario_data("dynaresize-8xh20")
    for phase in data["workload"]["phases"]:
        phase["steps"] = phase_steps
    apply_overrides(data, QUIET + ["steps=80", "workload.cycle_phases=true"] + extra)
    return build(ScenarioConfig, data)


def test_hysteresis_prevents_thrashing_on_alternating_short_phases():
    static = simulate(_alternating(4, ["resize.policy=static"]))
    no_hysteresis = simulate(_alternating(4, ["controller.threshold=0.05", "controller.consecutive=1",
                                              "controller.cooldown_steps=0", "controller.break_even=false",
                                              "controller.window=1"]))
    default = simulate(_alternating(4, []))
    assert len(no_hysteresis.resizes) >= 5
    assert no_hysteresis.total_s > static.total_s
    assert default.total_s <= static.total_s * 1.02


def test_streamrl_pipelines():
    sync, stream, asyn = (simulate(load_scenario("streamrl-pipeline", QUIET + pipeline_overrides(m)))
                          for m in ("sync", "stream", "async"))
    assert stream.tokens_per_s >= 1.05 * sync.tokens_per_s
    assert asyn.tokens_per_s >= 1.25 * sync.tokens_per_s


def test_skew_aware_oracle_dispatch_cuts_generation_time():
    random_ = simulate(load_scenario("streamrl-skew", QUIET + ["steps=8", "dispatch.policy=random"]))
    oracle = simulate(load_scenario("streamrl-skew", QUIET + ["steps=8", "dispatch.policy=skew_aware",
                                                              "dispatch.ranker=oracle"]))
    assert oracle.rollout_s_mean <= 0.85 * random_.rollout_s_mean
