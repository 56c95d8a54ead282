"""README's "Coming from TRL" table, row by row, against a hand transcription of TRL's own formulas.

The transcription (TRL 1.16, `trl/trainer/grpo_trainer.py`): `_generate_and_score_completions`'
advantages (one reward function, `sum_then_normalize`: group mean, group or batch std with
Bessel's correction, `+ 1e-4`) and `_compute_loss` (the clipped surrogate at token or sequence
level, then `grpo` / `bnpo` / `dr_grpo` / `dapo` aggregation over micro-batches of gradient
accumulation, one process, `steps_per_generation` = the accumulation steps). TRL is not imported:
the formulas are copied here by hand, in float64, so each row is checked to rounding.

Each row's TRL settings over a baseline run through the transcription; the row's Poise keys over
the baseline's Poise keys run through Poise's own functions (`outcome_advantages`, `policy_loss`,
the step's normaliser, `step_stats`); loss, gradient and clip fraction must agree. The baseline is
read from the table too: the rows whose TRL side is TRL's default.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from poise.algo.advantages import outcome_advantages
from poise.algo.losses import policy_loss
from poise.config import AlgorithmConfig, ConfigError, build_train_config, load_train_config
from poise.policy.plan import MicroStats, step_stats

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
TRL_DEFAULTS = {"loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": None,
                "importance_sampling_level": "token"}
G, T = 4, 6  # group size, max_completion_length = sampling.max_new_tokens


def _table() -> list[tuple[dict, dict, str]]:
    """(TRL settings, Poise algorithm keys, the row's text) of each row of the table."""
    section = README.split("\n## Coming from TRL", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `") and not line.startswith("| the "):
            continue
        trl_cell, poise_cell = [c.strip() for c in line.strip("|").split("|")][:2]
        trl = {k: v for s in re.findall(r"`([^`]+)`", trl_cell) if ": " in s for k, v in yaml.safe_load(s).items()}
        poise = {k: v for s in re.findall(r"`([^`]+)`", poise_cell) if ": " in s
                 for k, v in yaml.safe_load(s).items()}
        rows.append((trl, poise, line))
    assert len(rows) >= 10, "README's TRL table"
    return rows


# ---- TRL, transcribed by hand ------------------------------------------------------------------

def trl_advantages(rewards: torch.Tensor, scale_rewards: str | bool) -> torch.Tensor:
    scale = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)  # GRPOConfig.__post_init__
    grouped = rewards.view(-1, G)
    mean = grouped.mean(dim=1).repeat_interleave(G)
    if scale in ("group", "none"):
        std = grouped.std(dim=1).repeat_interleave(G)  # nanstd: Bessel's correction
    else:
        assert scale == "batch"
        std = rewards.std().expand_as(rewards)
    advantages = rewards - mean
    return advantages / (std + 1e-4) if scale != "none" else advantages


def trl_micro_loss(logps, old, advantages, mask, args, accumulation: int, items_in_batch: float):
    """One micro-batch of `_compute_loss` (train mode, one process). Returns (loss, region-clipped mask)."""
    low, high = args["epsilon"], args["epsilon_high"] if args["epsilon_high"] is not None else args["epsilon"]
    advantages = advantages.unsqueeze(1)
    log_ratio = logps - old
    if args["importance_sampling_level"] == "token":
        log_weights = log_ratio
    else:
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_weights)
    coef_2 = torch.clamp(coef_1, 1 - low, 1 + high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    kind = args["loss_type"]
    if kind == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    elif kind == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    elif kind == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * T) / accumulation
    else:
        assert kind == "dapo"
        normalizer = items_in_batch * accumulation / accumulation  # num_items_in_batch / processes x accum / spg
        loss = (per_token_loss * mask).sum() / normalizer
    clipped = ((coef_1 < 1 - low) & (advantages < 0)) | ((coef_1 > 1 + high) & (advantages > 0))
    return loss, clipped


def trl_step(batch, args, micro: int):
    """TRL's accumulated loss, gradient and clip_ratio/region_mean over micro-batches of `micro` rows."""
    rewards, logps, old, mask = batch
    logps = logps.detach().clone().requires_grad_(True)
    advantages = trl_advantages(rewards, args["scale_rewards"])
    cuts = range(0, len(rewards), micro)
    total, clipped, counted = 0.0, 0.0, 0.0
    for i in cuts:
        part = slice(i, i + micro)
        loss, region = trl_micro_loss(logps[part], old[part], advantages[part], mask[part], args, len(cuts),
                                      float(mask.sum()))
        loss.backward()
        total += float(loss.detach())
        if region.shape[1] == 1:  # global_masked_mean: sequences at sequence level, tokens at token level
            clipped, counted = clipped + float(region.sum()), counted + region.shape[0]
        else:
            clipped, counted = clipped + float((region * mask[part]).sum()), counted + float(mask[part].sum())
    return total, logps.grad, clipped / counted


# ---- Poise -------------------------------------------------------------------------------------

def poise_step(batch, keys: dict, micro: int):
    """Poise's step loss, gradient and clip fraction (the metric TRL's level counts) under `keys`."""
    algo = build_train_config({"algorithm": {**keys, "sampling": {"max_new_tokens": T}}}).algorithm
    rewards, logps, old, mask = batch
    logps = logps.detach().clone().requires_grad_(True)
    groups = rewards.view(-1, G).tolist()
    advantages = torch.tensor([a for g in outcome_advantages(algo.advantage, groups, algo.std_eps) for a in g],
                              dtype=torch.float64)
    results, stats = [], []
    for i in range(0, len(rewards), micro):
        part = slice(i, i + micro)
        out = policy_loss(logps[part], old[part], advantages[part], mask[part], clip_eps_low=algo.clip_eps_low,
                          clip_eps_high=algo.clip_eps_high, ratio_level=algo.ratio_level, agg=algo.loss_agg,
                          max_response=algo.sampling.max_new_tokens)
        results.append(out)
        stats.append(MicroStats(float(out.total.detach()), out.normaliser, out.clipped_tokens, 0.0,
                                int(mask[part].sum()), clipped_responses=out.clipped_responses, responses=micro))
    normaliser = sum(r.normaliser for r in results)  # the step plan's loss_normaliser: lengths only
    loss = sum(r.total for r in results) / normaliser
    loss.backward()
    row = step_stats(stats, [0.0])
    metric = row["clip_frac_responses"] if algo.ratio_level == "sequence" else row["clip_frac"]
    return float(loss.detach()), logps.grad, metric


@pytest.fixture
def batch():
    """4 groups of 4 responses of 1-6 tokens; token and sequence ratios within about +-70 % of 1
    (some clipped either side); one group's rewards nearly equal (std 5e-4, where 1e-4 and 1e-6
    differ)."""
    gen = torch.Generator().manual_seed(7)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.001, 0.0, 3.0, 0.2, 0.1],
                           dtype=torch.float64)
    logps = -torch.rand(16, T, generator=gen, dtype=torch.float64) * 3
    shift = (torch.rand(16, 1, generator=gen, dtype=torch.float64) - 0.5) * 0.8  # sequence ratios vary too
    old = logps + shift + (torch.rand(16, T, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    lengths = torch.tensor([1, 2, 6, 6, 3, 1, 5, 2, 6, 6, 6, 4, 1, 6, 5, 6])  # micro-batches of unequal tokens
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    return rewards, logps, old, mask


def _baseline_keys(rows) -> dict:
    """Poise's side of the rows whose TRL side is TRL's default: together, TRL's defaults."""
    keys = {}
    for trl, poise, line in rows:
        if not trl and "1e-4" in line or trl and all(TRL_DEFAULTS.get(k) == v for k, v in trl.items()):
            keys.update(poise)
    return keys


ROWS = _table()


@pytest.mark.parametrize("row", range(len(ROWS)), ids=[r[2].split("|")[1].strip() for r in ROWS])
def test_each_row_computes_what_trl_computes(batch, row):
    trl, poise, line = ROWS[row]
    if not poise:  # no Poise equivalent: refused, see test_bnpo_is_refused_because_it_depends_on_the_cut
        assert "refused" in line, line
        return
    trl_args = {**TRL_DEFAULTS, **trl}
    keys = {**_baseline_keys(ROWS), **poise}
    micro = 8  # two micro-batches of two groups each, as TRL's gradient accumulation would cut them
    want_loss, want_grad, want_clip = trl_step(batch, trl_args, micro)
    got_loss, got_grad, got_clip = poise_step(batch, keys, micro)
    assert got_loss == pytest.approx(want_loss, rel=1e-12, abs=1e-15), line
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-15, msg=line)
    assert got_clip == pytest.approx(want_clip, rel=1e-12), line
    assert 0 < want_clip < 1, "the batch must clip some (not all) to test the clip fraction"
    # the row's Poise setting is what makes the difference: without it (defaults) Poise differs
    if any(getattr(AlgorithmConfig(), k) != getattr(AlgorithmConfig(**{k: v}), k) for k, v in poise.items()):
        other_loss, other_grad, _ = poise_step(batch, {k: v for k, v in keys.items() if k not in poise}, micro)
        assert (other_loss, other_grad.tolist()) != (want_loss, want_grad.tolist()), line


def test_poise_loss_grpo_is_trl_dapo_with_a_symmetric_clip_not_trl_grpo(batch):
    """The name that means something else: Poise's `loss: grpo` averages over every token of the
    step; TRL's `loss_type: grpo` averages per response."""
    ours = poise_step(batch, {"loss": "grpo", "std_eps": 1e-4}, 8)
    dapo = trl_step(batch, {**TRL_DEFAULTS, "loss_type": "dapo"}, 8)
    grpo = trl_step(batch, {**TRL_DEFAULTS, "loss_type": "grpo"}, 8)
    assert ours[0] == pytest.approx(dapo[0], rel=1e-12)
    assert ours[0] != pytest.approx(grpo[0], rel=1e-3)


def test_bnpo_is_refused_because_it_depends_on_the_cut(batch):
    """TRL's bnpo over the same 16 responses gives another update when they are cut into 4
    micro-batches instead of 2; Poise's loss_agg token (the closest) gives the same either way."""
    trl_args = {**TRL_DEFAULTS, "loss_type": "bnpo"}
    assert not torch.allclose(trl_step(batch, trl_args, 8)[1], trl_step(batch, trl_args, 4)[1], rtol=1e-6)
    keys = {"loss_agg": "token"}
    torch.testing.assert_close(poise_step(batch, keys, 8)[1], poise_step(batch, keys, 4)[1], rtol=1e-12, atol=0)
    for key in ("algorithm.loss", "algorithm.loss_agg"):
        with pytest.raises(ConfigError, match=f"{key}.*micro-batches.*loss_agg=token") as e:
            load_train_config(None, [f"{key}=bnpo"])
        assert "\n" not in str(e.value)


def test_trl_loss_type_key_names_the_corresponding_poise_setting():
    with pytest.raises(ConfigError) as e:
        build_train_config({"algorithm": {"loss_type": "grpo"}})
    message = str(e.value)
    for words in ("its grpo (a mean per response) is loss_agg=sequence", "not algorithm.loss=grpo",
                  "its dapo is loss_agg=token", "dr_grpo loss_agg=constant", "bnpo has no equivalent"):
        assert words in message, message


@pytest.mark.parametrize("value, advantage", [(True, "grpo"), ("group", "grpo"), ("batch", "grpo_batch"),
                                              (False, "dr_grpo"), ("none", "dr_grpo")])
def test_scale_rewards_takes_trls_values(value, advantage, tmp_path):
    from poise.schema import to_dict

    cfg = build_train_config({"algorithm": {"scale_rewards": value}})
    assert cfg.algorithm.advantage == advantage
    path = tmp_path / "config.yaml"  # the resolved config loads back to the same run
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_train_config(path) == cfg


def test_scale_rewards_and_a_contrary_advantage_are_refused():
    with pytest.raises(ConfigError, match="scale_rewards.*means advantage grpo_batch.*advantage is grpo"):
        AlgorithmConfig(scale_rewards="batch", advantage="grpo")
    with pytest.raises(ConfigError, match="scale_rewards.*expected bool or one of 'group', 'batch', 'none'"):
        build_train_config({"algorithm": {"scale_rewards": "batches"}})
    with pytest.raises(ConfigError, match="std_eps.*must be in \\(0, 1\\]"):
        AlgorithmConfig(std_eps=0.0)


def test_std_eps_default_is_1e_6_and_trls_1e_4_is_a_key_away():
    """The default (1e-6) is what the advantages divided by before the key existed; TRL's 1e-4 shows
    where a group's rewards are nearly equal: [1, 1, 1, 1.001] has std 5e-4."""
    assert AlgorithmConfig().std_eps == 1e-6
    rewards = [[1.0, 1.0, 1.0, 1.001]]
    std = 0.001 / 2  # unbiased: sqrt((3 x 0.00025^2 + 0.00075^2) / 3)
    assert outcome_advantages("grpo", rewards)[0][3] == pytest.approx(0.00075 / (std + 1e-6), rel=1e-9)
    assert outcome_advantages("grpo", rewards, 1e-4)[0][3] == pytest.approx(0.00075 / (std + 1e-4), rel=1e-9)
    assert outcome_advantages("grpo", rewards, 1e-4)[0][3] < 0.9 * outcome_advantages("grpo", rewards)[0][3]
