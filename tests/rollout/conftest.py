"""Tiny Llama/Qwen2 models for the rollout tests: built at random, saved, loaded back from disk."""

from __future__ import annotations

import pytest
import torch

from poise.model.loading import TinyModelConfig, build_tiny, load_model, save_model

VOCAB = 60  # the char tokenizer's size
SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, max_positions=96)


@pytest.fixture(autouse=True)
def _one_thread():
    """Bitwise claims are made at one torch thread; a test that changes it gets it back."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


def sharpen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Re-draw the weights with std 0.2 (HF's default 0.02 leaves attention nearly uniform, so
    greedy tokens would barely depend on positions or keys and a broken rotary could pass)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


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
