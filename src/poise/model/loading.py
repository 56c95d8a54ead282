"""Build, load and save HF causal LMs. Nothing is ever downloaded: loads are local-only.

The built-in tiny models use the real transformers Qwen2/Llama/Qwen3/Mistral classes, so
parameter names match any checkpoint of the family and weights move between trainer and rollout
by name. A checkpoint of a type the rollout engine cannot run is refused before its weights load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from poise.config import TinyModelConfig  # torch-free; stays importable from here
from poise.errors import PoiseError
from poise.model.files import check_model_dir
from poise.rollout.runner import check_model_type


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


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Load a causal LM from a local directory holding config.json and safetensors weights."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    check_model_dir(path)  # a directory, and no pickle weights beside the safetensors (issue 11)
    if not path.is_dir():
        raise PoiseError(f"model directory '{path}' does not exist; pass a local HF checkpoint "
                         "directory (config.json + *.safetensors) or run `poise sft` to make one")
    if not (path / "config.json").is_file():
        raise PoiseError(f"model directory '{path}' has no config.json; it must be a transformers checkpoint")
    if not any(path.glob("*.safetensors")):
        raise PoiseError(f"model directory '{path}' has no *.safetensors weights; save with safe_serialization")
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise PoiseError(f"cannot read '{path / 'config.json'}': {str(e).splitlines()[0]}") from None
    check_model_type(model_type)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                    attn_implementation="sdpa", use_safetensors=True)
    except (OSError, ValueError) as e:
        raise PoiseError(f"cannot load model from '{path}': {str(e).splitlines()[0]}") from None


def save_hf_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Write `config.json` + `model.safetensors`, loadable by `from_pretrained`.

    Not `save_pretrained`: inside an initialised torch.distributed world, transformers 5 writes
    only on rank 0 (`should_save_on_this_rank`), and a train leader is rarely rank 0. Tied weights
    are written once (named_parameters yields a tied tensor under its first name), as HF does.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.name_or_path = ""  # keep run-specific paths out of the bytes
    model.config.to_json_file(str(path / "config.json"), use_diff=True)
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def save_model(model: torch.nn.Module, path: str | Path, tokenizer: object | None = None) -> None:
    """Save in HF format with safetensors weights (and the char tokenizer's marker file)."""
    path = Path(path)
    save_hf_weights(model, path)
    save = getattr(tokenizer, "save", None)
    if save is not None:
        save(path)
    elif tokenizer is not None and hasattr(tokenizer, "_tok"):
        tokenizer._tok.save_pretrained(str(path))
