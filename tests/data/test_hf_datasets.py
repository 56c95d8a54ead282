"""User datasets through every format (`datasets` save_to_disk, Parquet, JSONL) with column
mapping; the other columns stay with their row; a prompt too long for the context stops the CLI
with one line naming its row, before the run directory exists."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import poise.data
from poise.config import load_train_config
from poise.data.dataset import load_dataset
from poise.data.prompts import TaskSteps, check_prompts
from poise.errors import DataError
from poise.schema import read_yaml

ROWS = [
    {"question": "2+2", "solution": "4", "level": 1, "source": "a"},
    {"question": "sort 3 1", "solution": "1 3", "level": 2, "source": "b"},
    {"question": "7+5", "solution": "12", "level": 3, "source": "c"},
]
KEYS = ["data.prompt_key=question", "data.answer_key=solution"]


def _write(fmt, tmp_path, rows=ROWS):
    if fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        import datasets

        path = tmp_path / "saved"
        ds = datasets.Dataset.from_list(rows)
        (datasets.DatasetDict({"train": ds, "test": ds.select([0])}) if fmt == "dict" else ds).save_to_disk(path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved", "dict"])
def test_formats_with_column_mapping_keep_the_other_columns(tmp_path, fmt):
    path = _write(fmt, tmp_path)
    problems = load_dataset(path, prompt_key="question", answer_key="solution")
    assert [(p.prompt, p.answer) for p in problems] == [(r["question"], r["solution"]) for r in ROWS]
    assert [p.columns for p in problems] == [{"level": r["level"], "source": r["source"]} for r in ROWS]
    where = {"jsonl": f"{path}:3", "parquet": f"{path}:row 2", "saved": f"{path}:row 2",
             "dict": f"{path}[train]:row 2"}[fmt]
    assert problems[2].origin == where
    # and through the config, as a run's prompt source sees them
    cfg = load_train_config(None, [f"data.dataset={path}", *KEYS])
    steps = TaskSteps(cfg.data, cfg.model, seed=0, prompts_per_step=3)
    assert sorted(p.prompt for p in steps.problems(0)) == sorted(r["question"] for r in ROWS)


def test_default_keys_and_a_missing_column_name_the_fix(tmp_path):
    path = _write("parquet", tmp_path)
    with pytest.raises(DataError, match=r"d.parquet:row 0: row has no 'prompt' \(it has question, solution, "
                                        r"level, source\); set data.prompt_key"):
        load_dataset(path)
    with pytest.raises(DataError, match=r"row has no 'answer'"):
        load_dataset(path, prompt_key="question")


def test_numeric_answer_column_becomes_text(tmp_path):
    path = _write("jsonl", tmp_path, [{"prompt": "6*7", "answer": 42}])
    assert load_dataset(path)[0].answer == "42"


def test_dataset_dict_without_a_train_split(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"validation": ds, "test": ds}).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match="splits validation, test and none is 'train'"):
        load_dataset(tmp_path / "saved")


def test_directory_that_is_not_a_saved_dataset(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="cannot read as a `datasets` save_to_disk directory"):
        load_dataset(tmp_path / "plain")


@pytest.mark.parametrize("fmt", ["parquet", "saved"])
def test_too_long_prompt_names_its_row(tmp_path, fmt):
    rows = [dict(ROWS[0]), dict(ROWS[1], question="x" * 40)]
    path = _write(fmt, tmp_path, rows)
    cfg = load_train_config(None, [f"data.dataset={path}", *KEYS, "model.tiny.max_positions=48",
                                   "algorithm.sampling.max_new_tokens=8"])
    # 40 chars + BOS + separator = 42 prompt tokens, + 8 > 48
    with pytest.raises(DataError, match=rf"{path}:row 1: prompt of 42 tokens \+ algorithm.sampling.max_new_tokens "
                                        r"\(8\) exceeds the context of 48 tokens"):
        check_prompts(cfg.data, cfg.model, 0, cfg.rollout.max_context, cfg.algorithm.sampling.max_new_tokens)
    # one token shorter fits: the check is exact, not a rough bound
    rows[1]["question"] = "x" * 38
    (tmp_path / "fits").mkdir()
    path = _write(fmt, tmp_path / "fits", rows)
    cfg = load_train_config(None, [f"data.dataset={path}", *KEYS, "model.tiny.max_positions=48",
                                   "algorithm.sampling.max_new_tokens=8"])
    check_prompts(cfg.data, cfg.model, 0, cfg.rollout.max_context, cfg.algorithm.sampling.max_new_tokens)


def test_cli_stops_on_a_too_long_prompt_before_any_work(tmp_path):
    data = tmp_path / "d.jsonl"
    lines = [{"question": "2+2", "solution": "4"}, {"question": "3+3", "solution": "6"},
             {"question": "count " + "1 " * 40, "solution": "40"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "poise", "train", f"data.dataset={data}", *KEYS,
                             "model.tiny.max_positions=64", "rollout.max_context=48",
                             "algorithm.sampling.max_new_tokens=16", f"run.dir={run}", "run.progress=false"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"poise: error: {data}:3: prompt of 88 tokens"), lines[0]
    assert "context of 48 tokens" in lines[0] and "rollout.max_context" in lines[0]
    assert not run.exists()  # nothing written


def test_gsm8k_sample_and_its_config():
    sample = Path(poise.data.__file__).parent / "samples" / "gsm8k_sample.jsonl"
    problems = load_dataset(sample, prompt_key="question")
    assert len(problems) >= 20
    assert all(re.search(r"\n#### \d+$", p.answer) for p in problems)
    root = Path(__file__).resolve().parents[2]
    raw = read_yaml(root / "configs" / "gsm8k.yaml")
    assert Path(root, raw["data"]["dataset"]).resolve() == sample.resolve()
    assert raw["reward"] == {"functions": [{"fn": "math", "weight": 1.0}]}
    cfg = load_train_config(root / "configs" / "gsm8k.yaml", [f"data.dataset={sample}"])
    # what the loader made of the file: the run scores with math alone, on the sample's questions
    assert [(f.fn, f.weight, f.label) for f in cfg.reward.functions] == [("math", 1.0, "math")]
    assert cfg.data.prompt_key == raw["data"]["prompt_key"] == "question"
    check_prompts(cfg.data, cfg.model, 0, cfg.rollout.max_context, cfg.algorithm.sampling.max_new_tokens)


def test_a_saved_dataset_without_the_datasets_package_names_the_extra(tmp_path, monkeypatch):
    path = _write("saved", tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # what a core install (no [data] extra) has
    with pytest.raises(DataError, match=r"needs the datasets package: pip install 'poise\[data\]'"):
        load_dataset(str(path))
