"""The context checks before any work: rollout.max_context within the model's positions, and every
prompt (dataset or built-in task) plus max_new_tokens within the context, with a hint that works."""

import json

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.config import DataConfig, ModelConfig
from poise.data.prompts import check_prompts
from poise.errors import PoiseError

TINY = ModelConfig()  # model.path null: the tiny model, model.tiny.max_positions positions (256)


def _dataset(tmp_path, prompt_chars: int):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "a" * prompt_chars, "answer": "1"}) + "\n")
    return DataConfig(dataset=str(path))


def test_max_context_beyond_the_model_is_refused():
    assert TINY.tiny.max_positions == 256
    with pytest.raises(PoiseError, match=r"rollout.max_context 512 exceeds the model's 256 positions.*at most 256"):
        check_prompts(DataConfig(), TINY, 0, 512, 80)
    check_prompts(DataConfig(), TINY, 0, 256, 80)  # the model's own limit is fine


def test_built_in_prompts_plus_max_new_tokens_must_fit():
    with pytest.raises(PoiseError, match=r"prompt of \d+ tokens \+ algorithm.sampling.max_new_tokens \(250\)"):
        check_prompts(DataConfig(), TINY, 0, 0, 250)


def test_hint_does_not_say_raise_max_context_at_the_models_limit(tmp_path):
    data = _dataset(tmp_path, 200)
    with pytest.raises(PoiseError) as at_limit:
        check_prompts(data, TINY, 0, 0, 80)  # context = the model's 256 positions
    assert "raise rollout.max_context" not in str(at_limit.value)
    assert "256 positions" in str(at_limit.value)
    with pytest.raises(PoiseError) as below:
        check_prompts(data, TINY, 0, 128, 80)
    assert "raise rollout.max_context (at most 256" in str(below.value)


def test_train_refuses_max_context_beyond_the_model_before_any_work(tmp_path):
    result = poise("train", "configs/demo.yaml", "model.path=null", "rollout.max_context=512",
                   f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "rollout.max_context 512", "256 positions")
    assert not (tmp_path / "run").exists()
