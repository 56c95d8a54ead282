"""Dynamic sampling's bookkeeping (policy/dynamic.py): which draws fill the step's slots is a
function of the groups' rewards alone, never of the order they finish in."""

import itertools
import random

import pytest

from poise.policy.dynamic import DrawResolver, default_max_draws, group_is_informative

G = 2


def _resolve(outcomes: list[bool], prompts: int, max_draws: int, order_seed: int) -> DrawResolver:
    """Run a resolver over draws whose groups are informative per `outcomes` (draw d: rewards
    (0, 1) if informative, else (1, 1)), scoring the samples in flight in a shuffled order."""
    rng = random.Random(order_seed)
    r = DrawResolver(prompts, G, max_draws)
    in_flight = [(0, d, j) for d in r.start() for j in range(G)]
    assigned: list[tuple[int, int]] = []
    while in_flight:
        sid = in_flight.pop(rng.randrange(len(in_flight)))
        reward = float(sid[2]) if outcomes[sid[1]] else 1.0
        in_flight += [(0, d, j) for d in r.scored(sid, reward) for j in range(G)]
        assigned += r.assign()
    assert [slot for slot, _ in assigned] == list(range(len(assigned)))  # slots come in order
    assert [d for _, d in assigned] == r.slots
    return r


def test_the_slots_hold_the_first_informative_draws_whatever_the_arrival_order():
    # draws 0..: informative, dropped, dropped, informative, dropped, informative, informative ...
    outcomes = [True, False, False, True, False, True, True, True, True, True]
    for seed in range(20):
        r = _resolve(outcomes, prompts=3, max_draws=10, order_seed=seed)
        assert r.done and r.slots == [0, 3, 5]
        # launched: one past the 3rd informative draw (5); the drops 1, 2, 4 each drew one more
        assert r.launched == 6 and r.dropped == 3 and r.unfilled == 0
        assert r.metrics() == {"dynamic/dropped_groups": 3, "dynamic/draws": 6, "dynamic/extra_samples": 3 * G,
                               "dynamic/unfilled": 0}


def test_every_arrival_order_gives_the_same_slots_and_draws():
    outcomes = [False, True, False, True, True, False, True, True]
    results = {(tuple(r.slots), r.launched) for r in (_resolve(outcomes, 2, 8, seed) for seed in range(50))}
    assert results == {((1, 3), 4)}


def test_when_the_draws_run_out_the_earliest_dropped_draws_fill_the_step():
    outcomes = [False, True, False, False, False, True]
    r = _resolve(outcomes, prompts=3, max_draws=4, order_seed=0)
    assert r.done and r.launched == 4
    assert r.slots == [1, 0, 2]  # the one informative draw, then the earliest dropped ones
    assert r.unfilled == 2 and r.dropped == 3


def test_a_group_is_informative_when_its_rewards_differ_at_all():
    assert not group_is_informative([1.0, 1.0, 1.0])
    assert not group_is_informative([0.0, 0.0])
    assert group_is_informative([0.5, 0.5, 0.5000001])


def test_bad_use_is_refused():
    with pytest.raises(ValueError, match="max_draws"):
        DrawResolver(4, 2, 3)
    r = DrawResolver(1, 2, 4)
    r.start()
    r.scored((0, 0, 0), 1.0)
    with pytest.raises(ValueError, match="twice"):
        r.scored((0, 0, 0), 1.0)
    with pytest.raises(ValueError, match="draw 3"):
        r.scored((0, 3, 0), 1.0)
    assert default_max_draws(8, 0) == 32 and default_max_draws(8, 10) == 10
