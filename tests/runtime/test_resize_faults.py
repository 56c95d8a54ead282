"""A resize is under the same fault handling as every other phase of a step: each of its waits has
the `cluster.step_timeout_s` deadline, and a device that dies during a resize is replaced and the
resize runs again, so the run ends with the bytes of the undisturbed run."""

import threading
import time
from types import SimpleNamespace

import pytest
import ray

from poise.config import ClusterConfig
from poise.policy.controller import ResizeConfig
from poise.policy.split import Split
from poise.runtime.driver import train_disaggregated
from poise.runtime.faults import StepTimeout
from poise.runtime.resize import live_resize
from poise.runtime.topology import Topology

from fault_runs import assert_logged_once, baseline, run_once

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class _StuckDevice:
    """A rollout device whose abort never returns (an engine that stopped stepping)."""

    def ready(self) -> bool:
        return True

    def abort_generation(self):
        time.sleep(3600)


def test_a_resize_wait_has_a_deadline(ray_session):
    """2+2 -> 1+3: device 1 leaves the rollout role and its abort hangs. The resize ends with one
    line naming the device within a few deadlines; without a deadline it waits for ever."""
    devices = [_StuckDevice.remote() for _ in range(4)]
    ray.get([d.ready.remote() for d in devices])
    rt = SimpleNamespace(topology=Topology.of_split(Split(2, 2)), sharded=False, fully_sharded=False, workers=devices)
    outcome: list = []

    def resize() -> None:
        try:
            live_resize(rt, Split(1, 3), version=1, step=0, cluster=ClusterConfig(step_timeout_s=2.0),
                        resize=ResizeConfig(staging_mb=1.0))
            outcome.append("returned")
        except Exception as e:  # noqa: BLE001 - the test reads it below
            outcome.append(e)

    thread = threading.Thread(target=resize, daemon=True)
    thread.start()
    thread.join(60)
    for d in devices:
        ray.kill(d)
    assert outcome, "live_resize was still waiting on the hung device after 60 s (deadline 2 s)"
    assert isinstance(outcome[0], StepTimeout), outcome
    assert str(outcome[0]).startswith("device 1 (rollout) made no progress for 2 s during the resize"), outcome


@pytest.mark.slow
def test_a_device_killed_during_a_live_resize_is_survived_byte_identical(ray_session, tmp_path_factory, warm_start,
                                                                         read_run):
    """2+2 -> 1+3 after step 1, and rollout device 1 (the one that switches to train) is killed as
    the resize starts: the devices are replaced on the old split, the resize runs again, and the
    run ends with the undisturbed static run's samples and bytes (resizes change nothing)."""
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    killed = run_once("sync-killed-in-resize", tmp_path_factory.getbasetemp(), warm_start, read_run,
                      train_disaggregated, "pipeline.mode=sync", "cluster.step_timeout_s=60",
                      "resize.schedule=[{at_step: 2, split: [1, 3]}]", faults={"kill": "resize:1:1"})
    recoveries = [e for e in killed.events if e["kind"] == "recovery"]
    assert [(e["step"], e["phase"], e["devices"]) for e in recoveries] == [(1, "resize", [1])], recoveries
    resizes = [e for e in killed.events if e["kind"] == "resize"]
    assert [(e["from_split"], e["to_split"]) for e in resizes] == [([2, 2], [1, 3])], resizes
    assert [r["split"] for r in killed.rows] == [[2, 2], [2, 2], [1, 3]]
    killed.assert_learned(warm_start)
    killed.assert_bitwise_equal(straight, "sync: a device killed during a live resize vs undisturbed static 2+2")
    assert_logged_once(killed)
