"""GRPO and PPO-clip as pure tensor functions.

Shapes: B responses, T response tokens (padded; `mask` is 1 on real tokens).
References: PPO clipped surrogate, Schulman et al. 2017, eq. 7; GRPO group-normalised
advantages and k3 KL, Shao et al. 2024 (DeepSeekMath), eqs. 3 and 4.

Departures: losses return per-token *sums* plus the normaliser separately
(`PolicyLoss.total`, `PolicyLoss.normaliser`) so a step's loss can be accumulated over
micro-batches that arrive one at a time and normalised once at the end (dynamic-batch
pipelining, StreamRL §4.1) without changing the update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def ppo_clip_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss, -min(r A, clip(r, 1-eps, 1+eps) A) with r = exp(logp - old).

    logprobs, old_logprobs: [B, T]; advantages: [B] or [B, T]. Returns (loss [B, T],
    clipped [B, T] bool: where the clipped branch was taken).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    clipped = clipped_ratio * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0. [B, T]."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


@dataclass
class PolicyLoss:
    total: torch.Tensor  # scalar: sum of the aggregated per-token losses of this micro-batch
    normaliser: float  # what `total` is divided by for the whole step (tokens or responses)
    clipped_tokens: int
    kl_sum: float


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, kl_coef: float = 0.0,
              ref_logprobs: torch.Tensor | None = None, agg: str = "token") -> PolicyLoss:
    """GRPO objective of one micro-batch, as a sum to be divided by the step's normaliser.

    logprobs, old_logprobs, ref_logprobs, mask: [B, T]; advantages: [B].
    agg "token": sum over every response token (normaliser = token count; DAPO's token mean).
    agg "sequence": each response's token mean, summed over responses (normaliser = responses;
    the original GRPO eq. 3).
    """
    mask = mask.to(logprobs.dtype)
    per_token, clipped = ppo_clip_token_loss(logprobs, old_logprobs, advantages, clip_eps)
    kl_sum = 0.0
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    if agg == "token":
        total, normaliser = (per_token * mask).sum(), float(mask.sum())
    elif agg == "sequence":
        lengths = mask.sum(dim=1).clamp(min=1.0)
        total, normaliser = ((per_token * mask).sum(dim=1) / lengths).sum(), float(mask.shape[0])
    else:
        raise ValueError(f"agg must be 'token' or 'sequence', got {agg!r}")
    return PolicyLoss(total, normaliser, int((clipped & mask.bool()).sum()), kl_sum)
