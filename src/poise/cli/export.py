"""`poise export RUN_DIR [--step N] --out DIR`: a checkpoint as an HF model directory.

A LoRA run's checkpoint holds the adapter: the export merges it into the run's base weights
(train/lora.py `merged_state`: W0 + alpha / r * B @ A in float32, rounded once to the model's
dtype), so the directory is a plain model of the base's family.

The directory holds `config.json`, `model.safetensors`, the run's tokenizer (the built-in char
tokenizer as `tokenizer.json` with Poise's marker file, or an HF tokenizer's own files, unchanged) and a
model card (`README.md`) that states the prompt format, so `AutoTokenizer` and
`AutoModelForCausalLM.from_pretrained(DIR)` load it and `poise train model.path=DIR data.tokenizer=model`
continues from it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from poise.errors import PoiseError

WEIGHT_FILES = ("config.json", "model.safetensors")


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of `poise train`")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest complete one)")
    parser.add_argument("--out", required=True, help="a new (or empty) directory for the HF model")


def run(args: argparse.Namespace) -> int:
    from poise.config import load_train_config
    from poise.training.checkpoint import checkpoint_dir, latest_checkpoint, verify_checkpoint

    run_dir, out = Path(args.run_dir), Path(args.out)
    if not (run_dir / "config.yaml").is_file():
        raise PoiseError(f"'{run_dir}' holds no config.yaml; point poise export at a run directory of poise train")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PoiseError(f"--out '{out}' exists and is not an empty directory; choose a new directory")
    if args.step is None:
        source = latest_checkpoint(run_dir)
    else:
        source = checkpoint_dir(run_dir, args.step)
        if not source.is_dir():
            have = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
            raise PoiseError(f"--step {args.step}: no checkpoint {source.name} in '{run_dir}' "
                             f"(it has {', '.join(have) or 'none'})")
        problem = verify_checkpoint(source, args.step)
        if problem is not None:
            raise PoiseError(f"checkpoint {source.name} is incomplete ({problem}); export another --step")
    cfg = load_train_config(run_dir / "config.yaml")
    from poise.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.model.path)
    staging = out.parent / f".{out.name}.partial"  # a failed export leaves no half-written --out
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if cfg.model.lora is None:
        for name in WEIGHT_FILES:
            shutil.copyfile(source / name, staging / name)
    else:
        _write_merged(cfg, tokenizer, source, staging)
    tokenizer.save(staging)
    from poise.model.card import model_card

    card = model_card(cfg.model, cfg.data, cfg.algorithm.sampling, cfg.env, tokenizer,
                      f"checkpoint {source.name} of run `{run_dir.name}`")
    (staging / "README.md").write_text(card)
    if out.exists():
        out.rmdir()
    staging.rename(out)
    print(f"poise: {source.name} of {run_dir} exported to {out} (load it with "
          f"AutoModelForCausalLM.from_pretrained('{out}') and AutoTokenizer; {out / 'README.md'} gives the "
          "prompt format)", file=sys.stderr)
    return 0


def _write_merged(cfg, tokenizer, source: Path, out: Path) -> None:
    """The run's base model with checkpoint `source`'s adapter merged, as an HF directory."""
    import torch

    from poise.model.loading import save_hf_weights
    from poise.training.checkpoint import load_weights
    from poise.model.lora import merged_state
    from poise.training.setup import make_policy

    model = make_policy(cfg, tokenizer, "cpu", getattr(torch, cfg.model.dtype), progress=False)
    load_weights(source, model)
    save_hf_weights(model, out, merged_state(model))
