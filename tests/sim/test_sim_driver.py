from __future__ import annotations

import json

import pytest

from poise.runlog import read_jsonl
from poise.schema import build
from poise.sim import ScenarioConfig, load_scenario, simulate
from poise.sim.driver import Simulation
from poise.sim.scenario import pipeline_overrides

COST = dict(decode_base_s=0.01, decode_per_seq_s=0.001, decode_per_kv_token_s=0.0,
            prefill_per_token_s=0.0, train_per_token_s=0.001, train_fixed_s=1.0,
            train_allreduce_s=0.0, weight_bytes=1.0, sync_bandwidth=1.0, sync_latency_s=0.0)


def tiny(kind: str, **kw) -> ScenarioConfig:
    mode = "async" if kind == "async" else "sync"
    data = {"steps": 6, "pipeline": {"mode": mode, "streaming": kind == "stream"}, "split": [1, 1], "seed": 3,
            "cluster": {"devices": 2, "batch_cap": 8, "micro_batch_size": 4},
            "dispatch": {"policy": "round_robin"},
            "cost": COST,
            "workload": {"prompts_per_step": 4, "samples_per_prompt": 2, "pool_size": 8,
                         "sample_sigma": 0.0,
                         "phases": [{"mix": [{"name": "a", "dist": "fixed", "median": 50,
                                              "prompt_len": 10}]}]}}
    data.update(kw)
    return build(ScenarioConfig, data)


def test_sync_step_is_rollout_plus_train_plus_sync_by_hand():
    sim = Simulation(tiny("sync"))
    s = sim.run()
    # 8 samples of 50 tokens on one instance (cap 8): 50 steps at batch 8 = 50 * 0.018 s
    rollout = 50 * (0.01 + 0.001 * 8)
    train = 0.001 * 8 * 60 + 1.0
    assert sim.records[1].rollout_s == pytest.approx(rollout)
    assert sim.records[1].train_s == pytest.approx(train)
    assert sim.records[1].step_s == pytest.approx(rollout + train + 1.0)  # + weight sync 1 s
    assert s.total_s == pytest.approx(6 * (rollout + train) + 5 * 1.0)


def test_assist_shares_generation_and_the_training_tail_by_hand():
    """pipeline.assist: the train device generates beside the rollout device (round robin: 2 of the
    4 prompts, 4 samples each), then the 2 micro-batches of 4 samples x 60 tokens go one to the
    train device and one to the rollout device, which is free once generation ends."""
    sim = Simulation(tiny("sync", pipeline={"mode": "sync", "streaming": False, "assist": True}))
    sim.run()
    assert sim.records[1].rollout_s == pytest.approx(50 * (0.01 + 0.001 * 4))  # 4 sequences per instance
    assert sim.records[1].train_s == pytest.approx(0.001 * 4 * 60 + 1.0)  # one micro-batch, then the step
    without = Simulation(tiny("sync"))
    without.run()
    assert without.records[1].rollout_s == pytest.approx(50 * (0.01 + 0.001 * 8))
    assert without.records[1].train_s == pytest.approx(0.001 * 8 * 60 + 1.0)


def test_async_overlaps_and_stream_pipelines():
    sync = simulate(tiny("sync"))
    stream = simulate(tiny("stream"))
    asyn = Simulation(tiny("async"))
    a = asyn.run()
    rollout, train = 0.9, 1.48
    # steady state of one-step async: max(rollout, train, (rollout + train + sync) / 2) per
    # step on average (here the 2-step cycle through the weight sync binds: 3.38 s per 2 steps)
    last_two = (asyn.records[-1].step_s + asyn.records[-2].step_s) / 2
    assert last_two == pytest.approx(max(rollout, train, (rollout + train + 1.0) / 2))
    assert a.total_s < stream.total_s <= sync.total_s


def test_event_log_is_complete(tmp_path):
    sim = Simulation(tiny("async"), tmp_path)
    sim.run()
    events = list(read_jsonl(tmp_path / "events.jsonl"))
    kinds = {e["kind"] for e in events}
    assert {"interval", "sample", "step"} <= kinds
    samples = [e for e in events if e["kind"] == "sample"]
    ids = [tuple(e["id"]) for e in samples]
    assert len(ids) == len(set(ids)) == 6 * 8
    # async: step k generates with weights version k-1 (step 0 with the initial weights)
    assert {e["step"]: e["weights_version"] for e in samples} == {k: max(k - 1, 0) for k in range(6)}
    assert all(e["submit"] <= e["finish"] for e in samples)
    metrics = list(read_jsonl(tmp_path / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(6))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 6 and (tmp_path / "config.yaml").is_file()


def test_same_seed_same_run_and_seed_matters():
    sc = load_scenario("streamrl-skew", ["steps=3", "workload.prompts_per_step=32"])
    a, b = simulate(sc), simulate(sc)
    c = simulate(load_scenario("streamrl-skew", ["steps=3", "workload.prompts_per_step=32", "seed=1"]))
    assert a.as_dict() == b.as_dict()
    assert a.total_s != c.total_s


def test_trace_replay(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"prompt_id": f"q{i % 3}", "step": s, "output_length": 50} for s in range(2) for i in range(8)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    sim = Simulation(tiny("sync", workload={"trace": str(trace)}))
    sim.run()
    assert [r.tokens for r in sim.records] == [400] * 6  # the 2 trace steps replay cyclically
    # prompt q0 gets samples 0, 1, 2 within its step: stable sample ids
    s0 = sim.workload.step(0)
    assert [x.sample_id for x in s0[:4]] == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 0, 1)]


def test_live_resize_is_cheaper_than_hard():
    live = simulate(load_scenario("dynaresize-8xh20", ["steps=40", "log.samples=false"]))
    hard = simulate(load_scenario("dynaresize-8xh20", ["steps=40", "log.samples=false", "resize.mode=hard"]))
    assert live.resizes and hard.resizes
    assert hard.total_s - live.total_s == pytest.approx(254.8 - 187.2, rel=0.35)


@pytest.mark.parametrize("mode", ["sync", "stream", "async"])
def test_resizes_lose_no_sample_and_keep_staleness(tmp_path, mode):
    sim = Simulation(load_scenario("dynaresize-8xh20", ["steps=34", *pipeline_overrides(mode), "log.intervals=none",
                                                       "controller.consecutive=1"]), tmp_path)
    s = sim.run()
    assert s.resizes, "the phase change at step 20 should trigger a resize in every mode"
    samples = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "sample"]
    ids = {tuple(e["id"]) for e in samples}
    assert len(ids) == len(samples) == 34 * 48 * 8
    lag = 1 if mode == "async" else 0
    assert all(e["weights_version"] == max(e["step"] - lag, 0) for e in samples)
    resize = next(e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "resize")
    assert resize["critical_path_s"] == pytest.approx(187.2)
    assert resize["end"] - resize["start"] == pytest.approx(187.2)


def test_abort_resumes_partial_samples_on_the_new_split(tmp_path):
    # swing: the second resize (2:6 -> 6:2 after step 202) happens while step 203 generates.
    sim = Simulation(load_scenario("dynaresize-8xh20-swing", ["steps=205", "log.intervals=none",
                                                             "log.samples=true", "resize.inflight=abort"]),
                     tmp_path)
    s = sim.run()
    second = s.resizes[1]
    assert (second["from"], second["to"]) == ([2, 6], [6, 2])
    samples = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "sample"]
    assert len({tuple(e["id"]) for e in samples}) == len(samples) == 205 * 48 * 8
    resumed = [e for e in samples if "aborted_on" in e]
    assert resumed and {e["step"] for e in resumed} == {203}
    resize_end = second["at_s"] + second["critical_path_s"]
    for e in resumed:
        assert e["finish"] > resize_end
        assert 0 <= e["resumed_after_tokens"] < e["output_length"]
    assert any(e["resumed_after_tokens"] > 0 for e in resumed)  # progress was kept, not redone
    drain = simulate(load_scenario("dynaresize-8xh20-swing", ["steps=205", "log.samples=false",
                                                             "log.intervals=none"]))
    assert drain.resizes[1]["at_s"] > second["at_s"]  # drain waits for the generation to finish


def test_dynamic_sampling_prices_the_extra_generation_and_trains_one_batch():
    base = ["steps=4", "workload.prompts_per_step=32", "log.samples=false"]
    plain = simulate(load_scenario("streamrl-skew", base))
    dyn = Simulation(load_scenario("streamrl-skew", [*base, "workload.drop_rate=0.3"]))
    generated = sum(len(dyn.workload.step(k)) for k in range(4))
    summary = dyn.run()
    assert generated > 4 * 32 * dyn.sc.workload.samples_per_prompt  # groups were dropped and redrawn
    assert summary.output_tokens > plain.output_tokens  # and generated, at a price
    assert summary.total_s > plain.total_s
    trained, finish = dyn.trained(dyn.workload.step(0), [0.0] * len(dyn.workload.step(0)))
    assert len(trained) == 32 * dyn.sc.workload.samples_per_prompt
    assert sorted({s.sample_id[1] for s in trained}) == list(range(32)) and not any(s.dropped for s in trained)
