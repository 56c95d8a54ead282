"""Per-sample rewards from `reward.functions`, run in the sandbox and combined by weight.

    scorer = RewardScorer(cfg.reward)                 # resolves, starts the sandbox; bad input fails here
    pending = scorer.submit([RewardInput(...), ...])  # returns at once: scored while generation goes on
    results = pending.result()                        # one RewardResult per input, in order
    scorer.close()

A sample's reward is `sum(weight_f * r_f)` over the functions in config order, where `r_f` is the
function's reward for that sample alone or, when the call failed, `reward.fallback`. Each sample
is one call per function (poise.rewards.worker), so the same sample gets the same reward whatever
it was batched with (docs/design.md invariant 1), as long as the function itself is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from poise.config import REWARD_LIMIT, EnvConfig, RewardConfig
from poise.rewards.functions import resolve_environment, resolve_functions
from poise.rewards.sandbox import CHUNK, Batch, Call, SandboxLimits, SandboxPool


@dataclass(frozen=True)
class RewardInput:
    sample_id: tuple[int, int, int]
    prompt: str
    completion: str
    columns: Mapping[str, Any]  # answer, reward_kind and the dataset row's other columns


@dataclass(frozen=True)
class RewardFailure:
    function: str  # the function's metrics name
    reason: str


@dataclass(frozen=True)
class RewardResult:
    value: float  # the weighted sum: the sample's reward
    parts: Mapping[str, float] = field(default_factory=dict)  # each function's reward (fallback included)
    failures: tuple[RewardFailure, ...] = ()


class PendingRewards:
    """The rewards of one `submit`: `done()` without blocking, `result()` blocking."""

    def __init__(self, batch: Batch | None, combine=None, results: list[RewardResult] | None = None):
        self._batch, self._combine, self._results = batch, combine, results

    @classmethod
    def ready(cls, results: list[RewardResult]) -> "PendingRewards":
        """Rewards already known (the emulated job's, computed in the driver)."""
        return cls(None, results=results)

    def done(self, wait_s: float = 0.0) -> bool:
        """Whether `result()` would return at once, after waiting up to `wait_s` for it."""
        return self._results is not None or self._batch is None or self._batch.done(wait_s)

    def result(self) -> list[RewardResult]:
        if self._results is None:
            self._results = self._combine(self._batch.result())
        return self._results


class RewardScorer:
    """The reward functions, and an episode environment where `env` names one (poise.episodes): both
    run in the one sandbox pool, under reward.timeout_s, memory_mb, cpu_s and isolation."""

    def __init__(self, cfg: RewardConfig, env: EnvConfig | None = None):
        self.cfg = cfg
        self.specs = resolve_functions(cfg)
        pool_specs = self.specs
        self.env_index = -1
        if env is not None and env.path is not None:
            self.env_index = len(self.specs)
            pool_specs += (resolve_environment(env.path, dict(env.args or {}), env.max_observation_chars,
                                               name=env.name),)
        self.pool = SandboxPool(pool_specs, SandboxLimits(cfg.timeout_s, cfg.memory_mb, cfg.cpu_s, cfg.workers,
                                                          CHUNK if cfg.isolation == "batch" else 1))

    def submit_env(self, calls: Sequence[Call]) -> Batch:
        """Queue environment calls (poise.episodes.runner); returns at once."""
        if self.env_index < 0:
            raise RuntimeError("submit_env: this scorer was built without an environment (env.name)")
        return self.pool.submit(calls)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def submit(self, inputs: Sequence[RewardInput]) -> PendingRewards:
        n = len(self.specs)
        calls = [Call(f, x.prompt, x.completion, dict(x.columns)) for x in inputs for f in range(n)]
        batch = self.pool.submit(calls)
        return PendingRewards(batch, lambda outcomes: self._combine(outcomes, len(inputs)))

    def score(self, inputs: Sequence[RewardInput]) -> list[RewardResult]:
        return self.submit(inputs).result()

    def _combine(self, outcomes, count: int) -> list[RewardResult]:
        n, fallback = len(self.specs), self.cfg.fallback
        results = []
        for i in range(count):
            value, parts, failures = 0.0, {}, []
            for f, spec in enumerate(self.specs):
                r, error = _accepted(outcomes[i * n + f])
                if error is not None:
                    r = fallback
                    failures.append(RewardFailure(spec.name, error))
                parts[spec.name] = r
                value += spec.weight * r
            results.append(RewardResult(value, parts, tuple(failures)))
        return results

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _accepted(outcome) -> tuple[float, str | None]:
    """An outcome's reward, or why it is a failed call: no value, or one beyond ±REWARD_LIMIT (finite,
    yet it would overflow the advantages' sums and crash the driver)."""
    if outcome.value is None:
        return 0.0, outcome.error or "failed"
    if abs(outcome.value) > REWARD_LIMIT:
        return 0.0, f"returned {outcome.value:g}, beyond ±{REWARD_LIMIT:g}"
    return outcome.value, None


def check_rewards(cfg: RewardConfig, env: EnvConfig | None = None) -> None:
    """Every function (and the environment class) resolves and loads in the sandbox (a ConfigError
    otherwise); ~0.2 s."""
    RewardScorer(cfg, env).close()


def reward_metrics(results: Iterable[RewardResult]) -> dict[str, float | int]:
    """A step's `reward/<name>` means (one per function) and `reward_failures` (failed calls)."""
    results = list(results)
    sums: dict[str, float] = {}
    for r in results:
        for name, v in r.parts.items():
            sums[name] = sums.get(name, 0.0) + v
    out: dict[str, float | int] = {f"reward/{name}": s / len(results) for name, s in sums.items()}
    out["reward_failures"] = sum(len(r.failures) for r in results)
    return out


def log_failures(log, t: float, step: int, scored: Iterable[tuple[tuple[int, int, int], RewardResult]],
                 fallback: float | None = None) -> None:
    """One `reward_failure` event per failed call: the sample id, the function and why."""
    for sample_id, r in scored:
        for failure in r.failures:
            log.event("reward_failure", t, step=step, id=list(sample_id), function=failure.function,
                      reason=failure.reason, **({"fallback": fallback} if fallback is not None else {}))


__all__ = ["RewardScorer", "check_rewards", "RewardInput", "RewardResult", "RewardFailure", "PendingRewards", "reward_metrics",
           "log_failures"]
