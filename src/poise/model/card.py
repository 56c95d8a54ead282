"""The model card (`README.md`) of an exported model: what it is, how to load it and the prompt
format it was trained on, so that a transformers user gets the model's answers. Torch-free.

The prompt format is the one poise.data.prompts builds: `[BOS] + prompt + "\\n"` (the model answers
after the separator and ends with EOS), or the tokenizer's chat template with `data.chat_template`.
"""

from __future__ import annotations

import random
from pathlib import Path

from poise.config import DataConfig, EnvConfig, ModelConfig, SamplingConfig
from poise.data.tasks import TaskSource, make_problem
from poise.data.tokenizer import SEPARATOR, CharTokenizer, Tokenizer


def model_card(model: ModelConfig, data: DataConfig, sampling: SamplingConfig, env: EnvConfig,
               tokenizer: Tokenizer, origin: str) -> str:
    """The card of a model exported from `origin` (e.g. "checkpoint step_4 of run 'runs/x'")."""
    base = f"`{model.path}`" if model.path else f"Poise's built-in tiny {model.tiny.arch} model"
    lora = ", with its LoRA adapter merged into the base weights" if model.lora is not None else ""
    lines = [
        "# A Poise model",
        "",
        f"Exported by `poise export` from {origin}: {base} after RL post-training{lora}.",
        "",
        "## Load and generate",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'DIR = "path/to/this/directory"',
        "tok = AutoTokenizer.from_pretrained(DIR)",
        "model = AutoModelForCausalLM.from_pretrained(DIR)",
        *_encode_lines(data, tokenizer),
        f"out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, "
        f"max_new_tokens={sampling.max_new_tokens})",
        "print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))",
        "```",
        "",
        "`do_sample=False` gives the greedy answer Poise's held-out evaluation scores. The run sampled at "
        f"temperature {sampling.temperature}, top_p {sampling.top_p}, top_k {sampling.top_k} "
        f"(0: all), at most {sampling.max_new_tokens} new tokens.",
        "",
        "## Prompt format",
        "",
        *_format_lines(data, tokenizer),
        "",
        *_task_lines(data, env),
    ]
    return "\n".join(lines) + "\n"


def _encode_lines(data: DataConfig, tokenizer: Tokenizer) -> list[str]:
    """The snippet's lines that make `ids`, a (1, n) tensor of the prompt's ids as the run built them."""
    head = ['prompt = "arith 7+12"' if data.dataset is None else 'prompt = "..."  # a row\'s prompt text']
    if isinstance(tokenizer, CharTokenizer):
        return [*head, 'ids = tok(prompt + "\\n", return_tensors="pt").input_ids  # the tokenizer adds <bos>']
    if data.chat_template:
        system = [] if data.system_prompt is None else [f'{{"role": "system", "content": {data.system_prompt!r}}}']
        messages = ", ".join([*system, '{"role": "user", "content": prompt}'])
        return [*head, f"ids = torch.tensor([tok.apply_chat_template([{messages}], add_generation_prompt=True, "
                       "return_dict=False)])"]
    return [*head, f"ids = torch.tensor([[{tokenizer.bos_id}] + tok(prompt, add_special_tokens=False).input_ids "
                   '+ tok("\\n", add_special_tokens=False).input_ids])']


def _format_lines(data: DataConfig, tokenizer: Tokenizer) -> list[str]:
    separator = repr(SEPARATOR).replace("'", '"')
    if isinstance(tokenizer, CharTokenizer):
        return [f"Poise's character tokenizer: one token per character of a fixed vocabulary (lowercase letters, "
                f"digits, space, newline and `+-*/=:;,.()[]?!'\"`); text is lowercased and any other character "
                "becomes `?`. Specials: `<pad>` 0, `<bos>` 1, `<eos>` 2.",
                "",
                f"A prompt is `<bos>` + the prompt text + {separator}; the model answers after the {separator} and "
                "ends its answer with `<eos>`. `tok(text)` puts `<bos>` first itself, so pass `prompt + \"\\n\"`.",
                "",
                "Transformers 5 loads a `qwen2` model's tokenizer as its Qwen2 class, which neither lowercases nor "
                "turns other characters into `?` (it drops them): pass lowercase text of the vocabulary's "
                "characters, or load the exact tokenizer with `PreTrainedTokenizerFast.from_pretrained(DIR)`."]
    if data.chat_template:
        system = "" if data.system_prompt is None else f" after the system message {data.system_prompt!r}"
        return [f"The prompt text is a user message{system}, through this tokenizer's chat template with the "
                "assistant's generation prompt (`add_generation_prompt=True`); the model's answer ends with its "
                f"EOS token (id {tokenizer.eos_id})."]
    return [f"Token ids `[{tokenizer.bos_id}]` (BOS) + the prompt text's tokens + the tokens of {separator}, each "
            "part tokenized alone without special tokens (`add_special_tokens=False`); the model answers after "
            f"the separator and ends its answer with its EOS token (id {tokenizer.eos_id})."]


def _task_lines(data: DataConfig, env: EnvConfig) -> list[str]:
    episodes = ([f"Trained on multi-turn episodes of environment `{env.name}`: after each model turn the "
                 "environment's observation is appended and the model answers again."] if env.name else [])
    if data.dataset is not None:
        return ["## Training data", "",
                f"Rows of `{Path(data.dataset).name}`: the prompt text is column `{data.prompt_key}`, the "
                f"reference answer column `{data.answer_key}`.", *episodes]
    families = sorted({name for phase in TaskSource(0, data.phases or None, 1).phases for name in phase.mix})
    rng = random.Random(0)
    examples = [make_problem(name, rng, "example") for name in families]
    return ["## Training data", "",
            "Poise's built-in verifiable tasks (prompt text, then the reference answer):", "",
            *[f"- `{p.prompt}` -> `{p.answer}`" for p in examples], *episodes]
