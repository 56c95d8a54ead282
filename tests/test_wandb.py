"""run.wandb: mode offline writes RUN_DIR/wandb/ with no network, and its history holds, step by
step, the very scalars TensorBoard gets (read back from the offline run's .wandb file)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from poise.runlog import scalars

from test_tensorboard import TINY

wandb = pytest.importorskip("wandb")


def wandb_records(path: Path):
    """The protobuf records of a W&B run file: a 7-byte header (':W&B', magic 0xBEE1, version),
    then LevelDB-log blocks of 32 KiB, each record in fragments (full / first / middle / last)
    behind a 7-byte header (crc32, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic)
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero fill to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def test_offline_run_holds_the_tensorboard_scalars(tmp_path, monkeypatch):
    from poise.config import load_train_config
    from poise.training.colocated import train_colocated

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing answers there: offline must not ask
    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*TINY, f"run.dir={run}", "run.wandb.project=poise-test",
                                             "run.wandb.mode=offline"]))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(run_file))
    (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (info.project, info.display_name) == ("poise-test", "run")  # name: the run directory's
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert config["algorithm"]["loss"] == "grpo"  # the resolved config
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            # the scalars; the completions table's keys (completions/...) are checked by the test below
            history[items.pop("_step")] = {k: v for k, v in items.items()
                                           if not k.startswith("_") and not k.startswith("completions/")}
    assert sorted(history) == [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        expected = dict(scalars(row))  # what TensorBoard gets (tests/test_tensorboard.py)
        assert {"reward_mean", "grad_norm", "loss", "phases/rollout_s"} <= expected.keys()
        assert history[row["step"]].keys() == expected.keys(), row["step"]
        for name, value in expected.items():
            assert history[row["step"]][name] == pytest.approx(value, rel=1e-6, abs=1e-6), name


def test_run_wandb_without_the_package_stops_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    from poise.api import check_before_work
    from poise.config import load_train_config
    from poise.errors import PoiseError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = load_train_config(None, [f"run.dir={tmp_path}/run", "run.wandb.mode=offline"])
    with pytest.raises(PoiseError, match="run.wandb needs the wandb package"):
        check_before_work(cfg)
    assert not (tmp_path / "run").exists()


def test_offline_run_holds_each_steps_completions_as_a_table(tmp_path, monkeypatch):
    """With run.wandb, each step's completions.jsonl rows are a `completions` wandb.Table at its step."""
    from poise.completions import read_completions
    from poise.config import load_train_config
    from poise.runlog import COMPLETION_COLUMNS
    from poise.training.colocated import train_colocated

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*TINY, f"run.dir={run}", "run.wandb.project=poise-test",
                                             "run.wandb.mode=offline"]))
    rows = read_completions(run)
    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    tables = {}
    for r in wandb_records(run_file):
        if r.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            if "completions/path" in items:
                assert items["completions/_type"] == "table-file"
                tables[items["_step"]] = json.loads((run_file.parent / "files" / items["completions/path"]).read_text())
    assert sorted(tables) == [0, 1, 2]
    for step, table in tables.items():
        assert table["columns"] == list(COMPLETION_COLUMNS)
        mine = [r for r in rows if r["step"] == step]
        assert [row[3] for row in table["data"]] == [r["completion"] for r in mine]
        assert [row[4] for row in table["data"]] == [r["reward"] for r in mine]
