"""Multi-turn episodes in the simulator and the planner (workload.episode, policy/turns.py)."""

from __future__ import annotations

import json

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.errors import ConfigError
from poise.schema import build
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.scenario import ScenarioConfig
from poise.sim.workload import ParametricWorkload, WorkloadConfig

QUIET = ["log.samples=false", "log.intervals=none"]


def two_episodes(slots: str) -> ScenarioConfig:
    """1 rollout device with 1 slot; 2 episodes (one prompt, 2 samples) of 2 turns of 2 tokens, a
    10-token prompt, 5 observation tokens, 0.05 s per environment call; 0.01 s a decode step,
    0.001 s a prefilled token."""
    return build(ScenarioConfig, {
        "steps": 1, "split": [1, 1], "pipeline": {"mode": "sync", "streaming": False},
        "cluster": {"devices": 2, "batch_cap": 1, "micro_batch_size": 16},
        "cost": {"decode_base_s": 0.01, "decode_per_seq_s": 0.0, "decode_per_kv_token_s": 0.0,
                 "prefill_per_token_s": 0.001, "train_per_token_s": 0.001, "train_fixed_s": 1.0},
        "workload": {"prompts_per_step": 1, "samples_per_prompt": 2, "pool_size": 1, "sample_sigma": 0.0,
                     "episode": {"turns": {"dist": "fixed", "value": 2}, "slots": slots,
                                 "observation_tokens": {"dist": "fixed", "value": 5},
                                 "env_latency_s": {"dist": "fixed", "value": 0.05}},
                     "phases": [{"mix": [{"dist": "fixed", "median": 2, "prompt_len": 10}]}]},
    })


def sample_finishes(run_dir) -> list[float]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e["finish"] for e in sorted((e for e in events if e["kind"] == "sample"), key=lambda e: e["id"])]


def test_two_episodes_on_one_slot_by_hand(tmp_path):
    # refill: A0 0.01 prefill + 0.02 decode -> 0.03; B0 -> 0.06; A's answer (0.08) re-fills 17 tokens
    # -> A1 0.117, answer 0.167; B's answer (0.11) waits for the slot -> B1 0.154, answer 0.204
    sim = Simulation(two_episodes("refill"), tmp_path / "refill")
    sim.run()
    assert sample_finishes(tmp_path / "refill") == pytest.approx([0.167, 0.204])
    assert sim.records[0].gen_end == pytest.approx(0.204)
    # the trainer gets prompt, turns and observation of each: 2 x (10 + 2 + 2 + 5) tokens
    assert sim.records[0].train_s == pytest.approx(38 * 0.001 + 1.0)
    # hold: A keeps the slot through its waits (A1 prefills the 5 observation tokens only), B starts
    # when A's last answer frees it at 0.155: B0 0.185, answer 0.235, B1 0.26, answer 0.31
    sim = Simulation(two_episodes("hold"), tmp_path / "hold")
    sim.run()
    assert sample_finishes(tmp_path / "hold") == pytest.approx([0.155, 0.31])
    assert sim.records[0].gen_end == pytest.approx(0.31)


def test_refill_generates_a_step_sooner_than_holding_the_slot():
    runs = {slots: Simulation(load_scenario("agent-episodes", QUIET + [
        "steps=3", "split=[4,4]", "cluster.batch_cap=32", f"workload.episode.slots={slots}"])).run()
        for slots in ("refill", "hold")}
    assert runs["refill"].rollout_s_mean < runs["hold"].rollout_s_mean
    assert runs["refill"].tokens_per_s > runs["hold"].tokens_per_s


def test_episode_shape_is_drawn_per_episode_and_the_family_law_is_per_turn():
    single = WorkloadConfig(prompts_per_step=4, samples_per_prompt=3, pool_size=8)
    agent = build(WorkloadConfig, {"prompts_per_step": 4, "samples_per_prompt": 3, "pool_size": 8, "episode": {
        "turns": {"dist": "uniform", "low": 1, "high": 5}, "observation_tokens": {"dist": "fixed", "value": 7},
        "env_latency_s": {"dist": "exponential", "value": 2.0}}})
    plain, episodes = ParametricWorkload(single, 1).step(3), ParametricWorkload(agent, 1).step(3)
    assert [s.sample_id for s in plain] == [s.sample_id for s in episodes]
    counts = set()
    for p, s in zip(plain, episodes):
        e = s.episode
        assert e is not None and p.episode is None
        assert e.turns[0] == p.output_length  # the single-turn draw is the first turn
        assert s.output_length == sum(e.turns) and s.tokens == s.prompt_len + sum(e.turns) + 7 * (len(e.turns) - 1)
        assert 1 <= len(e.turns) <= 5 and all(t > 0 for t in e.env_s)
        counts.add(len(e.turns))
    assert len(counts) > 1  # the number of turns varies
    assert ParametricWorkload(agent, 1).step(3) == episodes  # a function of (seed, step)


def test_planner_prices_the_turns_and_the_environment_waits():
    r = poise("plan", "agent-episodes", "--steps", "2", "--max-splits", "2")
    assert r.returncode == 0, r.stderr
    assert "agent episodes: 256 a step" in r.stdout and "slots: refill" in r.stdout
    sim = Simulation(load_scenario("agent-episodes", QUIET + ["steps=1", "split=[4,4]"]))
    from poise.policy.allocator import predict_step
    work = sim.step_workload(sim.workload.step(0))
    priced = predict_step(sim.cost, work, sim.split, "sync", 1, 32, 8)
    plain = predict_step(sim.cost, type(work)(work.output_lengths, work.prompt_len), sim.split, "sync", 1, 32, 8)
    # every episode waits for its environment after each turn: no step is shorter than the longest chain
    assert priced.rollout_s >= max(sum(e.env_s) for e in work.episodes)
    assert priced.rollout_s > plain.rollout_s and priced.train_s > plain.train_s  # observations train too


@pytest.mark.parametrize("override, fragments", [
    ("workload.episode.turns.low=5", ("workload.episode.turns.low", "low <= high")),
    ("workload.episode.slots=keep", ("workload.episode.slots", "keep")),
    ("resize.inflight=abort", ("resize.inflight", "use drain")),
])
def test_bad_episode_config_is_one_line(override, fragments):
    assert_one_line_error(poise("simulate", "agent-episodes", "workload.episode.turns.high=2", override, "steps=1"),
                          *fragments)


def test_episodes_need_the_parametric_workload(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"prompt_id": "a", "step": 0, "output_length": 12}) + "\n")
    with pytest.raises(ConfigError, match="workload.episode"):
        load_scenario("agent-episodes", [f"workload.trace={trace}"])
