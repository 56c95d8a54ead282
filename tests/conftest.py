"""Session-wide test settings: one torch thread (bitwise results), tiny models made per test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True, scope="session")
def _pin_torch_threads():
    try:
        import torch
    except ImportError:  # policy-only environments
        yield
        return
    torch.set_num_threads(1)
    yield
