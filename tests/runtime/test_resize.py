"""Live resizing on the runtime changes no sampled token and no bit of any update.

From the session's SFT warm start (rewards differ within groups, every step moves the weights),
8 steps on 4 CPU devices with the schedule 2+2 -> 1+3 (step 2) -> 3+1 (step 4) -> 2+2 (step 6)
end with the samples and the model and optimizer bytes of the static 2+2 run, in sync and in
async, and in sync those of the colocated loop. Each run is made once per module.
"""

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from run_shapes import GROUP, PROMPTS, RunMemo, tiny_job

pytestmark = pytest.mark.ray

STEPS = 8
TINY = [
    *tiny_job(STEPS),  # 6 uneven micro-batches over 1, 2 or 3 train devices
    "run.verify_sync=true",
    "resize.staging_mb=0.05",  # the optimizer state (~0.6 MB) streams in ~12 chunks across tensor boundaries
]
SCHEDULE = "resize.schedule=[{at_step: 2, split: [1, 3]}, {at_step: 4, split: [3, 1]}, {at_step: 6, split: [2, 2]}]"
EXPECTED_SPLITS = [[2, 2]] * 2 + [[1, 3]] * 2 + [[3, 1]] * 2 + [[2, 2]] * 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm_start, read_run):
    def config(run_dir, *extra):
        return load_train_config(None, [*TINY, f"run.dir={run_dir}", *warm_start.overrides, *extra])

    return RunMemo(tmp_path_factory.mktemp("resize"), config, read_run)


def _resizes(record) -> list[dict]:
    return [e for e in record.events if e["kind"] == "resize"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_live_resizes_change_nothing(ray_session, runs, warm_start, mode):
    static = runs.get(f"{mode}-static", train_disaggregated, f"pipeline.mode={mode}", "cluster.split=[2,2]")
    resized = runs.get(f"{mode}-resized", train_disaggregated, f"pipeline.mode={mode}", "cluster.split=[2,2]",
                       SCHEDULE)
    static.assert_learned(warm_start)
    resized.assert_learned(warm_start)
    assert [r["split"] for r in resized.rows] == EXPECTED_SPLITS
    assert [r["split"] for r in static.rows] == [[2, 2]] * STEPS
    resized.assert_bitwise_equal(static, f"{mode}: resized vs static 2+2")
    assert len(resized.samples) == STEPS * PROMPTS * GROUP
    if mode == "sync":
        reference = runs.get("colocated", train_colocated, "pipeline.mode=colocated")
        resized.assert_bitwise_equal(reference, "sync resized vs colocated")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resize_events_record_each_switch(ray_session, runs, mode):
    resized = runs.get(f"{mode}-resized", train_disaggregated, f"pipeline.mode={mode}", "cluster.split=[2,2]",
                       SCHEDULE)
    events = _resizes(resized)
    assert [(e["step"], e["from_split"], e["to_split"]) for e in events] == [
        (1, [2, 2], [1, 3]), (3, [1, 3], [3, 1]), (5, [3, 1], [2, 2])]
    for e in events:
        assert e["mode"] == "live"
        assert e["groups_created"] == 0, e  # every communicator came from the cache
        # the driver-side phases are timed one after another inside the driver's own wall-clock window
        # of the resize (start, end), measured apart from them; the critical path adds the barrier wait
        driver_side = sum(v for k, v in e["phases"].items() if k != "barrier_wait")
        assert 0 < driver_side <= e["end"] - e["start"] + 1e-6, e
        assert e["critical_path_s"] == pytest.approx(driver_side + e["phases"]["barrier_wait"]), e
        assert set(e["phases"]) >= {"abort", "hand_over", "group_switch", "engine_build", "barrier_wait"}
    to_train = [e for e in events if e["to_train"]]
    assert [e["to_train"] for e in to_train] == [[1], [2]]  # 2+2 -> 1+3 and 3+1 -> 2+2
    assert [e["to_rollout"] for e in events] == [[], [1, 2], []]  # 1+3 -> 3+1
    for e in to_train:  # the joiners received the optimizer state through the bounded buffer
        assert e["optimizer_bytes"] > 4 * e["peak_host_buffer_bytes"] > 0, e  # in chunks
        assert e["peak_host_buffer_bytes"] <= 0.05 * 2**20, e
    decisions = [e for e in resized.events if e["kind"] == "decision"]
    assert [d["step"] for d in decisions] == list(range(STEPS - 1))  # every decision, resize or not
    assert [d["step"] for d in decisions if d["action"] == "resize"] == [1, 3, 5]
    resize_rows = {e["device"] for e in resized.events if e["kind"] == "interval" and e["role"] == "resize"}
    assert resize_rows == {1, 2}  # the devices that switched at some point


# sync resizes reshard the same way (and are checked unsharded)
@pytest.mark.parametrize("mode,shard", [("async", "optimizer"), ("async", "full")],
                         ids=["async-optimizer", "async-full"])
def test_sharded_live_resizes_reshard_the_optimizer_state_and_change_nothing(ray_session, runs, warm_start, mode,
                                                                             shard):
    """cluster.shard=optimizer: at every switch each parameter whose owner changes has its state
    sent by its old owner to its new one (through the bounded buffer); the run ends with the bytes
    of the unsharded static 2+2 run. full: the old train devices reshard the weights, a leaving
    one taking the whole model (it generates with it) and a staying one only its new run (it
    never holds the whole model), and each train device of the new split keeps its run alone."""
    static = runs.get(f"{mode}-static", train_disaggregated, f"pipeline.mode={mode}", "cluster.split=[2,2]")
    resized = runs.get(f"{mode}-{shard}-resized", train_disaggregated, f"pipeline.mode={mode}",
                       "cluster.split=[2,2]", SCHEDULE, f"cluster.shard={shard}")
    resized.assert_learned(warm_start)
    assert [r["split"] for r in resized.rows] == EXPECTED_SPLITS
    resized.assert_bitwise_equal(static, f"{mode}: sharded resized vs static 2+2")
    events = _resizes(resized)
    assert len(events) == 3
    for e in events:
        moved = e["optimizer_bytes_by_device"]
        owners = set(range(e["from_split"][0], 4)) | set(range(e["to_split"][0], 4))  # old and new train devices
        assert set(map(int, moved)) == owners, e
        assert e["optimizer_bytes"] > 4 * e["peak_host_buffer_bytes"] > 0, e  # owner to owner, in chunks
        assert e["peak_host_buffer_bytes"] <= 0.05 * 2**20, e
        assert e["groups_created"] == 0, e
        if shard == "optimizer":  # the weights stay where they are: every device holds them whole
            assert e["weights_bytes"] == 0, e
    held = {}
    for e in resized.events:
        if e["kind"] == "interval" and e["phase"] == "update":
            held.setdefault(e["step"], []).append(e["optimizer_bytes"])
    assert len({sum(parts) for parts in held.values()}) == 1, held  # the whole state, once, at every split
    weights = {}
    for e in resized.events:
        if e["kind"] == "interval" and e["phase"] == "update":
            weights.setdefault(e["step"], []).append(e["parameter_bytes"])
    whole = {b for parts in weights.values() for b in parts if len(parts) == 1}  # the 3+1 steps: one holds all
    assert len(whole) == 1, weights
    for step, parts in weights.items():  # full: the weights once, at every split; optimizer: whole everywhere
        assert (sum(parts) if shard == "full" else min(parts)) == max(whole), (step, parts)
    if shard == "full":
        (model_bytes,) = whole
        # 2+2 -> 1+3: both stay; 1+3 -> 3+1: 1 and 2 leave, 3 stays and owns it all; 3+1 -> 2+2: 3 owned it all
        for e in events:
            held = {int(d): b for d, b in e["weights_held_by_device"].items()}
            assert set(held) == set(range(e["from_split"][0], 4)), e
            for d, b in held.items():
                whole_here = d < e["to_split"][0] or e["to_split"][1] == 1 or e["from_split"][1] == 1
                assert (b == model_bytes) if whole_here else (b < model_bytes), (e["from_split"], e["to_split"], held)
        assert any(b < model_bytes for e in events for b in e["weights_held_by_device"].values())
        for e in events:  # each old train device received every parameter it did not own, once
            assert e["weights_bytes"] == (e["from_split"][1] - 1) * model_bytes, e
        updates = [e for e in resized.events if e["kind"] == "interval" and e["phase"] == "update"]
        for u in (u for u in updates if "received_bytes" in u):  # the weights the rounds gathered: part of it
            assert 0 <= u["weight_bytes"] <= u["received_bytes"], u
        assert any(u["weight_bytes"] > 0 for u in updates)


@pytest.mark.parametrize("shard", ["none", "full"])
def test_hard_resizes_change_nothing_either(ray_session, runs, warm_start, shard):
    """The baseline (checkpoint, kill every actor, start new ones on the new split, reload) ends
    where the live resizes and the static split do; every device stopped for it. full: the new
    actors start with their runs of the initial weights and reload their runs of the checkpoint
    the old owners wrote."""
    static = runs.get("sync-static", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]")
    hard = runs.get(f"sync-hard-{shard}", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]", SCHEDULE,
                    "resize.mode=hard", f"cluster.shard={shard}")
    hard.assert_learned(warm_start)
    assert [r["split"] for r in hard.rows] == EXPECTED_SPLITS
    hard.assert_bitwise_equal(static, "sync: hard-resized vs static 2+2")
    events = _resizes(hard)
    assert [e["mode"] for e in events] == ["hard"] * 3
    for e in events:
        assert set(e["phases"]) >= {"drain", "checkpoint", "kill", "start", "reload"}
    rows = {e["device"] for e in hard.events if e["kind"] == "interval" and e["role"] == "resize"}
    assert rows == {0, 1, 2, 3}
    assert not (hard.run_dir / "resize-hard").exists()  # the resize's own checkpoint is gone


def test_controller_on_real_compute_resizes_by_itself_and_changes_nothing(ray_session, runs, warm_start, tmp_path):
    """`resize.policy: controller` with a `cluster.profile`: the controller reads the measured
    step phases every step, prices the resize at the profile's measured live resize (then at the
    job's own), moves devices by itself, and the run still ends where the static 2+2 run does.
    The profile's train table is flat (a fixed-cost update), so the calibrated model says a
    train device is worth nothing: 3+1 is predicted faster (fewer prefills on the busiest
    instance) whatever the machine's timing, and with threshold 0 the decision does not depend on
    noise."""
    import json

    profile = {"format": "poise-profile/1",
               "decode": [{"batch": 1, "context": 16, "seconds_per_step": 0.001},
                          {"batch": 8, "context": 16, "seconds_per_step": 0.002}],
               "prefill": [{"tokens": 8, "seconds": 0.001}, {"tokens": 32, "seconds": 0.002}],
               "train": [{"tokens": 1, "seconds": 0.1}, {"tokens": 100000, "seconds": 0.1001}],
               "resize": {"live": {"phases": {"abort": 0.0123, "group_switch": 0.001}, "n": 1}}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    static = runs.get("sync-static", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]")
    ctl = runs.get("sync-controller", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]",
                   "resize.policy=controller", f"cluster.profile={path}", "controller.threshold=0",
                   "controller.break_even=false", "controller.consecutive=1", "controller.cooldown_steps=0", "controller.window=1")
    decisions = [e for e in ctl.events if e["kind"] == "decision"]
    assert [d["step"] for d in decisions] == list(range(STEPS - 1))
    first = decisions[0]
    assert first["action"] == "resize" and first["to"] == [3, 1], first
    assert first["predicted_cost_s"] == pytest.approx(0.0133)  # the profile's price, not the paper's 187 s
    assert "2:2 -> 3:1" in first["reason"] and set(first["predicted_step_s"]) == {"1:3", "2:2", "3:1"}
    measured = _resizes(ctl)[0]["critical_path_s"]
    assert decisions[1]["predicted_cost_s"] == pytest.approx(measured)  # then the job's own resize
    assert [r["split"] for r in ctl.rows][:2] == [[2, 2], [3, 1]]
    ctl.assert_learned(warm_start)
    ctl.assert_bitwise_equal(static, "sync: controller-resized vs static 2+2")
