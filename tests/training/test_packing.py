"""The lean train step (issue 13): a micro-batch is packed into rows without padding between its
sequences, runs one forward, and computes what one sequence at a time computes."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.training import trainer as trainer_mod
from poise.training.trainer import PolicyTrainer, pack_batch, packed_logprobs

VOCAB = 60
RESPONSE_LENGTHS = [5, 30, 1, 0, 17, 30, 2, 9]  # mixed, as a random policy's are (0: stopped at once)


@dataclass(frozen=True)
class _Sample:
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


def _samples(seed: int = 0) -> list[_Sample]:
    rng = random.Random(seed)
    out = []
    for j, n in enumerate(RESPONSE_LENGTHS):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 9))]
        out.append(_Sample((0, j // 4, j % 4), prompt, [rng.randrange(3, VOCAB) for _ in range(n)],
                           [rng.uniform(-5.0, -3.0) for _ in range(n)]))
    return out


def _model(arch: str = "llama") -> torch.nn.Module:
    torch.set_num_threads(1)
    return build_tiny(TinyModelConfig(arch=arch, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                                      max_positions=64), VOCAB, seed=3)


def _one_at_a_time(model: torch.nn.Module, samples, temperature: float) -> list[torch.Tensor]:
    """The reference: each sequence alone through the full HF forward, no packing, no padding."""
    out = []
    for s in samples:
        ids = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
        logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
        p = len(s.prompt_ids)
        logp = torch.log_softmax(logits[p - 1:p - 1 + len(s.token_ids)], -1)
        out.append(logp.gather(-1, torch.tensor(s.token_ids, dtype=torch.long)[:, None]).squeeze(-1))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_logprobs_equal_one_sequence_at_a_time(arch):
    model, samples = _model(arch), _samples()
    batch = pack_batch(samples, pad_id=0)
    # packed: fewer rows than sequences, and fewer token positions than right-padding would use
    assert batch.rows < len(samples)
    assert batch.input_ids.numel() < len(samples) * batch.input_ids.shape[1]
    with torch.no_grad():
        packed = packed_logprobs(model, batch, temperature=0.7)
        expected = _one_at_a_time(model, samples, 0.7)
    flat = torch.cat(expected)
    assert packed.shape == flat.shape == (sum(RESPONSE_LENGTHS),)
    assert flat.std() > 0.1  # real, varying log-probs: a row leaking into its neighbour would show
    torch.testing.assert_close(packed, flat, rtol=0, atol=2e-5)


def test_micro_batch_gradient_equals_the_unpacked_loss_gradient():
    """The whole train computation (packed forward, loss, backward) against the loss written
    directly over one-at-a-time forwards: same loss sum, same gradient."""
    model, samples = _model(), _samples(1)
    cfg = AlgorithmConfig(prompts_per_step=2, group_size=4, clip_eps=0.2)
    trainer = PolicyTrainer(model, cfg, pad_id=0)
    advantages = torch.linspace(-1.5, 1.5, len(samples))
    got = trainer.micro_batch_grad(0, samples, advantages)
    total = 0.0
    for logp, s, a in zip(_one_at_a_time(model, samples, cfg.sampling.temperature), samples, advantages):
        ratio = torch.exp(logp - torch.tensor(s.logprobs))
        total = total - torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a).sum()
    want = torch.autograd.grad(total, trainer.params)
    assert abs(got.loss_sum - float(total.detach())) < 1e-4 and got.tokens == got.normaliser == sum(RESPONSE_LENGTHS)
    # the entropy metric: -sum p log p of each response token's distribution, summed
    entropy = 0.0
    for s in samples:
        ids = torch.tensor([list(s.prompt_ids) + list(s.token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float() / cfg.sampling.temperature
        logp = torch.log_softmax(logits[len(s.prompt_ids) - 1:len(s.prompt_ids) - 1 + len(s.token_ids)], -1)
        entropy += float(-(logp.exp() * logp).sum())
    assert entropy > 1.0 and abs(got.entropy_sum - entropy) < 1e-3 * entropy, (got.entropy_sum, entropy)
    assert max(float(g.abs().max()) for g in got.grads) > 1e-3  # a gradient that could differ
    for g, w in zip(got.grads, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_one_decoder_forward_per_micro_batch_and_one_more_for_the_reference():
    model, ref = _model(), _model().requires_grad_(False)
    calls = {"policy": 0, "ref": 0}
    model.get_decoder().register_forward_hook(lambda *_: calls.__setitem__("policy", calls["policy"] + 1))
    ref.get_decoder().register_forward_hook(lambda *_: calls.__setitem__("ref", calls["ref"] + 1))
    samples = _samples()
    PolicyTrainer(model, AlgorithmConfig(), pad_id=0).micro_batch_grad(0, samples, torch.ones(len(samples)))
    assert calls == {"policy": 1, "ref": 0}
    PolicyTrainer(model, AlgorithmConfig(kl_coef=0.1), 0, ref).micro_batch_grad(0, samples, torch.ones(len(samples)))
    assert calls == {"policy": 2, "ref": 1}


def test_a_reference_built_on_demand_exists_only_while_the_device_trains():
    """The runtime passes a function: the reference is built at the first micro-batch that needs
    it (a rollout device never builds one), freed when the device leaves the trainer, and gives
    the same gradient as a reference passed built."""
    samples = _samples()
    built = []

    def factory():
        built.append(_model().requires_grad_(False).eval())
        return built[-1]

    model = _model()
    lazy = PolicyTrainer(model, AlgorithmConfig(kl_coef=0.1), 0, factory)
    assert built == []
    got = lazy.micro_batch_grad(0, samples, torch.ones(len(samples)))
    lazy.micro_batch_grad(1, samples, torch.ones(len(samples)))
    assert len(built) == 1
    want = PolicyTrainer(model, AlgorithmConfig(kl_coef=0.1), 0, _model().requires_grad_(False).eval()
                         ).micro_batch_grad(0, samples, torch.ones(len(samples)))
    assert torch.equal(got.flat_grad, want.flat_grad)
    lazy.release_reference()
    assert lazy._ref is None
    lazy.micro_batch_grad(2, samples, torch.ones(len(samples)))
    assert len(built) == 2


def test_packing_is_bitwise_repeatable_and_a_function_of_the_micro_batch_only(monkeypatch):
    """Same micro-batch, same bits; the rows come from pack_rows (lengths in sample-id order)."""
    model, samples = _model(), _samples(2)
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    adv = torch.linspace(-1.0, 1.0, len(samples))
    a = trainer.micro_batch_grad(0, samples, adv)
    b = trainer.micro_batch_grad(0, list(samples), adv.clone())
    assert all(torch.equal(x, y) for x, y in zip(a.grads, b.grads))
    seen = []
    real = trainer_mod.pack_rows
    monkeypatch.setattr(trainer_mod, "pack_rows", lambda lengths: seen.append(list(lengths)) or real(lengths))
    trainer.micro_batch_grad(0, samples, adv)
    assert seen == [[len(s.prompt_ids) + len(s.token_ids) for s in samples]]
