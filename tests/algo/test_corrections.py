"""Off-policy correction presets (algo/corrections.py), each against weights worked out by hand.

Three responses, behaviour log-prob -1 on every token and old = behaviour + log(rho), so the
per-token ratios rho = exp(old - behaviour) are the numbers written below:

    response 0: rho = 2.0, 0.4, 1.5   product 1.2    geometric mean 1.2 ** (1/3) = 1.06266
    response 1: rho = 6.0, 1.25, pad  product 7.5    geometric mean 7.5 ** (1/2) = 2.73861
    response 2: rho = 0.25, pad, pad  product 0.25   geometric mean 0.25

The padding holds NaN log-probs: nothing of them may reach a weight.
"""

from __future__ import annotations

import math
import typing

import pytest
import torch

from poise.algo.corrections import CORRECTION_PRESETS, correction_weights
from poise.algo.losses import policy_loss
from poise.config import AlgorithmConfig

NAN = float("nan")
RHO = [[2.0, 0.4, 1.5], [6.0, 1.25, NAN], [0.25, NAN, NAN]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
ON = MASK.bool()


def _logprobs() -> tuple[torch.Tensor, torch.Tensor]:
    behaviour = torch.full((3, 3), -1.0, dtype=torch.float64)
    old = behaviour + torch.log(torch.tensor(RHO, dtype=torch.float64))
    return old, behaviour


def _weights(preset: str, **bounds):
    old, behaviour = _logprobs()
    return correction_weights(old, behaviour, MASK, preset, **bounds)


def _on(t: torch.Tensor) -> list:
    """The real tokens' values, response by response."""
    return [t[i][ON[i]].tolist() for i in range(3)]


def _flat(rows: list) -> list:
    return [x for row in rows for x in row]


def test_token_and_sequence_are_truncated_is_unchanged():
    got = _weights("token", cap=1.6)
    assert _flat(_on(got.weights)) == pytest.approx([1.6, 0.4, 1.5, 1.6, 1.25, 0.25], abs=1e-12)
    assert _on(got.truncated) == [[True, False, False], [True, False], [False]]
    assert not got.masked.any()
    got = _weights("sequence", cap=2.0)
    assert _flat(_on(got.weights)) == pytest.approx([1.2] * 3 + [2.0] * 2 + [0.25], abs=1e-12)
    assert _on(got.truncated) == [[False] * 3, [True] * 2, [False]]


def test_sequence_mask_keeps_whole_responses_inside_the_band():
    got = _weights("sequence_mask", low=0.5, high=2.0)  # 1.2 in; 7.5 above; 0.25 below
    assert _on(got.weights) == [[1.0, 1.0, 1.0], [0.0, 0.0], [0.0]]
    assert _on(got.masked) == [[False] * 3, [True] * 2, [True]]
    assert not got.truncated.any()
    got = _weights("sequence_mask", low=0.2, high=8.0)  # a band that keeps every response
    assert _on(got.weights) == [[1.0] * 3, [1.0] * 2, [1.0]] and not got.masked.any()


def test_geometric_reject_uses_the_length_normalised_ratio():
    got = _weights("geometric_reject", low=0.999, high=1.001)  # the default band rejects all three
    assert _on(got.masked) == [[True] * 3, [True] * 2, [True]]
    assert _on(got.weights) == [[0.0] * 3, [0.0] * 2, [0.0]]
    got = _weights("geometric_reject", low=0.9, high=1.1)  # 1.06266 in; 2.73861 above; 0.25 below
    assert _on(got.weights) == [[1.0] * 3, [0.0] * 2, [0.0]]
    # the product of response 0 (1.2) is outside [0.9, 1.1]: only the mean over tokens keeps it
    assert _on(_weights("sequence_mask", low=0.9, high=1.1).weights)[0] == [0.0] * 3
    got = _weights("geometric_reject", low=0.2, high=2.8)
    assert _on(got.weights) == [[1.0] * 3, [1.0] * 2, [1.0]]


def test_icepop_keeps_each_tokens_ratio_inside_the_band_and_zeroes_the_rest():
    got = _weights("icepop", low=0.5, high=5.0)
    assert _flat(_on(got.weights)) == pytest.approx([2.0, 0.0, 1.5, 0.0, 1.25, 0.0], abs=1e-12)
    assert _on(got.masked) == [[False, True, False], [True, False], [True]]
    assert not got.truncated.any()
    got = _weights("icepop", low=0.2, high=8.0)
    assert _flat(_on(got.weights)) == pytest.approx([2.0, 0.4, 1.5, 6.0, 1.25, 0.25], abs=1e-12)


@pytest.mark.parametrize("preset", CORRECTION_PRESETS)
def test_padding_never_makes_a_nan_weight(preset):
    got = _weights(preset, cap=2.0, low=0.5, high=2.0)
    assert torch.isfinite(got.weights).all()
    assert not (got.masked & ~ON).any() and not (got.truncated & ~ON).any()


def test_bad_presets_and_bands_are_refused():
    with pytest.raises(ValueError, match="rollout_is must be one of none, token, sequence, sequence_mask"):
        _weights("tokens")
    for low, high in ((0.0, 2.0), (1.2, 2.0), (0.5, 0.9), (None, 2.0)):
        with pytest.raises(ValueError, match="0 < low <= 1 <= high"):
            _weights("icepop", low=low, high=high)


def test_the_config_names_the_same_presets():
    hints = typing.get_type_hints(AlgorithmConfig)
    assert typing.get_args(hints["rollout_is"]) == ("none", *CORRECTION_PRESETS)


@pytest.mark.parametrize("preset", CORRECTION_PRESETS)
def test_no_gradient_flows_through_the_weights(preset):
    """Ratio 1 (logp == old) and advantages +1, -2, +0.5: no token is clipped, so d total / d logp_t
    is -A_i w_t exactly (agg token), and nothing reaches the old or behaviour log-probs."""
    old, behaviour = _logprobs()
    old = old.clone().requires_grad_(True)
    behaviour = behaviour.clone().requires_grad_(True)
    got = correction_weights(old, behaviour, MASK, preset, cap=2.0, low=0.5, high=5.0)
    assert not got.weights.requires_grad
    logp = torch.where(ON, old.detach(), 0.0).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    loss = policy_loss(logp, torch.where(ON, old.detach(), 0.0), adv, MASK, clip_eps_low=0.2, clip_eps_high=0.2,
                       is_weights=got.weights)
    loss.total.backward()
    want = -adv[:, None] * got.weights.detach() * MASK
    assert torch.allclose(logp.grad, want, atol=1e-12)
    assert old.grad is None and behaviour.grad is None


def test_a_masked_response_leaves_the_others_terms_and_the_normaliser_alone():
    """sequence_mask drops response 1 and 2 (their ratios 7.5 and 0.25 are outside [0.5, 2]); the
    step's normaliser still counts their tokens (6), and the total is response 0's surrogate alone
    (ratio 1, A = 1: -1 per token, weight 1: -3), bit for bit what response 0 gives by itself."""
    old, behaviour = _logprobs()
    logp = torch.where(ON, old, 0.0)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    got = correction_weights(old, behaviour, MASK, "sequence_mask", low=0.5, high=2.0)
    loss = policy_loss(logp, logp, adv, MASK, clip_eps_low=0.2, clip_eps_high=0.2, is_weights=got.weights)
    assert loss.normaliser == 6.0
    assert float(loss.total) == -3.0
    alone = policy_loss(logp[:1], logp[:1], adv[:1], MASK[:1], clip_eps_low=0.2, clip_eps_high=0.2)
    assert loss.total.numpy().tobytes() == alone.total.numpy().tobytes()
    none = policy_loss(logp, logp, adv, MASK, clip_eps_low=0.2, clip_eps_high=0.2)
    assert float(none.total) == -3.0 + 2.0 * 2 - 0.5  # without the mask the others would count
    assert math.isclose(float(loss.total) / loss.normaliser, -0.5)
