"""The off-policy correction presets inside the trainer: one micro-batch of a tiny model with rollout
log-probs that are not the trainer's, `old_logprobs: recompute` (ratio exactly 1 at the first
update, so each token's loss is -A w), and the step's `correction/...` metrics."""

from __future__ import annotations

import math

import pytest
import torch

from poise.config import AlgorithmConfig
from poise.policy.mismatch import MismatchStats, correction_metrics
from poise.policy.plan import MicroStats, step_stats
from poise.training.trainer import PolicyTrainer, log_ratio_histogram
from test_old_logprobs import ADVANTAGES, _model, _samples, _trainer_logprobs  # tests/training


def _log_rho() -> list[torch.Tensor]:
    """Per response, log(proximal / behaviour) of each token: the trainer's log-probs at the initial
    weights minus the rollout's (float64)."""
    samples = _samples()
    log_rho = _trainer_logprobs(samples).double() - torch.tensor([x for s in samples for x in s.logprobs]).double()
    return list(log_rho.split([len(s.token_ids) for s in samples]))


def _by_hand(preset: str, low: float, high: float) -> list[list[float]]:
    """Each response's token weights, straight from the preset's formula (docs/corrections.md)."""
    out = []
    for part in _log_rho():
        if preset == "icepop":
            out.append([math.exp(x) if low <= math.exp(x) <= high else 0.0 for x in part.tolist()])
            continue
        ratio = math.exp(float(part.sum()) if preset == "sequence_mask" else float(part.mean()))
        out.append([1.0 if low <= ratio <= high else 0.0] * len(part))
    return out


@pytest.mark.parametrize("preset, band", [
    ("sequence_mask", {}),  # the default [0.5, 2]: keeps response 1 (product 1.97) alone
    ("geometric_reject", {"rollout_is_low": 0.8, "rollout_is_high": 1.25}),  # keeps responses 0 and 1
    ("icepop", {}),  # the default [0.5, 5]: masks the 4 tokens whose ratio is below 0.5
])
def test_each_preset_weights_the_loss_as_its_formula(preset, band):
    cfg = AlgorithmConfig(prompts_per_step=2, group_size=4, old_logprobs="recompute", rollout_is=preset, **band)
    want = _by_hand(preset, cfg.rollout_is_low, cfg.rollout_is_high)
    flat = [w for part in want for w in part]
    masked = sum(w == 0.0 for w in flat)
    assert 0 < masked < len(flat) == 22  # the band bites on some tokens, not all
    got = PolicyTrainer(_model(), cfg, pad_id=0).micro_batch_grad(0, _samples(), ADVANTAGES)
    # ratio 1, no clip: each token's loss is -A_i w_t; masked tokens still count in the normaliser (22)
    assert got.loss_sum == pytest.approx(-sum(float(a) * sum(p) for a, p in zip(ADVANTAGES, want)), rel=1e-5)
    assert got.normaliser == 22.0
    m = got.mismatch
    assert (m.is_tokens, m.is_masked, m.is_zero, m.is_truncated) == (22, masked, masked, 0)
    assert m.is_weight_max == pytest.approx(max(flat), rel=1e-6)
    assert m.is_weight_sum == pytest.approx(sum(flat), rel=1e-5)
    stats = step_stats([got.stats()], [1.0])
    assert stats["correction/masked_frac"] == masked / 22 and stats["correction/truncated_frac"] == 0.0
    assert stats["correction/is_weight_max"] == m.is_weight_max
    plain = PolicyTrainer(_model(), AlgorithmConfig(prompts_per_step=2, group_size=4, old_logprobs="recompute"),
                          pad_id=0).micro_batch_grad(0, _samples(), ADVANTAGES)
    assert not torch.equal(got.flat_grad, plain.flat_grad)  # the masked tokens' gradient is gone
    assert not any(k.startswith("correction/") for k in step_stats([plain.stats()], [1.0]))


def _part(weights: list[float], truncated: int) -> MismatchStats:
    """A micro-batch's share of the correction statistics, as the trainer makes it from its weights."""
    w = torch.tensor(weights, dtype=torch.float64)
    positive = w > 0
    return MismatchStats(is_tokens=len(weights), is_weight_sum=float(w.sum()), is_truncated=truncated,
                         is_masked=int((~positive).sum()), is_zero=int((~positive).sum()),
                         is_weight_max=float(w.max()), is_hist=log_ratio_histogram(torch.log(w[positive])))


def test_the_correction_metrics_by_hand_and_in_any_merge_order():
    """20 tokens: 2 masked (weight 0), 16 of weight 1, one 2.0 (cut at the cap 2) and one 4.0.
    Sorted, the 1st (p05: rank ceil(0.05 x 20) = 1) is 0, the 10th (p50) 1 exactly (the zero bin of
    log w), the 19th (p95) 2.0 within the grid's resolution (|log w| to 12%); the max 4.0 exactly."""
    a = _part([0.0] + [1.0] * 8 + [2.0], truncated=1)
    b = _part([0.0] + [1.0] * 8 + [4.0], truncated=0)
    got = correction_metrics([a, b])
    assert got["correction/is_weight_p05"] == 0.0
    assert got["correction/is_weight_p50"] == 1.0
    assert abs(math.log(got["correction/is_weight_p95"]) - math.log(2.0)) <= 0.12 * math.log(2.0)
    assert got["correction/is_weight_max"] == 4.0
    assert (got["correction/truncated_frac"], got["correction/masked_frac"]) == (1 / 20, 2 / 20)
    # exact counts and a max: the same bits whatever the order or grouping of the micro-batches
    assert correction_metrics([b, a]) == got
    assert correction_metrics([_part([0.0, 0.0] + [1.0] * 16 + [2.0, 4.0], truncated=1)]) == got
    assert correction_metrics([a, MismatchStats(tokens=3), b]) == got  # a part without a correction adds nothing
    assert correction_metrics([MismatchStats(tokens=3)]) == {}
    micro = MicroStats(0.0, 1.0, 0, 0.0, 20, mismatch=a)
    assert set(step_stats([micro], [1.0])) >= {"correction/is_weight_p05", "correction/is_weight_p50",
                                               "correction/is_weight_p95", "correction/is_weight_max",
                                               "correction/truncated_frac", "correction/masked_frac"}
