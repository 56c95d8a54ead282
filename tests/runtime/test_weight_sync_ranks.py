"""The weight sync, pre-warm and optimizer staging between two real processes (gloo), as on
a GPU job: receivers copy each bucket into the model as it arrives (never a second copy of the
model), pre-warm runs a collective on every group (NCCL builds communicators only then), and every
timing point synchronises the device first (a no-op on CPU; counted here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("sync_ranks.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("sync_ranks")
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(r), str(tmp / "store"), str(tmp / f"{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out[-3000:]
    return [json.loads((tmp / f"{r}.json").read_text()) for r in range(2)]


def test_receiver_holds_one_bucket_at_a_time_and_gets_the_senders_weights(ranks):
    sender, receiver = ranks[0]["publish"], ranks[1]["publish"]
    assert sender["broadcasts"] >= 4  # several buckets, or the bound is not exercised
    assert receiver["before"] != sender["before"]  # the weights differed: the sync moved them
    assert receiver["after"] == sender["after"] == sender["before"]
    assert receiver["version"] == sender["version"] == 7
    assert receiver["most_buffers_alive"] <= 1, "received buckets are kept alive until loading"


def test_prewarm_runs_a_collective_on_every_group_of_the_rank(ranks):
    for rank in ranks:  # groups [0, 1], [0], [1]: each rank is in two
        assert rank["warm"]["cached"] == 3
        assert rank["warm"]["all_reduce"] == 2 and rank["warm"]["warmed"] == 2


def test_timing_points_synchronise_the_device(ranks):
    for rank in ranks:
        assert rank["warm"]["sync"] >= 1
        assert rank["publish"]["sync"] >= 1
        assert rank["stage"]["sync"] >= 1


def test_staged_optimizer_state_is_the_senders(ranks):
    assert ranks[0]["stage"]["state"] == ranks[1]["stage"]["state"]
