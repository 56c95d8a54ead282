"""Workloads for the simulator: what each RL step asks the rollout side to generate.

Two sources with one interface, `workload.step(k) -> list[SimSample]`:

- `ParametricWorkload`: per phase, a task mix of families whose output lengths follow a
  lognormal or Pareto law. Each phase owns a pool of prompts iterated in epochs (as the
  built-in tasks do), and each prompt has its own expected length, so a prompt's length
  repeats across epochs (what the history ranker exploits); every sample adds lognormal noise
  around it, and `growth_per_step` stretches lengths as RL training tends to (StreamRL §4.2).
- `TraceWorkload`: a JSONL trace, one sample per line: {"prompt_id", "step", "output_length"}
  (optional "prompt_length"), e.g. exported from a real run's `sample` events.

With `episode:` (parametric only) every sample is a multi-turn episode (docs/design.md, Episodes): its
turns, observation tokens and environment seconds are drawn per episode, and a family's length
law becomes the law of one model turn (each turn its own noise around the prompt's length).

Both are deterministic functions of (seed, step): a `random.Random` per step, no global state.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from poise.errors import DataError
from poise.policy.rankers import Prompt
from poise.policy.seeds import stable_seed
from poise.policy.turns import SLOT_RULES, EpisodeWork, SlotRule
from poise.schema import check, help_factory, help_field


@dataclass(frozen=True)
class FamilyConfig:
    name: str = help_field("task", "name of the task family (a ranker feature)")
    weight: float = help_field(1.0, "share of the phase's prompts from this family")
    dist: Literal["lognormal", "pareto", "fixed"] = help_field("lognormal", "law of a prompt's expected output length")
    median: float = help_field(500.0, "lognormal median / Pareto minimum / fixed length, tokens")
    sigma: float = help_field(1.0, "lognormal sigma of the prompt's expected length")
    alpha: float = help_field(1.5, "Pareto shape (smaller = heavier tail)")
    max_len: int = help_field(16384, "generation limit, tokens")
    prompt_len: int = help_field(512, "prompt tokens")

    def __post_init__(self) -> None:
        check(self.weight >= 0, f"family '{self.name}'.weight", self.weight, "must be >= 0")
        check(self.median >= 1, f"family '{self.name}'.median", self.median, "must be >= 1 token")
        check(self.sigma >= 0, f"family '{self.name}'.sigma", self.sigma, "must be >= 0")
        check(self.alpha > 0, f"family '{self.name}'.alpha", self.alpha, "must be > 0")
        check(self.max_len >= 1, f"family '{self.name}'.max_len", self.max_len, "must be >= 1 token")
        check(self.prompt_len >= 0, f"family '{self.name}'.prompt_len", self.prompt_len, "must be >= 0 tokens")


@dataclass(frozen=True)
class PhaseConfig:
    steps: int | None = help_field(None, "steps this phase lasts; null = until the end")
    mix: tuple[FamilyConfig, ...] = help_field((FamilyConfig(),), "task families of the phase")

    def __post_init__(self) -> None:
        check(self.steps is None or self.steps >= 1, "phase.steps", self.steps, "must be >= 1 or null")
        check(len(self.mix) > 0 and sum(f.weight for f in self.mix) > 0, "phase.mix",
              [f.name for f in self.mix], "give at least one family with weight > 0")


@dataclass(frozen=True)
class DrawConfig:
    """A distribution: one number per draw."""

    dist: Literal["fixed", "uniform", "lognormal", "exponential"] = help_field("fixed", "the law")
    value: float = help_field(1.0, "fixed: the value; lognormal: the median; exponential: the mean")
    low: float = help_field(0.0, "uniform: the lowest value")
    high: float = help_field(0.0, "uniform: the highest value")
    sigma: float = help_field(0.5, "lognormal: sigma")

    def validate(self, key: str) -> None:
        check(self.value >= 0, f"{key}.value", self.value, "must be >= 0")
        check(self.sigma >= 0, f"{key}.sigma", self.sigma, "must be >= 0")
        check(self.dist != "uniform" or 0 <= self.low <= self.high, f"{key}.low", [self.low, self.high],
              "uniform needs 0 <= low <= high")

    def draw(self, rng: random.Random) -> float:
        if self.dist == "uniform":
            return rng.uniform(self.low, self.high)
        if self.dist == "lognormal":
            return self.value * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        if self.dist == "exponential":
            return rng.expovariate(1.0 / self.value) if self.value > 0 else 0.0
        return self.value


@dataclass(frozen=True)
class EpisodeConfig:
    """Multi-turn episodes: each sample is a prompt, then model turns and environment observations
    alternating; the environment runs off the device for `env_latency_s` after every turn."""

    turns: DrawConfig = help_factory(lambda: DrawConfig("fixed", 4.0), "model turns per episode (rounded, "
                                     "1 .. max_turns)")
    max_turns: int = help_field(16, "most model turns an episode takes (env.max_turns)")
    observation_tokens: DrawConfig = help_factory(lambda: DrawConfig("fixed", 64.0), "tokens the environment "
                                                  "appends after each turn but the last (rounded)")
    env_latency_s: DrawConfig = help_factory(lambda: DrawConfig("fixed", 1.0), "seconds of each environment "
                                             "call (one after every model turn; the last says done)")
    slots: SlotRule = help_field("refill", "refill: a finished turn frees its slot and the next turn re-fills "
                                 "the episode so far on the least busy instance (Poise); hold: the episode keeps "
                                 "its slot through every environment wait (the naive scheme, for comparison)")

    def __post_init__(self) -> None:
        check(self.max_turns >= 1, "workload.episode.max_turns", self.max_turns, "must be >= 1")
        check(self.slots in SLOT_RULES, "workload.episode.slots", self.slots, f"allowed: {', '.join(SLOT_RULES)}")
        for name in ("turns", "observation_tokens", "env_latency_s"):
            getattr(self, name).validate(f"workload.episode.{name}")


@dataclass(frozen=True)
class WorkloadConfig:
    prompts_per_step: int = help_field(64, "prompts per RL step")
    samples_per_prompt: int = help_field(8, "samples per prompt (the GRPO group size)")
    pool_size: int = help_field(1024, "prompts per phase pool, iterated in epochs")
    sample_sigma: float = help_field(0.25, "lognormal noise of one sample around its prompt's length")
    growth_per_step: float = help_field(0.0, "lengths grow by this fraction per step (linear)")
    phases: tuple[PhaseConfig, ...] = help_factory(lambda: (PhaseConfig(),), "phases in order")
    cycle_phases: bool = help_field(False, "repeat the phase list when it ends")
    trace: str | None = help_field(None, "JSONL trace to replay instead of the parametric workload")
    drop_rate: float = help_field(0.0, "dynamic sampling (algorithm.dynamic_sampling): the share of prompt groups "
                                       "whose rewards are all equal; each is dropped and one more group drawn, up to "
                                       "4 x prompts_per_step groups a step: all are generated (and priced), "
                                       "prompts_per_step groups train")
    episode: EpisodeConfig | None = help_field(None, "multi-turn episodes (null: one model turn per sample); "
                                               "a family's length law is then that of one model turn")

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "workload.prompts_per_step", self.prompts_per_step, "must be >= 1")
        check(self.samples_per_prompt >= 1, "workload.samples_per_prompt", self.samples_per_prompt, "must be >= 1")
        check(self.pool_size >= 1, "workload.pool_size", self.pool_size, "must be >= 1")
        check(self.sample_sigma >= 0, "workload.sample_sigma", self.sample_sigma, "must be >= 0")
        check(self.growth_per_step > -1, "workload.growth_per_step", self.growth_per_step, "must be > -1")
        check(0 <= self.drop_rate < 1, "workload.drop_rate", self.drop_rate, "must be in [0, 1)")
        check(not (self.drop_rate and self.trace), "workload.drop_rate", self.drop_rate,
              "applies to the parametric workload; a trace replays what it recorded: set it 0")
        check(not (self.episode and self.trace), "workload.episode", "set",
              "applies to the parametric workload; a trace replays single-turn samples: set it null")
        check(len(self.phases) >= 1, "workload.phases", [], "give at least one phase")
        for i, p in enumerate(self.phases[:-1]):
            check(p.steps is not None, f"workload.phases[{i}].steps", None,
                  "only the last phase may run until the end (steps: null)")


@dataclass(frozen=True)
class SimSample:
    sample_id: tuple[int, int, int]  # (step, prompt index, sample index): docs/design.md invariant 2
    prompt: Prompt
    prompt_len: int
    output_length: int
    dropped: bool = False  # dynamic sampling dropped its group: generated, not trained
    episode: EpisodeWork | None = None  # multi-turn: output_length is then its model tokens

    @property
    def tokens(self) -> int:
        """Tokens the trainer processes: prompt and response (an episode's observations too)."""
        return self.episode.tokens if self.episode else self.prompt_len + self.output_length


_seed = stable_seed  # the name the simulator (and runtime/emulated.py) imported first


class ParametricWorkload:
    def __init__(self, cfg: WorkloadConfig, seed: int):
        self.cfg = cfg
        self.seed = seed
        self._pools: dict[int, list[tuple[Prompt, int, float, int]]] = {}
        self._orders: dict[tuple[int, int], list[int]] = {}

    def phase_of(self, step: int) -> tuple[int, int]:
        """(phase index, first step of the phase); past the last finite phase, the last goes on."""
        phases = self.cfg.phases
        base = 0
        if self.cfg.cycle_phases and all(p.steps for p in phases):
            total = sum(p.steps or 0 for p in phases)
            base = (step // total) * total
        local, start = step - base, 0
        for i, p in enumerate(phases):
            if p.steps is None or local < start + p.steps:
                return i, base + start
            start += p.steps
        return len(phases) - 1, base + start - (phases[-1].steps or 0)

    def _pool(self, phase: int) -> list[tuple[Prompt, int, float, int]]:
        if phase not in self._pools:
            rng = random.Random(_seed("pool", self.seed, phase))
            mix = self.cfg.phases[phase].mix
            weights = [f.weight for f in mix]
            pool = []
            for i in range(self.cfg.pool_size):
                fam = rng.choices(mix, weights)[0]
                if fam.dist == "lognormal":
                    mean = fam.median * math.exp(fam.sigma * rng.gauss(0.0, 1.0))
                elif fam.dist == "pareto":
                    mean = fam.median * (1.0 - rng.random()) ** (-1.0 / fam.alpha)
                else:
                    mean = fam.median
                prompt = Prompt(f"p{phase}-{i:06d}", features={f"family={fam.name}": 1.0},
                                tokens=fam.prompt_len)
                pool.append((prompt, fam.prompt_len, min(mean, float(fam.max_len)), fam.max_len))
            self._pools[phase] = pool
        return self._pools[phase]

    def _order(self, phase: int, epoch: int) -> list[int]:
        key = (phase, epoch)
        if key not in self._orders:
            order = list(range(self.cfg.pool_size))
            random.Random(_seed("epoch", self.seed, phase, epoch)).shuffle(order)
            self._orders = {key: order}  # keep one: steps ask for epochs in order
        return self._orders[key]

    def step(self, k: int) -> list[SimSample]:
        cfg = self.cfg
        phase, start = self.phase_of(k)
        pool = self._pool(phase)
        rng = random.Random(_seed("step", self.seed, k))
        grow = 1.0 + cfg.growth_per_step * k
        sigma = cfg.sample_sigma
        out = []
        first = (k - start) * cfg.prompts_per_step
        draws = [pool[self._order(phase, epoch)[offset]]
                 for epoch, offset in (divmod(first + pi, cfg.pool_size) for pi in range(cfg.prompts_per_step))]
        dropped = [False] * len(draws)
        if cfg.drop_rate:  # dynamic sampling: each dropped group draws one more, while the step may
            drops = random.Random(_seed("drops", self.seed, k))
            dropped = [drops.random() < cfg.drop_rate for _ in draws]
            while sum(not d for d in dropped) < cfg.prompts_per_step and len(draws) < 4 * cfg.prompts_per_step:
                draws.append(pool[random.Random(_seed("draw", self.seed, k, len(draws))).randrange(len(pool))])
                dropped.append(drops.random() < cfg.drop_rate)
        turns = random.Random(_seed("episode", self.seed, k))  # its own stream: single-turn draws stay as they were
        for pi, ((prompt, plen, mean, max_len), drop) in enumerate(zip(draws, dropped)):
            for si in range(cfg.samples_per_prompt):
                noise = rng.lognormvariate(0.0, sigma) if sigma else 1.0
                length = min(max_len, max(1, int(mean * grow * noise)))
                if cfg.episode is None:
                    out.append(SimSample((k, pi, si), prompt, plen, length, drop))
                    continue
                episode = _episode(cfg.episode, turns, plen, length, mean * grow, sigma, max_len)
                out.append(SimSample((k, pi, si), prompt, plen, episode.model_tokens, drop, episode))
        return out

    def extra_groups(self, k: int, indices: list[int]) -> list[SimSample]:
        """Over-provisioned groups of step k (pipeline.overprovision): prompt index i >= prompts_per_step
        draws its problem as dynamic sampling's extra draws do, each sample its own length noise."""
        cfg, (phase, _) = self.cfg, self.phase_of(k)
        pool, grow, out = self._pool(phase), 1.0 + cfg.growth_per_step * k, []
        for pi in indices:
            prompt, plen, mean, max_len = pool[random.Random(_seed("draw", self.seed, k, pi)).randrange(len(pool))]
            rng = random.Random(_seed("extra", self.seed, k, pi))
            for si in range(cfg.samples_per_prompt):
                noise = rng.lognormvariate(0.0, cfg.sample_sigma) if cfg.sample_sigma else 1.0
                out.append(SimSample((k, pi, si), prompt, plen, min(max_len, max(1, int(mean * grow * noise)))))
        return out

    @property
    def steps_available(self) -> int | None:
        return None


def _episode(cfg: EpisodeConfig, rng: random.Random, prompt_len: int, first: int, mean: float, sigma: float,
             max_len: int) -> EpisodeWork:
    """One episode: `first` model tokens in its first turn, each later turn its own noise around
    the prompt's `mean` length."""
    n = min(cfg.max_turns, max(1, round(cfg.turns.draw(rng))))
    lengths = [first] + [min(max_len, max(1, int(mean * (rng.lognormvariate(0.0, sigma) if sigma else 1.0))))
                         for _ in range(n - 1)]
    observations = [max(0, round(cfg.observation_tokens.draw(rng))) for _ in range(n - 1)]
    return EpisodeWork(prompt_len, tuple(lengths), tuple(observations),
                       tuple(cfg.env_latency_s.draw(rng) for _ in range(n)))


class TraceWorkload:
    """Replays a JSONL trace; steps are the trace's `step` values in order."""

    def __init__(self, path: str | Path, default_prompt_len: int = 512):
        path = Path(path)
        if not path.is_file():
            raise DataError(f"trace '{path}' does not exist; give a JSONL file of "
                            '{"prompt_id", "step", "output_length"} lines')
        by_step: dict[int, list[tuple[str, int, int]]] = {}
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                    pid, step, length = str(row["prompt_id"]), row["step"], row["output_length"]
                    plen = row.get("prompt_length", default_prompt_len)
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DataError(f"{path}:{n}: not a trace row ({e.__class__.__name__}: {e}); "
                                    'expected {"prompt_id": ..., "step": ..., "output_length": ...}') from None
                for key, value, low in (("step", step, 0), ("output_length", length, 1),
                                        ("prompt_length", plen, 0)):
                    if not isinstance(value, int) or isinstance(value, bool) or value < low:
                        raise DataError(f"{path}:{n}: {key} {value!r} is invalid; it must be an "
                                        f"integer >= {low}")
                by_step.setdefault(step, []).append((pid, length, plen))
        if not by_step:
            raise DataError(f"trace '{path}' has no rows")
        self._steps = [by_step[s] for s in sorted(by_step)]

    @property
    def steps_available(self) -> int:
        return len(self._steps)

    def step(self, k: int) -> list[SimSample]:
        rows = self._steps[k % len(self._steps)]
        index: dict[str, int] = {}
        seen: dict[int, int] = {}
        out = []
        for pid, length, plen in rows:
            pi = index.setdefault(pid, len(index))
            si = seen[pi] = seen.get(pi, -1) + 1
            out.append(SimSample((k, pi, si), Prompt(pid, tokens=plen), plen, length))
        return out


def make_workload(cfg: WorkloadConfig, seed: int) -> ParametricWorkload | TraceWorkload:
    if cfg.trace:
        prompt_len = cfg.phases[0].mix[0].prompt_len
        return TraceWorkload(cfg.trace, prompt_len)
    return ParametricWorkload(cfg, seed)


__all__ = ["FamilyConfig", "PhaseConfig", "DrawConfig", "EpisodeConfig", "WorkloadConfig", "SimSample", "ParametricWorkload",
           "TraceWorkload", "make_workload", "stable_seed"]
