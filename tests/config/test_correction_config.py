"""algorithm.rollout_is presets and the band [rollout_is_low, rollout_is_high] the masking ones keep."""

import pytest
import yaml

from poise.config import AlgorithmConfig, load_train_config
from poise.errors import ConfigError
from poise.schema import to_dict


@pytest.mark.parametrize("preset, band", [
    ("sequence_mask", (0.5, 2.0)), ("geometric_reject", (0.999, 1.001)), ("icepop", (0.5, 5.0))])
def test_each_masking_preset_fills_its_band(preset, band):
    a = AlgorithmConfig(old_logprobs="recompute", rollout_is=preset)
    assert (a.rollout_is_low, a.rollout_is_high) == band
    a = AlgorithmConfig(old_logprobs="recompute", rollout_is=preset, rollout_is_high=3.0)  # an explicit bound wins
    assert (a.rollout_is_low, a.rollout_is_high) == (band[0], 3.0)


@pytest.mark.parametrize("preset", ["none", "token", "sequence"])
def test_todays_presets_take_no_band(preset):
    a = AlgorithmConfig(old_logprobs="recompute", rollout_is=preset)
    assert (a.rollout_is_low, a.rollout_is_high, a.rollout_is_cap) == (None, None, 2.0)
    with pytest.raises(ConfigError, match="rollout_is_low.*applies to rollout_is sequence_mask, geometric_reject, "
                                          "icepop only"):
        AlgorithmConfig(old_logprobs="recompute", rollout_is=preset, rollout_is_low=0.5)


@pytest.mark.parametrize("knobs, message", [
    ({"rollout_is_low": 0.0}, "rollout_is_low.*must be in \\(0, 1\\]"),
    ({"rollout_is_low": 1.5}, "rollout_is_low.*must be in \\(0, 1\\]"),
    ({"rollout_is_high": 0.9}, "rollout_is_high.*must be >= 1"),
    ({"rollout_is_high": float("inf")}, "rollout_is_high.*finite"),
])
def test_a_bad_band_is_refused(knobs, message):
    with pytest.raises(ConfigError, match=message):
        AlgorithmConfig(old_logprobs="recompute", rollout_is="icepop", **knobs)


@pytest.mark.parametrize("preset", ["token", "sequence", "sequence_mask", "geometric_reject", "icepop"])
def test_every_preset_needs_recompute(preset):
    with pytest.raises(ConfigError, match=f"rollout_is.*'{preset}'.*needs algorithm.old_logprobs=recompute"):
        AlgorithmConfig(rollout_is=preset)


def test_a_resolved_band_loads_back_the_same(tmp_path):
    cfg = load_train_config(None, ["algorithm.old_logprobs=recompute", "algorithm.rollout_is=geometric_reject"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_train_config(path) == cfg
    assert load_train_config(path).algorithm.rollout_is_high == 1.001
