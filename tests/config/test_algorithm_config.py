"""algorithm.loss presets and the orthogonal loss knobs they set."""

import pytest

from poise.config import AlgorithmConfig, load_train_config
from poise.errors import ConfigError


def knobs(a: AlgorithmConfig) -> dict:
    return {k: getattr(a, k) for k in ("clip_eps_low", "clip_eps_high", "ratio_level", "loss_agg", "advantage",
                                       "scale_rewards", "kl_estimator", "entropy_coef")}


def test_the_defaults_are_todays_grpo():
    assert knobs(AlgorithmConfig()) == {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "ratio_level": "token",
                                        "loss_agg": "token", "advantage": "grpo", "scale_rewards": True,
                                        "kl_estimator": "k3", "entropy_coef": 0.0}
    assert knobs(AlgorithmConfig(clip_eps=0.1))["clip_eps_high"] == 0.1  # no preset value: clip_eps both sides


@pytest.mark.parametrize("loss, want", [
    ("dapo", {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg": "token", "advantage": "grpo"}),
    ("dr_grpo", {"advantage": "dr_grpo", "loss_agg": "constant", "scale_rewards": False, "clip_eps_high": 0.2}),
    ("gspo", {"ratio_level": "sequence", "loss_agg": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}),
])
def test_presets_set_their_knobs(loss, want):
    got = knobs(load_train_config(None, [f"algorithm.loss={loss}"]).algorithm)
    assert {k: got[k] for k in want} == want


def test_an_explicit_knob_wins_over_its_preset():
    a = load_train_config(None, ["algorithm.loss=dapo", "algorithm.clip_eps_high=0.3",
                                 "algorithm.advantage=rloo"]).algorithm
    assert (a.clip_eps_low, a.clip_eps_high, a.advantage, a.scale_rewards) == (0.2, 0.3, "rloo", False)
    assert load_train_config(None, ["algorithm.loss=gspo", "algorithm.loss_agg=token"]).algorithm.loss_agg == "token"


def test_scale_rewards_false_is_dr_grpo_advantage():
    assert AlgorithmConfig(scale_rewards=False).advantage == "dr_grpo"
    assert AlgorithmConfig(scale_rewards=False, advantage="rloo").advantage == "rloo"
    with pytest.raises(ConfigError, match="scale_rewards.*algorithm.advantage is grpo"):
        AlgorithmConfig(scale_rewards=False, advantage="grpo")


def test_a_resolved_config_loads_back_the_same(tmp_path):
    import yaml

    from poise.schema import to_dict

    cfg = load_train_config(None, ["algorithm.loss=dr_grpo", "algorithm.kl_estimator=k1", "algorithm.kl_coef=0.01"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_train_config(path) == cfg


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.loss=ppo"], "algorithm.loss.*allowed: one of 'grpo', 'dapo', 'dr_grpo', 'gspo'"),
    (["algorithm.clip_eps_low=0.3", "algorithm.clip_eps_high=0.2"], "clip_eps_high.*must be >= clip_eps_low"),
    (["algorithm.loss=dapo", "algorithm.clip_eps_high=0.1"], "clip_eps_high.*must be >= clip_eps_low \\(0.2\\)"),
    (["algorithm.clip_eps_low=1.5"], "clip_eps_low.*must be in \\(0, 1\\)"),
    (["algorithm.kl_estimator=k4"], "kl_estimator"),
    (["algorithm.loss_agg=mean"], "loss_agg"),
    (["algorithm.entropy_coef=-0.1"], "entropy_coef.*>= 0"),
    (["algorithm.advantage=ppo"], "algorithm.advantage"),
    (["algorithm.max_prompt_draws=8"], "max_prompt_draws.*>= prompts_per_step \\(16\\)"),
    (["algorithm.overlong_buffer=80"], "overlong_buffer.*\\[0, 80\\)"),
    (["algorithm.overlong_penalty=-1"], "overlong_penalty.*>= 0"),
    (["algorithm.dynamic_sampling=true", "cluster.compute=emulated"], "dynamic_sampling.*emulated"),
])
def test_bad_loss_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_train_config(None, overrides)


def test_old_logprobs_and_rollout_is_defaults_and_combinations():
    a = AlgorithmConfig()
    assert (a.old_logprobs, a.rollout_is, a.rollout_is_cap) == ("rollout", "none", 2.0)  # today's behaviour
    a = load_train_config(None, ["algorithm.old_logprobs=recompute", "algorithm.rollout_is=sequence",
                                 "algorithm.rollout_is_cap=1.0"]).algorithm
    assert (a.old_logprobs, a.rollout_is, a.rollout_is_cap) == ("recompute", "sequence", 1.0)
    assert AlgorithmConfig(old_logprobs="recompute", updates_per_step=2).updates_per_step == 2  # a step-start copy
    with pytest.raises(ConfigError, match=r"rollout_is.*'token'.*old_logprobs=recompute"):
        AlgorithmConfig(rollout_is="token")
    with pytest.raises(ConfigError, match=r"rollout_is_cap.*0\.5.*>= 1"):
        AlgorithmConfig(old_logprobs="recompute", rollout_is="token", rollout_is_cap=0.5)
