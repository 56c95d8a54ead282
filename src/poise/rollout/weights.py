"""Weights by name: a full weights update checked against an engine's model by name and shape
before anything is copied, then copied in place in bounded buckets. Shared by both rollout
engines (rollout/engine.py, rollout/vllm_engine.py); parameters keep their HF names, so weights
move by name (docs/design.md, "Rollout engine").
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from poise.errors import PoiseError


class WeightsError(PoiseError):
    """`load_weights` got a missing, unknown or mis-shaped tensor; names it. The old weights stay."""

    def __init__(self, name: str, problem: str):
        self.name = name
        super().__init__(f"weights tensor '{name}': {problem}")


def check_named_weights(model: torch.nn.Module,
                        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]):
    """Check a full weights update against `model` by name and shape, copying nothing: returns
    (items, parameters by name, tied aliases by name), or raises WeightsError naming the first bad
    tensor. Tied aliases (e.g. `lm_head.weight` tied to the embedding) may be sent or left out."""
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    params = dict(model.named_parameters())
    aliases = {name: tensor for name, tensor in model.state_dict(keep_vars=True).items()
               if name not in params and any(tensor is p for p in params.values())}
    seen: set[str] = set()
    for name, tensor in items:
        target = params.get(name, aliases.get(name))
        if target is None:
            close = sorted(params)[:3]
            raise WeightsError(name, f"is not a parameter of this {model.config.model_type} model "
                                     f"(its names look like {close}); send the trainer's named_parameters()")
        if not isinstance(tensor, torch.Tensor):
            raise WeightsError(name, f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tuple(tensor.shape) != tuple(target.shape):
            raise WeightsError(name, f"has shape {tuple(tensor.shape)} but the engine's model needs "
                                     f"{tuple(target.shape)}; the checkpoints' configs differ")
        if name in seen:
            raise WeightsError(name, "was sent twice")
        seen.add(name)
    missing = [name for name in params if name not in seen]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise WeightsError(missing[0], f"is missing from the update{more}; send every parameter "
                                       "(a partial update would mix two weights versions)")
    return items, params, aliases


@torch.no_grad()
def copy_named_weights(items: list[tuple[str, torch.Tensor]], params: dict[str, torch.Tensor],
                       aliases: dict[str, torch.Tensor], bucket_mb: float) -> None:
    """Copy checked `items` into `params` in buckets of at most `bucket_mb`: only one bucket is
    staged on the parameters' device (cast to their dtype) at a time."""
    limit = int(bucket_mb * 2**20)
    bucket: list[tuple[torch.Tensor, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        if name in aliases:
            continue  # the tied parameter itself is in the update
        target = params[name]
        bucket.append((target, tensor))
        size += target.numel() * target.element_size()
        if size >= limit:
            _copy_bucket(bucket)
            bucket, size = [], 0
    _copy_bucket(bucket)


def _copy_bucket(bucket: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    staged = [tensor.to(device=target.device, dtype=target.dtype) for target, tensor in bucket]
    for (target, _), tensor in zip(bucket, staged):
        target.copy_(tensor)
