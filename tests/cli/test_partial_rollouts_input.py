"""`poise train` refuses partial-rollout knobs that cannot run: one line, exit 2, before any work."""

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


@pytest.mark.parametrize("overrides, fragments", [
    (["pipeline.mode=sync", "pipeline.max_staleness=2"], ["pipeline.max_staleness", "needs pipeline.mode=async"]),
    (["pipeline.mode=sync", "pipeline.partial_tokens=4"], ["pipeline.partial_tokens", "needs pipeline.mode=async"]),
    (["pipeline.mode=async", "algorithm.old_logprobs=recompute", "pipeline.max_staleness=2"],
     ["pipeline.max_staleness", "got 2", "partial_tokens > 0"]),
    (["pipeline.mode=async", "pipeline.partial_tokens=4"], ["algorithm.old_logprobs", "old_logprobs=recompute"]),
])
def test_bad_partial_rollout_settings(tmp_path, overrides, fragments):
    assert_one_line_error(poise("train", *overrides, f"run.dir={tmp_path}/run", "run.progress=false"), *fragments)
    assert not (tmp_path / "run").exists()  # failed before any work (Ray never started)
