"""A live progress display (rich) for long work; quiet when disabled or not on a terminal."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StepProgress:
    """`with StepProgress("train", total) as bar: bar.advance(reward=0.4, tok_s=900)`."""

    def __init__(self, name: str, total: int, enabled: bool = True, completed: int = 0):
        self.name, self.total, self.enabled = name, total, enabled
        self.console = Console(stderr=True)
        self.tty = self.console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        self._completed = completed
        self._last_print = 0.0

    def __enter__(self) -> "StepProgress":
        if self.enabled and self.tty:
            self._progress = Progress(TextColumn(f"[bold]{self.name}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                      console=self.console)
            self._progress.start()
            self._task = self._progress.add_task(self.name, total=self.total, completed=self._completed, info="")
        return self

    def advance(self, **info: float) -> None:
        self._completed += 1
        text = "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items())
        if self._progress is not None:
            self._progress.update(self._task, advance=1, info=text)
        elif self.enabled:
            now = time.monotonic()
            # Not a terminal (CI, pipes): a plain line at most every 5 s, and the last one.
            if now - self._last_print >= 5.0 or self._completed == self.total:
                print(f"{self.name} {self._completed}/{self.total}  {text}", file=sys.stderr, flush=True)
                self._last_print = now

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
