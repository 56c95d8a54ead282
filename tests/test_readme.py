"""README.md's and docs/*.md's snippets, as written: the quickstart trains, evaluates, exports and
reports on a model, data and reward of its own; the reward file and its config score the dataset
they name (through the reward sandbox); every YAML snippet loads as a `poise train` config; every
shell command names a make target or a `poise` command whose arguments and config load; the
command table lists every `poise` command; every relative link names a file in the repository.
(The other commands are not run to the end: `make demo` alone takes minutes; their first seconds
are what a typo breaks. A pip install from a wheel index is checked against the Makefile's pin,
not run.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from poise.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# the pages whose snippets are whole files, configs and commands (docs/episodes.md and docs/tools.md
# show fragments: a section of a config, a call inside a function)
PAGES = {"README.md": README, **{f"docs/{name}.md": (ROOT / "docs" / f"{name}.md").read_text() for name in (
    "installing", "configuration", "losses", "data-and-rewards", "environments", "training", "resizing", "faults",
    "vllm", "gpus", "simulator", "benchmark-scripts", "limitations", "corrections")}}
QUICKSTART = "# my-run.yaml"  # the quickstart's config: its commands run in test_the_quickstart_runs


def _blocks(lang: str) -> list[str]:
    return [b for text in PAGES.values() for b in re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)]


def _one(lang: str, marker: str) -> str:
    found = [b for b in _blocks(lang) if marker in b]
    assert len(found) == 1, f"README and docs have {len(found)} ```{lang} blocks holding {marker!r}"
    return found[0]


@pytest.fixture
def reward_project(tmp_path, monkeypatch):
    """The README's reward file and config in a directory of their own, with the data file the
    config names: the package's GSM8K sample (`question`, `answer` ending in `#### N`)."""
    (tmp_path / "my_rewards.py").write_text(_one("python", "# my_rewards.py"))
    (tmp_path / "config.yaml").write_text(_one("yaml", "my_rewards:concise"))
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "src/poise/data/samples/gsm8k_sample.jsonl", tmp_path / "data" / "train.jsonl")
    monkeypatch.chdir(tmp_path)  # `my_rewards:concise` is found from the working directory
    return tmp_path


def test_the_reward_snippet_scores_its_own_dataset(reward_project):
    from poise.data.dataset import load_dataset
    from poise.rewards.scorer import RewardInput, RewardScorer

    cfg = load_train_config("config.yaml", ["run.progress=false"])
    rows = load_dataset(cfg.data.dataset, cfg.data.prompt_key, cfg.data.answer_key)
    assert len(rows) >= 10
    right = [(r.prompt, r.answer, r.answer) for r in rows]  # the reference solution as the completion
    wrong = [(r.prompt, r.answer + "1", r.answer) for r in rows]  # its final number changed
    scorer = RewardScorer(cfg.reward)
    try:
        scores = scorer.score([RewardInput((0, i, 0), p, c, {"answer": a, "reward_kind": "math"})
                               for i, (p, c, a) in enumerate(right + wrong)])
    finally:
        scorer.close()
    assert not [f for s in scores for f in s.failures]
    by_function = {name: [s.parts[name] for s in scores] for name in scores[0].parts}
    ends = next(v for k, v in by_function.items() if "ends_with_answer" in k)
    assert ends == [1.0] * len(right) + [0.0] * len(wrong)  # it can score its own dataset
    concise = next(v for k, v in by_function.items() if "concise" in k)
    assert all(v < 0 for v in concise)


def test_every_yaml_snippet_loads_as_a_config(reward_project):
    for i, block in enumerate(_blocks("yaml")):
        if QUICKSTART in block:  # its model directory is the quickstart test's
            continue
        path = reward_project / f"snippet{i}.yaml"
        path.write_text(block)
        load_train_config(str(path), [])  # unknown keys, wrong types: PoiseError


def test_every_python_snippet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a snippet writes stays out of the checkout
    for block in _blocks("python"):
        if "poise.train(" not in block:  # the API's, which trains: test_the_python_api_snippet_trains
            exec(compile(block, "README.md", "exec"), {})


def test_the_python_api_snippet_trains(tmp_path, monkeypatch):
    """The API example runs as written: a run of two steps, its metrics returned, a resolved
    config, a simulation."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(_one("python", "poise.train("), "README.md", "exec"), ns)
    result = ns["result"]
    assert result.run_dir.resolve() == (tmp_path / "runs" / "api-example").resolve()
    assert [row["step"] for row in result.metrics] == [0, 1]
    assert len(result.rewards) == 2 and (result.run_dir / "config.yaml").is_file()
    assert result.config.algorithm.clip_eps_high == 0.28  # the dapo preset reached the run
    assert ns["cfg"].algorithm.ratio_level == "sequence"
    assert ns["summary"].steps == 5 and (tmp_path / "runs" / "sim-api" / "metrics.jsonl").is_file()


def test_the_environment_snippet_trains_episodes(tmp_path, monkeypatch):
    """The README's environment and its config as written (file and YAML), one colocated step on
    the tiny model: every episode reset and stepped in the sandbox, none failing, reward/env reported."""
    import json

    from poise.training.colocated import train_colocated

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_env.py").write_text(_one("python", "# my_env.py"))
    (tmp_path / "agent.yaml").write_text(_one("yaml", "my_env.py:Countdown"))
    cfg = load_train_config("agent.yaml", ["run.progress=false", "run.steps=1", "run.dir=run", "pipeline.mode=colocated",
                                           "data.phases=[{mix: {arith: 1.0}}]", "algorithm.prompts_per_step=2",
                                           "algorithm.group_size=2", "algorithm.sampling.max_new_tokens=3",
                                           "rollout.max_context=64"])
    train_colocated(cfg)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["env_failures"] == 0 and row["episode/env_calls"] >= 8, row  # 4 episodes: a reset and a step each
    assert "reward/env" in row and row["episode/end_done"] + row["episode/end_max_turns"] == 4, row


def _commands() -> list[list[str]]:
    out = []
    for block in _blocks("bash"):
        if "my-run.yaml" in block:  # the quickstart's: run in its own directory by test_the_quickstart_runs
            continue
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                for part in line.split("&&"):
                    out.append(shlex.split(part))
    return out


def test_every_shell_command_parses_and_its_config_loads(monkeypatch):
    import argparse
    import importlib

    from poise.cli import SUBCOMMANDS

    monkeypatch.chdir(ROOT)
    targets = set(re.findall(r"^([a-z][\w.-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    seen = set()
    torch_spec = re.search(r"^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    for argv in _commands():
        if argv[0] == "make":
            assert argv[1] in targets, argv
            continue
        if argv[0] == ".venv/bin/pip":  # a wheel index: not reachable from a test; the pin it names is the Makefile's
            assert argv[1] == "install" and torch_spec in argv, (argv, torch_spec)
            continue
        if argv[0] == ".venv/bin/python":  # run as written, by this interpreter
            done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (argv, done.stderr[-2000:])
            continue
        if argv[0].endswith(".sh"):  # a script (the GPU check): it exists and parses
            assert subprocess.run(["bash", "-n", str(ROOT / argv[0])]).returncode == 0, argv
            continue
        if argv[0] == ".venv-vllm/bin/poise":  # `make vllm`'s venv: the same command line
            argv = ["poise", *argv[1:]]
        assert argv[0] == "poise" and argv[1] in SUBCOMMANDS, argv
        seen.add(argv[1])
        parser = argparse.ArgumentParser(prog=f"poise {argv[1]}")
        importlib.import_module(SUBCOMMANDS[argv[1]][0]).add_parser(parser)
        args = parser.parse_args(argv[2:])
        if argv[1] in ("train", "sft", "config") and not getattr(args, "resume", None):
            config = args.config if args.config and "=" not in args.config else None
            overrides = args.overrides if config or not args.config else [args.config, *args.overrides]
            load_train_config(config, overrides)
        if argv[1] in ("simulate",) and not args.list:
            from poise.sim import load_scenario

            load_scenario(args.scenario, args.overrides)
    assert {"train", "sft", "simulate", "profile", "report"} <= seen


def test_no_issue_numbers_in_the_user_documents():
    """A user reads README, BENCHMARKS and RELIABILITY without our tracker: "issue 13's target" means
    nothing to them."""
    for name in ("README.md", "BENCHMARKS.md", "RELIABILITY.md"):
        found = re.findall(r".{0,30}\bissues? \d+.{0,20}", (ROOT / name).read_text(), flags=re.I)
        assert not found, (name, found)


def test_benchmarks_opens_with_one_table_of_current_figures():
    text = (ROOT / "BENCHMARKS.md").read_text()
    head = text.split("\n## ", 1)[0].split("\n# History", 1)[0]  # before the first section
    rows = [line for line in head.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert rows[0].startswith("| what | current figure | command | measured |")
    assert len(rows) >= 10
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and "`" in cells[2], row  # its command
        assert re.search(r"20\d\d-\d\d-\d\d", cells[3]), row  # its date
    assert head.count("| what |") == 1  # one table
    for image in re.findall(r"\]\((docs/[^)]+)\)", head):
        assert (ROOT / image).is_file(), image


def test_readme_states_the_scope_of_the_bitwise_promise():
    text = " ".join(README.split())
    for words in ("same device type", "threads per device", "library versions"):
        assert words in text, words


def test_the_command_table_lists_every_cli_command():
    """The README's table of commands names each `poise` subcommand once, and no other."""
    from poise.cli import SUBCOMMANDS

    section = README.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `poise (\w+)", section, flags=re.M)
    assert sorted(listed) == sorted(SUBCOMMANDS), (listed, sorted(SUBCOMMANDS))


def test_every_relative_link_names_a_file_in_the_repository():
    """README.md's and every docs/*.md page's markdown links (and images) that are not URLs."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:|#", target):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists() and ROOT in path.parents, f"{page.relative_to(ROOT)} links to {target}: no such file"
            checked += 1
    assert checked >= 20


def _tiny_hf_model(path: Path) -> None:
    """A user's own model directory as HF writes it: a 2-layer Qwen2 in safetensors and a
    character-level fast tokenizer beside it."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    chars = sorted(set("0123456789+-*= "))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    chars_only = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=chars_only, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.save_pretrained(path)
    config = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path, safe_serialization=True)


@pytest.mark.slow
@pytest.mark.ray
def test_the_quickstart_runs(tmp_path):
    """The quickstart as written, in a directory of its own: its rows as train.jsonl and eval.jsonl,
    its reward file and config, a model directory this test builds; then each of its commands
    (`poise train` cut to 2 steps), and what each says it leaves behind."""
    (tmp_path / "train.jsonl").write_text(_one("jsonl", '"prompt"'))
    (tmp_path / "eval.jsonl").write_text(_one("jsonl", '"prompt"'))
    (tmp_path / "my_reward.py").write_text(_one("python", "# my_reward.py"))
    (tmp_path / "my-run.yaml").write_text(_one("yaml", QUICKSTART))
    _tiny_hf_model(tmp_path / "my-model")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    commands = [shlex.split(line.split("  #")[0]) for line in _one("bash", "poise train my-run.yaml").splitlines()
                if line.strip()]
    assert [argv[:2] for argv in commands] == [["poise", "train"], ["poise", "eval"], ["poise", "export"],
                                               ["poise", "report"]]
    commands[0] += ["run.steps=2", "run.progress=false"]  # 20 steps on 2 cores: minutes; 2 show the same path
    for argv in commands:
        done = subprocess.run([sys.executable, "-m", "poise", *argv[1:]], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
    run = tmp_path / "runs" / "mine"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "eval" in rows[-1] and "reward/" + "exact" in " ".join(rows[0])
    assert 0 <= rows[0]["clip_frac_responses"] <= 1  # reported from the train devices
    scores = json.loads((run / "eval.json").read_text())
    assert "pass@4" in json.dumps(scores), scores
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "my-model-rl")
    assert AutoTokenizer.from_pretrained(tmp_path / "my-model-rl")("3+4=")["input_ids"]
    assert model.config.num_hidden_layers == 2
    assert (run / "report" / "index.html").is_file()
