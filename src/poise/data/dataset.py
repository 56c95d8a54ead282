"""User datasets: JSONL or Parquet rows of {prompt, answer, reward}.

`reward` names a reward function of `poise.data.tasks.REWARDS` ("exact" or "items"). A
malformed row fails the whole load with `file:line: reason` (Parquet: `file:row N`), before
any training starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poise.data.tasks import REWARDS, Problem
from poise.errors import DataError, PoiseError

REQUIRED = ("prompt", "answer")


def _problem(row: Any, where: str, index: int) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: row is {type(row).__name__}, expected an object with prompt, answer, reward")
    for key in REQUIRED:
        if key not in row:
            raise DataError(f"{where}: row has no '{key}'; every row needs prompt, answer and optionally reward")
        if not isinstance(row[key], str) or (key == "prompt" and not row[key]):
            raise DataError(f"{where}: '{key}' must be a non-empty string, got {row[key]!r}")
    reward_name = row.get("reward", "exact")
    if reward_name not in REWARDS:
        raise DataError(f"{where}: unknown reward {reward_name!r}; choose one of {', '.join(REWARDS)}")
    return Problem(uid=str(row.get("id", f"row-{index}")), family="dataset", prompt=row["prompt"],
                   answer=row["answer"], reward_name=reward_name)


def load_jsonl(path: Path) -> list[Problem]:
    problems = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            problems.append(_problem(row, f"{path}:{lineno}", len(problems)))
    return problems


def load_parquet(path: Path) -> list[Problem]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: cannot read as Parquet ({str(e).splitlines()[0]})") from None
    return [_problem(row, f"{path}:row {i}", i) for i, row in enumerate(table.to_pylist())]


def load_dataset(path: str | Path) -> list[Problem]:
    path = Path(path)
    if not path.is_file():
        raise PoiseError(f"dataset file '{path}' does not exist; set data.dataset to a .jsonl or .parquet file")
    if path.suffix == ".jsonl" or path.suffix == ".json":
        problems = load_jsonl(path)
    elif path.suffix == ".parquet":
        problems = load_parquet(path)
    else:
        raise PoiseError(f"dataset file '{path}' must end in .jsonl or .parquet")
    if not problems:
        raise DataError(f"{path}: the dataset has no rows")
    return problems
