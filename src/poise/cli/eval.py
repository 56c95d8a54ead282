"""`poise eval RUN_DIR|MODEL_DIR [CONFIG] [key=value ...] [--data PATH] [--step N] [--out FILE]`.

Evaluates a checkpoint on the held-out problems of the config's `eval` section (eval.every is not
needed): a run directory's newest checkpoint (or `--step N`) with the run's config, or an HF model
directory with CONFIG (default: the built-in defaults). The numbers are those a run logs as
`eval/...` after the step that wrote the checkpoint (same ids, same engines). A dataset run is
evaluated on held-out rows of its own (eval.dataset, or `--data PATH`), never on the built-in
problems; without any it stops in one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from poise.errors import PoiseError


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.usage = "poise eval RUN_DIR|MODEL_DIR [CONFIG] [key=value ...] [--data PATH] [--step N] [--out FILE]"
    # one list, split below: argparse drops optional positionals given after an option (--out X a=b)
    parser.add_argument("args", nargs="+", metavar="RUN_DIR|MODEL_DIR [CONFIG] [key=value ...]",
                        help="a run directory of `poise train` or an HF model directory (config.json + safetensors); "
                             "a YAML config (default: the run's config.yaml, or the defaults); dotted overrides, "
                             "e.g. eval.problems=32 eval.k=4")
    parser.add_argument("--step", type=int, metavar="N", help="a run directory's checkpoint of this step (default: the newest)")
    parser.add_argument("--data", metavar="PATH", help="held-out rows to evaluate on (.jsonl, .parquet or a `datasets` "
                                                      "save_to_disk directory with data.prompt_key and answer_key "
                                                      "columns): eval.dataset=PATH")
    parser.add_argument("--out", metavar="FILE", help="also write the metrics as JSON to this file")


def _checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    from poise.training.checkpoint import checkpoint_dir, latest_checkpoint, verify_checkpoint

    if step is None:
        source = latest_checkpoint(run_dir)
        return source, int(source.name.rpartition("_")[2])
    source = checkpoint_dir(run_dir, step)
    if not source.is_dir():
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
        raise PoiseError(f"--step {step}: no checkpoint {source.name} in '{run_dir}' "
                         f"(it has {', '.join(have) or 'none'})")
    problem = verify_checkpoint(source, step)
    if problem is not None:
        raise PoiseError(f"checkpoint {source.name} is incomplete ({problem}); evaluate another --step")
    return source, step


def _rows(metrics: dict, prefix: str = "") -> list[tuple[str, float]]:
    out = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            out += _rows(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "seconds":
            out.append((f"{prefix}{key}", value))
    return out


def run(args: argparse.Namespace) -> int:
    from poise.cli.train import config_and_overrides
    from poise.config import load_train_config

    target, rest = Path(args.args[0]), args.args[1:]
    config, overrides = config_and_overrides(rest[0] if rest else None, rest[1:])
    is_run = (target / "config.yaml").is_file()
    if not is_run and not (target / "config.json").is_file():
        raise PoiseError(f"'{target}' is neither a run directory (config.yaml) nor an HF model directory "
                         "(config.json); point poise eval at one")
    if args.step is not None and not is_run:
        raise PoiseError(f"--step {args.step} needs a run directory; '{target}' is a model directory")
    if not is_run:  # the model (its context, and with data.tokenizer=model its tokenizer) is TARGET
        overrides = [*overrides, f"model.path={target}"]
    cfg = load_train_config(config or (target / "config.yaml" if is_run else None), overrides)
    if args.data is not None:  # as given: a path is never parsed as YAML (a file named 2024 stays a name)
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, dataset=args.data))
    weights, version = _checkpoint(target, args.step) if is_run else (target, 0)
    model_dir = weights

    from poise.evaluation.heldout import HeldOut, load_heldout

    problems = load_heldout(cfg.eval, cfg.data, cfg.run.seed)  # a bad eval section fails before the model loads
    import torch

    from poise.evaluation.engine import evaluate_model
    from poise.model.loading import load_model
    from poise.rewards.scorer import RewardScorer
    from poise.training.setup import compute_dtype, pin_threads, run_device

    pin_threads(cfg.cluster.threads_per_device, cfg.determinism == "bitwise")
    device = run_device(cfg.cluster.device)
    rewards = RewardScorer(cfg.reward)
    staging = None
    try:
        if is_run:  # a checkpoint holds optimizer.safetensors too: the model is config.json + model.safetensors
            import tempfile

            staging = tempfile.TemporaryDirectory(prefix="poise-eval-")
            for name in ("config.json", "model.safetensors"):
                Path(staging.name, name).symlink_to(Path(weights, name).resolve())
            model_dir = Path(staging.name)
        heldout = HeldOut(cfg.eval, cfg.data, cfg.model, cfg.run.seed, rewards, problems)
        dtype = compute_dtype(cfg.model.dtype, cfg.cluster.device)
        if is_run and cfg.model.lora is not None:  # the checkpoint holds the adapter: the run's base plus it
            from poise.training.checkpoint import load_weights
            from poise.training.setup import make_policy

            model = make_policy(cfg, heldout.steps.tokenizer, device, dtype, progress=False)
            load_weights(weights, model)
        else:
            model = load_model(model_dir, dtype, device)
        with torch.no_grad():
            metrics = evaluate_model(heldout, model, cfg.model, cfg.rollout, cfg.algorithm.sampling, cfg.run.seed,
                                     heldout.steps.tokenizer.eos_id, version)["eval"]
    finally:
        rewards.close()
        if staging is not None:
            staging.cleanup()
    rows = _rows(metrics)
    width = max(len(k) for k, _ in rows)
    print(f"{'metric':<{width}}  value\n{'-' * width}  -----")
    for key, value in rows:
        print(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if args.out:
        Path(args.out).write_text(json.dumps({"weights": str(weights), "version": version, "eval": metrics},
                                             indent=1) + "\n")
    print(f"poise: {len(problems)} held-out problems on {weights} in {metrics['seconds']:.1f} s", file=sys.stderr)
    return 0
