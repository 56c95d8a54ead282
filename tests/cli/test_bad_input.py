"""Bad input gets one clear line and a non-zero exit, never a traceback (issue: foundation)."""

import json

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm:\n  learning_rate: 0.1\n")
    assert_one_line_error(poise("train", str(cfg), f"run.dir={tmp_path}/run"), "algorithm.learning_rate",
                          "unknown key")
    assert not (tmp_path / "run").exists()  # failed before any work


def test_unknown_override_key(tmp_path):
    assert_one_line_error(poise("train", "algorithm.group_sise=4", f"run.dir={tmp_path}/run"),
                          "algorithm.group_sise", "did you mean 'group_size'")


def test_group_size_one_with_grpo(tmp_path):
    assert_one_line_error(poise("train", "algorithm.group_size=1", f"run.dir={tmp_path}/run"),
                          "algorithm.group_size", "got 1", "group_size >= 2")


def test_yaml_syntax_error(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("run:\n  steps: [1, 2\n  seed: 0\n")
    assert_one_line_error(poise("train", str(cfg)), "YAML syntax error", str(cfg))


def test_model_directory_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-model"
    assert_one_line_error(poise("train", f"model.path={missing}", f"run.dir={tmp_path}/run", "run.progress=false"),
                          str(missing), "does not exist")


def test_dataset_row_without_answer(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2"}) + "\n")
    assert_one_line_error(poise("train", f"data.dataset={data}", f"run.dir={tmp_path}/run", "run.progress=false"),
                          f"{data}:2", "no 'answer'")


def test_wrong_type_and_range(tmp_path):
    assert_one_line_error(poise("train", "algorithm.lr=fast", f"run.dir={tmp_path}/run"), "algorithm.lr", "number")
    assert_one_line_error(poise("train", "algorithm.sampling.top_p=1.5", f"run.dir={tmp_path}/run"),
                          "algorithm.sampling.top_p", "(0, 1]")


def test_resume_without_a_run(tmp_path):
    assert_one_line_error(poise("train", "--resume", str(tmp_path / "nothing")), "--resume", "config.yaml")


def test_existing_run_is_not_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    assert_one_line_error(poise("train", f"run.dir={run}"), "already holds a run", "--resume")
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'  # nothing lost


@pytest.mark.parametrize("override,fragments", [
    ("cluster.shard=zero3", ["cluster.shard", "zero3", "none", "optimizer", "full"]),
    ("model.dtype=float16", ["model.dtype", "float16", "bfloat16"]),
    ("model.dtype=bf16", ["model.dtype", "bf16", "bfloat16"]),
])
def test_unknown_shard_mode_or_dtype(tmp_path, override, fragments):
    assert_one_line_error(poise("train", override, f"run.dir={tmp_path}/run"), *fragments)


@pytest.mark.parametrize("overrides,fragments", [
    (["algorithm.kl_coef=0.05"], ["cluster.shard", "full", "kl_coef", "cluster.shard=optimizer"]),
    (["algorithm.old_logprobs=recompute", "algorithm.updates_per_step=2"], ["cluster.shard", "full", "recompute"]),
    (["model.lora.r=4"], ["cluster.shard", "full", "model.lora"]),
], ids=["kl", "recompute", "lora"])
def test_what_full_parameter_sharding_does_not_shard_yet(tmp_path, overrides, fragments):
    assert_one_line_error(poise("train", "cluster.shard=full", *overrides, f"run.dir={tmp_path}/run"), *fragments)


def test_assist_with_sharded_optimizer_state(tmp_path):
    assert_one_line_error(poise("train", "pipeline.assist=true", "cluster.shard=optimizer", f"run.dir={tmp_path}/run"),
                          "pipeline.assist", "cluster.shard=optimizer")


def test_unknown_loss_and_inverted_clip(tmp_path):
    assert_one_line_error(poise("train", "algorithm.loss=ppo", f"run.dir={tmp_path}/run"), "algorithm.loss",
                          "'dapo'")
    assert_one_line_error(poise("train", "algorithm.clip_eps_low=0.3", "algorithm.clip_eps_high=0.2",
                                f"run.dir={tmp_path}/run"), "algorithm.clip_eps_high", "must be >= clip_eps_low")
    assert not (tmp_path / "run").exists()  # failed before any work


@pytest.mark.parametrize("overrides, words", [
    (["algorithm.old_logprobs=trainer"], ["algorithm.old_logprobs", "'trainer'", "'rollout', 'recompute'"]),
    (["algorithm.rollout_is=token"], ["algorithm.rollout_is", "'token'", "old_logprobs=recompute"]),
    (["algorithm.old_logprobs=recompute", "algorithm.rollout_is=token", "algorithm.rollout_is_cap=0.9"],
     ["algorithm.rollout_is_cap", "0.9", ">= 1"]),
    (["algorithm.old_logprobs=recompute", "algorithm.updates_per_step=2", "pipeline.assist=true"],
     ["pipeline.assist", "updates_per_step > 1", "updates_per_step=1 or pipeline.assist=false"]),
])
def test_old_logprobs_and_rollout_is_bad_values(tmp_path, overrides, words):
    assert_one_line_error(poise("train", *overrides, f"run.dir={tmp_path}/run"), *words)
    assert not (tmp_path / "run").exists()
