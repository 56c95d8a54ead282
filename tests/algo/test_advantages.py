"""The advantage estimators of algorithm.advantage, each checked against numbers computed by hand."""

import math

import pytest

from poise.algo.advantages import outcome_advantages, ready_advantages, reinforce_pp_advantages, rloo_advantages


def test_rloo_by_hand():
    # G = 4, sum 2: r_i - (2 - r_i) / 3 -> 1 - 1/3 = 2/3 and 0 - 2/3
    assert rloo_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-12)
    # G = 3, [3, 0, 0]: 3 - 0 = 3, 0 - 3/2 = -1.5
    assert rloo_advantages([3.0, 0.0, 0.0]) == [3.0, -1.5, -1.5]
    assert rloo_advantages([0.5, 0.5]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages([1.0])


def test_reinforce_pp_by_hand():
    # groups [1, 0] and [1, 1]: centred [0.5, -0.5] and [0, 0]; batch mean 0, unbiased std
    # sqrt((0.25 + 0.25) / 3) = 0.408248 -> 0.5 / 0.408248 = 1.224745
    adv = reinforce_pp_advantages([[1.0, 0.0], [1.0, 1.0]])
    s = math.sqrt(0.5 / 3)
    assert adv[0] == pytest.approx([0.5 / s, -0.5 / s], abs=1e-5)
    assert adv[1] == [0.0, 0.0]
    assert reinforce_pp_advantages([[2.0, 2.0], [0.0, 0.0]]) == [[0.0, 0.0], [0.0, 0.0]]  # no signal, no NaN


def test_outcome_advantages_by_name():
    groups = [[1.0, 0.0, 0.0, 1.0]]
    assert outcome_advantages("grpo", groups)[0] == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025],
                                                                  abs=1e-5)
    assert outcome_advantages("dr_grpo", groups) == [[0.5, -0.5, -0.5, 0.5]]
    assert outcome_advantages("rloo", groups)[0] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        outcome_advantages("ppo", groups)


def test_ready_advantages_complete_a_group_or_the_step():
    rewards = {(3, 0, 0): 1.0, (3, 0, 1): 0.0, (3, 1, 0): 1.0}
    # group 0 is complete, group 1 is not
    assert ready_advantages("dr_grpo", rewards, (3, 0, 1), 2, 2) == {(3, 0, 0): 0.5, (3, 0, 1): -0.5}
    assert ready_advantages("dr_grpo", rewards, (3, 1, 0), 2, 2) == {}
    # reinforce_pp whitens over the step: nothing before the step's last reward
    assert ready_advantages("reinforce_pp", rewards, (3, 0, 1), 2, 2) == {}
    rewards[(3, 1, 1)] = 1.0
    got = ready_advantages("reinforce_pp", rewards, (3, 1, 1), 2, 2)
    s = math.sqrt(0.5 / 3)
    assert got == pytest.approx({(3, 0, 0): 0.5 / s, (3, 0, 1): -0.5 / s, (3, 1, 0): 0.0, (3, 1, 1): 0.0}, abs=1e-5)


def test_grpo_batch_by_hand():
    # groups [1, 0] and [1, 1]: centred [0.5, -0.5] and [0, 0]; the rewards 1, 0, 1, 1 have mean 0.75
    # and unbiased std sqrt((3 x 0.0625 + 0.5625) / 3) = 0.5 -> 0.5 / 0.5 = 1
    assert outcome_advantages("grpo_batch", [[1.0, 0.0], [1.0, 1.0]], eps=0.0) == [[1.0, -1.0], [0.0, 0.0]]
    # the whole step at once: nothing before the step's last reward
    rewards = {(0, 0, 0): 1.0, (0, 0, 1): 0.0, (0, 1, 0): 1.0}
    assert ready_advantages("grpo_batch", rewards, (0, 0, 1), 2, 2) == {}
    rewards[(0, 1, 1)] = 1.0
    assert ready_advantages("grpo_batch", rewards, (0, 1, 1), 2, 2, eps=0.0) == {
        (0, 0, 0): 1.0, (0, 0, 1): -1.0, (0, 1, 0): 0.0, (0, 1, 1): 0.0}
