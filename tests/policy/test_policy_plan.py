"""The step plan (policy/plan.py): the one statement of what a step trains on and how."""

from __future__ import annotations

import pytest

from poise.errors import ConfigError
from poise.policy.plan import MicroStats, loss_normaliser, plan_step, step_stats, tail_shares


def test_plan_cuts_by_sample_id_and_spreads_contiguous_ranges_by_hand():
    plan = plan_step(3, 3, 2, micro_batch_size=4, train_devices=2, mode="async")
    assert plan.weights_version == 2 and plan.prompts == 3
    assert plan.sample_ids == ((3, 0, 0), (3, 0, 1), (3, 1, 0), (3, 1, 1), (3, 2, 0), (3, 2, 1))
    (mini,) = plan.minis
    assert mini.micro == (((3, 0, 0), (3, 0, 1), (3, 1, 0), (3, 1, 1)), ((3, 2, 0), (3, 2, 1)))
    assert mini.ranges == ((0, 1), (1, 2)) and [mini.owner(j) for j in (0, 1)] == [0, 1]
    # more devices than micro-batches: the extra ones get empty ranges (and idle)
    assert plan_step(0, 3, 2, micro_batch_size=4, train_devices=3).minis[0].ranges == ((0, 0), (0, 1), (1, 2))
    two = plan_step(0, 4, 2, updates_per_step=2, micro_batch_size=3)
    assert [m.sample_ids[0] for m in two.minis] == [(0, 0, 0), (0, 2, 0)]
    assert [len(m.micro) for m in two.minis] == [2, 2] and two.mini_of((0, 3, 1)) == 1
    with pytest.raises(ConfigError, match="updates_per_step"):
        plan_step(0, 3, 2, updates_per_step=2)


def test_tail_shares_by_hand():
    """pipeline.assist: the unstarted micro-batches, cut into contiguous shares of about equal tokens."""
    assert tail_shares([0, 1], 2) == [[0], [1]]
    assert tail_shares([2, 3, 4, 5], 2) == [[2, 3], [4, 5]]
    assert tail_shares([2, 3, 4, 5], 2, [30, 10, 10, 10]) == [[2], [3, 4, 5]]  # the long one alone
    assert tail_shares([4, 5], 3) == [[4], [], [5]]  # more devices than work: some idle
    assert tail_shares([], 2) == [[], []]
    for n in range(1, 9):  # every micro-batch exactly once, in index order
        for devices in range(1, 5):
            shares = tail_shares(list(range(n)), devices, [1 + (j * 7) % 5 for j in range(n)])
            assert [j for share in shares for j in share] == list(range(n))
    with pytest.raises(ValueError, match="weights"):
        tail_shares([0, 1], 2, [1.0])


def test_normaliser_and_step_stats_by_hand():
    assert loss_normaliser([[3, 5], [2]], "token") == 10.0
    assert loss_normaliser([[3, 5], [2]], "sequence") == 3.0
    with pytest.raises(ConfigError, match="loss_agg"):
        loss_normaliser([[1]], "mean")
    micro = [MicroStats(loss_sum=2.0, normaliser=8.0, clipped_tokens=2, kl_sum=0.4, tokens=8, entropy_sum=6.0,
                        clipped_responses=1, responses=2),
             MicroStats(loss_sum=1.0, normaliser=2.0, clipped_tokens=0, kl_sum=0.1, tokens=2, entropy_sum=1.0,
                        clipped_responses=0, responses=1)]
    assert step_stats(micro, [0.5, 1.5]) == pytest.approx({"loss": 0.3, "grad_norm": 1.0, "clip_frac": 0.2,
                                                           "clip_frac_responses": 1 / 3, "kl": 0.05,
                                                           "entropy": 0.7})  # no mismatch measured


def test_pack_rows_first_fit_decreasing_by_hand():
    from poise.policy.plan import pack_rows

    # capacity 10 (the longest); longest first: 10 -> row 0; 6 -> row 1; 4 (pos 1) -> row 1; 4 (pos 4) -> row 2;
    # 3 -> row 2; 2 -> row 2 (room 3 left); each row lists its sequences in position (sample-id) order
    assert pack_rows([6, 4, 10, 2, 4, 3]) == ((2,), (0, 1), (3, 4, 5))
    assert pack_rows([5, 5, 5]) == ((0,), (1,), (2,))  # equal lengths: one per row, like padding
    assert pack_rows([7]) == ((0,),)
    # 40 tokens in rows of 9 need 5 rows; first fit decreasing finds them (padding would need 8)
    assert pack_rows([9, 1, 8, 2, 7, 3, 5, 5]) == ((0,), (1, 2), (3, 4), (5, 6), (7,))
    with pytest.raises(ValueError, match="at least one token"):
        pack_rows([3, 0])
