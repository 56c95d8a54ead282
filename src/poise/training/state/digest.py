"""The digest of a model's weights: equal digests, equal weights (the runtime's replica checks and
the tests' byte comparisons)."""

from __future__ import annotations

import hashlib

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every named parameter's name and bytes."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
