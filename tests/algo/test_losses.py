import math

import pytest
import torch

from poise.algo.losses import group_advantages, grpo_loss, k3_kl, ppo_clip_token_loss


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(rewards, eps=0.0 + 1e-6)
    # group 0: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> +-0.866025
    assert adv[0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # equal rewards carry no signal
    centred = group_advantages(rewards, scale=False)
    assert centred[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_group_advantages_rejects_single_response_groups():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.tensor([[1.0], [0.0]]))


def test_ppo_clip_by_hand():
    # ratios exp(0.5)=1.6487 (A=+1 -> clipped at 1.2), exp(-0.5)=0.6065 (A=+1 -> unclipped 0.6065),
    # exp(0.5) with A=-1 -> -min(-1.6487, -1.2) = 1.6487 (unclipped branch is the pessimistic one).
    logp = torch.tensor([[0.5, -0.5, 0.5]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, clipped = ppo_clip_token_loss(logp, old, adv, clip_eps=0.2)
    assert loss[0].tolist() == pytest.approx([-1.2, -math.exp(-0.5), math.exp(0.5)], abs=1e-6)
    assert clipped[0].tolist() == [True, False, False]


def test_k3_kl_by_hand():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    # exp(ref - logp) - (ref - logp) - 1 = 0.5 - ln(0.5) - 1 = 0.193147
    assert k3_kl(logp, ref).item() == pytest.approx(0.5 - math.log(0.5) - 1, abs=1e-6)
    assert k3_kl(logp, logp).item() == 0.0


def test_grpo_loss_aggregation_by_hand():
    # two responses: lengths 2 and 1; advantages +1 and -2; ratio 1 everywhere (logp == old).
    logp = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    tok = grpo_loss(logp, logp.detach(), adv, mask, clip_eps=0.2, agg="token")
    # per-token loss = -A: [-1, -1] and [2]; sum = 0; normaliser = 3 tokens
    assert tok.total.item() == pytest.approx(0.0)
    assert tok.normaliser == 3.0
    seq = grpo_loss(logp, logp.detach(), adv, mask, clip_eps=0.2, agg="sequence")
    # per-response means: -1 and 2 -> sum 1; normaliser = 2 responses
    assert seq.total.item() == pytest.approx(1.0)
    assert seq.normaliser == 2.0
    # gradient of the token sum w.r.t. logp is -A * mask (ratio'(0) = 1)
    (g,) = torch.autograd.grad(tok.total, logp)
    assert g.tolist() == [[-1.0, -1.0], [2.0, 0.0]]


def test_grpo_loss_with_kl():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    out = grpo_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), 0.2, kl_coef=0.1, ref_logprobs=ref)
    assert out.total.item() == pytest.approx(0.1 * (0.5 - math.log(0.5) - 1), abs=1e-6)
