"""`poise config`: the resolved config with every key's help and default; hints for TRL/verl names."""

from pathlib import Path

import pytest
import yaml

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.config import load_train_config


def test_config_prints_the_resolved_config_that_loads_back(tmp_path):
    out = poise("config", "algorithm.loss=dapo", "run.steps=7")
    assert out.returncode == 0, out.stderr
    saved = tmp_path / "resolved.yaml"
    saved.write_text(out.stdout)
    assert load_train_config(saved) == load_train_config(None, ["algorithm.loss=dapo", "run.steps=7"])
    data = yaml.safe_load(out.stdout)
    assert data["algorithm"]["clip_eps_high"] is None  # the preset fills it: written null, value in the comment
    assert "now: 0.28, from loss dapo" in out.stdout
    assert load_train_config(saved).algorithm.clip_eps_high == 0.28
    assert data["run"]["steps"] == 7


def test_config_section_shows_help_and_default(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm:\n  lr: 0.0003\n")
    out = poise("config", str(cfg), "--section", "algorithm")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "algorithm:"
    at = lines.index("  lr: 0.0003")
    assert lines[at - 1] == "  # AdamW learning rate [default: 0.001]"
    assert "  # weight of the KL penalty to the frozen initial policy (TRL's beta); 0 disables [default: 0.0]" in lines
    assert "run:" not in lines  # one section only
    nested = poise("config", "--section", "algorithm.sampling").stdout.splitlines()
    assert nested[:2] == ["algorithm:", "  sampling:"] and "    max_new_tokens: 80" in nested


def test_config_bad_section_and_bad_value():
    assert_one_line_error(poise("config", "--section", "algo"), "--section algo", "algorithm")
    assert_one_line_error(poise("config", "algorithm.loss=ppo"), "algorithm.loss", "'gspo'")


def test_train_help_points_to_poise_config():
    out = poise("train", "--help")
    assert out.returncode == 0
    assert "poise config" in " ".join(out.stdout.split())


@pytest.mark.parametrize("key, fragment", [
    ("algorithm.beta=0.04", "algorithm.kl_coef"),
    ("algorithm.num_generations=8", "algorithm.group_size"),
    ("algorithm.learning_rate=1e-6", "algorithm.lr"),
    ("model.lora_r=8", "TRL's lora_r is model.lora.r"),
    ("beta=0.04", "algorithm.kl_coef"),  # at the top level too
    ("algorithm.temperature=0.7", "algorithm.sampling.temperature"),
])
def test_trl_and_verl_names_get_the_poise_name(tmp_path, key, fragment):
    assert_one_line_error(poise("train", key, f"run.dir={tmp_path}/run"), key.partition("=")[0], "unknown key",
                          fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[2] / "configs").glob("*.yaml")))
def test_every_shipped_config_prints_and_loads_back_equal(tmp_path, name):
    from poise.cli.config import render

    cfg = load_train_config(Path(__file__).parents[2] / "configs" / name)
    (tmp_path / "printed.yaml").write_text(render(cfg))
    assert load_train_config(tmp_path / "printed.yaml") == cfg


@pytest.mark.parametrize("loss", ["gspo", "dapo", "dr_grpo"])
def test_written_template_follows_a_changed_loss_in_the_file_and_on_the_command_line(tmp_path, loss):
    """`poise config > mine.yaml`, then another loss: in the file or as an override, the new loss's
    preset applies, as it does with no template at all (the template must not pin grpo's knobs)."""
    out = poise("config")
    assert out.returncode == 0, out.stderr
    template = yaml.safe_load(out.stdout)
    want = load_train_config(None, [f"algorithm.loss={loss}"]).algorithm
    edited = tmp_path / "mine.yaml"
    template["algorithm"]["loss"] = loss
    edited.write_text(yaml.safe_dump(template))
    in_file = load_train_config(edited).algorithm
    saved = tmp_path / "template.yaml"
    saved.write_text(out.stdout)
    on_command_line = load_train_config(saved, [f"algorithm.loss={loss}"]).algorithm
    for got in (in_file, on_command_line):
        assert (got.ratio_level, got.loss_agg, got.clip_eps_low, got.clip_eps_high, got.advantage) == (
            want.ratio_level, want.loss_agg, want.clip_eps_low, want.clip_eps_high, want.advantage)
    assert want != load_train_config(saved).algorithm  # the presets differ, so the comparison can fail


def test_template_keeps_a_knob_set_explicitly(tmp_path):
    out = poise("config", "algorithm.clip_eps_high=0.3")
    assert out.returncode == 0, out.stderr
    saved = tmp_path / "t.yaml"
    saved.write_text(out.stdout)
    assert load_train_config(saved, ["algorithm.loss=dapo"]).algorithm.clip_eps_high == 0.3
