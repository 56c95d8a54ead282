"""Between tokens and text for episodes: a model turn's text (for the environment) and an
observation's tokens (appended to the episode), for the built-in tokenizer and HF chat templates."""

from __future__ import annotations

from typing import Sequence

from poise.data.tokenizer import SEPARATOR, HFTokenizer, Tokenizer


class TurnCodec:
    """chat_template: observations as user messages in the HF tokenizer's chat template
    (`HFTokenizer.chat_observation_ids`); otherwise the observation's text and the separator a prompt
    ends with, after the model's EOS."""

    def __init__(self, tokenizer: Tokenizer, chat_template: bool):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self._cache: dict[str, list[int]] = {}  # observations repeat ("higher", "lower", tool errors)

    def action_text(self, token_ids: Sequence[int]) -> str:
        """What the environment sees of a model turn: its text, without EOS."""
        eos = self.tokenizer.eos_id
        return self.tokenizer.decode([t for t in token_ids if t != eos])

    def observation_ids(self, observation: str) -> list[int]:
        ids = self._cache.get(observation)
        if ids is None:
            if self.chat_template and isinstance(self.tokenizer, HFTokenizer):
                ids = self.tokenizer.chat_observation_ids(observation)
            else:
                ids = self.tokenizer.encode(observation + SEPARATOR)
            if len(self._cache) < 4096:
                self._cache[observation] = ids
        return list(ids)
