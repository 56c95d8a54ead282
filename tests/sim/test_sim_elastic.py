"""Elastic scale-out in the simulator: reserve devices join as rollout instances when generation
lags training (streamrl-elastic: outputs lengthen at steps 30 and 60)."""

import json
from collections import Counter

import pytest

from poise.errors import ConfigError
from poise.sim import load_scenario, simulate
from poise.sim.driver import Simulation


def _events(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def test_instances_join_after_the_phase_shift_and_raise_throughput():
    fixed_sim = Simulation(load_scenario("streamrl-elastic", ["steps=45", "scale.policy=static"]))
    fixed = fixed_sim.run()
    sim = Simulation(load_scenario("streamrl-elastic", ["steps=45"]))
    elastic = sim.run()
    assert fixed.joins == [] and elastic.joins
    # none in the balanced first phase; the first as soon as 3 lagging steps of the second are seen
    first = elastic.joins[0]
    assert first["step"] == 32 and first["first_step"] == 35  # async: steps 33 and 34 already dispatched
    assert [j["instances"] for j in elastic.joins] == list(range(5, 5 + len(elastic.joins)))
    assert [j["devices"] for j in elastic.joins] == [[8 + i] for i in range(len(elastic.joins))]
    assert all(r.step < 35 or r.split.rollout == 4 for r in sim.records)  # the pool's split is unchanged
    # once both joined instances serve (from step 39), the same steps take >= 10% less time
    after = slice(39, 45)
    assert sum(r.step_s for r in sim.records[after]) < 0.9 * sum(r.step_s for r in fixed_sim.records[after])
    assert elastic.tokens_per_s > fixed.tokens_per_s
    assert elastic.output_tokens == fixed.output_tokens  # the same samples
    assert elastic.device_s > fixed.device_s  # joined devices are paid for from their join on


def test_fixed_and_elastic_match_until_the_first_join_serves():
    fixed = Simulation(load_scenario("streamrl-elastic", ["steps=40", "scale.policy=static"]))
    fixed.run()
    elastic = Simulation(load_scenario("streamrl-elastic", ["steps=40"]))
    elastic.run()
    served = elastic.joins[0]["first_step"]
    assert [r.step_s for r in elastic.records[:served]] == [r.step_s for r in fixed.records[:served]]
    assert elastic.records[served].rollout_s < fixed.records[served].rollout_s


def test_a_scheduled_join_serves_from_its_first_step_and_loses_nothing(tmp_path):
    sc = load_scenario("streamrl-elastic", ["steps=6", "pipeline.mode=sync", "pipeline.streaming=true",
                                            "scale.policy=static", "scale.schedule=[{after_step: 1, add: 2}]",
                                            "log.samples=true", "log.intervals=device",
                                            "workload.prompts_per_step=16"])
    summary = simulate(sc, tmp_path)
    assert [(j["step"], j["first_step"], j["devices"]) for j in summary.joins] == [(1, 3, [8]), (1, 3, [9])]
    events = _events(tmp_path)
    samples = [e for e in events if e["kind"] == "sample"]
    assert Counter(tuple(e["id"]) for e in samples) == Counter(
        {(k, p, i): 1 for k in range(6) for p in range(16) for i in range(8)})  # every id exactly once
    by_step = {k: {e["instance"] for e in samples if e["step"] == k} for k in range(6)}
    assert all(by_step[k] <= {0, 1, 2, 3} for k in range(3))
    assert all({4, 5} <= by_step[k] for k in range(3, 6)), by_step  # the joined instances generate
    rows = {(e["device"]) for e in events if e["kind"] == "interval" and e["role"] == "rollout"}
    assert rows == {0, 1, 2, 3, 8, 9}  # joined devices get their own rows, after the pool's
    decisions = [e for e in events if e["kind"] == "decision" and e["what"] == "scale"]
    assert [d["step"] for d in decisions] == list(range(6))  # every decision, join or not
    assert [(d["step"], d["from"], d["to"]) for d in decisions if d["action"] == "add"] == [(1, 4, 6)]
    assert [e["step"] for e in events if e["kind"] == "join"] == [1, 1]


@pytest.mark.parametrize("overrides, key", [
    (["cluster.reserve_devices=0"], "cluster.reserve_devices"),
    (["scale.policy=static", "scale.schedule=[{after_step: 1, add: 5}]"], "scale.schedule"),
    (["resize.policy=controller"], "scale.policy"),
])
def test_bad_scale_config_is_one_line(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_scenario("streamrl-elastic", overrides)
    assert e.value.key == key and "\n" not in str(e.value)
