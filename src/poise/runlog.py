"""The run directory's JSONL logs, shared by the runtime, the colocated loop and the simulator.

Layout (docs/events.md): RUN_DIR/config.yaml, RUN_DIR/metrics.jsonl (one line per step),
RUN_DIR/events.jsonl (one line per event, each with `t` and `kind`), RUN_DIR/completions.jsonl (a few
samples of each step as text: poise.completions).
Event kinds: interval, sample, step, decision, resize. `t` is seconds from run start: wall
clock for real runs, virtual for simulations. Pure Python (no torch) so the simulator uses it.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from pathlib import Path
from typing import Any, Iterator

from poise.errors import PoiseError

EVENT_KINDS = ("interval", "sample", "step", "decision", "resize", "sync",  # sync: run.verify_sync digests
               "reward_failure",  # a reward function failed on a sample: scored by reward.fallback
               "join",  # a reserve device joined as a rollout instance (scale:)
               "recovery")  # a worker died and the run survived it (runtime/faults.py)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def scalars(row: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every finite number of a metrics row, nested keys joined by '/' (phases/rollout_s,
    reward/math), except the step itself."""
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars(value, name + "/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step":
            if math.isfinite(value):
                yield name, float(value)


COMPLETION_COLUMNS = ("step", "id", "prompt", "completion", "reward", "rewards", "length", "finish_reason")


def _cell(value: Any) -> Any:
    return value if isinstance(value, (str, int, float)) or value is None else json.dumps(value)


def completions_markdown(rows: list[dict[str, Any]]) -> str:
    """A step's completions as Markdown: per sample a heading (id, reward, length, finish reason) and
    its prompt and completion as indented code blocks, which Markdown shows verbatim."""
    block = lambda text: "\n".join("    " + line for line in str(text).splitlines() or [""])  # noqa: E731
    parts = []
    for r in rows:
        functions = ", ".join(f"{k} {v:.3g}" for k, v in (r.get("rewards") or {}).items())
        parts.append(f"**sample {'/'.join(map(str, r['id']))}**: reward {r['reward']:.3g}"
                     f"{f' ({functions})' if functions else ''}, {r['length']} tokens, {r['finish_reason']}\n\n"
                     f"prompt:\n\n{block(r['prompt'])}\n\ncompletion:\n\n{block(r['completion'])}")
    return "\n\n".join(parts)


class TensorBoardSink:
    """Each metrics row as TensorBoard scalars at global_step = row["step"], in RUN_DIR/tensorboard/.

    torch.utils.tensorboard is imported here, on first use only: a run without run.tensorboard
    (and the torch-free driver of an emulated job) never loads torch for it.
    """

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise PoiseError(f"run.tensorboard needs torch and the tensorboard package ({e}); "
                             "pip install 'poise[tensorboard]' (or tensorboard), or set run.tensorboard=false") from None
        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for name, value in scalars(row):
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()  # a live TensorBoard sees each step as it ends

    def write_completions(self, rows: list[dict[str, Any]]) -> None:
        """A step's completions as one `completions` text (Markdown) at its step."""
        self._writer.add_text("completions", completions_markdown(rows), global_step=int(rows[0]["step"]))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Each metrics row as Weights & Biases scalars at step = row["step"]: the TensorBoard
    scalars, by the same names. The run's files go to RUN_DIR/wandb/. wandb is imported here, on
    first use only. `settings`: run.wandb (project, name, mode); `config`: the resolved config,
    recorded as the W&B run's config."""

    def __init__(self, run_dir: Path, settings: Any, config: dict[str, Any] | None = None):
        try:
            import wandb
        except ImportError as e:
            raise PoiseError(f"run.wandb needs the wandb package ({e}); pip install 'poise[wandb]', or drop "
                             "run.wandb") from None
        # console off: W&B would wrap stdout and stderr (the progress display writes there); no system
        # metrics sampler: a thread of polling on the devices' cores
        self._run = wandb.init(project=settings.project, name=settings.name or run_dir.name, mode=settings.mode,
                               dir=str(run_dir), config=config or {},
                               settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                                       save_code=False))

    def write(self, row: dict[str, Any]) -> None:
        self._run.log(dict(scalars(row)), step=int(row["step"]))

    def write_completions(self, rows: list[dict[str, Any]]) -> None:
        """A step's completions as a `completions` table at its step (before its metrics row)."""
        import wandb

        table = wandb.Table(columns=list(COMPLETION_COLUMNS),
                            data=[[_cell(r.get(c)) for c in COMPLETION_COLUMNS] for r in rows])
        self._run.log({"completions": table}, step=int(rows[0]["step"]), commit=False)

    def close(self) -> None:
        self._run.finish()


class RunLog:
    """Appends events and per-step metrics to a run directory as JSON lines.

    `background=True` (the Ray driver) formats and writes on a thread of its own, so a step's
    hundreds of sample events cost the step loop a queue put each, not a JSON encoding; `close`
    (or leaving the `with` block, also on an error) writes everything still queued.
    `tensorboard=True` also writes every metrics row as TensorBoard scalars (TensorBoardSink),
    `wandb` (run.wandb, with the resolved `config`) to Weights & Biases (WandbSink).
    """

    def __init__(self, run_dir: str | Path, append: bool = False, background: bool = False,
                 tensorboard: bool = False, wandb: Any = None, config: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._tensorboard = TensorBoardSink(self.run_dir) if tensorboard else None
        self._wandb = WandbSink(self.run_dir, wandb, config) if wandb is not None else None
        mode = "a" if append else "w"
        self._events = open(self.run_dir / "events.jsonl", mode)
        self._metrics = open(self.run_dir / "metrics.jsonl", mode)
        self._completions_mode = mode
        self._completions: Any = None  # RUN_DIR/completions.jsonl, opened by the first completions()
        self._queue: queue.SimpleQueue | None = None
        self._error: BaseException | None = None
        if background:
            self._queue = queue.SimpleQueue()
            self._writer = threading.Thread(target=self._drain, name="runlog", daemon=True)
            self._writer.start()

    def event(self, kind: str, t: float, **fields: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        line = {"t": round(t, 6), "kind": kind, **fields}
        if self._queue is not None:
            self._queue.put((self._events, line))
        else:
            self._events.write(json.dumps(_clean(line)) + "\n")

    def metrics(self, row: dict[str, Any]) -> None:
        if self._queue is not None:
            self._queue.put((self._metrics, row))
            return
        self._write_metrics(row)

    def completions(self, rows: list[dict[str, Any]]) -> None:
        """A step's completions (poise.completions rows): RUN_DIR/completions.jsonl, and TensorBoard
        text and a W&B table where those are on."""
        if self._queue is not None:
            self._queue.put(("completions", rows))
            return
        self._write_completions(rows)

    def _write_completions(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self._completions is None:
            self._completions = open(self.run_dir / "completions.jsonl", self._completions_mode)
        for row in rows:
            self._completions.write(json.dumps(_clean(row)) + "\n")
        self._completions.flush()
        if self._tensorboard is not None:
            self._tensorboard.write_completions(rows)
        if self._wandb is not None:
            self._wandb.write_completions(rows)

    def _write_metrics(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(_clean(row)) + "\n")
        self._metrics.flush()
        self._events.flush()
        if self._tensorboard is not None:
            self._tensorboard.write(row)
        if self._wandb is not None:
            self._wandb.write(row)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                target, line = item
                if target is None:  # flush(): everything queued before it is written
                    self._events.flush()
                    self._metrics.flush()
                    line.set()
                elif target is self._metrics:
                    self._write_metrics(line)
                elif target == "completions":
                    self._write_completions(line)
                else:
                    target.write(json.dumps(_clean(line)) + "\n")
            except BaseException as e:  # noqa: BLE001 - raised by close()
                self._error = self._error or e

    def flush(self) -> None:
        """Return once everything logged so far is in the files (before a checkpoint: a resume
        from it must find every event of the steps it covers)."""
        if self._queue is not None:
            written = threading.Event()
            self._queue.put((None, written))
            written.wait()
        else:
            self._events.flush()
            self._metrics.flush()

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._writer.join()
            self._queue = None
        self._events.close()
        self._metrics.close()
        if self._completions is not None:
            self._completions.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.close()
        if self._error is not None:
            raise self._error

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
