"""Build, load and save HF causal LMs. Nothing is ever downloaded: loads are local-only.

The built-in tiny models use the real transformers Qwen2/Llama/Qwen3/Mistral classes, so
parameter names match any checkpoint of the family and weights move between trainer and rollout
by name. A checkpoint of a type the rollout engine cannot run is refused before its weights load.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from poise.config import TinyModelConfig  # torch-free; stays importable from here
from poise.data.tokenizer import Tokenizer
from poise.errors import PoiseError
from poise.model.files import check_model_dir, check_model_type


def tiny_hf_config(cfg: TinyModelConfig, vocab_size: int, eos_id: int, pad_id: int, bos_id: int):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
    )
    head_dim = cfg.hidden_size // cfg.num_heads  # Qwen3's default is 128, Mistral's derives like this
    if cfg.arch == "qwen3":
        return Qwen3Config(head_dim=head_dim, **common)
    if cfg.arch == "mistral":
        return MistralConfig(head_dim=head_dim, sliding_window=None, **common)  # tiny contexts: no window
    return Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)


def build_tiny(cfg: TinyModelConfig, vocab_size: int, seed: int, eos_id: int = 2, pad_id: int = 0,
               bos_id: int = 1) -> torch.nn.Module:
    """A randomly initialised tiny model; the weights are a pure function of (cfg, seed)."""
    from transformers import AutoModelForCausalLM

    hf_cfg = tiny_hf_config(cfg, vocab_size, eos_id, pad_id, bos_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", keep: set[str] | None = None) -> torch.nn.Module:
    """Load a causal LM from a local directory holding config.json and safetensors weights,
    straight onto `device` in `dtype`.

    No full copy in another dtype or on another device exists at any time: the model is built
    without storage (meta), its parameters are allocated on `device` in `dtype`, and each
    checkpoint tensor is read alone (a plain read, not a memory map, whose pages would count in
    the process's resident memory for the whole file) and copied in, cast on the way. So N device
    processes on one node hold N models in the compute dtype on their devices, never N float32
    copies in host memory. The result has the bits of loading in float32 and then
    `.to(device, dtype)` (the same rounding, the RoPE buffers cast alike): a run in bfloat16
    starts from the float32 checkpoint's weights rounded once. `device="meta"` checks the
    directory, the config and every tensor's name and shape without reading any weights.
    `keep`: only these parameters are allocated and read; every other one keeps its shape with
    an empty storage (`cluster.shard: full`: a train device starts with its own run alone).
    """
    path = Path(path)
    check_model_dir(path)  # a directory, and no pickle weights beside the safetensors
    if not path.is_dir():
        raise PoiseError(f"model directory '{path}' does not exist; pass a local HF checkpoint "
                         "directory (config.json + *.safetensors) or run `poise sft` to make one")
    if not (path / "config.json").is_file():
        raise PoiseError(f"model directory '{path}' has no config.json; it must be a transformers checkpoint")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise PoiseError(f"model directory '{path}' has no *.safetensors weights; save with safe_serialization")
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError, RecursionError) as e:
        raise PoiseError(f"cannot read '{path / 'config.json'}': {_reason(e)}") from None
    check_model_type(model_type)
    device = torch.device(device)
    model = _meta_model(path, dtype)
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = _tied_aliases(model)
    headers = [(file, _safetensors_header(file)) for file in files]
    stored = {name for _, header in headers for name in header}
    adapter = next((name for name in sorted(stored) if ".lora_A." in name or ".lora_B." in name), None)
    if adapter is not None:  # a LoRA run's checkpoint (train/lora.py)
        raise PoiseError(f"'{path}' holds a LoRA adapter ('{adapter}'), not a whole model; `poise export RUN_DIR "
                         "--out DIR` merges a run's adapter into its base model")
    missing = sorted(set(params) - stored - tied)
    if missing:
        raise PoiseError(f"cannot load model from '{path}': its safetensors hold no '{missing[0]}'"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; the checkpoint and "
                         "its config.json disagree")
    for _, header in headers:
        for name, (file_dtype, shape, _, _) in header.items():
            if name not in params:
                if name.endswith("rotary_emb.inv_freq"):  # old checkpoints saved RoPE's buffer: recomputed
                    continue
                raise PoiseError(f"cannot load model from '{path}': tensor '{name}' is not a parameter of this "
                                 f"{model_type} model; the checkpoint and its config.json disagree")
            if tuple(shape) != tuple(params[name].shape):
                raise PoiseError(f"cannot load model from '{path}': tensor '{name}' has shape {tuple(shape)}, "
                                 f"the config makes {tuple(params[name].shape)}")
    if device.type == "meta":
        return model.eval()
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives each name its own storage: tied parameters share one again
    _rebuild_buffers(model, device, dtype)
    if keep is not None:  # to_empty's storage is untouched memory: freeing it costs nothing resident
        for name, p in model.named_parameters():
            if name not in keep:
                p.data.untyped_storage().resize_(0)
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for file, header in headers:
            with open(file, "rb", buffering=0) as f:
                for name, (file_dtype, shape, start, end) in sorted(header.items(), key=lambda kv: kv[1][2]):
                    if name in params and params[name].untyped_storage().nbytes():
                        _read_into(f, start, end, file_dtype, shape, params[name])
    return model.eval()


def _meta_model(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The model its config.json describes, built without storage (meta), or one line on why not."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    except Exception as e:  # transformers' validation raises its own types (e.g. a strict-dataclass error)
        raise PoiseError(f"cannot load model from '{path}': its config.json is refused ({_reason(e)}); "
                         "fix config.json or save the model again") from None


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Parameter names that share their tensor with an earlier name (a tied lm_head): a checkpoint
    may store such a tensor once."""
    seen: dict[int, str] = {}
    aliases = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        seen.setdefault(id(p), name)
    return aliases


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


SAFETENSORS_HEADER_LIMIT = 100_000_000  # the format's own bound on the JSON header (safetensors' spec)


def _reason(e: BaseException) -> str:
    """The first line of what went wrong, from the root cause: transformers wraps its validators'
    ValueError in an error whose own first line names only the validator."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _safetensors_header(file: Path) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """name -> (dtype, shape, first byte, end byte) of each tensor of a safetensors file: an
    8-byte little-endian header length, the JSON header, then the data (offsets count from it)."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            # the length is checked before the read: 2^62 would ask for one 4 EiB buffer (MemoryError)
            if size > min(os.fstat(f.fileno()).st_size - 8, SAFETENSORS_HEADER_LIMIT):
                raise ValueError(f"header length {size} exceeds the file's {os.fstat(f.fileno()).st_size} bytes "
                                 f"or the {SAFETENSORS_HEADER_LIMIT}-byte limit")
            header = json.loads(f.read(size))
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: a header nested thousands deep
        raise PoiseError(f"cannot load model from '{file.parent}': its safetensors file '{file.name}' has no "
                         f"readable header ({_reason(e)}); save the model again") from None
    out = {}
    for name, entry in (header.items() if isinstance(header, dict) else [("", header)]):
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype")) if isinstance(entry, dict) else None
        if isinstance(entry, dict) and dtype is None:
            raise PoiseError(f"cannot load model from '{file.parent}': tensor '{name}' of '{file.name}' has dtype "
                             f"{entry.get('dtype')!r}; save the model in one of {', '.join(_SAFETENSORS_DTYPES)}")
        try:
            start, end = entry["data_offsets"]
            shape = [int(n) for n in entry["shape"]]
            if end - start != math.prod(shape) * dtype.itemsize:
                raise ValueError("size")
        except (KeyError, TypeError, ValueError):
            raise PoiseError(f"cannot load model from '{file.parent}': the header of '{file.name}' describes tensor "
                             f"'{name}' as {entry!r}; save the model again") from None
        out[name] = (dtype, shape, 8 + size + start, 8 + size + end)
    return out


def _read_into(f, start: int, end: int, dtype: torch.dtype, shape: list[int], param: torch.Tensor) -> None:
    """Read one tensor's bytes and copy them into `param` (cast to its dtype, moved to its device).
    A float32 parameter on the CPU from a float32 file is read in place, with no buffer at all."""
    in_place = param.device.type == "cpu" and param.dtype == dtype and param.is_contiguous()
    buffer = param.data.view(-1).view(torch.uint8) if in_place else torch.empty(end - start, dtype=torch.uint8)
    view = memoryview(buffer.numpy()).cast("B")
    f.seek(start)
    done = 0
    while done < len(view):  # one read returns at most ~2 GB on Linux
        got = f.readinto(view[done:])
        if not got:
            raise PoiseError(f"cannot load model: safetensors file '{f.name}' ends inside a tensor (truncated); "
                             "save the model again")
        done += got
    if not in_place:
        param.copy_(buffer.view(dtype).view(shape))


def _rebuild_buffers(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """The non-persistent buffers (RoPE's inverse frequencies: in no checkpoint, and left
    uninitialised by to_empty) as the module's own constructor computes them, cast to `dtype` as
    `Module.to(dtype)` casts a float32 model's buffers."""
    for name, module in model.named_modules():
        if not module._non_persistent_buffers_set:
            continue
        if not hasattr(module, "config"):
            raise PoiseError(f"cannot rebuild the buffers {sorted(module._non_persistent_buffers_set)} of "
                             f"{type(module).__name__} '{name}' (it has no config); load this model family in "
                             "float32 on the CPU")
        fresh = type(module)(config=module.config)
        for key in module._non_persistent_buffers_set:
            value = fresh._buffers[key]
            module._buffers[key] = value.to(device, dtype if value.is_floating_point() else value.dtype)


def save_hf_weights(model: torch.nn.Module, path: str | Path, tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write `config.json` + `model.safetensors`, loadable by `from_pretrained`.

    Not `save_pretrained`: inside an initialised torch.distributed world, transformers 5 writes
    only on rank 0 (`should_save_on_this_rank`), and a train leader is rarely rank 0. Tied weights
    are written once (named_parameters yields a tied tensor under its first name), as HF does.
    `tensors`: the weights to write, by name (default: every named parameter).
    """
    from safetensors.torch import save_file

    path = save_hf_config(model, path)
    tensors = model.named_parameters() if tensors is None else tensors.items()
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in tensors}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def save_hf_config(model: torch.nn.Module, path: str | Path) -> Path:
    """Write the model's `config.json` into directory `path` (made if missing), with no
    run-specific path in its bytes; returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.name_or_path = ""
    model.config.to_json_file(str(path / "config.json"), use_diff=True)
    return path


def save_model(model: torch.nn.Module, path: str | Path, tokenizer: Tokenizer | None = None) -> None:
    """Save in HF format with safetensors weights, and the tokenizer's files (data/tokenizer.py `save`)."""
    path = Path(path)
    save_hf_weights(model, path)
    if tokenizer is not None:
        tokenizer.save(path)
