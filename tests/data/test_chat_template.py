"""data.chat_template: a prompt becomes the ids of the HF tokenizer's own apply_chat_template
(with the generation prompt and an optional system message), from a tokenizer built here."""

import json

import pytest

from poise.config import load_train_config
from poise.data.prompts import TaskSteps, check_prompts, make_tokenizer
from poise.errors import ConfigError, DataError, PoiseError

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]


def _tokenizer_dir(path, chat_template=TEMPLATE):
    """A character-level fast tokenizer (BPE without merges) with the chat template saved beside it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?.,:\n'" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=SPECIALS[4:])
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return _tokenizer_dir(tmp_path_factory.mktemp("tok"))


def _dataset(tmp_path, prompts):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in prompts))
    return path


def _steps(tmp_path, tok_dir, *extra):
    data = _dataset(tmp_path, ["what is 3+4?", "sort 3 1 2"])
    cfg = load_train_config(None, [f"data.dataset={data}", "data.prompt_key=question", f"data.tokenizer={tok_dir}",
                                   "data.chat_template=true", *extra])
    return TaskSteps(cfg.data, cfg.model, seed=0, prompts_per_step=2)


@pytest.mark.parametrize("system", [None, "You are a careful solver."])
def test_prompt_ids_are_the_tokenizers_chat_template(tmp_path, tok_dir, system):
    from transformers import AutoTokenizer

    steps = _steps(tmp_path, tok_dir, *([f"data.system_prompt={system}"] if system else []))
    hf = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    for problem in steps.problems(0):
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": problem.prompt}]
        expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = steps.prompt_ids(problem)
        assert ids == list(expected)
        # the template is really applied: turn markers, the generation prompt, the system message
        text = "".join(hf.convert_ids_to_tokens(ids))
        assert text.startswith("<s><|im_start|>") and text.endswith("<|im_start|>assistant\n"), text
        assert ("<|im_start|>system\n" + (system or "") in text) == bool(system), text
        assert ids != [steps.tokenizer.bos_id] + steps.tokenizer.encode(problem.prompt + "\n")


def test_context_check_counts_the_template_tokens(tmp_path, tok_dir):
    data = _dataset(tmp_path, ["x" * 20])
    common = [f"data.dataset={data}", "data.prompt_key=question", f"data.tokenizer={tok_dir}",
              "model.tiny.max_positions=40", "algorithm.sampling.max_new_tokens=8"]
    plain = load_train_config(None, common)  # 20 chars + BOS + separator = 22 tokens: fits in 40 - 8
    check_prompts(plain.data, plain.model, 0, 0, 8)
    # <s> <|im_start|> user\n (5) prompt (20) <|im_end|> \n <|im_start|> assistant\n (10): 40 tokens
    chat = load_train_config(None, [*common, "data.chat_template=true"])
    with pytest.raises(DataError, match=rf"{data}:1: prompt of 40 tokens"):
        check_prompts(chat.data, chat.model, 0, 0, 8)


def test_chat_template_with_the_char_tokenizer_is_a_config_error():
    with pytest.raises(ConfigError, match="data.chat_template.*built-in char tokenizer has no chat template"):
        load_train_config(None, ["data.chat_template=true"])
    with pytest.raises(ConfigError, match="data.system_prompt.*set data.chat_template=true"):
        load_train_config(None, ["data.system_prompt=be brief"])


def test_tokenizer_without_a_template_and_a_char_model_tokenizer(tmp_path):
    plain = _tokenizer_dir(tmp_path / "plain", chat_template=None)
    cfg = load_train_config(None, [f"data.tokenizer={plain}", "data.chat_template=true"])
    with pytest.raises(PoiseError, match="has no chat_template; add one"):
        make_tokenizer(cfg.data, cfg.model)
    model = tmp_path / "model"  # a checkpoint of the tiny model: its tokenizer is the char one
    model.mkdir()
    (model / "poise_tokenizer.json").write_text('{"type": "char"}')
    cfg = load_train_config(None, [f"model.path={model}", "data.tokenizer=model", "data.chat_template=true"])
    with pytest.raises(PoiseError, match="needs an HF tokenizer"):
        make_tokenizer(cfg.data, cfg.model)
