"""A run with `rollout.backend: vllm` leaves nothing on /dev/shm: not vLLM's weights directory
(`poise-vllm-*`), not the shared-memory segments of its message queues (`psm_*`, 160 and 250 MB
here) and semaphores, after a colocated run, after a runtime run that exits 0, and after one in
which a rollout device was killed (a crash: no release ran in it).

Runs where vLLM is installed: `make test-vllm` (.venv-vllm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poise.config import load_train_config

PROMPTS, GROUP = 2, 4
JOB = ["run.progress=false", "run.log_tokens=true", "run.checkpoint_every=1", f"algorithm.prompts_per_step={PROMPTS}",
       f"algorithm.group_size={GROUP}", "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=8",
       "rollout.num_slots=8", "rollout.backend=vllm", "determinism=semantic"]


def _ours() -> set[str]:
    """The /dev/shm entries a vLLM engine makes (its directory, its queues' segments and
    multiprocessing's semaphores)."""
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(("poise-vllm-", "psm_", "sem.mp-"))}


def _config(run_dir, warm_start, *extra):
    return load_train_config(None, [*JOB, f"run.dir={run_dir}", *warm_start.overrides, *extra])


def test_a_colocated_vllm_run_leaves_nothing_on_dev_shm(tmp_path, warm_start):
    from poise.training.colocated import train_colocated

    before = _ours()
    train_colocated(_config(tmp_path / "run", warm_start, "pipeline.mode=colocated", "run.steps=2"))
    assert _ours() - before == set()


@pytest.mark.ray
@pytest.mark.parametrize("kill", [None, "generate:1:0"], ids=["clean", "rollout-killed"])
def test_a_runtime_vllm_run_leaves_nothing_on_dev_shm(ray_session, tmp_path, warm_start, read_run, kill):
    from poise.runtime.driver import train_disaggregated

    from fault_injection import injected  # tests/fault_injection.py

    before = _ours()
    # the fault tests' injector: a real ray.kill of device 0 (vLLM's) during step 1's generation
    with injected(kill=kill or ""):
        train_disaggregated(_config(tmp_path / "run", warm_start, "pipeline.mode=sync", "run.steps=3",
                                    "cluster.devices=2", "cluster.split=[1,1]", "cluster.step_timeout_s=120"))
    if kill:
        recoveries = [e for e in read_run(tmp_path / "run").events if e["kind"] == "recovery"]
        assert [e["devices"] for e in recoveries] == [[0]], recoveries  # the kill hit the vLLM device
    assert _ours() - before == set()
