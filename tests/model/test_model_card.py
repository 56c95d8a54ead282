"""The model card's snippet builds the prompt ids Poise trains on, run as written with transformers'
AutoTokenizer: for the built-in tokenizer, an HF tokenizer, and an HF tokenizer's chat template with
and without a system prompt."""

import json
import re

import pytest
import torch

from poise.config import DataConfig, EnvConfig, ModelConfig, SamplingConfig
from poise.data.prompts import encode_prompt, make_tokenizer
from poise.data.tasks import Problem
from poise.data.tokenizer import CharTokenizer
from poise.model.card import model_card

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A byte-level character HF tokenizer with a chat template, its BOS and EOS special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = tmp_path_factory.mktemp("tok")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    chars = "0123456789abcdefghijklmnopqrstuvwxyz+-*/=:;,.()[] \n?!|<>_"
    specials = ["<|end|>", "<|start|>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate([*specials, *(byte_level.pre_tokenize_str(c)[0][0] for c in chars)])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = byte_level
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    core.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>", "bos_token": "<|start|>",
        "chat_template": TEMPLATE, "model_input_names": ["input_ids", "attention_mask"]}))
    return path


def _card_ids(card: str, tokenizer_dir) -> list[int]:
    """The ids the card's snippet builds for its prompt, with everything but the model run as written."""
    from transformers import AutoTokenizer

    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    lines = [line for line in snippet.splitlines() if line.startswith(("prompt =", "ids ="))]
    scope = {"torch": torch, "tok": AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)}
    exec("\n".join(lines), scope)
    return scope["ids"][0].tolist()


@pytest.mark.parametrize("chat_template, system_prompt", [(False, None), (True, None), (True, "be brief")])
def test_the_cards_snippet_builds_poises_prompt_ids_for_an_hf_tokenizer(hf_dir, chat_template, system_prompt):
    data = DataConfig(tokenizer=str(hf_dir), chat_template=chat_template, system_prompt=system_prompt)
    tok = make_tokenizer(data, ModelConfig())
    card = model_card(ModelConfig(), data, SamplingConfig(), EnvConfig(), tok, "a test")
    want = encode_prompt(tok, Problem("c", "arith", "arith 7+12", "19", "exact"), chat_template, system_prompt)
    assert _card_ids(card, hf_dir) == want
    assert ("chat template" in card) == chat_template
    if system_prompt:
        assert "be brief" in card


def test_the_cards_snippet_builds_poises_prompt_ids_for_the_char_tokenizer(tmp_path):
    tok = CharTokenizer()
    tok.save(tmp_path)
    data = DataConfig()
    card = model_card(ModelConfig(), data, SamplingConfig(), EnvConfig(), tok, "a test")
    assert _card_ids(card, tmp_path) == encode_prompt(tok, Problem("c", "arith", "arith 7+12", "19", "exact"))
