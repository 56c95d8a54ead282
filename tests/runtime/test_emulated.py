"""Emulated compute: the real runtime with cost-model sleeps for compute (runtime/emulated.py)."""

import json
import random
from collections import Counter

import pytest

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.policy.cost import CostConfig, CostModel, instance_finish_times
from poise.runtime.driver import train_disaggregated
from poise.runtime.emulated import EmulatedEngine, Emulation
from poise.sim.scenario import load_scenario
from poise.sim.workload import make_workload
from poise.types import Request

SMALL = [
    "run.progress=false",
    "run.steps=3",
    "cluster.compute=emulated",
    "cluster.devices=8",
    "algorithm.micro_batch_size=8",
    "rollout.num_slots=16",
    "emulation.scenario=streamrl-pipeline",
    # 8 prompts x 8 samples; a modelled ~60 s step sleeps ~0.1 s (Ray's RPCs dominate: no timing here)
    "emulation.overrides=[workload.prompts_per_step=8]",
    "emulation.time_scale=0.002",
]


def _events(run_dir):
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


class _VirtualClock:
    t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_emulated_engine_sleeps_what_the_simulator_prices():
    """With every request queued at once, the engine's finish times are the simulator kernel's."""
    rng = random.Random(3)
    lengths = [rng.randint(1, 400) for _ in range(50)]
    prompt_lens = [rng.randint(0, 60) for _ in range(50)]
    cost = CostModel(CostConfig())
    clock = _VirtualClock()
    engine = EmulatedEngine(cost, lambda sid: lengths[sid[1]], 8, 1.0, clock.now, clock.sleep)
    for i in range(50):
        engine.submit(Request((0, i, 0), [0] * prompt_lens[i]))
    finish = {}
    while not engine.occupancy.idle:
        for s in engine.step():
            finish[s.sample_id[1]] = s.finish_time
            assert len(s.token_ids) == lengths[s.sample_id[1]]
    expected = instance_finish_times(cost, lengths, prompt_lens, 8)
    assert finish == pytest.approx(dict(enumerate(expected)), rel=1e-9)


def test_emulated_engine_refuses_weights_while_in_flight():
    engine = EmulatedEngine(CostModel(), lambda sid: 5, 2, 0.0)
    engine.submit(Request((0, 0, 0), [0]))
    with pytest.raises(RuntimeError, match="in flight|running"):
        engine.load_weights((), 1)


def test_unknown_scenario_fails_before_ray(tmp_path):
    cfg = load_train_config(None, [*SMALL, f"run.dir={tmp_path}", "emulation.scenario=no-such-scenario"])
    with pytest.raises(PoiseError, match="unknown scenario 'no-such-scenario'"):
        Emulation.from_config(cfg)
    with pytest.raises(PoiseError, match="--resume"):
        Emulation.from_config(load_train_config(None, [*SMALL, f"run.dir={tmp_path}"]), resume=True)


@pytest.mark.ray
# ~8 s each (8 torch-free actors; "hosted": 3 processes of up to 3 devices); non-streaming sync
# differs only inside TrainerGroup and runs in benchmarks/runtime_emulated.py
@pytest.mark.parametrize("mode", [["pipeline.mode=sync"], ["pipeline.mode=async"],
                                  ["pipeline.mode=sync", "pipeline.assist=true"],
                                  ["pipeline.mode=async", "emulation.devices_per_process=3"]],
                         ids=["stream", "async", "assist", "hosted"])
def test_emulated_run_delivers_every_sample_once(ray_session, tmp_path, mode):
    cfg = load_train_config(None, [*SMALL, f"run.dir={tmp_path}", "cluster.split=[5,3]", *mode])
    rows = train_disaggregated(cfg)
    assert [r["step"] for r in rows] == [0, 1, 2]

    sc = load_scenario("streamrl-pipeline", ["workload.prompts_per_step=8"])
    workload = make_workload(sc.workload, sc.seed)
    events = _events(tmp_path)
    samples = [e for e in events if e["kind"] == "sample"]
    ids = Counter(tuple(e["id"]) for e in samples)
    expected = {s.sample_id: s.output_length for k in range(3) for s in workload.step(k)}
    assert set(ids) == set(expected) and set(ids.values()) == {1}  # every id, exactly once
    assert {tuple(e["id"]): e["output_length"] for e in samples} == expected  # the scenario's lengths
    asynchronous = "pipeline.mode=async" in mode
    for e in samples:  # exact staleness: sync k, async k-1 (step 0: the initial weights)
        assert e["weights_version"] == (max(0, e["step"] - 1) if asynchronous else e["step"]), e
    busy = {(e["role"], e["device"]) for e in events if e["kind"] == "interval"}
    generated = {d for role, d in busy if role == "rollout"}
    trained = {d for role, d in busy if role == "train"}
    if "pipeline.assist=true" in mode:  # the devices of both roles did both
        assert trained > {5, 6, 7} and trained - {5, 6, 7} <= set(range(5)), trained
        assert generated > set(range(5)) and generated - set(range(5)) <= {5, 6, 7}, generated
        # a device never trains while its engine generates: both would share its one thread budget
        spans = [e for e in events if e["kind"] == "interval"]
        for g in (e for e in spans if e["role"] == "rollout"):
            for t in (e for e in spans if e["role"] == "train" and e["device"] == g["device"]):
                assert t["end"] <= g["start"] or t["start"] >= g["end"], (g, t)
    else:
        assert generated <= set(range(5))
        assert trained == {5, 6, 7}  # every train device did work
    assert [e["step"] for e in events if e["kind"] == "step"] == [0, 1, 2]
    saved = (tmp_path / "config.yaml").read_text()
    assert "prompts_per_step: 8" in saved and "compute: emulated" in saved
