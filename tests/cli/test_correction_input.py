"""Bad off-policy correction input to `poise train`: one line, exit 2, before any work."""

import pytest

from cli_checks import assert_one_line_error, poise


def test_an_unknown_correction_preset(tmp_path):
    result = poise("train", "algorithm.old_logprobs=recompute", "algorithm.rollout_is=tis", f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "algorithm.rollout_is", "'tis'", "'sequence_mask', 'geometric_reject', 'icepop'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("preset", ["token", "sequence", "sequence_mask", "geometric_reject", "icepop"])
def test_every_preset_with_rollout_old_logprobs(tmp_path, preset):
    result = poise("train", "algorithm.old_logprobs=rollout", f"algorithm.rollout_is={preset}",
                   f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "algorithm.rollout_is", f"'{preset}'", "old_logprobs=recompute")
    assert not (tmp_path / "run").exists()


def test_a_band_outside_its_range(tmp_path):
    result = poise("train", "algorithm.old_logprobs=recompute", "algorithm.rollout_is=icepop",
                   "algorithm.rollout_is_high=0.8", f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "algorithm.rollout_is_high", "0.8", ">= 1")
    assert not (tmp_path / "run").exists()
