"""GRPO and its variants (DAPO, Dr. GRPO, GSPO) as pure tensor functions.

Shapes: B responses, T response tokens (padded; `mask` is 1 on real tokens).
References: PPO clipped surrogate, Schulman et al. 2017, eq. 7; GRPO group-normalised
advantages and k3 KL, Shao et al. 2024 (DeepSeekMath), eqs. 3 and 4; DAPO's decoupled clip
("clip-higher") and token-level loss, Yu et al. 2025, eq. 8; Dr. GRPO's constant normaliser,
Liu et al. 2025, eq. 3; GSPO's sequence-level ratio, Zheng et al. 2025, eqs. 5-7 and 10 (the
GSPO-token form); KL estimators k1/k2/k3, Schulman 2020, "Approximating KL divergence";
truncated importance sampling of the rollout/trainer mismatch, Yao et al. 2025, "Your Efficient
RL Framework Secretly Brings You Off-Policy RL Training" (TIS; verl's rollout_is).

Departures: losses return per-token *sums* plus the normaliser separately
(`PolicyLoss.total`, `PolicyLoss.normaliser`) so a step's loss can be accumulated over
micro-batches that arrive one at a time and normalised once at the end (dynamic-batch
pipelining, StreamRL §4.1) without changing the update. The normaliser of a whole mini-batch is
the step plan's (poise.policy.plan.loss_normaliser), a function of the samples' lengths only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGGS = ("token", "sequence", "sequence_sum", "constant")  # algorithm.loss_agg
KL_ESTIMATORS = ("k1", "k2", "k3")  # algorithm.kl_estimator
RATIO_LEVELS = ("token", "sequence")  # algorithm.ratio_level
ROLLOUT_IS_LEVELS = ("token", "sequence")  # algorithm.rollout_is (besides none)


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_eps_low: float,
                      clip_eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r A, clip(r, 1 - low, 1 + high) A) with r = exp(log_ratio).

    log_ratio: [B, T]; advantages: [B] or [B, T]. Returns (loss [B, T], clipped [B, T] bool:
    where the clipped branch was taken). low == high is PPO's clip; high > low is DAPO's
    clip-higher (more room for a rare token's probability to grow).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    clipped = clipped_ratio * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def ppo_clip_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        clip_eps: float, clip_eps_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss with the token ratio r = exp(logp - old); `clip_eps_high` defaults
    to `clip_eps` (symmetric). logprobs, old_logprobs: [B, T]; advantages: [B] or [B, T]."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return clipped_surrogate(logprobs - old_logprobs, advantages, clip_eps, high)


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's log-ratio [B, T] (Zheng et al. 2025, eq. 10): every token of response i has the
    value log s_i = mean over its tokens of (logp - old), the length-normalised sequence ratio, and
    the gradient of its own token's logp (sg[log s_i] + logp - sg[logp]). Averaged per response
    (loss_agg sequence) its gradient is GSPO's, s_i A_i mean_t grad logp_t.

    logprobs, old_logprobs, mask: [B, T] (mask float)."""
    lengths = mask.sum(dim=1).clamp(min=1.0)
    seq = ((logprobs - old_logprobs) * mask).sum(dim=1) / lengths
    return seq.detach()[:, None] + (logprobs - logprobs.detach())


def k1_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimator of KL(pi || ref): logp - ref (unbiased, can be negative). [B, T]."""
    return logprobs - ref_logprobs


def k2_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k2 estimator of KL(pi || ref): (logp - ref)^2 / 2 >= 0 (low variance, biased). [B, T]."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0. [B, T]."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) by `estimator` (k1, k2 or k3). [B, T]."""
    if estimator == "k3":
        return k3_kl(logprobs, ref_logprobs)
    if estimator == "k2":
        return k2_kl(logprobs, ref_logprobs)
    if estimator == "k1":
        return k1_kl(logprobs, ref_logprobs)
    raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's softmax, -sum_v p_v log p_v. logits: [..., V] -> [...]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(torch.exp(logp) * logp).sum(dim=-1)


def rollout_is_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       level: str, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance-sampling weights that correct the behaviour policy (the rollout
    engine's log-probs) towards the old policy of the PPO ratio (the trainer's recomputed ones):
    TIS, Yao et al. 2025; verl's rollout_is. No gradient flows through them.

    token: w_t = min(exp(old_t - behaviour_t), cap). sequence: w_i = min(exp(sum_t (old_t -
    behaviour_t)), cap) over response i's tokens, the same for each of them.
    old_logprobs, behaviour_logprobs, mask: [B, T] (mask float, 1 on real tokens). Returns
    (weights [B, T], truncated [B, T] bool: where the cap cut the weight); both are meaningful on
    masked tokens only.
    """
    if cap < 1:
        raise ValueError(f"the importance-sampling cap must be >= 1, got {cap}")
    log_w = torch.where(mask > 0, (old_logprobs - behaviour_logprobs).detach(), 0.0)  # masked: weight 1, never NaN
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"rollout_is level must be one of {', '.join(ROLLOUT_IS_LEVELS)}, got {level!r}")
    raw = torch.exp(log_w)
    return torch.clamp(raw, max=cap), raw > cap


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str,
              max_response: int | None = None) -> tuple[torch.Tensor, float]:
    """A micro-batch's (sum to divide, normaliser) of per-token losses [B, T] (mask float [B, T]).

    token: every response token summed; normaliser = tokens (DAPO's token-level mean; verl
    token-mean). sequence: each response's token mean, summed; normaliser = responses (GRPO eq. 3;
    verl seq-mean-token-mean). sequence_sum: every token summed; normaliser = responses (verl
    seq-mean-token-sum). constant: every token summed and divided by `max_response`; normaliser =
    responses, so the step divides by responses x max_response, a constant (Dr. GRPO; verl
    seq-mean-token-sum-norm; TRL loss_type dr_grpo).
    """
    masked = per_token * mask
    if agg == "token":
        return masked.sum(), float(mask.sum())
    if agg == "sequence":
        lengths = mask.sum(dim=1).clamp(min=1.0)
        return (masked.sum(dim=1) / lengths).sum(), float(mask.shape[0])
    if agg == "sequence_sum":
        return masked.sum(), float(mask.shape[0])
    if agg == "constant":
        if not max_response or max_response < 1:
            raise ValueError(f"loss_agg constant needs max_response >= 1 (sampling.max_new_tokens), got {max_response}")
        return masked.sum() / float(max_response), float(mask.shape[0])
    raise ValueError(f"agg must be one of {', '.join(LOSS_AGGS)}, got {agg!r}")


@dataclass
class PolicyLoss:
    total: torch.Tensor  # scalar: sum of the aggregated per-token losses of this micro-batch
    normaliser: float  # what `total` is divided by for the whole step (tokens or responses)
    clipped_tokens: int
    kl_sum: float
    clipped_responses: int = 0  # responses with a clipped token (ratio_level sequence: whose ratio was clipped)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                *, clip_eps_low: float, clip_eps_high: float, ratio_level: str = "token", agg: str = "token",
                max_response: int | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                ref_logprobs: torch.Tensor | None = None, entropy_coef: float = 0.0,
                entropy: torch.Tensor | None = None, is_weights: torch.Tensor | None = None) -> PolicyLoss:
    """The clipped policy-gradient objective of one micro-batch, as a sum to be divided by the
    step's normaliser: per token, the clipped surrogate (token or sequence ratio) times
    `is_weights` if given (`rollout_is_weights`: the KL and entropy terms are not weighted), plus
    kl_coef times the KL estimate to the reference, minus entropy_coef times the policy's
    entropy; then aggregated by `agg` (see `aggregate`).

    logprobs, old_logprobs, ref_logprobs, entropy, is_weights, mask: [B, T]; advantages: [B].
    """
    mask = mask.to(logprobs.dtype)
    # a masked position (padding, an episode's observation token) gets ratio 1 from its own log-prob,
    # so whatever its old log-prob holds (an environment's token has none) cannot reach the sum or
    # the gradient as inf * 0 = NaN; unmasked positions keep their values bit for bit
    old_logprobs = torch.where(mask > 0, old_logprobs, logprobs.detach())
    if ratio_level == "token":
        log_ratio = logprobs - old_logprobs
    elif ratio_level == "sequence":
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)
    else:
        raise ValueError(f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {ratio_level!r}")
    per_token, clipped = clipped_surrogate(log_ratio, advantages, clip_eps_low, clip_eps_high)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    kl_sum = 0.0
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_estimate(logprobs, ref_logprobs, kl_estimator)
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    if entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy of each response token")
        per_token = per_token - entropy_coef * entropy
    total, normaliser = aggregate(per_token, mask, agg, max_response)
    clipped = clipped & mask.bool()
    return PolicyLoss(total, normaliser, int(clipped.sum()), kl_sum, int(clipped.any(dim=1).sum()))


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, kl_coef: float = 0.0,
              ref_logprobs: torch.Tensor | None = None, agg: str = "token") -> PolicyLoss:
    """GRPO with PPO's symmetric clip and the k3 KL: `policy_loss` with its defaults.

    logprobs, old_logprobs, ref_logprobs, mask: [B, T]; advantages: [B].
    agg "token": sum over every response token (normaliser = token count; DAPO's token mean).
    agg "sequence": each response's token mean, summed over responses (normaliser = responses;
    the original GRPO eq. 3).
    """
    return policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps_low=clip_eps, clip_eps_high=clip_eps,
                       agg=agg, kl_coef=kl_coef, ref_logprobs=ref_logprobs)
