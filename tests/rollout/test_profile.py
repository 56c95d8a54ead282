"""`poise profile` writes the poise-profile/1 JSON that the cost model reads."""

from __future__ import annotations

import json

import pytest

from poise.cli import main
from poise.errors import ConfigError
from poise.policy.cost import CostModel
from poise.rollout.profile import FORMAT, ProfileConfig, profile_model


def test_profile_has_the_documented_tables_and_the_cost_model_reads_it(qwen2):
    cfg = ProfileConfig(batch_sizes=(1, 4), contexts=(8, 32), prompt_lengths=(4, 16), repeats=1)
    calls = []
    profile = profile_model(qwen2, cfg, "tiny", progress=lambda done, total, what: calls.append((done, total)))
    assert profile["format"] == FORMAT and profile["device"] == "cpu"
    assert profile["model"]["layers"] == 2 and profile["model"]["hidden"] == 64
    assert profile["model"]["params"] == sum(p.numel() for p in qwen2.parameters())
    assert sorted((r["batch"], r["context"]) for r in profile["decode"]) == [(1, 8), (1, 32), (4, 8), (4, 32)]
    assert [r["tokens"] for r in profile["prefill"]] == [4, 16]
    assert all(r["seconds_per_step"] > 0 for r in profile["decode"]) and profile["tokens_per_second"] > 0
    assert calls[-1] == (6, 6)
    cost = CostModel.from_profile(json.loads(json.dumps(profile)))
    assert cost.decode_step_s(2, 16) > 0 and cost.prefill_s(8) > 0


def test_profile_rejects_contexts_beyond_the_model(qwen2):
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        profile_model(qwen2, ProfileConfig(contexts=(500,), repeats=1), "tiny")


def test_poise_profile_command_writes_the_file(tmp_path, model_dirs, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--model", str(model_dirs["qwen2"]), "--out", str(out), "--batches", "1,2",
                 "--contexts", "16", "--prompts", "8", "--repeats", "1"])
    assert code == 0
    profile = json.loads(out.read_text())
    assert profile["format"] == FORMAT and len(profile["decode"]) == 2
    captured = capsys.readouterr()
    assert "profile [3/3]" in captured.err and "wrote" in captured.out


def test_poise_profile_bad_list_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--batches", "1,x"])
    assert "comma-separated" in capsys.readouterr().err
