"""The `reward:` section: the reward functions and their sandbox."""

from __future__ import annotations

import math
from dataclasses import dataclass

from poise.errors import ConfigError
from poise.schema import check, help_field

# The names of the built-in reward functions (poise.rewards.builtin.BUILTINS, which keeps the same
# names in the same order), as plain data: the section checks a name without importing the rewards.
REWARD_BUILTINS = ("task", "exact", "items", "math", "code")


# A reward's magnitude bound: beyond it a reward is a failed call (poise.rewards.scorer). A finite
# 1e308 passes isfinite yet overflows the sums and squares the advantages take; within these bounds a
# weighted sum over functions and the std of a step's batch stay far from float overflow.
REWARD_LIMIT = 1e12
REWARD_WEIGHT_LIMIT = 1e6


@dataclass(frozen=True)
class RewardFunctionConfig:
    """One reward function of `reward.functions` (poise.rewards.functions resolves it at start)."""

    fn: str = help_field("task", "a built-in (task, exact, items, math, code), an import path 'module:function' "
                                 "or a file 'path/to/file.py:function'; TRL's signature "
                                 "fn(prompts, completions, **columns) -> list[float]")
    weight: float = help_field(1.0, "the run's reward is the weighted sum of its functions' rewards")
    name: str = help_field("", "metrics key reward/<name>; empty = the built-in's name or the function's")

    def __post_init__(self) -> None:
        check(bool(self.fn.strip()), "fn", self.fn, "name a function: a built-in (task, exact, items, math, code), "
                                                    "'module:function' or 'path/to/file.py:function'")
        if ":" in self.fn:
            where, _, attr = self.fn.rpartition(":")
            check(bool(where) and all(part.isidentifier() for part in attr.split(".")), "fn", self.fn,
                  "write 'module:function' or 'path/to/file.py:function'")
        else:
            check(self.fn in REWARD_BUILTINS, "fn", self.fn, f"unknown built-in; choose one of "
                  f"{', '.join(REWARD_BUILTINS)}, or give 'module:function' or 'path/to/file.py:function'")
        check(math.isfinite(self.weight) and abs(self.weight) <= REWARD_WEIGHT_LIMIT, "weight", self.weight,
              f"must be a finite number within ±{REWARD_WEIGHT_LIMIT:g}, e.g. 1.0")

    @property
    def label(self) -> str:
        """Its metrics name: `name`, else the built-in's name or the function's attribute."""
        return self.name or self.fn.rpartition(":")[2].rpartition(".")[2]


@dataclass(frozen=True)
class RewardConfig:
    """How samples are scored: which functions, and the sandbox they run in (poise.rewards)."""

    functions: tuple[RewardFunctionConfig | str, ...] = help_field(
        (), "[{fn: my_module:score, weight: 1.0}, ...] (or just [math, 'file.py:f']); empty = the built-in per-row "
            "task reward (`task`: each row's exact/items kind)")
    timeout_s: float = help_field(10.0, "wall-clock seconds one function may take on one sample; past it the "
                                        "sandbox worker is killed and replaced and the sample gets the fallback")
    fallback: float = help_field(0.0, "the reward of a function that timed out, crashed, raised or returned "
                                      "something other than one finite number (counted in reward_failures)")
    workers: int = help_field(2, "sandboxed reward worker processes, started once per run")
    memory_mb: int = help_field(2048, "address-space limit (RLIMIT_AS) of each reward worker, in MiB")
    cpu_s: float = help_field(10.0, "CPU seconds (RLIMIT_CPU) one function may use on one sample")
    isolation: str = help_field("batch", "what one fresh process of a reward worker runs: `batch` (up to 64 calls of "
                                         "one submitted batch; a reward cannot touch another batch's results) or "
                                         "`call` (one sample: nor another sample's; ~1 ms more a call)")

    def __post_init__(self) -> None:
        entries = []
        for i, f in enumerate(self.functions):
            try:
                entries.append(RewardFunctionConfig(fn=f) if isinstance(f, str) else f)
            except ConfigError as e:  # the shorthand `- math` is checked here, not by schema.build
                raise ConfigError(f"functions[{i}].{e.key}", e.value, e.allowed) from None
        object.__setattr__(self, "functions", tuple(entries))
        labels = [f.label for f in self.functions]
        for i, label in enumerate(labels):
            check(labels.index(label) == i, f"functions[{i}].name", label,
                  "two functions would both report as reward/" + label + "; give one a distinct `name`")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0, e.g. 10")
        check(math.isfinite(self.fallback) and abs(self.fallback) <= REWARD_LIMIT, "fallback", self.fallback,
              f"must be a finite number within ±{REWARD_LIMIT:g}, e.g. 0.0")
        check(self.workers >= 1, "workers", self.workers, "must be >= 1")
        check(self.memory_mb >= 64, "memory_mb", self.memory_mb, "must be >= 64 (a Python worker needs ~30 MiB)")
        check(self.cpu_s > 0, "cpu_s", self.cpu_s, "must be > 0, e.g. 10")
        check(self.isolation in ("batch", "call"), "isolation", self.isolation, "must be batch or call")

    @property
    def resolved(self) -> tuple[RewardFunctionConfig, ...]:
        """The functions that score a run: `functions`, or the built-in per-row `task` reward."""
        return self.functions or (RewardFunctionConfig(),)
