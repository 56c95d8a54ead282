"""An episode trains on its model tokens only: observation tokens move no gradient whatever values
they carry, and the loss normaliser counts model tokens (hand-computed)."""

from __future__ import annotations

import math

import pytest
import torch

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.policy.plan import loss_normaliser
from poise.training.trainer import PolicyTrainer, trained_tokens
from poise.types import Sample

VOCAB = 60
# an episode: model turn [7, 8, 2], observation [20, 21, 22], model turn [9, 2]
EPISODE_TOKENS = (7, 8, 2, 20, 21, 22, 9, 2)
EPISODE_MASK = (1, 1, 1, 0, 0, 0, 1, 1)
PROMPT = (1, 30, 31, 32)


def _episode(sid, observation_logprob: float = 0.0) -> Sample:
    logprobs = tuple(-2.5 if m else observation_logprob for m in EPISODE_MASK)
    return Sample(sid, PROMPT, EPISODE_TOKENS, logprobs, "eos", 0, 0.0, 0.0, 4, turn=2, loss_mask=EPISODE_MASK)


def _trainer(**knobs) -> PolicyTrainer:
    torch.set_num_threads(1)
    model = build_tiny(TinyModelConfig(arch="llama", hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                                       max_positions=64), VOCAB, seed=5)
    cfg = AlgorithmConfig(prompts_per_step=1, group_size=2, micro_batch_size=2, **knobs)
    return PolicyTrainer(model, cfg, pad_id=0)


@pytest.mark.parametrize("knobs", [{"old_logprobs": "rollout"},
                                   {"old_logprobs": "recompute", "rollout_is": "token"},
                                   {"old_logprobs": "recompute", "rollout_is": "sequence"}],
                         ids=["rollout", "recompute-token-is", "recompute-sequence-is"])
def test_observation_tokens_move_no_gradient_whatever_they_carry(knobs):
    """The engine gives an observation token no log-prob (0.0 here); a huge one (+-1e30) in its
    place must change no bit of the gradient (without the mask it would be NaN or inf)."""
    grads = {}
    for value in (0.0, 1e30, -1e30):
        trainer = _trainer(**knobs)
        samples = [_episode((0, 0, 0), value), _episode((0, 0, 1), value)]
        result = trainer.micro_batch_grad(0, samples, torch.tensor([1.0, -0.5]))
        assert torch.isfinite(result.flat_grad).all(), (knobs, value)
        grads[value] = result.flat_grad
    assert grads[0.0].abs().sum() > 0
    assert torch.equal(grads[0.0], grads[1e30]) and torch.equal(grads[0.0], grads[-1e30])


def test_the_gradient_is_the_model_tokens_alone_by_hand():
    """At ratio 1 (recompute: the first update), the token-level loss of one episode with advantage
    A is -A * sum of log p(model token | everything before it): computed here directly on the model,
    over the five model tokens only, it gives the trainer's gradient."""
    trainer = _trainer(old_logprobs="recompute")
    advantage = 0.75
    result = trainer.micro_batch_grad(0, [_episode((0, 0, 0)), _episode((0, 0, 1))],
                                      torch.tensor([advantage, 0.0]))
    model = trainer.model
    model.zero_grad(set_to_none=True)
    ids = torch.tensor([PROMPT + EPISODE_TOKENS])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    total = 0.0
    for t, (token, on) in enumerate(zip(EPISODE_TOKENS, EPISODE_MASK)):
        if on:  # token t is predicted at position len(PROMPT) - 1 + t
            total = total - advantage * logp[len(PROMPT) - 1 + t, token]
    total.backward()
    by_hand = torch.cat([p.grad.reshape(-1) for p in trainer.params])
    assert by_hand.abs().sum() > 0
    torch.testing.assert_close(result.flat_grad, by_hand, rtol=1e-4, atol=1e-6)
    assert result.tokens == 2 * sum(EPISODE_MASK)  # the micro-batch's trained tokens: 10 of 16


def test_the_normaliser_counts_model_tokens_only():
    """Two episodes of 8 and 5 tokens with 5 and 2 model tokens: token-level normaliser 7 (not 13);
    per-sequence normalisers count episodes (2)."""
    a = _episode((0, 0, 0))
    b = Sample((0, 0, 1), PROMPT, (7, 2, 20, 21, 2), (-1.0, -1.0, 0.0, 0.0, -1.0), "eos", 0, 0.0, 0.0, 4, turn=2,
               loss_mask=(1, 1, 0, 0, 1))
    assert [trained_tokens(a), trained_tokens(b)] == [5, 3]
    assert loss_normaliser([[trained_tokens(a)], [trained_tokens(b)]], "token") == 8.0
    assert loss_normaliser([[trained_tokens(a), trained_tokens(b)]], "sequence") == 2.0
    single = Sample((0, 0, 2), PROMPT, (7, 8, 2), (-1.0,) * 3, "eos", 0, 0.0, 0.0, 4)
    assert trained_tokens(single) == 3  # a single answer: every token


def test_the_train_step_divides_by_model_tokens():
    """One update of two episodes: the step's gradient is the summed micro-batch gradient over 10
    model tokens (the 6 observation tokens count nowhere); a wrong normaliser (16) gives another
    gradient norm."""
    trainer = _trainer(old_logprobs="recompute")
    samples = [_episode((0, 0, 0)), _episode((0, 0, 1))]
    summed = trainer.micro_batch_grad(0, samples, torch.tensor([1.0, -1.0])).flat_grad
    fresh = _trainer(old_logprobs="recompute")
    stats = fresh.train_step(samples, {(0, 0, 0): 1.0, (0, 0, 1): -1.0})
    expected = float(torch.linalg.vector_norm(summed / 10.0))
    assert math.isclose(stats["grad_norm"], expected, rel_tol=1e-5), (stats["grad_norm"], expected)
    assert not math.isclose(stats["grad_norm"], float(torch.linalg.vector_norm(summed / 16.0)), rel_tol=1e-3)


def test_the_log_prob_mismatch_counts_model_tokens_only():
    """An observation token has no behaviour log-prob (0.0): the trainer-vs-rollout mismatch of the
    first mini-batch is measured over the 10 model tokens only, not over the 16."""
    trainer = _trainer(old_logprobs="recompute")
    result = trainer.micro_batch_grad(0, [_episode((0, 0, 0)), _episode((0, 0, 1))], torch.tensor([1.0, -1.0]))
    assert result.mismatch.tokens == 2 * sum(EPISODE_MASK)
    # the model tokens' behaviour log-prob is -2.5; a random model's is about -log(60) = -4.1
    assert result.mismatch.abs_max < 5.0, result.mismatch
