"""`poise completions RUN_DIR [--step N] [--last K]`: what the model wrote, as a readable table.

Reads RUN_DIR/completions.jsonl (run.log_completions samples of each step, poise.completions):
per sample its id, reward (and each reward function's), length and finish reason, then its prompt
and completion, an episode's observations marked.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from poise.completions import FILE, read_completions
from poise.errors import PoiseError

WIDTH = 100


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory (`poise train` wrote completions.jsonl there)")
    parser.add_argument("--step", type=int, default=None, help="show this step's samples (steps count from 0)")
    parser.add_argument("--last", type=int, default=None,
                        help="show the samples of the last K steps (default: the last step; with --step: ignored)")


def run(args: argparse.Namespace) -> int:
    if args.last is not None and args.last < 1:
        raise PoiseError(f"--last {args.last}: must be >= 1 (the number of last steps to show)")
    rows = load(Path(args.run_dir))
    for step in chosen_steps(rows, args.step, args.last):
        print(f"== step {step} ==")
        for row in rows:
            if row["step"] == step:
                print(format_row(row))
    return 0


def load(run_dir: Path) -> list[dict]:
    if not run_dir.is_dir():
        raise PoiseError(f"'{run_dir}' is not a directory; pass the run directory that `poise train` wrote (run.dir)")
    try:
        rows = read_completions(run_dir)
    except json.JSONDecodeError as e:
        raise PoiseError(f"'{run_dir / FILE}' has a malformed line ({e}); was the run killed mid-write? remove the "
                         "last line and retry") from None
    if not rows:
        raise PoiseError(f"'{run_dir}' has no completions ({FILE} is missing or empty); a run writes them with "
                         "run.log_completions > 0 (the default, 4 a step) on real compute, from its first step on")
    return rows


def chosen_steps(rows: list[dict], step: int | None, last: int | None) -> list[int]:
    steps = sorted({r["step"] for r in rows})
    if step is not None:
        if step not in steps:
            raise PoiseError(f"--step {step}: the run logged completions for steps {_ranges(steps)}; pick one of them")
        return [step]
    return steps[-(last or 1):]


def format_row(row: dict) -> str:
    functions = ", ".join(f"{k} {_num(v)}" for k, v in (row.get("rewards") or {}).items())
    head = (f"-- sample {'/'.join(map(str, row['id']))} (prompt {row.get('prompt_id', '?')}): reward "
            f"{_num(row.get('reward'))}{f' ({functions})' if functions else ''}, {row.get('length')} tokens, "
            f"finished: {row.get('finish_reason')}{', text cut' if row.get('truncated') else ''}")
    return "\n".join([head, _block("prompt", row.get("prompt", "")), _block("completion", row.get("completion", ""))])


def _block(label: str, text: str) -> str:
    """`label:` then the text indented, long lines wrapped, blank lines kept, so a reader sees the layout."""
    lines = []
    for line in str(text).split("\n"):
        lines += textwrap.wrap(line, WIDTH - 4, replace_whitespace=False, drop_whitespace=False) or [""]
    return f"  {label}:\n" + "\n".join("    " + line for line in lines)


def _num(value) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ", ".join(map(str, steps))
