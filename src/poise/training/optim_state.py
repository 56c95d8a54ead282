"""Placing optimizer state that was not made beside its parameter (a checkpoint read on the CPU, a
transfer buffer): the policy of `torch.optim.Optimizer.load_state_dict`, which Poise bypasses
because it restores state by parameter name, not by the optimizer's own numbering.

Without it, AdamW moments read from a checkpoint stay on the CPU in the dtype they were saved in,
and the next `optimizer.step()` on a CUDA (or other-dtype) parameter fails with a device or dtype
mismatch: every `--resume`, hard resize and fault recovery.
"""

from __future__ import annotations

import torch


def place_state(optimizer: torch.optim.Optimizer, param: torch.Tensor,
                state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` of `param` as `optimizer.load_state_dict` would store it: floating-point entries on
    the parameter's device and in its dtype (float32 beside a bfloat16 or float16 parameter: mixed
    precision keeps fp32 moments and masters); `step` in float32, on the parameter's device only where
    the optimizer steps there (fused or capturable), else on the CPU as AdamW expects. Always a copy,
    so the caller's tensors (a checkpoint's, a buffer's) are never aliased by the optimizer."""
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])), {})
    on_device = bool(group.get("fused") or group.get("capturable"))
    out = {}
    for key, value in state.items():
        value = torch.as_tensor(value)
        if key == "step":
            out[key] = value.to(device=param.device if on_device else "cpu", dtype=torch.float32, copy=True)
        elif value.is_floating_point():  # mixed precision keeps fp32 state beside bf16/fp16 weights
            dtype = torch.float32 if param.dtype in (torch.bfloat16, torch.float16) else param.dtype
            out[key] = value.to(device=param.device, dtype=dtype, copy=True)
        else:
            out[key] = value.to(device=param.device, copy=True)
    return out
