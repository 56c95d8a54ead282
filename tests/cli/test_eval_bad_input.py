"""Bad input to the `eval` section stops `poise train` with one line and exit 2 before any work
(no run directory, so before Ray starts); `poise config --section eval` shows every field's help."""

import json

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case", ["missing_column", "missing_path", "too_long", "dataset_without_heldout", "every",
                                  "k"])
def test_bad_eval_input_fails_up_front(tmp_path, case):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": "arith 1+2", "answer": "3"}])
    no_prompt = _jsonl(tmp_path / "held.jsonl", [{"question": "arith 2+2", "answer": "4"}])
    too_long = _jsonl(tmp_path / "long.jsonl", [{"prompt": "sort " + "1 " * 60, "answer": "1"}])
    args = {
        "missing_column": ([f"data.dataset={train}", "eval.every=5",
                            f"eval.dataset={no_prompt}"],
                           ["eval.dataset", "held.jsonl:1", "no 'prompt'", "data.prompt_key"]),
        "missing_path": (["eval.every=5", f"eval.dataset={tmp_path / 'nope.jsonl'}"],
                         ["eval.dataset", "nope.jsonl", "does not exist"]),
        "too_long": (["eval.every=5", "rollout.max_context=128",
                      f"eval.dataset={too_long}"],
                     ["eval.dataset", "long.jsonl:1", "exceeds the context of 128"]),
        "dataset_without_heldout": ([f"data.dataset={train}", "eval.every=5"], ["eval.dataset", "held-out file"]),
        "every": (["eval.every=-1"], ["eval.every", "-1", ">= 0"]),
        "k": (["eval.every=5", "eval.k=-2"], ["eval.k", "-2", ">= 0"]),
    }[case]
    result = poise("train", "pipeline.mode=sync", f"run.dir={tmp_path / 'run'}", "run.progress=false", *args[0])
    assert_one_line_error(result, *args[1])
    assert not (tmp_path / "run").exists()  # before the run directory, so before Ray


def test_config_shows_the_eval_section(capsys):
    from poise.cli import main

    assert main(["config", "--section", "eval"]) == 0
    out = capsys.readouterr().out
    for field in ("every: 0", "dataset: null", "problems: 64", "greedy: true", "k: 0", "pass_threshold: 1.0"):
        assert field in out, field
    assert "0 = off" in out and "pass@k" in out  # the help text beside each field


@pytest.mark.parametrize("key, hint", [("data.eval_dataset=x.jsonl", "eval.dataset"),
                                       ("run.eval_steps=10", "eval.every")])
def test_trl_eval_names_get_the_poise_name(key, hint):
    from poise.config import load_train_config
    from poise.errors import ConfigError

    with pytest.raises(ConfigError, match=hint):
        load_train_config(None, [key])


def test_poise_eval_of_neither_a_run_nor_a_model_fails_in_one_line(tmp_path):
    result = poise("eval", str(tmp_path / "nothing"), "--out", str(tmp_path / "eval.json"))
    assert_one_line_error(result, "nothing", "neither a run directory", "nor an HF model directory")
    assert not (tmp_path / "eval.json").exists()
