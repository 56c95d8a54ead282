"""Tiny models whose tokens depend on what they attend to (the rollout tests' weights)."""

import torch


def sharpen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Re-draw the weights with std 0.2 (HF's default 0.02 leaves attention nearly uniform, so
    greedy tokens would barely depend on positions or keys and a broken rotary could pass)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model
