import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from poise.data.dataset import load_dataset
from poise.errors import DataError, PoiseError


def test_jsonl_rows_load(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "2+2", "answer": "4"}) + "\n\n"
                    + json.dumps({"prompt": "sort 3 1", "answer": "1 3", "reward": "items"}) + "\n")
    rows = load_dataset(path)
    assert [(r.prompt, r.answer, r.reward_name) for r in rows] == [("2+2", "4", "exact"), ("sort 3 1", "1 3", "items")]


def test_row_without_answer_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n" + json.dumps({"prompt": "c"}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: row has no 'answer'"):
        load_dataset(path)


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not valid JSON"),
    (json.dumps({"prompt": "a", "answer": "b", "reward": "bleu"}), "unknown reward 'bleu'"),
    (json.dumps({"prompt": "", "answer": "b"}), "'prompt' must be a non-empty string"),
    (json.dumps(["a", "b"]), "row is list"),
])
def test_malformed_rows(tmp_path, line, reason):
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DataError, match=reason):
        load_dataset(path)


def test_parquet_rows_and_bad_row(tmp_path):
    good = tmp_path / "g.parquet"
    pq.write_table(pa.table({"prompt": ["p1", "p2"], "answer": ["a1", "a2"]}), good)
    assert [r.answer for r in load_dataset(good)] == ["a1", "a2"]
    bad = tmp_path / "b.parquet"
    pq.write_table(pa.table({"prompt": ["p1", "p2"], "answer": ["a1", None]}), bad)
    with pytest.raises(DataError, match=r"b.parquet:row 1: 'answer' must be a non-empty string"):
        load_dataset(bad)


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(PoiseError, match="does not exist"):
        load_dataset(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("prompt,answer\n")
    with pytest.raises(PoiseError, match=".jsonl or .parquet"):
        load_dataset(tmp_path / "x.csv")
