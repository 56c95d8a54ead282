"""Multi-turn episodes on continuous batching (policy/turns.py): refill vs hold, by hand."""

from __future__ import annotations

import random

import pytest

from poise.errors import ConfigError
from poise.policy.allocator import StepWorkload, predict_step
from poise.policy.controller import ControllerConfig, ResizeController, StepObservation
from poise.policy.cost import CostConfig, CostModel, ContinuousBatch, instance_finish_times
from poise.policy.split import Split
from poise.policy.turns import EpisodeWork, deal_longest_first, episode_times


def tiny() -> CostModel:
    """0.01 s per decode step whatever the batch, 0.001 s per prefilled token."""
    return CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                                prefill_per_token_s=0.001))


def test_one_slot_two_episodes_of_two_turns_by_hand():
    # prompt 10 tokens, turns of 2 tokens, 5 observation tokens, 0.05 s per environment call
    eps = [EpisodeWork(10, (2, 2), (5,), (0.05, 0.05))] * 2
    refill = episode_times(tiny(), eps, [[0, 1]], [1], rule="refill")
    # A0: prefill 0.01, decode 0.02 -> 0.03; its slot goes to B0: 0.03 + 0.01 + 0.02 = 0.06.
    # A's environment answers at 0.08: A1 re-fills the whole episode (10 + 2 + 5 = 17 tokens, 0.017)
    # and decodes 2 -> 0.117. B's answer (0.11) waits for the slot: 0.117 + 0.017 + 0.02 = 0.154.
    assert refill.turn_finish == [pytest.approx([0.03, 0.117]), pytest.approx([0.06, 0.154])]
    assert refill.finish == pytest.approx([0.167, 0.204])  # + the last environment call
    assert refill.busy_s == pytest.approx([0.134])
    assert refill.slot_s == pytest.approx([0.08])  # 4 turns x 2 decode steps x 1 sequence
    hold = episode_times(tiny(), eps, [[0, 1]], [1], rule="hold")
    # A keeps the slot: A0 -> 0.03, waits to 0.08, A1 prefills only the observation (0.005) -> 0.105,
    # and the slot frees when A's last call answers (0.155); B then runs the same way.
    assert hold.turn_finish == [pytest.approx([0.03, 0.105]), pytest.approx([0.185, 0.26])]
    assert hold.finish == pytest.approx([0.155, 0.31])
    assert hold.busy_s == pytest.approx([0.11])  # less prefill, yet the device idles far longer
    assert max(refill.finish) < max(hold.finish)


def test_single_turn_episodes_are_timed_as_plain_requests():
    cost = CostModel()
    rng = random.Random(3)
    lengths = [rng.randint(1, 600) for _ in range(60)]
    prompts = [rng.randint(0, 400) for _ in range(60)]
    eps = [EpisodeWork(p, (n,), (), (0.0,)) for n, p in zip(lengths, prompts)]
    for cap in (1, 7, 64):
        for rule in ("refill", "hold"):
            got = episode_times(cost, eps, [list(range(60))], [cap], 2.0, rule).finish
            assert got == instance_finish_times(cost, lengths, prompts, cap, 2.0)


def test_a_turn_that_arrives_mid_decode_joins_at_the_next_step():
    batch = ContinuousBatch(tiny(), 2)
    batch.admit("a", 0, 10)
    assert batch.next_finish_s() == pytest.approx(0.10)
    # something arrives 0.035 s in: the batch stops at the first step boundary after it (4 steps)
    assert batch.advance(0.035) == (pytest.approx(0.04), [])
    batch.admit("b", 0, 2)
    assert batch.advance() == (pytest.approx(0.02), ["b"])
    assert batch.advance(1.0) == (pytest.approx(0.04), ["a"])  # a limit past the finish changes nothing


def test_refill_sends_the_next_turn_to_the_least_busy_instance():
    # every first turn is queued on instance 0; A and B end their first turn at 0.03 while C decodes on
    pair, long = EpisodeWork(0, (3, 3), (0,), (0.1, 0.0)), EpisodeWork(0, (100,), (), (0.0,))
    eps = [pair, pair, long]
    refill = episode_times(tiny(), eps, [[0, 1, 2], []], [3, 3], rule="refill")
    # at 0.13 instance 0 holds C, instance 1 nothing: A1 goes to 1; then a tie (one each): B1 to 0
    assert refill.instance == [1, 0, 0]
    assert refill.busy_s[1] == pytest.approx(0.003 + 0.03)  # A1 re-fills its 3 tokens, decodes 3
    hold = episode_times(tiny(), eps, [[0, 1, 2], []], [3, 3], rule="hold")
    assert hold.instance == [0, 0, 0] and hold.busy_s[1] == 0.0  # the naive scheme stays in its slot


@pytest.mark.parametrize("seed", range(6))
def test_refill_finishes_no_later_than_hold(seed):
    rng = random.Random(seed)
    cost = CostModel()
    eps = []
    for _ in range(rng.randint(8, 40)):
        turns = rng.randint(1, 5)
        eps.append(EpisodeWork(rng.randint(50, 400), tuple(rng.randint(20, 400) for _ in range(turns)),
                               tuple(rng.randint(5, 80) for _ in range(turns - 1)),
                               tuple(rng.uniform(0.5, 5.0) for _ in range(turns))))
    instances, cap = rng.randint(1, 3), rng.choice([1, 2, 4, 8])
    queues = deal_longest_first(eps, instances)
    refill = episode_times(cost, eps, queues, [cap] * instances, rule="refill")
    hold = episode_times(cost, eps, queues, [cap] * instances, rule="hold")
    assert max(refill.finish) <= max(hold.finish)
    # the turns are the same work: the device seconds differ only by the re-filled prefixes
    extra = sum(cost.prefill_s(e.context(t)) - cost.prefill_s(e.observations[t - 1])
                for e in eps for t in range(1, len(e.turns)))
    assert sum(refill.busy_s) - sum(hold.busy_s) <= extra + 1e-9


def test_bad_episode_shapes_are_one_line_errors():
    with pytest.raises(ConfigError, match="observations"):
        EpisodeWork(10, (2, 2), (), (0.1, 0.1))
    with pytest.raises(ConfigError, match="env_s"):
        EpisodeWork(10, (2,), (), (-1.0,))
    with pytest.raises(ConfigError, match="turns"):
        EpisodeWork(10, (), (), ())
    with pytest.raises(ConfigError, match="slots"):
        episode_times(tiny(), [EpisodeWork(1, (1,), (), (0.0,))], [[0]], [1], rule="keep")


def agent_step(slots: str = "refill", latency: float = 3.0, n: int = 64) -> StepWorkload:
    eps = tuple(EpisodeWork(100, (200, 200, 200), (50, 50), (latency,) * 3) for _ in range(n))
    return StepWorkload(tuple(e.model_tokens for e in eps), 100, eps, slots)


def test_the_allocator_prices_turns_and_environment_waits():
    cost = CostModel()
    refill, hold = agent_step("refill"), agent_step("hold")
    plain = StepWorkload(refill.output_lengths, 100)
    p_refill, p_hold, p_plain = (predict_step(cost, w, Split(2, 2), "sync", 1, 16) for w in (refill, hold, plain))
    assert p_plain.rollout_s < p_refill.rollout_s < p_hold.rollout_s
    assert p_refill.rollout_s > 9.0  # three 3 s environment calls after an episode's turns
    assert p_hold.rollout_s > 2 * 9.0  # 64 episodes in 2 x 16 held slots: two waves at least
    assert refill.tokens == 64 * (100 + 600 + 100) and p_refill.train_s > p_plain.train_s  # observations train


def test_the_controller_sees_that_environment_waits_do_not_shrink_with_rollout_devices():
    cost = CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                                prefill_per_token_s=0.0, train_per_token_s=1e-4, train_fixed_s=0.0,
                                train_allreduce_s=0.0, weight_bytes=0.0, sync_latency_s=0.0))
    splits = [Split(2, 6), Split(4, 4), Split(6, 2)]
    ctl = ResizeController(ControllerConfig(window=1), cost, "sync", "live", splits, batch_cap=16)
    work = agent_step(latency=10.0, n=192)
    seen = dict(step=0, now=36.0, split=Split(2, 6), rollout_s=35.0, train_s=1.0, step_s=36.0,
                output_lengths=work.output_lengths, prompt_len=100)
    plain = ctl.predictions(StepObservation(**seen))
    agent = ctl.predictions(StepObservation(**seen, episodes=work.episodes, slots=work.slots))
    assert plain[Split(2, 6)] == pytest.approx(agent[Split(2, 6)])  # both calibrated to what was seen
    # lengths alone: 3x the instances, a third of the waves; with 30 s of waits, far less gained
    assert plain[Split(6, 2)] < 0.5 * plain[Split(2, 6)]
    assert agent[Split(6, 2)] > 0.75 * agent[Split(2, 6)]
