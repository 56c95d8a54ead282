"""Tokenizers: a built-in character tokenizer, and HF tokenizers from a local directory.

The character tokenizer has a fixed vocabulary (ids never depend on the data), so a
checkpoint trained on it loads anywhere. Prompts end with a separator; the model answers
after it and stops with EOS. Both save themselves beside a model so that transformers'
`AutoTokenizer` loads them: the character tokenizer as a `tokenizers` file of its own
vocabulary, an HF tokenizer as its files, copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Protocol

from poise.errors import PoiseError

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz+-*/=:;,.()[] \n?!'\""
SEPARATOR = "\n"  # between prompt and answer
# the files of an HF tokenizer besides its vocabulary files (the tokenizer class's vocab_files_names)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: str | Path) -> None: ...


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
        """The marker `load_tokenizer('model')` reads, and this tokenizer as transformers files, which
        `AutoTokenizer.from_pretrained(directory)` loads: it encodes text to the ids `encode` gives, after
        BOS (a prompt's start; poise.data.prompts), and decodes them back."""
        directory = Path(directory)
        (directory / "poise_tokenizer.json").write_text(json.dumps({"type": "char", "chars": CHARS}))
        self.hf_core().save(str(directory / "tokenizer.json"))
        specials = {"bos_token": SPECIALS[self.bos_id], "eos_token": SPECIALS[self.eos_id],
                    "pad_token": SPECIALS[self.pad_id]}
        (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
        # written by hand, not by transformers' save_pretrained: the same bytes under transformers 4 and 5;
        # no cleanup of spaces before punctuation ("a ." stays "a ."), no token_type_ids (causal LMs take none)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, "clean_up_tokenization_spaces": False,
                  "model_input_names": ["input_ids", "attention_mask"]}
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def hf_core(self):
        """This tokenizer as a `tokenizers.Tokenizer`: lowercase, every character outside the vocabulary
        made '?', then one token per character (a BPE without merges) and BOS first, as here.

        The vocabulary is written in the byte-level alphabet (space is 'Ġ', newline 'Ċ') with a byte-level
        pre-tokenizer and decoder: transformers 5 loads a `qwen2` model's tokenizer as its own Qwen2
        class, which keeps this file's vocabulary and BOS template but puts its byte-level pipeline in
        place of this one's, so the ids are the same there for text of the vocabulary's characters."""
        import re

        from tokenizers import Regex
        from tokenizers import Tokenizer as Core
        from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        vocab = {byte_level.pre_tokenize_str(t)[0][0] if i >= len(SPECIALS) else t: i for i, t in enumerate(self.itos)}
        core = Core(models.BPE(vocab=vocab, merges=[], unk_token=self.itos[self._unknown]))
        outside = Regex(f"[^{re.escape(CHARS)}]")
        core.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(outside, "?")])
        core.pre_tokenizer = byte_level
        core.decoder = decoders.ByteLevel()
        core.add_special_tokens(list(SPECIALS))
        bos = SPECIALS[self.bos_id]
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                            special_tokens=[(bos, self.bos_id)])
        return core


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (never from a hub)."""

    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as e:
            raise PoiseError(f"cannot load a tokenizer from '{directory}': {str(e).splitlines()[0]}") from None
        self.name = str(directory)
        self.directory = Path(directory)
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

    def save(self, directory: str | Path) -> None:
        """The tokenizer's own files, copied unchanged into `directory` (a save_pretrained of the loaded
        tokenizer would rewrite them in this transformers version's format)."""
        names = {*TOKENIZER_FILES, *getattr(self._tok, "vocab_files_names", {}).values()}
        for name in sorted(names):
            source, target = self.directory / name, Path(directory, name)
            if source.is_file() and not (target.exists() and target.samefile(source)):
                shutil.copyfile(source, target)
        templates = self.directory / "additional_chat_templates"
        if templates.is_dir():
            shutil.copytree(templates, Path(directory, templates.name), dirs_exist_ok=True)

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
