"""The rollout/trainer log-prob mismatch of a step, as statistics that add up over micro-batches.

The rollout engine's log-prob of a sampled token (the behaviour policy's) and the trainer's
log-prob of the same token under the same weights can differ: another kernel (vLLM), another
dtype (bf16), another reduction order. Each micro-batch of a step's first mini-batch (whose
forward runs at the step-start weights) reports `MismatchStats`; the step's numbers are their
sums, in micro-batch index order, so they come out the same bits whatever the split of the
micro-batches over devices (docs/design.md invariant 1). In async mode a step's samples come from
the weights one update older (invariant 4), so the difference includes that update's change too.

Quantiles do not add up over micro-batches; a fixed-grid histogram does. The signed log-ratio
d = trainer logp - rollout logp of each token goes into one of `LOG_RATIO_BINS` bins: |d| < 1e-9
(the zero bin, reported as d = 0), or |d| in one of 100 log-spaced magnitude bins per sign, 10 per
decade from 1e-9 to 10 (|d| >= 10 counts in the top bin). A quantile is reported as its bin's
geometric centre: within a factor 10**0.05 (about 12%) of the true |d| in [1e-9, 10).

With an off-policy correction (algorithm.rollout_is) each micro-batch also counts the log of its
tokens' weights on the same grid, with the zero weights (masked tokens) counted apart below it:
`correction_metrics` reads the step's weight quantiles off the merged counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

PER_DECADE = 10
LOWEST, HIGHEST = -9, 1  # magnitude bins span 10**LOWEST .. 10**HIGHEST
MAGNITUDE_BINS = PER_DECADE * (HIGHEST - LOWEST)  # per sign: 100
LOG_RATIO_BINS = 2 * MAGNITUDE_BINS + 1  # negative bins (most negative first), the zero bin, positive bins
ZERO_BIN = MAGNITUDE_BINS
# |d| >= MAGNITUDE_EDGES[k] and < MAGNITUDE_EDGES[k + 1]: magnitude bin k; below MAGNITUDE_EDGES[0]: zero bin
MAGNITUDE_EDGES = tuple(10.0 ** (LOWEST + k / PER_DECADE) for k in range(MAGNITUDE_BINS + 1))


def bin_value(index: int) -> float:
    """The signed log-ratio a histogram bin stands for: 0 for the zero bin, else the geometric
    centre of its magnitude range, with the bin's sign."""
    if not 0 <= index < LOG_RATIO_BINS:
        raise ValueError(f"bin {index} outside 0..{LOG_RATIO_BINS - 1}")
    if index == ZERO_BIN:
        return 0.0
    k = abs(index - ZERO_BIN) - 1  # magnitude bin
    magnitude = 10.0 ** (LOWEST + (k + 0.5) / PER_DECADE)
    return magnitude if index > ZERO_BIN else -magnitude


def histogram_quantile(hist: Sequence[int], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of the log-ratios counted in `hist` (LOG_RATIO_BINS counts), as
    its bin's value: the bin holding the ceil(q * N)-th smallest of the N values (the smallest for
    q = 0). An empty histogram gives 0 (ratio 1)."""
    total = sum(hist)
    if total == 0:
        return 0.0
    return _value_of_rank(hist, max(1, math.ceil(q * total)))


def _value_of_rank(hist: Sequence[int], rank: int) -> float:
    """The value of the bin holding the rank-th smallest (1-based) of the values counted in `hist`."""
    seen = 0
    for index, count in enumerate(hist):
        seen += count
        if seen >= rank:
            return bin_value(index)
    raise AssertionError("unreachable: the ranks end at the total")


@dataclass(frozen=True)
class MismatchStats:
    """One micro-batch's share of its step's mismatch statistics: all zero (and `hist` empty)
    outside the step's first mini-batch. `is_weight_sum` is None without a rollout_is correction."""

    tokens: int = 0  # response tokens measured (those of the step's first mini-batch)
    abs_sum: float = 0.0  # sum over them of |trainer logp - rollout logp|
    abs_max: float = 0.0  # the largest of those
    hist: tuple[int, ...] = ()  # LOG_RATIO_BINS counts of trainer logp - rollout logp; () when tokens is 0
    is_tokens: int = 0  # response tokens weighted by the truncated importance-sampling correction
    is_weight_sum: float | None = None  # their weights' sum (after truncation)
    is_truncated: int = 0  # of those tokens, the ones whose weight the cap cut
    is_masked: int = 0  # of those tokens, the ones the correction masked out of the surrogate (weight 0)
    is_zero: int = 0  # of those tokens, the ones of weight 0 (masked, or an underflow), which have no log
    is_weight_max: float = 0.0  # the largest of their weights
    is_hist: tuple[int, ...] = ()  # LOG_RATIO_BINS counts of log(weight) of the others (weight > 0)


def mismatch_metrics(parts: Sequence[MismatchStats]) -> dict[str, float]:
    """A step's `mismatch/...` metrics from its micro-batches' MismatchStats, in index order: the
    mean and largest |trainer logp - rollout logp| and the 5th/50th/95th percentile of the ratio
    exp(trainer logp - rollout logp) over the first mini-batch's response tokens, and with a
    rollout_is correction the mean weight and the share of tokens whose weight was cut at the cap.
    A step that measured no token (emulated compute has no log-probs) has none of them."""
    out: dict[str, float] = {}
    tokens = sum(p.tokens for p in parts)
    if tokens:
        hist = _merged([p.hist for p in parts])
        out["mismatch/logp_abs_diff_mean"] = sum(p.abs_sum for p in parts) / tokens
        out["mismatch/logp_abs_diff_max"] = max(p.abs_max for p in parts)
        for q in (5, 50, 95):
            out[f"mismatch/ratio_p{q:02d}"] = math.exp(histogram_quantile(hist, q / 100))
    weighted = [p for p in parts if p.is_weight_sum is not None]
    if weighted:
        is_tokens = max(1, sum(p.is_tokens for p in weighted))
        out["mismatch/is_weight_mean"] = sum(p.is_weight_sum for p in weighted) / is_tokens
        out["mismatch/is_truncated_frac"] = sum(p.is_truncated for p in weighted) / is_tokens
    return out


def _merged(hists: Sequence[tuple[int, ...]]) -> list[int]:
    total = [0] * LOG_RATIO_BINS
    for hist in hists:
        for i, count in enumerate(hist):
            total[i] += count
    return total


def correction_metrics(parts: Sequence[MismatchStats]) -> dict[str, float]:
    """A step's `correction/...` metrics from its micro-batches' MismatchStats (index order), with a
    rollout_is correction: the 5th/50th/95th percentile and the largest of the per-token weights over
    every trained token of the step, and the shares of those tokens the cap truncated and the preset
    masked. Quantiles come off the merged fixed-grid histogram of log(weight) with the zero weights
    counted below it (a quantile among them is 0): exact counts that add up over micro-batches and
    devices in any order, each quantile within its bin's resolution (module docstring)."""
    weighted = [p for p in parts if p.is_weight_sum is not None]
    tokens = sum(p.is_tokens for p in weighted)
    if not tokens:
        return {}
    hist, zeros = _merged([p.is_hist for p in weighted]), sum(p.is_zero for p in weighted)
    out = {}
    for q in (5, 50, 95):
        rank = max(1, math.ceil(q / 100 * tokens))
        out[f"correction/is_weight_p{q:02d}"] = 0.0 if rank <= zeros else math.exp(_value_of_rank(hist, rank - zeros))
    out["correction/is_weight_max"] = max(p.is_weight_max for p in weighted)
    out["correction/truncated_frac"] = sum(p.is_truncated for p in weighted) / tokens
    out["correction/masked_frac"] = sum(p.is_masked for p in weighted) / tokens
    return out


__all__ = ["LOG_RATIO_BINS", "MAGNITUDE_EDGES", "ZERO_BIN", "MismatchStats", "bin_value", "histogram_quantile",
           "correction_metrics", "mismatch_metrics"]
