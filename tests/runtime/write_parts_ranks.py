"""One rank of the two-rank gloo world of tests/runtime/test_checkpoint_parts.py (a script, not a
test): both train devices write their optimizer state into one checkpoint file (`write_parts`),
and rank FAILING's write raises a non-OSError; what each rank raised is written to OUT_JSON.

    python write_parts_ranks.py RANK STORE_FILE TMP_DIR FAILING OUT_JSON
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.runtime.communicators import CommunicatorCache
from poise.runtime.train_shard import TorchTrainShard
from poise.training import tensor_files
from poise.training.trainer import PolicyTrainer

TIMEOUT_S = 40  # the collectives' deadline (cluster.step_timeout_s): a rank left waiting fails only then


def main(rank: int, store: str, tmp: str, failing: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    shape = TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32,
                            max_positions=32)
    trainer = PolicyTrainer(build_tiny(shape, 40, seed=0), AlgorithmConfig(), 0)
    params = trainer.params
    for p in params[rank::2]:  # each rank owns every other parameter's state, as a sharded optimizer does
        trainer.optimizer.state[p] = {"step": torch.tensor(3.0), "exp_avg": torch.ones(p.shape),
                                      "exp_avg_sq": torch.ones(p.shape)}
    shard = TorchTrainShard(rank, trainer, CommunicatorCache(timedelta(seconds=TIMEOUT_S)), True,
                            torch.device("cpu"), None, "optimizer")
    listing = shard.state.stream.listing([0, 1])
    if rank == failing:
        def broken(path, entries, names):
            raise ValueError("injected: a tensor that is not what the listing said")
        tensor_files.write_tensor_parts = broken
    start, raised = time.monotonic(), None
    try:
        shard.state.stream.write_parts([0, 1], 0, listing, Path(tmp) if rank == 0 else None)
    except Exception as e:  # noqa: BLE001 - what the rank raised is the result
        raised = f"{type(e).__name__}: {e}"
    Path(out).write_text(json.dumps({"raised": raised, "seconds": time.monotonic() - start}))
    # stay alive until the other rank is done, as a device actor does: a rank whose peer exited
    # would see its connection close instead of waiting out the deadline
    other = Path(out).with_name(f"{1 - rank}.json")
    deadline = time.monotonic() + 2 * TIMEOUT_S
    while not other.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
