"""The run directory's lifecycle: claim it for a fresh run or a resume (layout: poise.runlog).

Shared by the colocated loop and the Ray driver; torch-free.
"""

from __future__ import annotations

import json
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


def truncate_metrics(run_dir: Path, steps_done: int) -> None:
    """Drop metrics rows of steps after the checkpoint: they will be recomputed identically."""
    path = run_dir / "metrics.jsonl"
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [r for r in rows if json.loads(r)["step"] < steps_done]
        path.write_text("".join(r + "\n" for r in kept))
