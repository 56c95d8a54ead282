"""Tiny Llama/Qwen2 models for the rollout tests: built at random, saved, loaded back from disk."""

from __future__ import annotations

import pytest
import torch

from poise.model.loading import TinyModelConfig, build_tiny, load_model, save_model

from sharpened import sharpen

VOCAB = 60  # the char tokenizer's size
SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, max_positions=96)


@pytest.fixture(autouse=True)
def _one_thread():
    """Bitwise claims are made at one torch thread; a test that changes it gets it back."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)




@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    dirs = {}
    for arch in ("llama", "qwen2"):
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        save_model(sharpen(build_tiny(TinyModelConfig(arch=arch, **SMALL), VOCAB, seed=11), 11), path)
        dirs[arch] = path
    return dirs


@pytest.fixture
def qwen2(model_dirs):
    """A fresh copy per test (load_weights tests mutate it)."""
    return load_model(model_dirs["qwen2"])


@pytest.fixture
def llama(model_dirs):
    return load_model(model_dirs["llama"])


@pytest.fixture
def other_qwen2():
    """The same architecture as `qwen2` with other weights (a trainer's next version)."""
    return sharpen(build_tiny(TinyModelConfig(arch="qwen2", **SMALL), VOCAB, seed=99), 99)
