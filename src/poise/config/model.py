"""The `model:` section: the policy model, the built-in tiny model, LoRA and the SFT warm start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from poise.schema import check, help_factory, help_field

# What a local model directory may hold. Weights load from safetensors only (`use_safetensors=True`
# in poise.model.loading): a pickle file (`pytorch_model.bin`, `*.pt`, ...) can run code when
# unpickled, so a directory holding one is refused outright, even beside a `*.safetensors` file
# that might be a decoy.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def model_dir_problem(path: str | Path) -> str | None:
    """None if `path` may be a model directory (it need not exist yet), else what it is and the fix."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return ("a file, not a directory: point it at a local HF checkpoint directory (config.json + "
                "*.safetensors), or at where model.sft_if_missing should write one")
    if path.is_dir():
        try:
            pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
        except OSError:
            return None  # unreadable: the loader says so when it gets there
        if pickles:
            shown = ", ".join(pickles[:3]) + (", ..." if len(pickles) > 3 else "")
            return (f"a directory holding pickle files ({shown}); Poise loads safetensors weights only: "
                    "convert them (save_pretrained(..., safe_serialization=True)) and remove the pickle files")
    return None


@dataclass(frozen=True)
class SFTConfig:
    steps: int = help_field(300, "optimizer steps of supervised warm start")
    batch_size: int = help_field(64, "reference answers per step")
    lr: float = help_field(3e-3, "AdamW learning rate")
    seed: int = help_field(1, "seed of the warm start (weights init and its own prompt stream)")
    threads: int = help_field(1, "torch threads of the warm start (one process; its bytes depend on the count)")

    def __post_init__(self) -> None:
        check(self.steps >= 0, "steps", self.steps, "must be >= 0")
        check(self.threads >= 1, "threads", self.threads, "must be >= 1")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "lr", self.lr, "must be > 0")


@dataclass(frozen=True)
class TinyModelConfig:
    """A small decoder that trains on a 2-core CPU in minutes."""

    arch: Literal["qwen2", "llama", "qwen3", "mistral"] = help_field(
        "qwen2", "transformers architecture of the tiny model")
    hidden_size: int = help_field(128, "model width")
    num_layers: int = help_field(2, "decoder layers")
    num_heads: int = help_field(4, "attention heads")
    num_kv_heads: int = help_field(2, "key/value heads (grouped-query attention)")
    intermediate_size: int = help_field(256, "MLP width")
    max_positions: int = help_field(256, "longest prompt + response the model supports")

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_positions"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(self.hidden_size % self.num_heads == 0, "hidden_size", self.hidden_size,
              f"must be a multiple of num_heads ({self.num_heads})")
        check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
              f"must divide num_heads ({self.num_heads})")


# The linear projections of a decoder layer of every family the engine runs (Llama, Qwen2, Qwen3,
# Mistral): the modules LoRA may adapt (the engine applies an adapter on these alone).
LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (via peft) on the decoder layers' projections: the base weights stay frozen,
    only the adapters train (their AdamW state is all the optimizer holds)."""

    r: int = help_field(8, "adapter rank")
    alpha: float = help_field(16.0, "scale numerator: an adapter adds alpha / r * B @ A to its projection")
    dropout: float = help_field(0.0, "dropout on the adapter's input while training; > 0 needs determinism: "
                                     "semantic (its randomness is not a function of the sample id)")
    target_modules: tuple[str, ...] = help_field(LORA_PROJECTIONS, "the projections to adapt, by name, in every "
                                                                   "decoder layer")

    def __post_init__(self) -> None:
        check(self.r >= 1, "r", self.r, "must be >= 1")
        check(self.alpha > 0, "alpha", self.alpha, "must be > 0 (the adapter's scale is alpha / r)")
        check(0 <= self.dropout < 1, "dropout", self.dropout, "must be in [0, 1)")
        check(len(self.target_modules) >= 1, "target_modules", list(self.target_modules),
              f"must name at least one of the model's projections: {', '.join(LORA_PROJECTIONS)}")
        for name in self.target_modules:
            check(name in LORA_PROJECTIONS, "target_modules", name,
                  f"is not a projection of the model's decoder layers; choose from {', '.join(LORA_PROJECTIONS)}")
        check(len(set(self.target_modules)) == len(self.target_modules), "target_modules",
              list(self.target_modules), "names a module twice")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = help_field(None, "local HF checkpoint directory (config.json + safetensors); "
                                        "null builds the tiny model from `tiny` with run.seed")
    tiny: TinyModelConfig = help_factory(TinyModelConfig, "shape of the built-in tiny model")
    sft_if_missing: bool = help_field(False, "if `path` does not exist, make it with `poise sft` first")
    dtype: Literal["float32", "bfloat16"] = help_field(
        "float32", "compute dtype of the trainer and the engine (weights, activations, KV cache, weight sync); "
                   "bfloat16 keeps fp32 master weights and AdamW state, starting from the weights rounded to "
                   "bfloat16; bitwise holds within one dtype")
    sft: SFTConfig = help_factory(SFTConfig, "the warm start used by sft_if_missing and `poise sft`")
    lora: LoraConfig | None = help_field(None, "train LoRA adapters instead of every weight: {r, alpha, dropout, "
                                               "target_modules}; null = full fine-tuning (needs the peft package: "
                                               "pip install 'poise[lora]')")

    def __post_init__(self) -> None:
        problem = None if self.path is None else model_dir_problem(self.path)
        check(problem is None, "path", self.path, problem or "")
