"""`poise eval` of a run trained on a dataset evaluates on held-out rows of that dataset (the run's
eval.dataset, or --data PATH), and without any stops in one line: the built-in problems are another
task, which the user's reward functions were never written for."""

import json

import pytest

from poise.cli import main
from poise.config import DataConfig, EvalConfig, load_train_config
from poise.errors import PoiseError
from poise.evaluation.heldout import load_heldout
from poise.training.colocated import train_colocated

RUN = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.steps=1",
    "run.checkpoint_every=1",
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=2",
    "algorithm.sampling.max_new_tokens=6",
    "rollout.num_slots=4",
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-dataset")
    train = _jsonl(root / "train.jsonl", [{"prompt": f"arith {a}+{a}", "answer": str(2 * a)} for a in range(6)])
    held = _jsonl(root / "held.jsonl", [{"prompt": f"arith {a}+1", "answer": str(a + 1)} for a in range(3)])
    return root, train, held


@pytest.fixture(scope="module")
def dataset_run(data):
    root, train, _ = data
    path = root / "run"
    train_colocated(load_train_config(None, [*RUN, f"data.dataset={train}", f"run.dir={path}"]))
    return path


def test_a_dataset_run_without_held_out_rows_is_refused_in_one_line(dataset_run, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(dataset_run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("poise: error:") and "\n" not in err, err
    assert "train.jsonl" in err and "--data PATH" in err and "eval.dataset=PATH" in err, err
    assert not out.exists()  # nothing scored


def test_a_dataset_run_is_evaluated_on_the_rows_given_with_data(dataset_run, data, tmp_path):
    _, _, held = data
    out = tmp_path / "eval.json"
    assert main(["eval", str(dataset_run), "--data", str(held), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["eval"]["problems"] == 3 and got["version"] == 1  # held.jsonl's rows, not 64 built-in problems
    assert got["eval"]["greedy"]["response_len_mean"] > 0


def test_the_runs_own_eval_dataset_is_used(data, tmp_path):
    _, train, held = data
    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*RUN, f"data.dataset={train}", f"eval.dataset={held}",
                                             "eval.problems=2", f"run.dir={run}"]))
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["eval"]["problems"] == 2  # its first eval.problems rows


def test_load_heldout_never_gives_a_dataset_run_the_built_in_problems(data):
    _, train, held = data
    with pytest.raises(PoiseError, match="eval.dataset names no held-out rows"):
        load_heldout(EvalConfig(), DataConfig(dataset=str(train)), 0)
    assert [p.prompt for p in load_heldout(EvalConfig(dataset=str(held)), DataConfig(dataset=str(train)), 0)] == \
        ["arith 0+1", "arith 1+1", "arith 2+1"]
    assert len(load_heldout(EvalConfig(problems=5), DataConfig(), 0)) == 5  # a built-in run keeps its problems


def test_a_datasetdicts_test_split_is_the_held_out_rows(tmp_path):
    """A save_to_disk DatasetDict: training reads its train split; evaluation its test split (or
    validation), whether it is the run's data.dataset or named as eval.dataset, never its train rows."""
    import datasets

    from poise.data.dataset import load_dataset

    train = datasets.Dataset.from_list([{"prompt": f"arith {a}+{a}", "answer": str(2 * a)} for a in range(4)])
    test = datasets.Dataset.from_list([{"prompt": f"arith {a}+2", "answer": str(a + 2)} for a in range(3)])
    both = tmp_path / "both"
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(both)
    validation = tmp_path / "validation"
    datasets.DatasetDict({"train": train, "validation": test}).save_to_disk(validation)
    held = ["arith 0+2", "arith 1+2", "arith 2+2"]
    assert [p.prompt for p in load_dataset(both)] == [f"arith {a}+{a}" for a in range(4)]  # training's rows
    for path in (both, validation):
        assert [p.prompt for p in load_heldout(EvalConfig(), DataConfig(dataset=str(path)), 0)] == held
        assert [p.prompt for p in load_heldout(EvalConfig(dataset=str(path)), DataConfig(), 0)] == held
        assert [p.prompt for p in load_heldout(EvalConfig(problems=2), DataConfig(dataset=str(path)), 0)] == held[:2]
    only_train = tmp_path / "train-only"
    datasets.DatasetDict({"train": train}).save_to_disk(only_train)
    with pytest.raises(PoiseError, match="eval.dataset names no held-out rows"):
        load_heldout(EvalConfig(), DataConfig(dataset=str(only_train)), 0)
