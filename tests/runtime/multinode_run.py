"""Run by tests/runtime/test_multinode.py in a process of its own (the test session's Ray is a
single node): start Ray's multi-node test cluster, 2 nodes with 2 CPUs each on this machine, and
run the 2+2 sync job of tests/runtime/fault_runs.py on it, its 4 devices spread over both nodes,
with every checkpoint going through the driver (`cluster.storage=driver`: what a node without the
driver's storage gets); then resume a copy of the run from step 2's checkpoint (RUN_DIR-resumed),
which the driver pushes to each device.

    python tests/runtime/multinode_run.py RUN_DIR WARM_START_OVERRIDE...
"""

import json
import os
import shutil
import sys
from dataclasses import replace

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, as the test session
os.environ["RAY_AUTH_MODE"] = "disabled"  # a cluster without token authentication: joining it warns
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(run_dir: str, *warm_start: str) -> None:
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from poise.runtime.driver import train_disaggregated
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]  # fault_runs, and the tests' fault_injection it imports
    from fault_runs import STEPS, TINY

    from poise.config import load_train_config

    torch.set_num_threads(1)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        cfg = load_train_config(None, [*TINY, f"run.dir={run_dir}", *warm_start, "pipeline.mode=sync",
                                       f"cluster.address={cluster.address}", "cluster.storage=driver"])
        train_disaggregated(cfg)
        # resume a copy from step 2's checkpoint: the driver pushes it to every device's node
        resumed = f"{run_dir}-resumed"
        shutil.copytree(run_dir, resumed)
        shutil.rmtree(f"{resumed}/checkpoints/step_{STEPS:06d}")
        os.remove(f"{resumed}/checkpoints/latest")
        train_disaggregated(replace(cfg, run=replace(cfg.run, dir=resumed)), resume=True)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        print(json.dumps({"nodes": len(nodes), "cpus_per_node": sorted(int(n["Resources"]["CPU"]) for n in nodes)}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
