"""User datasets: JSONL, Parquet or a HF `datasets` save_to_disk directory, one problem per row.

A row needs a prompt and a reference answer (columns `data.prompt_key`, `data.answer_key`); an
optional `reward` names a reward function of `poise.data.tasks.REWARDS` ("exact" or "items").
Every other column stays with its row (`Problem.columns`) for the reward functions. A malformed
row fails the whole load with `file:line: reason` (Parquet and save_to_disk: `file:row N`),
before any training starts. JSONL and Parquet are read directly (line numbers, no cache
directory); `datasets` is imported only for a save_to_disk directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poise.data.tasks import REWARDS, Problem
from poise.errors import DataError, PoiseError



def _problem(row: Any, where: str, index: int, prompt_key: str = "prompt", answer_key: str = "answer") -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: row is {type(row).__name__}, expected an object with {prompt_key}, "
                        f"{answer_key} and optionally reward")
    for key in (prompt_key, answer_key):
        if key not in row:
            raise DataError(f"{where}: row has no '{key}' (it has {', '.join(map(str, row)) or 'no columns'}); "
                            f"set data.prompt_key and data.answer_key to the columns of prompt and answer")
    answer = row[answer_key]
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)  # a numeric answer column: its text is the reference
    for key, value in ((prompt_key, row[prompt_key]), (answer_key, answer)):
        if not isinstance(value, str) or (key == prompt_key and not value):
            raise DataError(f"{where}: '{key}' must be a non-empty string, got {value!r}")
    reward_name = row.get("reward", "exact")
    if reward_name not in REWARDS:
        raise DataError(f"{where}: unknown reward {reward_name!r}; choose one of {', '.join(REWARDS)}")
    columns = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    return Problem(uid=str(row.get("id", f"row-{index}")), family="dataset", prompt=row[prompt_key],
                   answer=answer, reward_name=reward_name, columns=columns, origin=where)


def load_jsonl(path: Path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Problem]:
    problems = []
    with open(path, "rb") as f:  # bytes, decoded line by line: a bad byte's error names its line
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                "save the dataset as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            except RecursionError:  # json's decoder recurses once per level of nesting
                raise DataError(f"{path}:{lineno}: JSON nested too deeply to read; a row is one flat object "
                                '{"prompt": ..., "answer": ...}') from None
            problems.append(_problem(row, f"{path}:{lineno}", len(problems), prompt_key, answer_key))
    return problems


def load_parquet(path: Path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Problem]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: cannot read as Parquet ({str(e).splitlines()[0]})") from None
    return [_problem(row, f"{path}:row {i}", i, prompt_key, answer_key) for i, row in enumerate(table.to_pylist())]


TRAIN_SPLITS = ("train",)
HELD_OUT_SPLITS = ("test", "validation")  # a DatasetDict's held-out rows, in this order of preference


def held_out_split(path: str | Path) -> str | None:
    """The held-out split of a `datasets` save_to_disk DatasetDict directory (its dataset_dict.json),
    or None: not such a directory, or none of its splits is one of HELD_OUT_SPLITS."""
    try:
        splits = json.loads(Path(path, "dataset_dict.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return next((s for s in HELD_OUT_SPLITS if s in splits), None)


def load_saved(path: Path, prompt_key: str = "prompt", answer_key: str = "answer",
               splits: tuple[str, ...] = TRAIN_SPLITS) -> list[Problem]:
    """A `datasets` save_to_disk directory: a Dataset, or a DatasetDict's split: the first of `splits`
    it holds, or its only one."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: a `datasets` save_to_disk directory needs the datasets package: "
                        "pip install 'poise[data]' (or datasets), or give a .jsonl or .parquet file") from None

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # FileNotFoundError for a plain directory, others for a damaged one
        raise DataError(f"{path}: cannot read as a `datasets` save_to_disk directory "
                        f"({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    where = str(path)
    if isinstance(ds, datasets.DatasetDict):
        held = list(ds)
        split = next((s for s in splits if s in ds), held[0] if len(held) == 1 else None)
        if split is None:
            wanted = " or ".join(repr(s) for s in splits)
            raise DataError(f"{path}: holds splits {', '.join(held)} and none is {wanted}; save the split to "
                            "use alone (dataset_dict[NAME].save_to_disk(DIR)) and point at that directory")
        ds, where = ds[split], f"{path}[{split}]"
    return [_problem(row, f"{where}:row {i}", i, prompt_key, answer_key) for i, row in enumerate(ds.to_list())]


def load_dataset(path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer",
                 splits: tuple[str, ...] = TRAIN_SPLITS) -> list[Problem]:
    """The rows of a file or save_to_disk directory (`splits`: which of a DatasetDict's splits, by preference)."""
    path = Path(path)
    if path.is_dir():
        problems = load_saved(path, prompt_key, answer_key, splits)
    elif not path.is_file():
        raise PoiseError(f"dataset '{path}' does not exist; set data.dataset to a .jsonl or .parquet file or a "
                         "`datasets` save_to_disk directory")
    elif path.suffix == ".jsonl" or path.suffix == ".json":
        problems = load_jsonl(path, prompt_key, answer_key)
    elif path.suffix == ".parquet":
        problems = load_parquet(path, prompt_key, answer_key)
    else:
        raise PoiseError(f"dataset file '{path}' must end in .jsonl or .parquet (or be a `datasets` "
                         "save_to_disk directory)")
    if not problems:
        raise DataError(f"{path}: the dataset has no rows")
    return problems
