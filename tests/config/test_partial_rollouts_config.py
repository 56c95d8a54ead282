"""pipeline.max_staleness, partial_tokens and overprovision: what each needs, refused in one line."""

import pytest

from poise.config import load_train_config
from poise.errors import ConfigError

PARTIAL = ["pipeline.mode=async", "algorithm.old_logprobs=recompute", "algorithm.rollout_is=token"]


@pytest.mark.parametrize("mode", ["sync", "colocated"])
@pytest.mark.parametrize("knob", ["max_staleness=1", "partial_tokens=4", "overprovision=1"])
def test_the_knobs_need_async(mode, knob):
    with pytest.raises(ConfigError, match=rf"pipeline.{knob.split('=')[0]}.*needs pipeline.mode=async"):
        load_train_config(None, [f"pipeline.mode={mode}", f"pipeline.{knob}"])


def test_staleness_above_one_needs_partial_rollouts():
    with pytest.raises(ConfigError, match=r"pipeline.max_staleness.*got 2.*partial_tokens > 0"):
        load_train_config(None, [*PARTIAL, "pipeline.max_staleness=2"])
    assert load_train_config(None, [*PARTIAL, "pipeline.max_staleness=2", "pipeline.partial_tokens=4"]
                             ).pipeline.staleness == 2


def test_partial_rollouts_need_recomputed_old_logprobs():
    with pytest.raises(ConfigError, match=r"algorithm.old_logprobs.*'rollout'.*old_logprobs=recompute"):
        load_train_config(None, ["pipeline.mode=async", "pipeline.partial_tokens=4"])


def test_overprovision_needs_partial_rollouts_and_partial_needs_staleness():
    with pytest.raises(ConfigError, match=r"pipeline.overprovision.*partial_tokens > 0"):
        load_train_config(None, [*PARTIAL, "pipeline.overprovision=2"])
    with pytest.raises(ConfigError, match=r"pipeline.partial_tokens.*max_staleness >= 1"):
        load_train_config(None, [*PARTIAL, "pipeline.partial_tokens=4", "pipeline.max_staleness=0"])


def test_overprovision_fits_in_a_batch():
    partial = [*PARTIAL, "pipeline.partial_tokens=4", "algorithm.prompts_per_step=4"]
    with pytest.raises(ConfigError, match=r"pipeline.overprovision.*got 5.*<= algorithm.prompts_per_step \(4\)"):
        load_train_config(None, [*partial, "pipeline.overprovision=5"])
    assert load_train_config(None, [*partial, "pipeline.overprovision=4"]).pipeline.overprovision == 4


def test_staleness_zero_is_the_sync_loop_and_unset_is_one():
    cfg = load_train_config(None, ["pipeline.mode=async", "pipeline.max_staleness=0"])
    assert cfg.pipeline.kind == load_train_config(None, ["pipeline.mode=sync"]).pipeline.kind == "stream"
    assert load_train_config(None, ["pipeline.mode=async"]).pipeline.staleness == 1
    assert load_train_config(None, ["pipeline.mode=async", "pipeline.max_staleness=1"]).pipeline.kind == "async"


def test_emulated_compute_runs_partial_rollouts():
    cfg = load_train_config(None, [*PARTIAL, "pipeline.partial_tokens=4", "pipeline.max_staleness=2",
                                   "pipeline.overprovision=1", "cluster.compute=emulated"])
    assert cfg.pipeline.partial and cfg.cluster.compute == "emulated"
