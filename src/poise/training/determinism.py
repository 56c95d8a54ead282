"""What `determinism: bitwise` needs of a CUDA device, set before its first kernel, and the check
that refuses it in one line where a kernel the training step needs has no deterministic form.

On CPU Poise's bitwise promise rests on pinned threads and fixed reduction orders (setup.py
`pin_threads`); on CUDA three more things decide the bits:
- cuBLAS picks a workspace per stream and may split reductions differently run to run unless
  `CUBLAS_WORKSPACE_CONFIG` fixes it (read when the first cuBLAS handle is made: set it first);
- the flash and memory-efficient attention backwards accumulate with atomics: training attention
  runs on the math SDPA backend instead (the engine's decode attention is forward-only);
- `torch.use_deterministic_algorithms(..., warn_only=True)` (what pin_threads sets, for the CPU
  ops without a deterministic form that Poise never meets) only warns where CUDA would silently
  differ, on every call: the probe runs the training step's kernels once with the strict setting.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from poise.errors import PoiseError

CUBLAS_WORKSPACE = ":4096:8"  # the documented deterministic setting (8 buffers of 4 MiB per stream)


def bitwise_cuda(device: torch.device, model_type: str = "qwen2", probe=None) -> None:
    """Make `device` deterministic for training, or raise one line saying why it cannot be.
    A no-op on CPU. `probe(device, model_type)` runs the step's kernels strictly (default
    `probe_training_kernels`; tests pass one that fails)."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    try:
        (probe or probe_training_kernels)(device, model_type)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else str(device)
        raise PoiseError(f"determinism: bitwise needs deterministic kernels, but on {name} (torch "
                         f"{torch.__version__}) {first}; set determinism: semantic, or use a torch build "
                         "that has this kernel's deterministic form") from None


def probe_training_kernels(device: torch.device, model_type: str = "qwen2") -> None:
    """One forward/backward of the trainer's packed log-prob path (train/trainer.py) on a tiny model
    of `model_type`, with deterministic algorithms strict: raises RuntimeError naming the first
    kernel that has no deterministic form on `device`. Restores the caller's setting."""
    from poise.config import TinyModelConfig
    from poise.model.loading import build_tiny
    from poise.training.trainer import pack_batch, packed_logprobs

    was_on, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    shape = TinyModelConfig(arch=model_type if model_type in ("qwen2", "llama", "qwen3", "mistral") else "qwen2",
                            hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            max_positions=64)
    model = build_tiny(shape, 64, seed=0).to(device)
    samples = [SimpleNamespace(prompt_ids=[1, 5, 7], token_ids=[9, 11, 2], logprobs=[-1.0, -1.0, -1.0]),
               SimpleNamespace(prompt_ids=[1, 4], token_ids=[3, 2], logprobs=[-1.0, -1.0])]
    _set_deterministic(True, warn_only=False)
    try:
        logp = packed_logprobs(model, pack_batch(samples, 0), 1.0)
        logp.sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        _set_deterministic(was_on, warn_only=was_warn)


def _set_deterministic(on: bool, warn_only: bool) -> None:
    """`torch.use_deterministic_algorithms` without its import of torch._inductor (setup.py
    `_deterministic_algorithms` says why)."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
    else:
        setter(on, warn_only=warn_only)
