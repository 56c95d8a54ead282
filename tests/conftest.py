"""Session-wide test settings: one torch thread (bitwise results), tiny models made per test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray in loopback-only mode (see poise/runtime/__init__.py), whichever test imports ray first
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(autouse=True, scope="session")
def _pin_torch_threads():
    try:
        import torch
    except ImportError:  # policy-only environments
        yield
        return
    torch.set_num_threads(1)
    yield
