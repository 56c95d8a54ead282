"""The episode runner with the real reward sandbox: turns, observations, the loss mask, and hostile
environments and model actions, each a counted failure that ends its own episode only.

Model turns here are scripted samples (what the engine would hand back); everything else is real:
the sandbox pool, the environment classes loaded from a user file, the replay of actions.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from poise.config import EnvConfig, RewardConfig
from poise.data.tasks import Problem
from poise.data.tokenizer import CharTokenizer
from poise.episodes.codec import TurnCodec
from poise.episodes.metrics import episode_metrics, with_env_rewards
from poise.episodes.runner import EpisodeRunner
from poise.rewards.scorer import RewardScorer
from poise.types import Sample

TOK = CharTokenizer()
ENVS = '''
import os, time

class Counter:
    """Says how many turns it has seen; rewards 0.5 a turn; done when the model says 'stop'."""
    def __init__(self, bonus=0.0):
        self.bonus = bonus
    def reset(self, row, seed):
        self.turns, self.seed = 0, seed
        return "start " + row["answer"]
    def step(self, action):
        self.turns += 1
        return "seen " + str(self.turns), 0.5 + self.bonus, action == "stop", {"tool_calls": 1}

class Hostile(Counter):
    """Honest but for the action that names an attack."""
    def step(self, action):
        if action == "crash":
            raise RuntimeError("boom")
        if action == "hang":
            time.sleep(1000)
        if action == "number":
            return 123, 0.0, False, {}
        if action == "huge":
            return "x" * 10_000_000, 0.0, False, {}
        if action == "nan":
            return "ok", float("nan"), False, {}
        if action == "triple":
            return ("ok", 0.0, False)
        if action == "forge":  # an answer for every call id a counter would give, on every fd
            line = "".join('[%d, "ok", ["win", 100.0, true, {}]]\\n' % k for k in range(300)).encode()
            for fd in range(256):
                try:
                    os.write(fd, line)
                except OSError:
                    pass
        if action == "read":
            return open("/etc/shadow").read()[:50], 0.0, False, {}
        return super().step(action)

class BrokenReset:
    def reset(self, row, seed):
        raise ValueError("no reset for you")
    def step(self, action):
        return "", 0.0, True, {}
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "user_envs.py"
    path.write_text(textwrap.dedent(ENVS))
    return path


@pytest.fixture
def make_runner(env_file):
    made = []

    def make(cls: str, max_turns: int = 4, timeout_s: float = 3.0, isolation: str = "batch", **env) -> EpisodeRunner:
        cfg = EnvConfig(name=f"{env_file}:{cls}", max_turns=max_turns, **env)
        scorer = RewardScorer(RewardConfig(timeout_s=timeout_s, isolation=isolation), cfg)
        made.append(scorer)
        return EpisodeRunner(cfg, scorer, TurnCodec(TOK, chat_template=False), max_new_tokens=8, context=96, seed=7)
    yield make
    for scorer in made:
        scorer.close()


def _problems(n: int) -> list[Problem]:
    return [Problem(f"u{i}", "arith", f"p{i}", str(i), "exact") for i in range(n)]


def _play(runner: EpisodeRunner, policy, problems, group: int = 1, timeout: float = 60.0) -> list[Sample]:
    """Generate every turn the runner hands out with `policy(sample_id, turn) -> text`."""
    runner.start(0, problems, [[TOK.bos_id] + TOK.encode(p.prompt + "\n") for p in problems], group, version=0)
    done, deadline = [], time.monotonic() + timeout
    while runner.active:
        assert time.monotonic() < deadline, f"episodes still active: {sorted(runner.episodes)}"
        requests, finished = runner.poll(wait_s=0.05)
        done += finished
        turns = []
        for r in requests:
            ids = tuple(TOK.encode(policy(r.sample_id, r.turn))) + (TOK.eos_id,)
            turns.append(Sample(r.sample_id, tuple(r.prompt_ids), ids, (-1.0,) * len(ids), "eos", 0, 0.0, 0.0,
                                r.max_new_tokens, turn=r.turn))
        runner.turns_done(turns)
    return sorted(done, key=lambda s: s.sample_id)


def test_an_episode_is_one_sequence_with_its_observations_masked(make_runner):
    runner = make_runner("Counter", max_turns=3)
    [episode] = _play(runner, lambda sid, turn: f"a{turn}", _problems(1))
    prompt = [TOK.bos_id] + TOK.encode("p0\n") + TOK.encode("start 0\n")  # reset's observation joins the prompt
    assert list(episode.prompt_ids) == prompt
    turn = lambda t: TOK.encode(f"a{t}") + [TOK.eos_id]  # noqa: E731
    seen = lambda k: TOK.encode(f"seen {k}\n")  # noqa: E731
    assert list(episode.token_ids) == turn(0) + seen(1) + turn(1) + seen(2) + turn(2)  # no observation after the last
    assert list(episode.loss_mask) == [1] * 3 + [0] * 7 + [1] * 3 + [0] * 7 + [1] * 3
    assert [lp for lp, m in zip(episode.logprobs, episode.loss_mask) if not m] == [0.0] * 14
    assert episode.turn == 3
    stats = runner.stats[episode.sample_id]
    assert (stats.turns, stats.end, stats.env_reward, stats.model_tokens, stats.observation_tokens) == \
        (3, "max_turns", 1.5, 9, 14)
    assert stats.env_calls == 4 and stats.tool_calls == 3  # reset + 3 steps


def test_the_environment_ends_the_episode_and_its_rewards_join_the_reward_functions(make_runner):
    runner = make_runner("Counter", max_turns=5, args={"bonus": 0.25})
    episodes = _play(runner, lambda sid, turn: "stop" if turn == sid[1] else "go", _problems(3))
    assert [e.turn for e in episodes] == [1, 2, 3]
    stats = {e.sample_id: runner.stats[e.sample_id] for e in episodes}
    assert [s.end for s in stats.values()] == ["done"] * 3
    assert [s.env_reward for s in stats.values()] == [0.75, 1.5, 2.25]
    from poise.rewards.scorer import RewardResult
    scored = with_env_rewards({sid: RewardResult(1.0, {"task": 1.0}) for sid in stats}, stats)
    assert [r.value for r in scored.values()] == [1.75, 2.5, 3.25]
    assert all(r.parts["env"] == stats[sid].env_reward for sid, r in scored.items())
    metrics = episode_metrics(stats.values())
    assert metrics["episode/turns_mean"] == 2.0 and metrics["episode/turns_max"] == 3
    assert metrics["episode/end_done"] == 3 and metrics["env_failures"] == 0


def test_the_token_budget_ends_an_episode(make_runner):
    runner = make_runner("Counter", max_turns=50, max_tokens=30)
    [episode] = _play(runner, lambda sid, turn: "go", _problems(1))
    assert len(episode.token_ids) < 30 and runner.stats[episode.sample_id].end == "max_tokens"


HOSTILE = ["crash", "hang", "number", "huge", "nan", "triple", "forge", "read"]


@pytest.mark.parametrize("isolation", ["batch", "call"])
def test_hostile_environments_and_actions_end_their_own_episode_counted(make_runner, isolation):
    """Episode i plays 'go' twice, then (for i < 8) an attack; the honest episode 8 and the turns
    before each attack are untouched; every attack is one env failure, and the run goes on."""
    runner = make_runner("Hostile", max_turns=4, timeout_s=2.0, isolation=isolation)
    policy = lambda sid, turn: HOSTILE[sid[1]] if turn == 2 and sid[1] < len(HOSTILE) else "go"  # noqa: E731
    t = time.monotonic()
    episodes = _play(runner, policy, _problems(len(HOSTILE) + 1))
    assert time.monotonic() - t < 40  # one hang costs its timeout (2 s), not a stall
    stats = [runner.stats[e.sample_id] for e in episodes]
    for attack, episode, s in zip(HOSTILE, episodes, stats):
        assert s.end == "env_failure" and s.turns == 3, (attack, s)
        assert s.env_reward == 1.0, (attack, s)  # the two honest turns' rewards, nothing forged
        assert s.failure, attack
    honest = stats[-1]
    assert (honest.end, honest.turns, honest.env_reward, honest.failure) == ("max_turns", 4, 2.0, None)
    assert episode_metrics(stats)["env_failures"] == len(HOSTILE)
    reasons = {a: s.failure for a, s in zip(HOSTILE, stats)}
    assert "RuntimeError: boom" in reasons["crash"] and "timed out" in reasons["hang"]
    assert "not str" in reasons["number"] and "limit" in reasons["huge"], reasons
    assert "unexpected" in reasons["forge"], reasons


def test_an_environment_that_fails_at_reset_still_hands_on_its_sample(make_runner):
    runner = make_runner("BrokenReset")
    episodes = _play(runner, lambda sid, turn: "go", _problems(2), group=2)
    assert [e.sample_id for e in episodes] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]  # none lost
    assert all(e.loss_mask == (0,) for e in episodes)  # nothing to train on
    assert all(runner.stats[e.sample_id].end == "env_failure" and "no reset" in runner.stats[e.sample_id].failure
               for e in episodes)
