import math
import random

import pytest
import torch

from poise.algo.advantages import group_advantages
from poise.algo.losses import (aggregate, clipped_surrogate, grpo_loss, k3_kl, kl_estimate, policy_loss,
                               ppo_clip_token_loss, rollout_is_weights, sequence_log_ratio, token_entropy)


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


def test_clip_higher_by_hand():
    # r = 1.25 with A = +1: PPO's 0.2 clips it to 1.2; clip-higher 0.28 leaves it (1.25 < 1.28).
    # r = 0.7 with A = -1: the low side 0.2 clips it to 0.8: -min(-0.7, -0.8) = 0.8.
    logp = torch.tensor([[math.log(1.25), math.log(0.7)]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    sym, sym_clipped = ppo_clip_token_loss(logp, old, adv, clip_eps=0.2)
    assert sym[0].tolist() == pytest.approx([-1.2, 0.8], abs=1e-6)
    assert sym_clipped[0].tolist() == [True, True]
    high, high_clipped = clipped_surrogate(logp - old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    assert high[0].tolist() == pytest.approx([-1.25, 0.8], abs=1e-6)
    assert high_clipped[0].tolist() == [False, True]


def test_sequence_log_ratio_by_hand():
    # logp - old = [0.2, 0.4] and [0.3, (pad)] -> each response's mean 0.3 on all its tokens
    logp = torch.tensor([[0.2, 0.4], [0.3, 9.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    seq = sequence_log_ratio(logp, old, mask)
    assert (seq * mask).flatten().tolist() == pytest.approx([0.3, 0.3, 0.3, 0.0], abs=1e-6)
    # the gradient of each token's value is its own logp's (the mean is a stop-gradient value)
    (g,) = torch.autograd.grad((seq * mask).sum(), logp)
    assert g.tolist() == [[1.0, 1.0], [1.0, 0.0]]


def test_gspo_loss_by_hand():
    # one response, logp - old = [0.2, -0.2], A = 1, wide clip. Sequence ratio exp(mean) = 1 on both
    # tokens: loss per token -1, sequence mean -1, gradient -1/2 per token (GSPO: s A mean_t grad logp).
    logp = torch.tensor([[0.2, -0.2]], requires_grad=True)
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    seq = policy_loss(logp, old, adv, mask, clip_eps_low=0.5, clip_eps_high=0.5, ratio_level="sequence",
                      agg="sequence")
    assert seq.total.item() == pytest.approx(-1.0, abs=1e-6)
    assert torch.autograd.grad(seq.total, logp)[0][0].tolist() == pytest.approx([-0.5, -0.5], abs=1e-6)
    # the token ratio instead: -(e^0.2 + e^-0.2) / 2 and gradients -e^0.2 / 2, -e^-0.2 / 2
    tok = policy_loss(logp, old, adv, mask, clip_eps_low=0.5, clip_eps_high=0.5, agg="sequence")
    assert tok.total.item() == pytest.approx(-(math.exp(0.2) + math.exp(-0.2)) / 2, abs=1e-6)
    assert torch.autograd.grad(tok.total, logp)[0][0].tolist() == pytest.approx(
        [-math.exp(0.2) / 2, -math.exp(-0.2) / 2], abs=1e-6)
    # GSPO's tight clip: exp(0.3) > 1 + 4e-4 with A > 0 clips the whole response: no gradient
    logp2 = torch.tensor([[0.2, 0.4]], requires_grad=True)
    clipped = policy_loss(logp2, old, adv, mask, clip_eps_low=3e-4, clip_eps_high=4e-4, ratio_level="sequence",
                          agg="sequence")
    assert clipped.total.item() == pytest.approx(-(1 + 4e-4), abs=1e-6)
    assert clipped.clipped_tokens == 2
    assert torch.autograd.grad(clipped.total, logp2)[0].tolist() == [[0.0, 0.0]]


def test_kl_estimators_by_hand():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    # logp - ref = ln 2
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert kl_estimate(ref, logp, "k1").item() == pytest.approx(-math.log(2), abs=1e-6)  # k1 can be negative
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, ref, "k4")
    # in the loss: A = 0, ratio 1 -> the total is kl_coef x k2
    out = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), clip_eps_low=0.2, clip_eps_high=0.2,
                      kl_coef=0.1, kl_estimator="k2", ref_logprobs=ref)
    assert out.total.item() == pytest.approx(0.1 * 0.5 * math.log(2) ** 2, abs=1e-6)
    assert out.kl_sum == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)


def test_entropy_by_hand():
    # logits [0, 0]: H = ln 2; logits [0, ln 3]: p = [1/4, 3/4], H = 1/4 ln 4 + 3/4 ln(4/3) = 0.562335
    h = token_entropy(torch.tensor([[0.0, 0.0], [0.0, math.log(3)]]))
    assert h.tolist() == pytest.approx([math.log(2), 0.25 * math.log(4) + 0.75 * math.log(4 / 3)], abs=1e-6)
    # the bonus: A = 0, ratio 1, entropy ln 2 on one token, coef 0.1 -> total -0.1 ln 2
    logp = torch.zeros(1, 1)
    out = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), clip_eps_low=0.2, clip_eps_high=0.2,
                      entropy_coef=0.1, entropy=torch.tensor([[math.log(2)]]))
    assert out.total.item() == pytest.approx(-0.1 * math.log(2), abs=1e-6)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), clip_eps_low=0.2, clip_eps_high=0.2,
                    entropy_coef=0.1)


def test_loss_aggregation_modes_by_hand():
    # per-token losses [1, 2] and [3, (pad 100)]
    per_token = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    total, n = aggregate(per_token, mask, "token")
    assert (total.item(), n) == (6.0, 3.0)  # 6 / 3 tokens
    total, n = aggregate(per_token, mask, "sequence")
    assert (total.item(), n) == (4.5, 2.0)  # (1.5 + 3) / 2 responses
    total, n = aggregate(per_token, mask, "sequence_sum")
    assert (total.item(), n) == (6.0, 2.0)  # (3 + 3) / 2 responses
    total, n = aggregate(per_token, mask, "constant", max_response=4)
    assert (total.item(), n) == (1.5, 2.0)  # 6 / (2 responses x 4 tokens)
    with pytest.raises(ValueError, match="max_response"):
        aggregate(per_token, mask, "constant")
    with pytest.raises(ValueError, match="mean"):
        aggregate(per_token, mask, "mean")


def test_grpo_loss_is_policy_loss_with_its_defaults():
    """The default knobs are today's GRPO, bit for bit."""
    g = torch.Generator().manual_seed(0)
    logp, old, ref = (torch.randn(3, 5, generator=g) for _ in range(3))
    adv, mask = torch.randn(3, generator=g), (torch.rand(3, 5, generator=g) > 0.3).float()
    for agg in ("token", "sequence"):
        a = grpo_loss(logp, old, adv, mask, 0.2, 0.05, ref, agg)
        b = policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2, agg=agg, kl_coef=0.05,
                        kl_estimator="k3", ref_logprobs=ref, ratio_level="token", entropy_coef=0.0)
        assert a.total.numpy().tobytes() == b.total.numpy().tobytes()
        assert (a.normaliser, a.clipped_tokens, a.kl_sum) == (b.normaliser, b.clipped_tokens, b.kl_sum)


def test_rollout_is_weights_token_by_hand():
    # old - behaviour per token: 1 (exp 2.718 -> cut at the cap 2), -0.5 (0.6065), -1 (0.3679); the 4th is padding
    old = torch.tensor([[0.0, 0.0, -1.0, 0.0]])
    behaviour = torch.tensor([[-1.0, 0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, cut = rollout_is_weights(old, behaviour, mask, "token", cap=2.0)
    assert w[0, :3].tolist() == pytest.approx([2.0, math.exp(-0.5), math.exp(-1.0)], abs=1e-6)
    assert cut[0, :3].tolist() == [True, False, False]
    w, cut = rollout_is_weights(old, behaviour, mask, "token", cap=3.0)  # a cap that does not bite
    assert w[0, 0].item() == pytest.approx(math.e, abs=1e-6) and not cut[0, :3].any()


def test_rollout_is_weights_sequence_by_hand():
    # response 0: 1 - 0.5 - 1 = -0.5 -> exp(-0.5) = 0.6065 on each of its tokens;
    # response 1: 0.3 + 0.6 = 0.9 -> exp(0.9) = 2.4596, cut at 2 on each of its tokens (its padding adds nothing)
    old = torch.tensor([[0.0, 0.0, -1.0], [0.3, 0.0, 7.0]])
    behaviour = torch.tensor([[-1.0, 0.5, 0.0], [0.0, -0.6, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, cut = rollout_is_weights(old, behaviour, mask, "sequence", cap=2.0)
    assert w[0].tolist() == pytest.approx([math.exp(-0.5)] * 3, abs=1e-6)
    assert w[1, :2].tolist() == [2.0, 2.0] and cut[1, :2].tolist() == [True, True] and not cut[0].any()
    w, _ = rollout_is_weights(old, behaviour, mask, "sequence", cap=2.5)
    assert w[1, :2].tolist() == pytest.approx([math.exp(0.9)] * 2, abs=1e-5)
    with pytest.raises(ValueError, match="cap"):
        rollout_is_weights(old, behaviour, mask, "token", cap=0.5)
    with pytest.raises(ValueError, match="token, sequence"):
        rollout_is_weights(old, behaviour, mask, "prompt", cap=2.0)


def test_is_weights_scale_the_surrogate_not_the_kl():
    """Ratio 1 (logp == old), advantages +1: each token's surrogate is -1, times its weight; the
    k1 KL term (logp - ref = 0.5 per token, kl_coef 0.1) is added unweighted. The weight has no
    gradient: d total / d logp_t = -A w_t + kl_coef."""
    logp = torch.zeros(1, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights = torch.tensor([[2.0, 0.5, 9.0]], requires_grad=True)  # the padded token's weight must not count
    out = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask, clip_eps_low=0.2, clip_eps_high=0.2,
                      kl_coef=0.1, kl_estimator="k1", ref_logprobs=torch.full((1, 3), -0.5), is_weights=weights)
    # -(2 + 0.5) + 0.1 * (0.5 + 0.5) = -2.4
    assert out.total.item() == pytest.approx(-2.4, abs=1e-6)
    (g,) = torch.autograd.grad(out.total, logp)
    assert g[0].tolist() == pytest.approx([-2.0 + 0.1, -0.5 + 0.1, 0.0], abs=1e-6)
    plain = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask, clip_eps_low=0.2, clip_eps_high=0.2)
    assert plain.total.item() == pytest.approx(-2.0)  # without weights: one per token
