"""The colocated loop runs on `cluster.device`: on a GPU machine the policy, its reference and the
engine's cache live on the GPU (it used to run on the CPU whatever the config said). Without a
GPU the same config fails in one line, before the reward sandbox starts."""

from __future__ import annotations

import pytest
import torch

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.training.colocated import ColocatedLoop, train_colocated

FAST = ["pipeline.mode=colocated", "run.progress=false", "algorithm.prompts_per_step=2", "algorithm.group_size=2",
        "algorithm.sampling.max_new_tokens=6", "rollout.num_slots=4", "algorithm.kl_coef=0.01"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is usable")
def test_colocated_honours_cluster_device_cuda(tmp_path):
    cfg = load_train_config(None, [*FAST, f"run.dir={tmp_path}", "cluster.device=cuda"])
    with pytest.raises(PoiseError) as e:
        ColocatedLoop(cfg, tmp_path)
    assert "\n" not in str(e.value) and "cluster.device=cuda" in str(e.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh)")
def test_colocated_trains_and_resumes_on_the_gpu(tmp_path):
    over = [*FAST, f"run.dir={tmp_path}", "cluster.device=cuda", "run.steps=2", "run.checkpoint_every=1"]
    loop = ColocatedLoop(load_train_config(None, over), tmp_path)
    try:
        assert {p.device.type for p in loop.model.parameters()} == {"cuda"}
        assert {p.device.type for p in loop.trainer.ref_model.parameters()} == {"cuda"}
    finally:
        loop.steps.rewards.close()
    train_colocated(load_train_config(None, over))
    rows = train_colocated(load_train_config(None, [*over, "run.steps=3"]), resume=True)  # optimizer state onto cuda
    assert [r["step"] for r in rows] == [2]
