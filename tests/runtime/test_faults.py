"""Failures are detected and survived (issue 11, runtime/faults.py).

`ray.kill` of a rollout device during generation, of a train device during its micro-batches and
of the train leader during the weight publish, in one sync and in one async run (the real kill,
at an exact phase, by the fault tests' injector, tests/fault_injection.py): each run completes with the samples (tokens,
logprobs, weights versions) and the model and optimizer bytes of the undisturbed run, learning
all along, and logs each sample and step once. A worker that sleeps forever (its `hang`)
stops the run with one line within cluster.step_timeout_s of its last progress and releases the
placement group; the death of the only train device stops the run with one line and an intact
checkpoint to resume from.
"""

import time

import pytest
import ray

from poise.runtime.driver import train_disaggregated
from poise.errors import PoiseError
from poise.runtime.faults import RunFailure, StepTimeout, WorkerLost, wait
from poise.training.checkpoint import latest_checkpoint, verify_checkpoint

from fault_injection import Faults, KillAt, injected, parse_kills  # tests/fault_injection.py
from fault_runs import assert_logged_once, baseline, config, run_once

pytestmark = pytest.mark.ray

# (phase, step, device) on 2+2: devices 0, 1 roll out, 2 (the leader) and 3 train
KILLS = {
    # sync: step 0's generation, step 1's micro-batches, step 2's publish
    "sync": "generate:0:0,train:1:3,publish:2:2",
    # async: step 1's generation (run during step 0, after its update), step 1's micro-batches, step 2's publish
    "async": "generate:1:1,train:1:3,publish:2:2",
}


def _recoveries(record) -> list[dict]:
    return [e for e in record.events if e["kind"] == "recovery"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_workers_are_survived_byte_identical(ray_session, tmp_path_factory, warm_start, read_run, mode):
    straight = baseline(mode, tmp_path_factory, warm_start, read_run)
    # a 60 s deadline (and gloo timeout) bounds this test if a survivor sits in a collective with the
    # dead peer (gloo can miss the death); the recovery no longer waits for one (PROBE_S): the attack
    # at the default deadline is test_a_device_killed_during_a_weight_sync_is_survived_at_the_default_deadline
    killed = run_once(f"{mode}-killed", tmp_path_factory.getbasetemp(), warm_start, read_run, train_disaggregated,
                      f"pipeline.mode={mode}", "cluster.step_timeout_s=60", faults={"kill": KILLS[mode]})
    straight.assert_learned(warm_start)
    killed.assert_learned(warm_start)
    recoveries = _recoveries(killed)
    assert [e["devices"] for e in recoveries] == [[1 if mode == "async" else 0], [3], [2]], recoveries
    assert all(e["detect_s"] is not None and e["recover_s"] > 0 for e in recoveries), recoveries
    killed.assert_bitwise_equal(straight, f"{mode}: three workers killed vs undisturbed")
    assert_logged_once(killed)
    assert not (killed.run_dir / "recover").exists()  # the scratch replica is gone


@pytest.mark.slow
def test_a_device_killed_during_a_weight_sync_is_survived_at_the_default_deadline(ray_session, tmp_path_factory,
                                                                                  warm_start, read_run):
    """The attack: devices die inside weight syncs while cluster.step_timeout_s keeps its default
    (600 s, also gloo's collective timeout). The train leader SIGKILLs itself as it starts
    broadcasting step 1's weights while rollout device 1 stays in that broadcast (gloo can leave a
    survivor waiting there for its whole timeout; a `sync` hang makes it certain), and rollout
    device 0 dies 2 ms into step 2's sync. Each death is detected within 30 s, the recovery gives the
    stuck survivor PROBE_S and no more (it restores from train device 3 and replaces every actor),
    and the run ends byte-identical to the undisturbed one. Waiting on the stuck survivor instead
    (the probe at step_timeout_s) stalls the recovery for the whole 600 s and ends the run there."""
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    killed = run_once("sync-killed-in-sync", tmp_path_factory.getbasetemp(), warm_start, read_run,
                      train_disaggregated, "pipeline.mode=sync",
                      faults={"kill": "sync:1:2:0,sync:2:0:0.002", "hang": "sync:1:1"})
    assert config(killed.run_dir, warm_start).cluster.step_timeout_s == 600  # the default, not a test's
    recoveries = _recoveries(killed)
    assert [(e["step"], e["devices"]) for e in recoveries] == [(1, [2]), (2, [0])], recoveries
    assert recoveries[0]["silent"] == [1], recoveries  # the attack hit: a survivor stuck in the broadcast
    assert all("in the sync" in e["killed"] or "sync's end" in e["killed"] for e in recoveries), recoveries
    assert all(e["detect_s"] < 30 for e in recoveries), recoveries
    # a bound on a stall, not a speed: waiting on the stuck survivor takes the whole 600 s
    assert all(e["recover_s"] < 300 for e in recoveries), recoveries
    straight.assert_learned(warm_start)
    killed.assert_learned(warm_start)
    killed.assert_bitwise_equal(straight, "sync: the leader and a rollout device killed inside weight syncs")
    assert_logged_once(killed)


def _placement_groups_removed() -> bool:
    return all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


@pytest.mark.slow
def test_a_hung_worker_stops_the_run_with_one_line(ray_session, tmp_path, warm_start):
    timeout_s = 20
    cfg = config(tmp_path, warm_start, "pipeline.mode=sync", "cluster.devices=2", "cluster.split=[1,1]",
                 "run.steps=2", f"cluster.step_timeout_s={timeout_s}")
    t0 = time.monotonic()
    with injected(hang="train:1:1"), pytest.raises(RunFailure) as failure:
        train_disaggregated(cfg)
    message = str(failure.value)
    assert "\n" not in message and message.startswith("device 1 (train) made no progress for 20 s during training "
                                                      "of step 1"), message
    assert time.monotonic() - t0 < 10 * timeout_s  # a hang would never end: this only bounds the test
    assert _placement_groups_removed()
    assert latest_checkpoint(tmp_path).name == "step_000001"  # step 0 stays resumable


@pytest.mark.slow
def test_the_last_train_device_dying_stops_with_a_resumable_checkpoint(ray_session, tmp_path, warm_start):
    cfg = config(tmp_path, warm_start, "pipeline.mode=sync", "cluster.devices=2", "cluster.split=[1,1]",
                 "run.steps=2")
    with injected(kill="train:1:1"), pytest.raises(RunFailure) as failure:
        train_disaggregated(cfg)
    message = str(failure.value)
    assert "\n" not in message, message
    assert message.startswith("device 1 (train) died at step 1 and no train device survives"), message
    assert f"step_000001 is intact: continue with --resume {tmp_path}" in message
    assert verify_checkpoint(latest_checkpoint(tmp_path)) is None
    assert _placement_groups_removed()


@pytest.mark.slow
@pytest.mark.parametrize("shard,what", [("optimizer", "optimizer state"), ("full", "weights and optimizer state")],
                         ids=["optimizer", "full"])
def test_sharded_state_survives_a_rollout_death_and_stops_in_one_line_at_a_train_death(
        ray_session, tmp_path_factory, warm_start, read_run, shard, what):
    """cluster.shard=optimizer: a dead rollout device is recovered (every train device writes its
    part of the state into the recovery checkpoint) and the run ends with the undisturbed run's
    bytes; a dead train device took its part of the state with it: one line, the last checkpoint.
    full: the same, every owner writing its weights too."""
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    root = tmp_path_factory.getbasetemp()
    killed = run_once(f"{shard}-rollout-killed", root, warm_start, read_run, train_disaggregated, "pipeline.mode=sync",
                      f"cluster.shard={shard}", "cluster.step_timeout_s=60", faults={"kill": "generate:1:0"})
    assert [e["devices"] for e in _recoveries(killed)] == [[0]]
    killed.assert_bitwise_equal(straight, f"shard={shard}: a rollout device killed vs undisturbed")
    run_dir = root / f"{shard}-train-killed"
    cfg = config(run_dir, warm_start, "pipeline.mode=sync", f"cluster.shard={shard}", "cluster.step_timeout_s=60")
    with injected(kill="train:1:3"), pytest.raises(RunFailure) as failure:
        train_disaggregated(cfg)
    message = str(failure.value)
    assert "\n" not in message, message
    assert message.startswith(f"device 3 (train) died at step 1 and with cluster.shard={shard} its part of the "
                              f"{what} has no replica"), message
    assert f"step_000001 is intact: continue with --resume {run_dir}" in message
    assert _placement_groups_removed()


@ray.remote(num_cpus=0)
class _Sleeper:
    def after(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_the_deadline_is_a_heartbeat(ray_session):
    """Results that keep arriving keep the wait alive past the deadline; silence ends it."""
    sleeper = _Sleeper.remote()
    ray.get(sleeper.after.remote(0))  # started
    steady = [sleeper.after.remote(0.5) for _ in range(6)]  # one result every 0.5 s for 3 s, deadline 2 s
    assert wait(steady, list(range(6)), "a steady step", timeout_s=2.0) == [0.5] * 6
    t0 = time.monotonic()
    with pytest.raises(StepTimeout, match=r"^device 7 \(train\) made no progress for 2 s during a hung step;"):
        wait([sleeper.after.remote(0.1), sleeper.after.remote(60)], [6, 7], "a hung step", timeout_s=2.0,
             role="train")
    assert time.monotonic() - t0 < 30
    ray.kill(sleeper)


def test_a_dead_actor_ends_the_wait_at_once_while_the_other_call_still_hangs(ray_session):
    """A survivor stuck in a collective with the dead peer would hold the wait until gloo's timeout
    (step_timeout_s, 10 min by default); the dead actor's failed call must end it at once."""
    hung, doomed = _Sleeper.remote(), _Sleeper.remote()
    ray.get([hung.after.remote(0), doomed.after.remote(0)])  # both started
    refs = [hung.after.remote(120), doomed.after.remote(120)]
    time.sleep(0.5)
    ray.kill(doomed)
    t0 = time.monotonic()
    with pytest.raises(WorkerLost, match=r"device\(s\) \[4\] lost during a weight sync"):
        wait(refs, [3, 4], "a weight sync", timeout_s=60.0)
    assert time.monotonic() - t0 < 20
    ray.kill(hung)


def test_a_misspelt_fault_hook_is_refused():
    with pytest.raises(PoiseError, match="kill='generation:0:1'"):
        parse_kills("generation:0:1")


@pytest.mark.parametrize("spec", ["sync:1:2", "train:1:2:0.5", "sync:1:2:-1", "sync:1:2:soon"])
def test_a_sync_kill_needs_its_moment_and_only_a_sync_kill_has_one(spec):
    with pytest.raises(PoiseError, match="sync:<step>:<device>:<seconds>"):
        parse_kills(spec)


def test_sync_kills_and_hangs_go_to_the_devices_the_driver_kills_the_rest():
    faults = Faults(kill="publish:1:2,sync:1:2:0.004", hang="sync:1:1")
    assert faults.sync_kills == (KillAt("sync", 1, 2, 0.004),) and faults.hang == ("sync", 1, 1)
    assert faults.kills == [KillAt("publish", 1, 2)]
    assert Faults(kill="train:1:3", hang="train:1:1").sync_kills == ()


@ray.remote
class _Survivor:
    """A device after a death: one answers the probe, the other is stuck in a collective."""

    def held_version(self) -> int:
        return 3

    def stuck(self, seconds: float) -> None:
        time.sleep(seconds)


def test_the_recovery_probe_does_not_wait_for_a_survivor_stuck_in_a_collective(ray_session):
    """A survivor in a broadcast with the dead device answers nothing until gloo's timeout
    (step_timeout_s, 10 min by default): the probe gives it PROBE_S, then counts it as lost."""
    from types import SimpleNamespace

    from poise.runtime.faults import PROBE_S, _held_versions

    free, stuck = _Survivor.remote(), _Survivor.remote()
    ray.get([free.held_version.remote(), stuck.held_version.remote()])  # both started
    stuck.stuck.remote(600)
    time.sleep(0.5)
    t0 = time.monotonic()
    held = _held_versions(SimpleNamespace(workers=[None, free, stuck]), dead=[0])
    assert held == [None, 3, None]
    assert time.monotonic() - t0 < PROBE_S + 10
    ray.kill(stuck)
    ray.kill(free)


def test_an_unrecoverable_death_names_the_newest_checkpoint_that_verifies(tmp_path):
    """The one line after an unrecoverable death promises an intact checkpoint: it must be one that
    verifies (its bytes match their sha256), not merely the newest directory."""
    import types

    import torch

    from poise.config import TinyModelConfig
    from poise.model.loading import build_tiny
    from poise.runtime.faults import unrecoverable
    from poise.runtime.topology import Topology
    from poise.training.checkpoint import TrainState, checkpoint_dir, save_checkpoint

    model = build_tiny(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=32, max_positions=32), 40, seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model, optimizer, TrainState(step, step))
    weights = checkpoint_dir(tmp_path, 3) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in the newest checkpoint's last weight
    weights.write_bytes(bytes(data))
    rt = types.SimpleNamespace(topology=Topology(rollout=(0,), train=(1,)))
    line = unrecoverable(rt, [1], 4, tmp_path, "no train device is left")
    assert "step_000002" in line and f"--resume {tmp_path}" in line, line
    assert "step_000003" in line and "sha256" in line, line  # the damaged one is named as such
    assert "\n" not in line
    for step in (1, 2):
        (checkpoint_dir(tmp_path, step) / "state.json").unlink()
    line = unrecoverable(rt, [1], 4, tmp_path, "no train device is left")
    assert "--resume" not in line and "no intact checkpoint" in line, line
