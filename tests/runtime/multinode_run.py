"""Run by tests/runtime/test_multinode.py in a process of its own (the test session's Ray is a
single node): start Ray's multi-node test cluster, 2 nodes with 2 CPUs each on this machine, and
run the 2+2 sync job of tests/runtime/fault_runs.py on it, its 4 devices spread over both nodes.

    python tests/runtime/multinode_run.py RUN_DIR WARM_START_OVERRIDE...
"""

import json
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, as the test session
os.environ["RAY_AUTH_MODE"] = "disabled"  # a cluster without token authentication: joining it warns
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(run_dir: str, *warm_start: str) -> None:
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from poise.runtime.driver import train_disaggregated
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fault_runs import TINY

    from poise.config import load_train_config

    torch.set_num_threads(1)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        cfg = load_train_config(None, [*TINY, f"run.dir={run_dir}", *warm_start, "pipeline.mode=sync",
                                       f"cluster.address={cluster.address}"])
        train_disaggregated(cfg)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        print(json.dumps({"nodes": len(nodes), "cpus_per_node": sorted(int(n["Resources"]["CPU"]) for n in nodes)}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
