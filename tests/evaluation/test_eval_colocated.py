"""Held-out evaluation (eval section, poise eval): the training of a run with evaluation is the
training of one without, bit for bit; its numbers reach metrics.jsonl, TensorBoard, W&B and
`poise report`; `poise eval` of the checkpoint gives the row's numbers again.

One colocated run without evaluation and one with it (eval.every=2 over 3 steps: after steps 1 and
2), both from the session's warm start, so rewards differ and the weights move."""

from __future__ import annotations

import json
import re

import pytest

from poise.config import load_train_config
from poise.training.colocated import train_colocated

STEPS = 3
JOB = [
    "pipeline.mode=colocated", "run.progress=false", "run.log_tokens=true", f"run.steps={STEPS}",
    "run.checkpoint_every=1", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
    "algorithm.micro_batch_size=3", "algorithm.sampling.max_new_tokens=12", "rollout.num_slots=8",
]
EVAL = ["eval.every=2", "eval.k=2", "eval.problems=6"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm_start, read_run):
    """(without evaluation, with evaluation + TensorBoard + W&B offline), as RunRecords."""
    root = tmp_path_factory.mktemp("eval-runs")
    train_colocated(load_train_config(None, [*JOB, *warm_start.overrides, f"run.dir={root / 'off'}"]))
    extra = ["run.tensorboard=true"]
    if _has("wandb"):
        extra += ["run.wandb.project=poise-test", "run.wandb.mode=offline"]
    train_colocated(load_train_config(None, [*JOB, *warm_start.overrides, *EVAL, *extra, f"run.dir={root / 'on'}"]))
    return read_run(root / "off"), read_run(root / "on")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _without_seconds(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != "seconds"}


def test_evaluation_changes_no_training_bit(runs, warm_start):
    off, on = runs
    on.assert_learned(warm_start)  # rewards differ, gradients are not zero, every checkpoint moved
    on.assert_bitwise_equal(off, "eval on vs off")  # every sample's tokens, logprobs, version; model + optimizer
    assert all(sid[0] >= 0 for sid in on.samples)  # no held-out sample among training's
    for a, b in zip(off.rows, on.rows):  # training's metrics are untouched, eval's are beside them
        for key in ("reward_mean", "grad_norm", "loss", "response_len_mean", "tokens"):
            assert a.get(key) == b.get(key), (key, a.get(key), b.get(key))
    assert [r["step"] for r in on.rows if "eval" in r] == [1, 2]  # every 2 steps and after the last
    assert not any("eval" in r for r in off.rows)


def test_eval_metrics(runs):
    _, on = runs
    e = on.rows[-1]["eval"]
    assert e["problems"] == 6 and e["version"] == STEPS  # the weights the last step made
    for mode in ("greedy", "sampled"):
        assert 0 <= e[mode]["reward_mean"] <= 1 and 0 <= e[mode]["pass_rate"] <= 1
        assert e[mode]["reward/task"] == pytest.approx(e[mode]["reward_mean"])  # one function, weight 1
    assert e["sampled"]["pass_rate"] <= e["pass@2"] <= 1
    # the held-out problems got some partial credit (the warm start sorts), so a change would show
    assert on.rows[1]["eval"]["greedy"]["reward_mean"] > 0


def test_poise_eval_gives_the_rows_numbers(runs, tmp_path, capsys):
    """`poise eval RUN_DIR --step 3` evaluates checkpoint step_000003 as the run did after its last step."""
    from poise.cli import main

    _, on = runs
    out = tmp_path / "eval.json"
    assert main(["eval", str(on.run_dir), "--step", str(STEPS), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert re.search(r"greedy/reward_mean\s+\d\.\d{4}", table) and "pass@2" in table
    got = json.loads(out.read_text())
    assert got["version"] == STEPS
    assert _without_seconds(got["eval"]) == _without_seconds(on.rows[-1]["eval"])


def test_report_draws_eval_next_to_the_training_reward(runs, tmp_path):
    from poise.report import draw_report

    _, on = runs
    paths = draw_report(on.run_dir, tmp_path / "report")
    assert paths["reward"].is_file()
    html = paths["html"].read_text()
    table = re.search(r"<table[^>]*id='eval'>(.*?)</table>", html).group(1)
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(<td>.*?)</tr>", table)]
    assert [int(c[0]) for c in cells] == [1, 2]
    for c, row in zip(cells, [r for r in on.rows if "eval" in r]):
        assert float(c[1]) == pytest.approx(row["eval"]["greedy"]["reward_mean"], abs=5e-3)


def test_tensorboard_holds_the_eval_scalars(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, on = runs
    acc = EventAccumulator(str(on.run_dir / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("eval/greedy/reward_mean")]
    want = [(r["step"], r["eval"]["greedy"]["reward_mean"]) for r in on.rows if "eval" in r]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want])
    assert "eval/pass@2" in acc.Tags()["scalars"]


@pytest.mark.skipif(not _has("wandb"), reason="needs the wandb package")
def test_wandb_offline_run_holds_the_eval_scalars(runs):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from test_wandb import wandb_records

    _, on = runs
    (run_file,) = (on.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    logged = {}
    for r in wandb_records(run_file):
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            if "eval/greedy/reward_mean" in items:
                logged[items["_step"]] = items["eval/greedy/reward_mean"]
    want = {r["step"]: r["eval"]["greedy"]["reward_mean"] for r in on.rows if "eval" in r}
    assert logged == pytest.approx(want)


def test_poise_eval_of_a_model_directory(warm_start, tmp_path):
    from poise.cli import main

    out = tmp_path / "eval.json"
    assert main(["eval", str(warm_start.path), *warm_start.overrides[1:], "eval.problems=4", "eval.k=1",
                 "algorithm.sampling.max_new_tokens=12", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["version"] == 0 and got["eval"]["problems"] == 4  # an HF directory: weights version 0
    assert {"greedy", "sampled", "pass@1"} <= got["eval"].keys()
