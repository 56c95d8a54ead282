"""Off-policy correction presets: the weight each response token's clipped surrogate is multiplied
by, so the update corrects the behaviour policy (the rollout engine's log-probs, which sampled the
tokens) towards the proximal policy of the PPO ratio (the trainer's recomputed log-probs at the
step-start weights). With the PPO ratio taken against the proximal policy this is the decoupled
PPO objective (Hilton et al. 2022, "Batch size-invariance for policy optimization"; AReaL's
objective for samples one or more updates stale).

Shapes: B responses, T response tokens (padded; `mask` is 1 on real tokens). rho_t = exp(old_t -
behaviour_t), the per-token ratio proximal / behaviour.

- token, sequence: truncated importance sampling (TIS; Yao et al. 2025; verl's rollout_is),
  `losses.rollout_is_weights`, unchanged: min(rho_t, cap), or min(prod_t rho_t, cap) per response.
- sequence_mask: sequence-level masked importance sampling (verl's rollout_rs sequence): weight 1
  for every token of a response whose ratio prod_t rho_t lies in [low, high], else 0 (the response
  is masked out of the surrogate).
- geometric_reject: geometric-mean rejection (verl's rollout_rs geometric): the same with the
  length-normalised ratio exp(mean_t (old_t - behaviour_t)).
- icepop: IcePop's token masking (Ling Team 2025, "Every Step Evolves", Ring-1T's masked
  importance-sampling objective): w_t = rho_t where rho_t lies in [low, high], else 0. IcePop keeps the ratio as the
  weight inside the band (its M(k) = k on [alpha, beta]); that is the choice here.

Departure from verl: a masked token keeps its place in the loss normaliser (the step plan's, a
function of the samples' lengths alone, so it is known before any weight is): masking a response
removes its surrogate terms and changes no other response's term (verl drops masked tokens from
the denominator, which rescales every other token of the batch). The KL and entropy terms are not
weighted (`losses.policy_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from poise.algo.losses import ROLLOUT_IS_LEVELS, rollout_is_weights

MASKING_PRESETS = ("sequence_mask", "geometric_reject", "icepop")  # use algorithm.rollout_is_low / _high
CORRECTION_PRESETS = ROLLOUT_IS_LEVELS + MASKING_PRESETS  # algorithm.rollout_is, besides none


@dataclass(frozen=True)
class Correction:
    """Per-token correction of one micro-batch; every field [B, T], meaningful where mask is 1."""

    weights: torch.Tensor  # what each token's clipped surrogate is multiplied by (no gradient)
    truncated: torch.Tensor  # bool: the cap cut the weight (token, sequence)
    masked: torch.Tensor  # bool: the preset masked the token out of the surrogate (weight 0)


def correction_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       preset: str, *, cap: float = 2.0, low: float | None = None,
                       high: float | None = None) -> Correction:
    """The `preset`'s weights, and which tokens it truncated or masked (see the module docstring).

    old_logprobs (proximal policy), behaviour_logprobs (rollout engine), mask: [B, T] (mask float,
    1 on real tokens). `cap` bounds token and sequence; [low, high] is the band the masking
    presets keep (0 < low <= 1 <= high). No gradient flows through the weights.
    """
    if preset in ROLLOUT_IS_LEVELS:
        weights, truncated = rollout_is_weights(old_logprobs, behaviour_logprobs, mask, preset, cap)
        truncated = truncated & (mask > 0)  # a sequence weight's flag is on its padding too
        return Correction(weights, truncated, torch.zeros_like(truncated))
    if preset not in MASKING_PRESETS:
        raise ValueError(f"rollout_is must be one of none, {', '.join(CORRECTION_PRESETS)}, got {preset!r}")
    if low is None or high is None or not 0 < low <= 1 <= high:
        raise ValueError(f"the correction band needs 0 < low <= 1 <= high, got [{low}, {high}]")
    on = mask > 0
    log_rho = torch.where(on, (old_logprobs - behaviour_logprobs).detach(), 0.0)  # padding: ratio 1, never NaN
    if preset == "sequence_mask":
        log_rho = log_rho.sum(dim=1, keepdim=True).expand_as(mask)
    elif preset == "geometric_reject":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        log_rho = (log_rho.sum(dim=1, keepdim=True) / lengths).expand_as(mask)
    rho = torch.exp(log_rho)
    keep = (rho >= low) & (rho <= high)
    kept = rho if preset == "icepop" else torch.ones_like(rho)
    weights = torch.where(keep, kept, torch.zeros_like(rho))
    return Correction(weights, torch.zeros_like(keep), ~keep & on)


__all__ = ["CORRECTION_PRESETS", "MASKING_PRESETS", "Correction", "correction_weights"]
