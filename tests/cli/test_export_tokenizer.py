"""`poise export` as a transformers user meets it: in a fresh process with transformers alone, the
export's tokenizer encodes training prompts to the ids Poise trained on and decodes them back, greedy
`model.generate` gives Poise's greedy tokens, and the model card's snippet runs as written. A run on an
HF tokenizer exports that tokenizer's files unchanged."""

import dataclasses
import json
import random
import re
import subprocess
import sys

import pytest
import torch

from poise.cli import main
from poise.config import load_train_config
from poise.data.prompts import TaskSteps, fitted_context
from poise.data.tasks import Problem
from poise.training.colocated import train_colocated

RUN = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.steps=1",
    "run.checkpoint_every=1",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
]

# runs in a process of its own with no Poise on its path: what a transformers user has
TRANSFORMERS_ONLY = r'''
import json, re, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

out, given = sys.argv[1], json.load(open(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(out).eval()
got = {"ids": [], "plain": [], "skip": [], "generated": []}
for text in given["texts"]:
    ids = tok(text).input_ids
    got["ids"].append(list(ids))
    got["plain"].append(tok.decode(ids))
    got["skip"].append(tok.decode(ids, skip_special_tokens=True))
    if given["generate"]:
        prompt = torch.tensor([ids])
        with torch.no_grad():
            new = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=given["max_new_tokens"])
        got["generated"].append(new[0, len(ids):].tolist())
card = open(out + "/README.md").read()
snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("path/to/this/directory", out)
scope = {}
with torch.no_grad():
    exec(snippet, scope)
got["card"] = {"ids": scope["ids"][0].tolist(), "generated": scope["out"][0, scope["ids"].shape[1]:].tolist()}
got["poise_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "poise")
json.dump(got, open(sys.argv[3], "w"))
'''


def _as_a_transformers_user(out, tmp_path, texts, generate, max_new_tokens=0):
    given, got = tmp_path / "given.json", tmp_path / "got.json"
    given.write_text(json.dumps({"texts": texts, "generate": generate, "max_new_tokens": max_new_tokens}))
    script = tmp_path / "user.py"
    script.write_text(TRANSFORMERS_ONLY)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, str(script), str(out), str(given), str(got)], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(got.read_text())
    assert got["poise_imported"] == []
    return got


def _greedy(cfg, model, prompt_ids: list[list[int]], eos_id: int) -> list[list[int]]:
    """Poise's greedy tokens: held-out evaluation's path (temperature 0 on engines of its own)."""
    from poise.evaluation.engine import generate_heldout
    from poise.types import Request

    sampling = cfg.algorithm.sampling
    rollout = dataclasses.replace(cfg.rollout, max_context=fitted_context(
        cfg.model, cfg.rollout.max_context, max(map(len, prompt_ids)), sampling.max_new_tokens))
    requests = [Request((-1, i, 0), ids) for i, ids in enumerate(prompt_ids)]
    with torch.no_grad():
        samples = generate_heldout(model, rollout, sampling, cfg.run.seed, eos_id, 0, requests, [])
    return [list(s.token_ids) for s in samples]


def _trained_model(run_dir):
    """The trainer's model at the run's last checkpoint, restored the way --resume restores it."""
    from poise.data.tokenizer import load_tokenizer
    from poise.training.checkpoint import latest_checkpoint, load_checkpoint
    from poise.training.setup import make_model
    from poise.training.trainer import PolicyTrainer

    cfg = load_train_config(run_dir / "config.yaml")
    model = make_model(cfg, load_tokenizer(cfg.data.tokenizer, cfg.model.path), progress=False)
    load_checkpoint(latest_checkpoint(run_dir), model, PolicyTrainer(model, cfg.algorithm, 0).optimizer)
    return cfg, model.eval()


@pytest.fixture(scope="module")
def char_run(tmp_path_factory, warm_start):
    path = tmp_path_factory.mktemp("export-tok") / "run"
    train_colocated(load_train_config(None, [*RUN, *warm_start.overrides, f"run.dir={path}"]))
    return path


def test_the_char_tokenizer_export_is_what_a_transformers_user_needs(char_run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(char_run), "--out", str(out)]) == 0
    cfg, model = _trained_model(char_run)
    steps = TaskSteps(cfg.data, cfg.model, cfg.run.seed, 1)
    pool = [p for i in range(len(steps.source.phases)) for p in steps.source.pool(i)]
    problems = random.Random(7).sample(pool, 100)  # 100 training prompts of the run, drawn with a seed
    texts = [p.prompt + "\n" for p in problems]  # the prompt, then the separator the model answers after
    want_ids = [steps.prompt_ids(p) for p in problems]
    card_ids = steps.prompt_ids(Problem("card", "arith", "arith 7+12", "19", "exact"))
    eos = steps.tokenizer.eos_id
    want_tokens = _greedy(cfg, model, [*want_ids, card_ids], eos)

    got = _as_a_transformers_user(out, tmp_path, texts, generate=True,
                                  max_new_tokens=cfg.algorithm.sampling.max_new_tokens)
    assert got["ids"] == want_ids  # <bos> first, one id per character: Poise's own encoding
    assert got["skip"] == texts  # the text round-trips
    assert got["plain"] == ["<bos>" + t for t in texts]  # BOS shows as itself, as HF tokenizers decode it
    assert got["generated"] == want_tokens[:-1]
    assert sum(eos in t for t in want_tokens) >= 50  # answers that end, not only max_new_tokens of noise
    assert len({tuple(t) for t in want_tokens}) >= 5  # and they differ between prompts
    assert got["card"] == {"ids": card_ids, "generated": want_tokens[-1]}  # the card's snippet, as written


def test_the_model_card_states_the_prompt_format(char_run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(char_run), "--out", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert '`<bos>` + the prompt text + "\\n"' in card and "`<eos>`" in card
    assert re.search(r"- `sort [0-9 ]+` -> `[0-9 ]+`", card)  # a built-in task's prompt and answer


def _hf_tokenizer_dir(path):
    """A tiny byte-level HF tokenizer (GPT-2 and Qwen style: a space is 'Ġ') saved as transformers 4 wrote
    it (compact JSON) with a chat template in its config: a save_pretrained by transformers 5 would rewrite
    every file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    chars = [byte_level.pre_tokenize_str(c)[0][0] for c in "0123456789abcdefghijklmnopqrstuvwxyz+-*/=:;,.()[] \n?"]
    vocab = {t: i for i, t in enumerate(["<|end|>", "<|start|>", *chars])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = byte_level
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(["<|end|>", "<|start|>"])
    path.mkdir()
    core.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>", "bos_token": "<|start|>",
              "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"],
              "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|end|>", "bos_token": "<|start|>"}))
    return path


def test_an_hf_tokenizer_run_exports_its_tokenizer_unchanged(tmp_path):
    tok_dir = _hf_tokenizer_dir(tmp_path / "tok")
    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*RUN, f"data.tokenizer={tok_dir}", f"run.dir={run}"]))
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    for f in tok_dir.iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert not (out / "poise_tokenizer.json").exists()

    cfg, model = _trained_model(run)
    steps = TaskSteps(cfg.data, cfg.model, cfg.run.seed, 1)
    problems = random.Random(7).sample(steps.source.pool(0), 20)
    texts = [p.prompt for p in problems]
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained(str(tok_dir))
    want = [original(t).input_ids for t in texts]
    card_ids = steps.prompt_ids(Problem("card", "arith", "arith 7+12", "19", "exact"))
    got = _as_a_transformers_user(out, tmp_path, texts, generate=False)
    assert got["ids"] == want  # as the tokenizer encodes from its own directory
    assert got["skip"] == texts
    # the card's recipe builds the ids Poise trained on, and its greedy answer is Poise's
    assert got["card"] == {"ids": card_ids, "generated": _greedy(cfg, model, [card_ids], steps.tokenizer.eos_id)[0]}
