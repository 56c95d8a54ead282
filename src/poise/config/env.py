"""The `env:` section: multi-turn episodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from poise.schema import check, help_field


ENV_BUILTINS = {"guess": "poise.episodes.guess:GuessEnv", "tools": "poise.episodes.tools:ToolEnvironment"}


@dataclass(frozen=True)
class EnvConfig:
    """Multi-turn episodes (poise.episodes, docs/episodes.md): an environment answers each model turn."""

    name: str | None = help_field(None, "the environment: a built-in (guess, tools) or module:Class / "
                                        "path/to/file.py:Class; null = single-turn (one answer per prompt)")
    args: dict[str, Any] | None = help_field(None, "keyword arguments of the environment's constructor, e.g. "
                                                      "{tools: [calculator]}; null = none")
    max_turns: int = help_field(4, "model turns per episode at most (the environment may end it sooner)")
    max_tokens: int = help_field(0, "tokens of an episode after its prompt at most, model and observation "
                                    "tokens together; 0 = the engine's context less the prompt")
    max_observation_chars: int = help_field(2000, "characters one observation may have; a longer one fails "
                                                  "that environment call (env_failures) and ends the episode")

    def __post_init__(self) -> None:
        check(self.name is None or (isinstance(self.name, str) and self.name.strip() != ""), "name", self.name,
              "give a built-in (guess, tools), module:Class or path/to/file.py:Class, or null")
        check(self.name is None or self.name in ENV_BUILTINS or ":" in self.name, "name", self.name,
              "give a built-in (guess, tools), module:Class or path/to/file.py:Class")
        check(self.args is None or isinstance(self.args, Mapping), "args", self.args,
              "must be a mapping of constructor keyword arguments")
        check(isinstance(self.max_turns, int) and self.max_turns >= 1, "max_turns", self.max_turns,
              "must be an integer >= 1, e.g. 4")
        check(self.max_tokens >= 0, "max_tokens", self.max_tokens, "must be >= 0 (0 = the context less the prompt)")
        check(self.max_observation_chars >= 1, "max_observation_chars", self.max_observation_chars,
              "must be >= 1, e.g. 2000")

    def response_tokens(self, max_new_tokens: int) -> int:
        """Tokens after the prompt that the engine's context must hold: one answer's, or an episode's
        (env.max_tokens, else as many as the model's positions allow: a large number the context is capped by)."""
        if self.name is None:
            return max_new_tokens
        return self.max_tokens or 1 << 20

    @property
    def path(self) -> str | None:
        """The environment's import path (a built-in's resolved)."""
        return ENV_BUILTINS.get(self.name, self.name) if self.name is not None else None
