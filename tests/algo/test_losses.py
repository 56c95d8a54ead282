import math
import random

import pytest
import torch

from poise.algo.advantages import group_advantages
from poise.algo.losses import grpo_loss, k3_kl, ppo_clip_token_loss


def test_group_advantages_by_hand():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    # mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> +-0.866025
    assert adv == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0, 0.0]  # equal rewards carry no signal
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale=False) == [0.5, -0.5, -0.5, 0.5]


def test_group_advantages_rejects_single_response_groups():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages([1.0])


def test_a_groups_advantages_depend_on_its_rewards_alone():
    """The runtime computes a group when its last reward arrives, the colocated loop all groups of
    a step, one by one: a group's bits may depend on nothing but its rewards (a row of a batched
    torch reduction got other bits than the same row alone, on an AVX-512 machine). The function
    takes one group, so no company can enter; this checks the order the rewards are listed in."""
    rng = random.Random(0)
    for _ in range(200):
        rewards = [rng.choice([0.0, 1.0, 0.1, 1 / 3, 0.0625]) * rng.random() for _ in range(rng.randint(2, 16))]
        adv = group_advantages(rewards)
        order = list(range(len(rewards)))
        rng.shuffle(order)
        shuffled = group_advantages([rewards[i] for i in order])
        assert [shuffled[order.index(i)] for i in range(len(rewards))] == adv


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
