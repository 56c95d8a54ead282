"""The run directory's JSONL logs, shared by the runtime, the colocated loop and the simulator.

Layout (DESIGN.md, "Run directory and event log"): RUN_DIR/config.yaml, RUN_DIR/metrics.jsonl
(one line per step), RUN_DIR/events.jsonl (one line per event, each with `t` and `kind`).
Event kinds: interval, sample, step, decision, resize. `t` is seconds from run start: wall
clock for real runs, virtual for simulations. Pure Python (no torch) so the simulator uses it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

EVENT_KINDS = ("interval", "sample", "step", "decision", "resize", "sync")  # sync: run.verify_sync digests


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class RunLog:
    """Appends events and per-step metrics to a run directory as JSON lines."""

    def __init__(self, run_dir: str | Path, append: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self._events = open(self.run_dir / "events.jsonl", mode)
        self._metrics = open(self.run_dir / "metrics.jsonl", mode)

    def event(self, kind: str, t: float, **fields: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        self._events.write(json.dumps(_clean({"t": round(t, 6), "kind": kind, **fields})) + "\n")

    def metrics(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(_clean(row)) + "\n")
        self._metrics.flush()
        self._events.flush()

    def close(self) -> None:
        self._events.close()
        self._metrics.close()

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)
