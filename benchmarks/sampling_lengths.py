"""Does Poise's engine sample what HF `generate` samples? Response lengths on one model, side by side.

    .venv/bin/python benchmarks/sampling_lengths.py [--samples 512] [--prompts 4]

The model and prompts of benchmarks/peer_trl.py: a random tiny Llama (hidden 128, 2 layers, 4
heads, char vocabulary), `count a:b=` prompts, temperature 1, no top-k or top-p, up to 128 new
tokens. A random model stops only when it happens to draw <eos>, so the length distribution is a
sensitive summary of the sampling distribution over many steps. Three samplers, `--samples` per
prompt each:

- poise: `poise.rollout.engine.Engine` in bitwise mode (hash-keyed Gumbel-max sampling);
- hf: `model.generate(do_sample=True, top_k=0)`, every batch one prompt (no padding);
- hf-padded: the same over left-padded batches of all prompts mixed, as TRL's GRPOTrainer generates.

Prints mean length, the share cut at 128 and a chi-square of Poise's sampler alone (60 tokens,
200,000 draws from fixed logits) and writes bench-results/sampling_lengths-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys

import torch

from results import write_results  # benchmarks/results.py
from poise.config import EngineConfig, TinyModelConfig
from poise.data.tokenizer import SEPARATOR, CharTokenizer
from poise.model.loading import build_tiny
from poise.rollout.engine import Engine
from poise.rollout.sampling import SamplingConfig, sample_next
from poise.types import Request

NEW_TOKENS = 128


def lengths_summary(lengths: list[int]) -> dict:
    return {"mean": statistics.mean(lengths), "cut_at_max": sum(n >= NEW_TOKENS for n in lengths) / len(lengths),
            "n": len(lengths)}


def hf_lengths(model, prompts: list[list[int]], per_prompt: int, eos: int, padded: bool, batch: int = 128) -> list[int]:
    torch.manual_seed(0)
    rows = [p for p in prompts for _ in range(per_prompt)]
    if padded:
        random.Random(0).shuffle(rows)
    out = []
    with torch.no_grad():
        for lo in range(0, len(rows), batch):
            chunk = rows[lo:lo + batch]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            gen = model.generate(ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0)
            for row in gen[:, width:].tolist():
                out.append(row.index(eos) + 1 if eos in row else len(row))
    return out


def sampler_chi2(vocab: int = 60, draws: int = 200_000) -> float:
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 0.5
    ids = torch.stack([torch.zeros(draws, dtype=torch.long), torch.arange(draws) % 1000, torch.arange(draws) // 1000], 1)
    tokens, _ = sample_next(logits.repeat(draws, 1), 7, ids, torch.arange(draws) % 137, SamplingConfig())
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = logits.softmax(-1).double() * draws
    return float(((counts - expected) ** 2 / expected).sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=512, help="samples per prompt and sampler")
    ap.add_argument("--prompts", type=int, default=4, help="count prompts")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    tokenizer = CharTokenizer()
    model = build_tiny(TinyModelConfig(arch="llama", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                                       max_positions=160), tokenizer.vocab_size, 0, tokenizer.eos_id,
                       tokenizer.pad_id, tokenizer.bos_id).eval()
    rng = random.Random(0)
    texts = []
    for _ in range(args.prompts):
        a = rng.randint(0, 59)
        texts.append(f"count {a}:{a + rng.randint(1, 15)}=")
    prompts = [[tokenizer.bos_id] + tokenizer.encode(t + SEPARATOR) for t in texts]
    engine = Engine(model, EngineConfig(num_slots=64, batch_invariant=True, max_context=160),
                    SamplingConfig(temperature=1.0, max_new_tokens=NEW_TOKENS), seed=0, eos_id=tokenizer.eos_id)
    poise = [len(s.token_ids) for s in engine.generate(
        [Request((0, i, j), p) for i, p in enumerate(prompts) for j in range(args.samples)])]
    rows = {"poise": lengths_summary(poise),
            "hf": lengths_summary(hf_lengths(model, prompts, args.samples, tokenizer.eos_id, padded=False)),
            "hf-padded": lengths_summary(hf_lengths(model, prompts, args.samples, tokenizer.eos_id, padded=True))}
    chi2 = sampler_chi2()
    print(f"{len(prompts)} count prompts x {args.samples} samples per sampler, temperature 1, <= {NEW_TOKENS} tokens")
    print(f"{'sampler':10} {'mean len':>9} {'cut at max':>11}")
    for name, r in rows.items():
        print(f"{name:10} {r['mean']:9.1f} {r['cut_at_max']:11.3f}")
    bound = 59 + 3.1 * math.sqrt(2 * 59)
    print(f"poise sampler alone: chi-square {chi2:.1f} over 59 degrees of freedom (99.9% bound ~{bound:.0f})")
    write_results("sampling_lengths", {"args": vars(args), "prompts": texts, "rows": rows, "chi2": chi2})
    return 0


if __name__ == "__main__":
    sys.exit(main())
