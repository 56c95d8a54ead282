"""Poise next to TRL's GRPOTrainer on one small workload, end to end, interleaved.

    .venv/bin/python benchmarks/peer_trl.py [--steps 10] [--rounds 2] [--only trl,bitwise,semantic,sync,assist]

The workload (issue 13): the `count` task (prompt `count a:b=`, answer the numbers a..b), 4
prompts x 8 samples per step, up to 128 new tokens at temperature 1, a random tiny Llama (hidden
128, 2 layers, 4 heads, the char vocabulary of 60), 2 CPU threads, `--steps` steps. Contenders,
run in turn (A B C D A B C D ...), each in a fresh process:

trl       TRL's GRPOTrainer (installed by this script into benchmarks/.venv-trl, never into poise's
          environment) on the same model saved as an HF checkpoint and the same prompts:
          num_generations 8, 32 completions per step in 2 micro-batches of 16, max_completion_length
          128, lr 1e-3 constant, AdamW, clip 1.0, beta 0 (no reference model), num_iterations 1,
          logging, evaluation and checkpoints off.
bitwise   `poise train` colocated, determinism bitwise (the default), 2 threads.
semantic  the same with determinism semantic.
sync      `poise train` on the Ray runtime, sync, 1 rollout + 1 train device of 1 thread each.
assist    the same with pipeline.assist=true (the rollout device trains a share of the tail).

Each contender's time is its steps' span (first step's start to last step's end; model load, Ray
start and set-up excluded for all), so samples/s = 32 x steps / span and generated tokens/s =
response tokens / span. Ratios to TRL are taken per round (the machine is shared and noisy), and
their median is reported. Writes bench-results/peer_trl-<timestamp>.json; runs under runs/bench-peer-trl.

What differs unavoidably: TRL decodes with HF `generate` (a padded batch of 32, no KV slots,
stopping when all rows end) and samples with torch's global generator; Poise decodes with its own
engine and samples as a function of the sample id. So the two draw different tokens and responses
of different lengths (each side's own lengths are what its tokens/s counts). TRL's loss (dapo)
and Poise's (loss_agg token) both average over the batch's response tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_VENV = HERE / ".venv-trl"
TRL_SPEC = "trl==1.16.0"
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the CPU wheel, as in the Makefile
WORK = ROOT / "runs" / "bench-peer-trl"
PROMPTS, GROUP, NEW_TOKENS, LR, SEED = 4, 8, 128, 1e-3, 0
# torch threads of each colocated contender (and of TRL); sync 1+1 gives each device half (at least 1).
# --threads sets it for the worker processes through this variable.
THREADS = int(os.environ.get("PEER_TRL_THREADS", "2"))
POISE = ["run.progress=false", "run.checkpoint_every=0", "run.overwrite=true", f"run.seed={SEED}",
         "model.tiny.arch=llama", "model.tiny.hidden_size=128", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
         "model.tiny.num_kv_heads=4", "data.phases=[{mix: {count: 1.0}}]", f"algorithm.prompts_per_step={PROMPTS}",
         f"algorithm.group_size={GROUP}", f"algorithm.sampling.max_new_tokens={NEW_TOKENS}",
         "algorithm.sampling.temperature=1.0", f"algorithm.lr={LR}", "algorithm.micro_batch_size=16"]
CONTENDERS = {
    "bitwise": ["pipeline.mode=colocated", f"cluster.threads_per_device={THREADS}", "determinism=bitwise"],
    "semantic": ["pipeline.mode=colocated", f"cluster.threads_per_device={THREADS}", "determinism=semantic"],
    "sync": ["pipeline.mode=sync", "cluster.devices=2", "cluster.split=[1,1]",
             f"cluster.threads_per_device={max(1, THREADS // 2)}",
             "determinism=bitwise"],
    # sync with the rollout device computing a share of the training tail (pipeline.assist)
    "assist": ["pipeline.mode=sync", "pipeline.assist=true", "cluster.devices=2", "cluster.split=[1,1]",
               f"cluster.threads_per_device={max(1, THREADS // 2)}", "determinism=bitwise"],
}


# ---- the TRL side: runs inside benchmarks/.venv-trl, imports nothing of poise ----------------------
def trl_worker(spec_path: str) -> None:
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    itos = spec["vocab"]  # poise's char tokenizer: <pad> <bos> <eos> then one id per character
    tok = Tokenizer(WordLevel({s: i for i, s in enumerate(itos)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", unk_token="?")
    assert tokenizer("count 1:3=\n")["input_ids"] == spec["probe_ids"], "TRL's tokenizer differs from poise's"
    rows = [{"prompt": p["prompt"], "answer": p["answer"]} for p in spec["prompts"]]
    counted = {"tokens": 0, "samples": 0}

    def items(completions, answer, completion_ids, **_):  # poise.rewards.builtin.items_score
        counted["tokens"] += sum(len(c) for c in completion_ids)
        counted["samples"] += len(completions)
        out = []
        for text, ref in zip(completions, answer):
            got, want = text.split(), ref.split()
            out.append(sum(a == b for a, b in zip(got, want)) / max(len(got), len(want)) if (got or want) else 1.0)
        return out

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not marks:
                marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=spec["out"], use_cpu=True, seed=SEED, max_steps=spec["steps"],
        per_device_train_batch_size=PROMPTS * GROUP // 2, gradient_accumulation_steps=2, steps_per_generation=2,
        num_generations=GROUP, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group", shuffle_dataset=False,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", log_completions=False,
        disable_tqdm=True, dataloader_num_workers=0, bf16=False, fp16=False)
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32, attn_implementation="sdpa")
    trainer = GRPOTrainer(model=model, reward_funcs=[items], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({"span_s": marks[-1] - marks[0], "steps": len(marks) - 1,
                                                "samples": counted["samples"], "tokens": counted["tokens"]}))


def ensure_trl_venv() -> Path:
    """benchmarks/.venv-trl with the CPU torch first (a bare `pip install trl` pulls a CUDA build)."""
    python = TRL_VENV / "bin" / "python"
    probe = [str(python), "-c", "import trl, torch; assert not torch.version.cuda"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing {TRL_SPEC} into {TRL_VENV} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH_SPEC], check=True)
    subprocess.run([*pip, TRL_SPEC], check=True)
    subprocess.run(probe, check=True)
    return python


# ---- the Poise side -------------------------------------------------------------------------------
def poise_worker(name: str, spec_path: str) -> None:
    from poise.config import load_train_config

    spec = json.loads(Path(spec_path).read_text())
    run_dir = Path(spec["out"])
    cfg = load_train_config(None, [*POISE, *CONTENDERS[name], f"run.dir={run_dir}", f"run.steps={spec['steps']}"])
    if cfg.pipeline.mode == "colocated":
        from poise.training.colocated import train_colocated as train
    else:
        from poise.runtime.driver import train_disaggregated as train
    rows = train(cfg)
    steps = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["kind"] == "step"]
    Path(spec["result"]).write_text(json.dumps({
        "span_s": max(e["end"] for e in steps) - min(e["start"] for e in steps), "steps": len(rows),
        "samples": PROMPTS * GROUP * len(rows), "tokens": sum(r["tokens"] for r in rows)}))


def prepare(steps: int) -> dict:
    """The tiny Llama as an HF checkpoint and the prompts of every step (poise's own, seed SEED)."""
    from poise.config import TinyModelConfig
    from poise.data.tasks import Phase, TaskSource
    from poise.data.tokenizer import SEPARATOR, CharTokenizer
    from poise.model.loading import build_tiny, save_model

    tokenizer = CharTokenizer()
    model = build_tiny(TinyModelConfig(arch="llama", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4),
                       tokenizer.vocab_size, SEED, tokenizer.eos_id, tokenizer.pad_id, tokenizer.bos_id)
    model_dir = WORK / "model"
    save_model(model, model_dir, tokenizer)
    source = TaskSource(SEED, (Phase(mix={"count": 1.0}),))
    prompts = [{"prompt": p.prompt + SEPARATOR, "answer": p.answer}
               for k in range(steps) for p in source.prompts_for_step(k, PROMPTS)]
    probe = [tokenizer.bos_id] + tokenizer.encode("count 1:3=\n")
    return {"model": str(model_dir), "vocab": tokenizer.itos, "prompts": prompts, "probe_ids": probe,
            "steps": steps}


def run_one(name: str, base: dict, round_: int, trl_python: Path | None) -> dict:
    out = WORK / f"{name}-{round_}"
    spec = {**base, "out": str(out), "result": str(WORK / f"{name}-{round_}.json")}
    spec_path = WORK / f"{name}-{round_}.spec.json"
    spec_path.write_text(json.dumps(spec))
    Path(spec["result"]).unlink(missing_ok=True)
    if name == "trl":
        cmd = [str(trl_python), __file__, "--trl-worker", str(spec_path)]
    else:
        cmd = [sys.executable, __file__, "--poise-worker", name, str(spec_path)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ["PEER_TRL_THREADS"], "TOKENIZERS_PARALLELISM": "false"}
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    result = json.loads(Path(spec["result"]).read_text())
    result["process_s"] = time.perf_counter() - t
    result["samples_per_s"] = result["samples"] / result["span_s"]
    result["tokens_per_s"] = result["tokens"] / result["span_s"]
    print(f"round {round_} {name:>9}: {result['samples_per_s']:7.1f} samples/s {result['tokens_per_s']:8.0f} tok/s "
          f"({result['steps']} steps in {result['span_s']:.1f} s)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="trl,bitwise,semantic,sync,assist", help="contenders, in run order")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="torch threads per contender (the workload's 2; 1 on a machine too loaded for 2)")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    parser.add_argument("--poise-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        return trl_worker(args.trl_worker)
    if args.poise_worker:
        return poise_worker(*args.poise_worker)
    names = args.only.split(",")
    unknown = [n for n in names if n != "trl" and n not in CONTENDERS]
    if unknown or args.steps < 1 or args.rounds < 1 or args.threads < 1:
        sys.exit(f"peer_trl: bad --only {unknown} / --steps {args.steps} / --rounds {args.rounds}; contenders are "
                 f"trl, {', '.join(CONTENDERS)}; steps, rounds and threads >= 1")
    os.environ["PEER_TRL_THREADS"] = str(args.threads)  # read by every worker process
    trl_python = ensure_trl_venv() if "trl" in names else None
    WORK.mkdir(parents=True, exist_ok=True)
    base = prepare(args.steps)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            try:
                runs[name].append(run_one(name, base, r, trl_python))
            except subprocess.CalledProcessError as e:  # one broken contender must not lose the others' figures
                print(f"round {r} {name}: failed ({e}); left out", flush=True)
    names = [n for n in names if len(runs[n]) == args.rounds]
    summary = {}
    print(f"\n{'contender':>10} {'samples/s':>10} {'tok/s':>8} {'x TRL samples/s':>16} {'x TRL tok/s':>12}")
    for name in names:
        row = {"samples_per_s": statistics.median(x["samples_per_s"] for x in runs[name]),
               "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs[name])}
        if "trl" in runs and name != "trl":
            for key in ("samples_per_s", "tokens_per_s"):
                row[f"{key}_vs_trl"] = statistics.median(a[key] / b[key] for a, b in zip(runs[name], runs["trl"]))
        summary[name] = row
        print(f"{name:>10} {row['samples_per_s']:10.1f} {row['tokens_per_s']:8.0f} "
              f"{row.get('samples_per_s_vs_trl', 1.0):16.2f} {row.get('tokens_per_s_vs_trl', 1.0):12.2f}")
    sys.path.insert(0, str(HERE))
    from results import write_results

    write_results("peer_trl", {"workload": {"prompts": PROMPTS, "group": GROUP, "max_new_tokens": NEW_TOKENS,
                                            "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
                                            "poise_overrides": POISE, "contenders": CONTENDERS, "trl": TRL_SPEC},
                               "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
