"""DAPO's overlong reward shaping (algo/shaping.py), by hand: L_max 10, buffer 4 -> no penalty
up to 6 tokens, then -(|y| - 6) / 4 per token past 6."""

import pytest

from poise.algo.shaping import overlong_penalty


def test_the_penalty_is_zero_then_linear_in_the_buffer():
    got = [overlong_penalty(n, 10, 4) for n in range(0, 11)]
    assert got == [0.0] * 7 + [-0.25, -0.5, -0.75, -1.0]
    assert overlong_penalty(9, 10, 4, penalty=0.5) == -0.375
    assert overlong_penalty(10, 10, 0) == 0.0  # buffer 0: off


def test_a_buffer_outside_the_budget_is_refused():
    with pytest.raises(ValueError, match="buffer 10"):
        overlong_penalty(5, 10, 10)
