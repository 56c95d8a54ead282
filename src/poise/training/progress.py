"""A live progress display (rich) for long work; quiet when disabled, a line every 10 s when not
on a terminal."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LINE_EVERY_S = 10.0  # without a terminal (CI, pipes, log files): one line per this many seconds at most


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StepProgress:
    """`with StepProgress("train", total) as bar: bar.advance(reward=0.4, tok_s=900)`."""

    def __init__(self, name: str, total: int, enabled: bool = True, completed: int = 0,
                 every_s: float = LINE_EVERY_S):
        self.name, self.total, self.enabled, self.every_s = name, total, enabled, every_s
        self.console = Console(stderr=True)
        self.tty = self.console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        self._completed = completed
        self._first = completed  # a resumed run's rate counts the steps of this process only
        self._start = self._last_print = time.monotonic()

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
            if now - self._last_print >= self.every_s:
                print(self.line(now, text), file=sys.stderr, flush=True)
                self._last_print = now

    def line(self, now: float, text: str) -> str:
        """`train 40/200  reward 0.41 ...  0.83 steps/s  eta 3:13`: what a log file shows instead of the bar."""
        elapsed = now - self._start
        rate = (self._completed - self._first) / elapsed if elapsed > 0 else 0.0
        eta = _duration((self.total - self._completed) / rate) if rate > 0 else "?"
        return f"{self.name} {self._completed}/{self.total}  {text}  {rate:.3g} steps/s  eta {eta}".replace("    ", "  ")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
