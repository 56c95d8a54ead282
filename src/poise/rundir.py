"""The run directory's lifecycle: claim it for a fresh run or a resume (layout: poise.runlog).

Shared by the colocated loop and the Ray driver; torch-free.
"""

from __future__ import annotations

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


def truncate_logs(run_dir: Path, steps_done: int) -> None:
    """On resume: drop the metrics rows and the events of steps >= `steps_done` (they will be
    recomputed identically and logged again), so no step or sample is logged twice. Events without
    a `step` stay. A torn last line (a write cut short by a kill) is dropped; each file is rewritten
    to a temporary file and renamed over the old one, so a kill here loses nothing."""
    for name in ("metrics.jsonl", "events.jsonl"):
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
