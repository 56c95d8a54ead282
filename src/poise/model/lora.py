"""LoRA (`model.lora`): low-rank adapters on the decoder layers' projections, made by peft.

Each adapted projection computes `W0 x + b + scaling * B (A x)` (Hu et al. 2021, eq. 3; scaling =
alpha / r): W0 and b stay frozen, A and B train. The trainer's model is the HF model with peft's
LoRA layers injected in place, so `requires_grad` marks the adapter alone: the trainer's
parameters, the optimizer's state, a live resize's optimizer transfer and the owners' runs of a
sharded optimizer all cover the adapter and nothing else.

The one canonical form, in every mode: the frozen base weights (every device builds the same
ones, from model.path or the seeded tiny model) and the adapter, applied unmerged. The engine
applies it with the same formula as peft's layer (rollout/runner.py `_linear`), so a weight sync
moves the adapter alone, by name (`trained_parameters`), and every device's engine computes with
the same bits. Checkpoints hold the adapter; `merged_state` (one fixed function, in float32)
makes the merged weights `poise export` writes.

The adapter's initial A (peft's Kaiming init; B starts at zero) is drawn from the run's seed on a
forked generator: a pure function of the seed that leaves the global generator as it was.
"""

from __future__ import annotations

import torch

from poise.config import LORA_PROJECTIONS, LoraConfig
from poise.errors import PoiseError

ADAPTER = "default"  # peft's adapter name: one adapter per model


def attach_adapter(model: torch.nn.Module, cfg: LoraConfig, seed: int) -> torch.nn.Module:
    """Inject LoRA layers into `model` in place (peft), freezing everything else; returns it."""
    try:
        import peft
    except ImportError as e:
        raise PoiseError(f"model.lora needs the peft package ({e}); pip install 'poise[lora]', or drop "
                         "model.lora") from None
    present = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and ".layers." in name})
    for target in cfg.target_modules:
        if target not in present:
            raise PoiseError(f"model.lora.target_modules: '{target}' is not a linear module of this "
                             f"{getattr(model.config, 'model_type', '')} model's decoder layers; choose from "
                             f"{', '.join(n for n in present if n in LORA_PROJECTIONS)}")
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=list(cfg.target_modules), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    return model


def has_adapter(model: torch.nn.Module) -> bool:
    return any(lora_parts(m) is not None for m in model.modules())


def lora_parts(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A [r, in], B [out, r], scaling) of a peft LoRA layer, else None."""
    lora_a = getattr(module, "lora_A", None)
    if not isinstance(lora_a, torch.nn.ModuleDict) or ADAPTER not in lora_a:
        return None
    return lora_a[ADAPTER].weight, module.lora_B[ADAPTER].weight, module.scaling[ADAPTER]


def trained_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """What training changes, by name: the adapter under LoRA, else every parameter. What a
    weight sync sends and a checkpoint's model.safetensors holds."""
    named = list(model.named_parameters())
    return [(n, p) for n, p in named if p.requires_grad] if has_adapter(model) else named


@torch.no_grad()
def merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """The merged weight W0 + scaling * (B @ A), computed in float32 and rounded once to W0's dtype."""
    return (base.float() + scaling * (b.float() @ a.float())).to(base.dtype)


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under their HF names with every adapter merged (`merge`), on the CPU:
    what transformers loads as a plain model."""
    modules = dict(model.named_modules())
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        if not owner:
            out[name] = p.detach().to("cpu").contiguous()
            continue
        parts = lora_parts(modules[owner])
        value = merge(p, *parts) if leaf == "weight" and parts is not None else p.detach()
        out[f"{owner}.{leaf}"] = value.to("cpu").contiguous()
    return out
