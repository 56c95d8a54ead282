"""`poise train [CONFIG] [key=value ...] [--resume RUN_DIR]`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from poise import interrupt
from poise.errors import PoiseError


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Every config key, with its help and default: poise config [CONFIG] [key=value ...] "
                     "[--section algorithm] prints the resolved config as YAML.")
    parser.add_argument("config", nargs="?", help="YAML config (e.g. configs/demo.yaml); optional with --resume")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.lr=3e-4 run.steps=20 "
                                                     "(`poise config` lists every key)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")


def config_and_overrides(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """The config file and the overrides of `poise train|config [CONFIG] [key=value ...]`: a first
    argument that holds `=` and names no file is an override (`poise train key=value`)."""
    overrides = list(overrides)
    if config is not None and "=" in config and not Path(config).exists():
        return None, [config, *overrides]
    return config, overrides


def run(args: argparse.Namespace) -> int:
    from poise.api import check_before_work, run_training
    from poise.config import config_notes, load_train_config

    config_path, overrides = config_and_overrides(args.config, args.overrides)
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise PoiseError(f"--resume {args.resume}: no config.yaml there; point it at a run directory")
        if config_path is not None:
            raise PoiseError("--resume takes its config from the run directory; drop the CONFIG argument")
        config_path = saved
        overrides.append(f"run.dir={args.resume}")
    cfg = load_train_config(config_path, overrides)
    done = finished_line(Path(args.resume), cfg.run.steps) if args.resume else None
    if done:  # nothing to train: say so before the checks, the run directory's locks and Ray
        print(done, file=sys.stderr)
        return 0
    for note in config_notes(cfg):
        print(note, file=sys.stderr)
    check_before_work(cfg)  # optional packages, device, prompts, reward functions: before the run directory

    interrupt.install(Path(cfg.run.dir))  # Ctrl-C / SIGTERM: see poise.interrupt
    try:
        rows = run_training(cfg, resume=bool(args.resume))
    except interrupt.Stopped as e:
        print(f"poise: {signal.Signals(e.signum).name}: stopped after {e.steps_done} steps, checkpoint "
              f"{e.checkpoint.name} written; resume with: poise train --resume {cfg.run.dir}", file=sys.stderr)
        return 128 + e.signum
    if rows and args.resume:  # the whole run, not only this segment: metrics.jsonl holds every step once
        from poise.runlog import read_jsonl

        rows = sorted(read_jsonl(Path(cfg.run.dir) / "metrics.jsonl"), key=lambda r: r["step"])
    if rows:
        print(final_line(rows, cfg.run.dir), file=sys.stderr)
    return 0


def finished_line(run_dir: Path, steps: int) -> str | None:
    """What `--resume` of a run whose newest checkpoint already holds `steps` steps says; None
    while steps remain (or no checkpoint verifies: the resume itself says so)."""
    from poise.training.checkpoint import newest_intact_checkpoint

    checkpoint, _ = newest_intact_checkpoint(run_dir)
    done = int(checkpoint.name.removeprefix("step_")) if checkpoint is not None else 0
    if checkpoint is None or done < steps:
        return None
    return (f"poise: {run_dir} already finished: {done} of run.steps={steps} steps (checkpoint {checkpoint.name}); "
            f"to train further: poise train --resume {run_dir} run.steps={done + steps}")


def final_line(rows: list[dict], run_dir: str) -> str:
    """The run's last line: its reward at the start and the end, over 5 steps each where the run
    has 10 (fewer would make the two means share steps), else its first and last step."""
    n = len(rows)
    mean = lambda rs: sum(r["reward_mean"] for r in rs) / len(rs)  # noqa: E731
    head = f"poise: {n} step{'s' if n != 1 else ''} in {run_dir}; reward"
    if n == 1:
        return f"{head} {mean(rows):.3f}"
    if n < 10:
        return f"{head} {mean(rows[:1]):.3f} (first step) -> {mean(rows[-1:]):.3f} (last step)"
    return f"{head} {mean(rows[:5]):.3f} (first 5) -> {mean(rows[-5:]):.3f} (last 5)"
