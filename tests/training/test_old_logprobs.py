"""algorithm.old_logprobs and algorithm.rollout_is on one micro-batch: where the rollout engine's
log-probs differ from the trainer's (as vLLM's or bf16's do), `recompute` makes the first
update's ratio exactly 1, truncated importance sampling weights the surrogate, and the mismatch
is measured on the step's first mini-batch."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.policy.mismatch import LOG_RATIO_BINS, ZERO_BIN, bin_value, histogram_quantile
from poise.training import trainer as trainer_mod
from poise.training.trainer import PolicyTrainer, log_ratio_histogram, pack_batch, packed_logprobs

VOCAB = 60


@dataclass(frozen=True)
class _Sample:
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


def _samples(prompt: int = 0) -> list[_Sample]:
    """Four responses of prompt `prompt`, with rollout log-probs that are not the trainer's (about
    -log(60) = -4.1 for a random model): uniform in [-5, -3]."""
    rng = random.Random(prompt)
    out = []
    for j, n in enumerate([5, 9, 1, 7]):
        ids = [1] + [rng.randrange(3, VOCAB) for _ in range(4)]
        out.append(_Sample((0, prompt, j), ids, [rng.randrange(3, VOCAB) for _ in range(n)],
                           [rng.uniform(-5.0, -3.0) for _ in range(n)]))
    return out


def _model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return build_tiny(TinyModelConfig(arch="llama", hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                                      max_positions=64), VOCAB, seed=3)


def _trainer(**knobs) -> PolicyTrainer:
    return PolicyTrainer(_model(), AlgorithmConfig(prompts_per_step=2, group_size=4, **knobs), pad_id=0)


ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.0])


def _trainer_logprobs(samples) -> torch.Tensor:
    """The trainer's log-probs [N] of the response tokens at the initial weights (sample by sample)."""
    batch = pack_batch(samples, pad_id=0)
    with torch.no_grad():
        return packed_logprobs(_model(), batch, AlgorithmConfig().sampling.temperature)


def test_recompute_makes_the_first_ratio_exactly_one(monkeypatch):
    seen = {}
    real = trainer_mod.policy_loss

    def spy(logp, old, *args, **kwargs):
        seen["logp"], seen["old"] = logp.detach().clone(), old.clone()
        return real(logp, old, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "policy_loss", spy)
    samples = _samples()
    rollout = _trainer().micro_batch_grad(0, samples, ADVANTAGES)
    assert not torch.equal(seen["logp"], seen["old"])  # the rollout log-probs differ from the trainer's
    assert rollout.clipped_tokens > 0  # ... so much that the clip cuts at the first update
    recompute = _trainer(old_logprobs="recompute").micro_batch_grad(0, samples, ADVANTAGES)
    assert torch.equal(torch.exp(seen["logp"] - seen["old"]), torch.ones_like(seen["old"]))  # exactly 1
    assert recompute.clipped_tokens == 0
    # ratio 1: the loss is -A per token, and the update differs from rollout's
    lengths = torch.tensor([len(s.token_ids) for s in samples], dtype=torch.float32)
    assert recompute.loss_sum == pytest.approx(-float((ADVANTAGES * lengths).sum()), abs=1e-6)
    assert not torch.equal(recompute.flat_grad, rollout.flat_grad)
    assert float(recompute.flat_grad.abs().max()) > 1e-3


def test_the_mismatch_is_measured_on_the_first_mini_batch_only():
    samples = _samples()
    diff = _trainer_logprobs(samples).double() - torch.tensor([x for s in samples for x in s.logprobs]).double()
    for knobs in ({}, {"old_logprobs": "recompute"}):  # the first mini-batch's forward is at step-start weights
        got = _trainer(**knobs).micro_batch_grad(0, samples, ADVANTAGES).mismatch
        assert got.tokens == diff.numel() == 22
        assert got.abs_sum == pytest.approx(float(diff.abs().sum()), rel=1e-5)
        assert got.abs_max == pytest.approx(float(diff.abs().max()), rel=1e-5)
        assert sum(got.hist) == 22 and got.hist[ZERO_BIN] == 0  # uniform(-5, -3) never equals the trainer's
        assert got.is_weight_sum is None  # no rollout_is
    # two updates a step: prompt 1's group trains in the second mini-batch, after the first update
    later = PolicyTrainer(_model(), AlgorithmConfig(prompts_per_step=2, group_size=4, updates_per_step=2), 0)
    assert later.micro_batch_grad(0, _samples(1), ADVANTAGES).mismatch.tokens == 0
    assert later.micro_batch_grad(0, samples, ADVANTAGES).mismatch.tokens == 22


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_is_weights_the_surrogate(level):
    samples = _samples()
    trainer_logp = _trainer_logprobs(samples)
    behaviour = torch.tensor([x for s in samples for x in s.logprobs])
    log_w = trainer_logp - behaviour  # old (recomputed) - behaviour, per token
    if level == "sequence":
        lengths = [len(s.token_ids) for s in samples]
        log_w = torch.cat([part.sum().expand(len(part)) for part in log_w.split(lengths)])
    want = torch.clamp(torch.exp(log_w), max=1.5)
    assert 0 < int((torch.exp(log_w) > 1.5).sum()) < len(want)  # the cap bites on some tokens, not all
    got = _trainer(old_logprobs="recompute", rollout_is=level, rollout_is_cap=1.5).micro_batch_grad(
        0, samples, ADVANTAGES)
    m = got.mismatch
    assert m.is_tokens == 22 and m.is_truncated == int((torch.exp(log_w) > 1.5).sum())
    assert m.is_weight_sum == pytest.approx(float(want.sum()), rel=1e-5)
    # ratio 1, so each token's loss is -A w
    adv = torch.repeat_interleave(ADVANTAGES, torch.tensor([len(s.token_ids) for s in samples]))
    assert got.loss_sum == pytest.approx(-float((adv * want).sum()), rel=1e-5)
    plain = _trainer(old_logprobs="recompute").micro_batch_grad(0, samples, ADVANTAGES)
    assert not torch.equal(got.flat_grad, plain.flat_grad)


def test_the_histogram_reports_quantiles_within_its_resolution():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(5000, generator=gen) * torch.pow(10.0, torch.empty(5000).uniform_(-8, 0.5, generator=gen))
    values[:200] = 0.0  # agreements
    hist = log_ratio_histogram(values)
    tiny = int((values.abs() < 1e-9).sum())  # the 200 and a few more: the zero bin's
    assert len(hist) == LOG_RATIO_BINS and sum(hist) == 5000 and hist[ZERO_BIN] == tiny > 200
    ordered = sorted(values.tolist())
    for q in (0.05, 0.3, 0.5, 0.7, 0.95):
        exact = ordered[math.ceil(q * len(ordered)) - 1]
        got = histogram_quantile(hist, q)
        if abs(exact) < 1e-9:
            assert got == 0.0
        else:  # same sign, |d| within a factor 10**0.05 of the bin's centre
            assert got * exact > 0 and abs(math.log10(abs(got) / abs(exact))) <= 0.05 + 1e-9, (q, got, exact)
    assert log_ratio_histogram(torch.tensor([25.0, -1e-12]))[LOG_RATIO_BINS - 1] == 1  # beyond 10: the top bin
    assert bin_value(LOG_RATIO_BINS - 1) > 8


def test_later_mini_batches_take_the_step_start_weights():
    """updates_per_step 2: the second mini-batch (prompt 1) trains after the first update; its old
    log-probs are the step-start weights' (the copy taken before that update), so its ratio is not 1
    but exp(logp now - logp at the step's start), and the copy follows the weights step by step."""
    trainer = PolicyTrainer(_model(), AlgorithmConfig(prompts_per_step=2, group_size=4, updates_per_step=2,
                                                      old_logprobs="recompute", lr=0.05), pad_id=0)
    samples = {s.sample_id: s for s in _samples(0) + _samples(1)}
    advantages = {sid: float(ADVANTAGES[sid[2]]) for sid in samples}
    start = _trainer_logprobs(_samples(1))  # prompt 1's log-probs at the initial (step-start) weights
    with pytest.raises(RuntimeError, match="step-start weights"):  # before any update: nothing kept yet
        trainer.micro_batch_grad(0, _samples(1), ADVANTAGES)
    trainer.train_step(list(samples.values()), advantages)
    kept = packed_logprobs(trainer._step_start, pack_batch(_samples(1), pad_id=0), 1.0)
    assert torch.equal(kept, start), "the copy is not the weights the step started from"
    now = packed_logprobs(trainer.model, pack_batch(_samples(1), pad_id=0), 1.0)
    assert not torch.equal(now, start)  # two updates moved the weights
    trainer.train_step(list(samples.values()), advantages)  # the next step: the copy is refreshed
    moved = packed_logprobs(trainer._step_start, pack_batch(_samples(1), pad_id=0), 1.0)
    assert torch.equal(moved, now.detach())
