"""Checkpoints: HF-format safetensors weights, optimizer state, RNG state and data cursor.

RUN_DIR/checkpoints/step_XXXXXX/ holds `config.json` + `model.safetensors` (loadable by
transformers), `optimizer.safetensors` (AdamW moments by parameter name) and `state.json`
(completed steps = data cursor, weights version, torch RNG). Nothing time- or path-dependent is
written, so two runs with the same seed write byte-identical checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from poise.errors import PoiseError


@dataclass(frozen=True)
class TrainState:
    step: int  # completed steps; prompts of step `step` come next
    weights_version: int


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: TrainState) -> Path:
    path = checkpoint_dir(run_dir, state.step)
    path.mkdir(parents=True, exist_ok=True)
    from poise.model.loading import save_hf_weights

    save_hf_weights(model, path)
    names = {p: n for n, p in model.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"{names[p]}::{key}"] = torch.as_tensor(value).detach().clone().contiguous()
    save_file(tensors, str(path / "optimizer.safetensors"), metadata={"format": "pt"})
    rng = torch.get_rng_state().tolist()
    (path / "state.json").write_text(json.dumps({"step": state.step, "weights_version": state.weights_version,
                                                 "torch_rng": rng}) + "\n")
    (Path(run_dir) / "checkpoints" / "latest").write_text(path.name + "\n")
    return path


def latest_checkpoint(run_dir: str | Path) -> Path:
    marker = Path(run_dir) / "checkpoints" / "latest"
    if not marker.is_file():
        raise PoiseError(f"no checkpoint in '{run_dir}' to resume from; "
                         "start a fresh run (drop --resume) or point --resume at a run directory")
    return Path(run_dir) / "checkpoints" / marker.read_text().strip()


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
    """Restore weights, optimizer moments and RNG in place; returns the saved TrainState."""
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {n for n in missing if n == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise PoiseError(f"checkpoint '{path}' does not match the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")
    saved = load_file(str(path / "optimizer.safetensors"))
    params = dict(model.named_parameters())
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in saved.items():
        name, field = key.split("::")
        by_param.setdefault(name, {})[field] = value
    for name, fields in by_param.items():
        optimizer.state[params[name]] = {k: v.clone() for k, v in fields.items()}
    meta = json.loads((path / "state.json").read_text())
    torch.set_rng_state(torch.tensor(meta["torch_rng"], dtype=torch.uint8))
    return TrainState(step=meta["step"], weights_version=meta["weights_version"])
