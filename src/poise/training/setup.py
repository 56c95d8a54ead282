"""What every torch training mode needs before its first step: pinned threads and the initial policy.

The tokenizer and the prompts come from poise.data.prompts (torch-free, shared with the Ray driver).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from poise.config import ClusterConfig, TrainConfig
from poise.data.tokenizer import Tokenizer
from poise.errors import PoiseError
from poise.model.loading import build_tiny, load_model
from poise.training.sft import run_sft


def pin_threads(threads: int, bitwise: bool) -> None:
    """Fixed torch threads per device: bitwise mode needs the same reduction order every run."""
    torch.set_num_threads(threads)
    if bitwise:
        _deterministic_algorithms()


def _deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True, warn_only=True)` without its import of
    torch._inductor (to set the compiler's flag too), which costs every device process ~2 s and
    ~70 MB; Poise compiles nothing, so the eager flag is the whole setting. The public call where
    this torch lacks the private one."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        setter(True, warn_only=True)
    # With deterministic algorithms on, torch fills every new tensor of some ops (index_select,
    # empty_like, ...) with NaN first, in case a kernel reads memory it never wrote. Poise reads
    # none (the bitwise tests compare bytes), and on the engine's decode path the fill cost as
    # much as the copy it preceded.
    fill = getattr(torch._C, "_set_deterministic_fill_uninitialized_memory", None)
    if fill is not None:
        fill(False)


def check_device(cluster: ClusterConfig, colocated: bool) -> None:
    """`cluster.device: cuda` on this machine, before Ray starts: a torch that can use a GPU, and,
    for a disaggregated job whose devices hold whole GPUs, NCCL (the train group's backend there:
    runtime.cluster.collective_backend). Otherwise every device actor fails minutes later with a
    Ray traceback. A joined cluster's GPUs are on its nodes, not necessarily here: left to the
    actors. The GPU count is checked when Ray starts (runtime.cluster.check_gpu_count)."""
    if cluster.device != "cuda" or (cluster.address and not colocated):
        return
    import torch.distributed as dist

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise PoiseError(f"cluster.device=cuda but no CUDA device is usable here ({build}); install a CUDA build "
                         "of torch on a machine with GPUs (docs/gpus.md), or set cluster.device=cpu")
    if not colocated and cluster.gpus_per_device >= 1 and not (dist.is_available() and dist.is_nccl_available()):
        raise PoiseError(f"cluster.device=cuda but torch {torch.__version__} has no NCCL built in (the train "
                         "group's backend between whole GPUs); install a CUDA build of torch with NCCL, or set "
                         "cluster.device=cpu")


def run_device(device: str) -> torch.device:
    """The torch device of a process of `cluster.device` (a Ray actor sees its own GPU as cuda:0),
    touched once so that a missing GPU or a CPU-only torch fails here, before any work."""
    target = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    try:
        torch.empty(0, device=target)
    except (AssertionError, RuntimeError) as e:  # a CPU-only build raises AssertionError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PoiseError(f"cluster.device={device}, but torch {torch.__version__} cannot use it here ({first}); "
                         "install a CUDA build of torch (docs/gpus.md) or set cluster.device=cpu") from None
    return target


def compute_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """`model.dtype` as a torch dtype; says, in one line, when a CPU device has no native bfloat16."""
    dtype = getattr(torch, name)
    if dtype == torch.bfloat16 and device == "cpu" and not _native_bf16():
        print("poise: warning: this CPU has no native bfloat16 (AVX512-BF16 or AMX): model.dtype=bfloat16 runs "
              "emulated, slower than float32", file=sys.stderr)
    return dtype


def _native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # not Linux: nothing to say
    return "avx512_bf16" in flags or "amx_bf16" in flags or "flags" not in flags


def make_model(cfg: TrainConfig, tokenizer: Tokenizer, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, progress: bool = True) -> torch.nn.Module:
    """The initial policy on `device` in `dtype`: a local checkpoint (made first by SFT if asked),
    loaded straight there with no float32 host copy, or the tiny model (made in float32 on the
    CPU, where the seed defines its weights, then cast)."""
    m = cfg.model
    if m.path is None:
        return build_tiny(m.tiny, tokenizer.vocab_size, cfg.run.seed, tokenizer.eos_id, tokenizer.pad_id,
                          tokenizer.bos_id).to(device, dtype)
    if m.sft_if_missing and not Path(m.path, "config.json").is_file():
        run_sft(m, cfg.data, Path(m.path), progress=progress)
    return load_model(m.path, dtype, device)


def make_policy(cfg: TrainConfig, tokenizer: Tokenizer, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, progress: bool = True) -> torch.nn.Module:
    """`make_model`, with the LoRA adapter of `model.lora` attached (train/lora.py)."""
    model = make_model(cfg, tokenizer, device, dtype, progress)
    if cfg.model.lora is not None:
        from poise.model.lora import attach_adapter

        attach_adapter(model, cfg.model.lora, cfg.run.seed)
    return model
