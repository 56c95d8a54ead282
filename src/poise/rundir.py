"""The run directory's lifecycle: claim it for a fresh run or a resume (layout: poise.runlog).

Shared by the colocated loop and the Ray driver; torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from poise.config import TrainConfig
from poise.errors import PoiseError


def prepare_run_dir(cfg: TrainConfig, resume: bool) -> Path:
    run_dir = Path(cfg.run.dir)
    has_run = (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()
    if has_run and not resume:
        if not cfg.run.overwrite:
            raise PoiseError(f"run directory '{run_dir}' already holds a run; resume it with --resume {run_dir}, "
                             "choose another run.dir, or set run.overwrite=true")
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with each relative file path made absolute, so RUN_DIR/config.yaml resumes from any
    directory. A dataset or tokenizer value that names no file here is a `datasets` name (or
    `char`/`model`) and stays; model.path always is a path (sft_if_missing may make it)."""
    def file(value: str | None) -> str | None:
        return str(Path(value).absolute()) if value and Path(value).exists() else value

    def code(spec: str) -> str:  # 'path/to/file.py:name'; 'module:name' and built-ins stay
        where, sep, name = spec.rpartition(":")
        return f"{file(where)}{sep}{name}" if where.endswith(".py") else spec

    model, data = cfg.model, cfg.data
    functions = tuple(code(f) if isinstance(f, str) else dataclasses.replace(f, fn=code(f.fn))
                      for f in cfg.reward.functions)
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(model, path=str(Path(model.path).absolute()) if model.path else None),
        data=dataclasses.replace(data, dataset=file(data.dataset), tokenizer=file(data.tokenizer)),
        eval=dataclasses.replace(cfg.eval, dataset=file(cfg.eval.dataset)),
        reward=dataclasses.replace(cfg.reward, functions=functions),
        env=dataclasses.replace(cfg.env, name=code(cfg.env.name) if cfg.env.name else None),
        cluster=dataclasses.replace(cfg.cluster, profile=file(cfg.cluster.profile)),
        emulation=dataclasses.replace(cfg.emulation, scenario=file(cfg.emulation.scenario)))


def truncate_logs(run_dir: Path, steps_done: int) -> None:
    """On resume: drop the metrics rows and the events of steps >= `steps_done` (they will be
    recomputed identically and logged again), so no step or sample is logged twice. Events without
    a `step` stay. A torn last line (a write cut short by a kill) is dropped; each file is rewritten
    to a temporary file and renamed over the old one, so a kill here loses nothing."""
    for name in ("metrics.jsonl", "events.jsonl", "completions.jsonl"):
        path = run_dir / name
        if path.exists():
            _keep_lines(path, lambda row: not (isinstance(row.get("step"), int) and row["step"] >= steps_done))


def run_clock(run_dir: Path) -> float:
    """Where a resumed run's clock starts: the latest time its kept events reach (call after
    truncate_logs). One clock across resumes: the first segment's events keep their times and
    the next segment's continue after them, so a report draws each step once, in order; the time
    between the segments (the run was not running) is left out."""
    path, latest = run_dir / "events.jsonl", 0.0
    if not path.is_file():
        return latest
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # truncate_logs dropped torn lines; nothing else is written yet
            if isinstance(event, dict):
                for key in ("t", "end", "finish"):
                    if isinstance(event.get(key), (int, float)):
                        latest = max(latest, float(event[key]))
    return latest


def resume_line(run_dir: Path, checkpoint: Path, step: int) -> str:
    """What `poise train --resume` says before its first step (steps count from 0 everywhere: the
    checkpoint after N steps is step_N, and the next step is step N)."""
    return f"poise: resuming {run_dir} from step {step} (checkpoint {checkpoint.name})"


def _keep_lines(path: Path, keep) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for number, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                if not line.endswith(b"\n"):
                    break  # the torn last line of a killed run
                tmp.unlink()
                raise PoiseError(f"{path}:{number} is not JSON; repair or delete that line, then resume again") \
                    from None
            if not isinstance(row, dict) or keep(row):
                dst.write(line if line.endswith(b"\n") else line + b"\n")
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
