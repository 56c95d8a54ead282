"""The vLLM tests' warm start: the session's (tests/conftest.py) with 2 attention heads, so the head
size is 32, the smallest vLLM's CPU attention kernels take (the session's has 16)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from warm_shape import WARM_START as SESSION_WARM_START, WARM_START_DATA  # tests/warm_shape.py

WARM_START = [*SESSION_WARM_START, "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"]  # the last value wins


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory):
    from poise.config import load_train_config
    from poise.training.sft import run_sft

    cfg = load_train_config(None, WARM_START)
    path = tmp_path_factory.mktemp("warm-start-vllm") / "tiny-qwen2-sft"
    run_sft(cfg.model, cfg.data, path, threads=1, progress=False)
    # what tests/conftest.py's WarmStart holds (that module is not importable by name from here)
    return SimpleNamespace(path=path, overrides=(f"model.path={path}", f"data.phases={WARM_START_DATA}"))
