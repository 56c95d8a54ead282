"""Tokenizers: a built-in character tokenizer, and HF tokenizers from a local directory.

The character tokenizer has a fixed vocabulary (ids never depend on the data), so a
checkpoint trained on it loads anywhere. Prompts end with a separator; the model answers
after it and stops with EOS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from poise.errors import PoiseError

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz+-*/=:;,.()[] \n?!'\""
SEPARATOR = "\n"  # between prompt and answer


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One id per character; unknown characters map to '?' rather than failing mid-run."""

    name = "char"

    def __init__(self) -> None:
        self.itos = list(SPECIALS) + list(CHARS)
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}
        self.vocab_size = len(self.itos)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._unknown = self.stoi["?"]

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(ch, self._unknown) for ch in text.lower()]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= len(SPECIALS) and i < self.vocab_size)

    def save(self, directory: str | Path) -> None:
        Path(directory, "poise_tokenizer.json").write_text(json.dumps({"type": "char", "chars": CHARS}))


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (never from a hub)."""

    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as e:
            raise PoiseError(f"cannot load a tokenizer from '{directory}': {str(e).splitlines()[0]}") from None
        self.name = str(directory)
        self.vocab_size = len(self._tok)
        if self._tok.eos_token_id is None:
            raise PoiseError(f"tokenizer in '{directory}' has no eos token; set eos_token in its config")
        self.eos_id = self._tok.eos_token_id
        self.pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id
        self.bos_id = self._tok.bos_token_id if self._tok.bos_token_id is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def chat_ids(self, prompt: str, system_prompt: str | None = None) -> list[int]:
        """`prompt` as a user message (after an optional system message) through the tokenizer's chat
        template, ending with the assistant's generation prompt: the ids the model answers after."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        messages.append({"role": "user", "content": prompt})
        # return_dict=False: transformers 5 returns a BatchEncoding by default, 4.x a list
        return list(self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))

    def chat_observation_ids(self, observation: str) -> list[int]:
        """An environment's observation as the chat template renders a user message after the model's
        turn, through the next assistant generation prompt, less the EOS the model's turn ended with
        (it is the model's own token): the template's text after an assistant message, rendered once
        with and once without the observation (the approach of verl's and SkyRL's agent loops)."""
        head = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]
        before = self._tok.apply_chat_template(head, tokenize=False)
        after = self._tok.apply_chat_template(head + [{"role": "user", "content": observation}], tokenize=False,
                                              add_generation_prompt=True)
        turn_end = before.rindex("!") + 1
        eos = self._tok.eos_token or ""
        if before.startswith(eos, turn_end):
            turn_end += len(eos)
        if not after.startswith(before[:turn_end]):
            raise PoiseError(f"tokenizer '{self.name}': its chat template renders the conversation before an "
                             "observation differently once the observation follows; episodes need a template "
                             "that appends messages (set data.chat_template=false)")
        return list(self._tok.encode(after[turn_end:], add_special_tokens=False))


def load_tokenizer(spec: str, model_dir: str | Path | None = None) -> Tokenizer:
    """`char` for the built-in tokenizer, `model` for the one saved beside the model, or a directory."""
    if spec == "char":
        return CharTokenizer()
    if spec == "model":
        if model_dir is not None and Path(model_dir, "poise_tokenizer.json").is_file():
            return CharTokenizer()
        if model_dir is None:
            raise PoiseError("data.tokenizer 'model' needs model.path; or set data.tokenizer: char")
        return HFTokenizer(model_dir)
    if not Path(spec).is_dir():
        raise PoiseError(f"tokenizer directory '{spec}' does not exist; use 'char', 'model' or a local directory")
    return HFTokenizer(spec)
