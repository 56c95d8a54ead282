"""Networks and nodes (issue 11).

A local run keeps every listening socket on loopback: the Ray daemons, the device actors, the
torch.distributed store (bound to device 0's node address, not all interfaces) and gloo, probed
from /proc all through the sync 2+2 run. The same run on Ray's multi-node test cluster (2 nodes of
2 CPUs on this machine, so the 4 devices span both) ends with the same samples and the same model
and optimizer bytes, and joining that cluster, which has no token authentication, warns. There every
checkpoint goes through the driver (cluster.storage=driver: a node that does not see run.dir), and a
copy of that run resumed from step 2, its checkpoint pushed to every device, ends the same too.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fault_runs import assert_logged_once, baseline, beyond_loopback, listening

pytestmark = [pytest.mark.ray]


def test_nothing_listens_beyond_loopback_during_a_run(ray_session, tmp_path_factory, warm_start, read_run):
    baseline("sync", tmp_path_factory, warm_start, read_run)
    found = listening["sync-straight"]
    pids = {pid for pid, _, _ in found}
    assert len(pids) >= 4, found  # the probe saw the device actors' listeners (store, gloo), not just Ray's
    assert not beyond_loopback(found), sorted(beyond_loopback(found))


@pytest.mark.slow
def test_a_run_over_two_ray_nodes_equals_the_run_on_one(ray_session, tmp_path, tmp_path_factory, warm_start,
                                                          read_run):
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    script = Path(__file__).with_name("multinode_run.py")
    # a Ray temp directory of its own: the test cluster's head writes its address into
    # <tmp>/ray/ray_current_cluster, where every other local ray.init() on the machine would find
    # and join it while it runs
    ray_tmp = Path(tempfile.mkdtemp(prefix="pmn", dir="/tmp"))  # short: Ray's unix socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    # this session's Ray turned token authentication on in our environment; the test cluster has none
    env |= {"RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled"}
    run_dir = tmp_path / "two-nodes"
    stages = set(Path(tempfile.gettempdir()).glob("poise-stage-*"))  # left by anything before this test
    try:
        proc = subprocess.run([sys.executable, str(script), str(run_dir), *warm_start.overrides], capture_output=True,
                              text=True, env=env, timeout=1200)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"nodes": 2, "cpus_per_node": [2, 2]}
    assert "joined the Ray cluster at" in proc.stderr and "without token authentication" in proc.stderr
    assert proc.stderr.count("go through the driver") >= 2, proc.stderr[-4000:]  # both nodes, run and resume
    assert set(Path(tempfile.gettempdir()).glob("poise-stage-*")) == stages  # its staging copies removed
    got = read_run(run_dir)
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(straight, "2 Ray nodes vs 1")
    assert_logged_once(got)
    resumed = read_run(Path(f"{run_dir}-resumed"))
    resumed.assert_bitwise_equal(straight, "resumed on 2 Ray nodes vs straight on 1")
    assert_logged_once(resumed)
