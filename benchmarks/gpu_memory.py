"""Memory and speed of a Qwen2.5-0.5B-shaped random model (494M parameters, vocabulary 151,936) on
one device: the rollout engine in bf16 with its KV cache sized by prompt + max_new_tokens (both
decoding modes), and one GRPO step of the trainer (fp32 master weights and AdamW), with the peak
bytes per parameter of each.

    python benchmarks/gpu_memory.py --device cuda           # the shape of Qwen2.5-0.5B, on the GPU
    python benchmarks/gpu_memory.py --device cpu --layers 1 --vocab 2048 --requests 8   # a check of the script

Weights are random (no download): speeds and bytes depend on the shape, not the values. Peak
memory on CUDA is torch's `max_memory_allocated` after a reset per phase; on CPU the process's
peak resident set (which includes Python and the libraries). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_results  # noqa: E402

from poise.config import AlgorithmConfig, EngineConfig, SamplingConfig  # noqa: E402
from poise.data.prompts import fitted_context  # noqa: E402
from poise.rollout.engine import Engine  # noqa: E402
from poise.training.trainer import PolicyTrainer  # noqa: E402
from poise.types import Request, Sample  # noqa: E402


def qwen25_05b_shape(layers: int, vocab: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1e6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(shape, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """Random weights made on `device` itself: no host copy of the model first."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(shape, attn_implementation="sdpa", dtype=dtype)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def engine_rows(args, shape, device: torch.device) -> list[dict]:
    model = build(shape, torch.bfloat16, device, args.seed).eval()
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, shape.vocab_size, (int(torch.randint(16, 48, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(args.requests)]
    context = fitted_context_for(max(map(len, prompts)), args.max_new_tokens)
    rows = []
    for mode, invariant in (("engine-fast", False), ("engine-bitwise", True)):
        reset_peak(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        engine = Engine(model, EngineConfig(num_slots=args.slots, max_context=context, batch_invariant=invariant),
                        SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens), args.seed, None)
        sync(device)
        t0 = time.perf_counter()
        samples = engine.generate([Request((0, i, 0), p) for i, p in enumerate(prompts)])
        sync(device)
        seconds = time.perf_counter() - t0
        tokens = sum(len(s.token_ids) for s in samples)
        rows.append({"phase": mode, "dtype": "bfloat16", "params": params, "context": context,
                     "kv_cache_bytes": engine.cache_bytes, "seconds": seconds, "tokens_per_s": tokens / seconds,
                     "peak_bytes": peak_bytes(device), "bytes_per_param": (peak_bytes(device) - base) / params})
        engine.release()
    del model
    return rows


def fitted_context_for(longest_prompt: int, max_new_tokens: int) -> int:
    from poise.config import ModelConfig, TinyModelConfig

    return fitted_context(ModelConfig(tiny=TinyModelConfig(max_positions=32768)), 0, longest_prompt, max_new_tokens)


def train_row(args, shape, device: torch.device) -> dict:
    reset_peak(device)
    model = build(shape, torch.float32, device, args.seed)
    params = sum(p.numel() for p in model.parameters())
    algo = AlgorithmConfig(prompts_per_step=args.samples // 4, group_size=4, micro_batch_size=8)
    trainer = PolicyTrainer(model, algo, pad_id=0)
    g = torch.Generator().manual_seed(args.seed + 1)
    samples, advantages = [], {}
    for i in range(algo.prompts_per_step):
        prompt = tuple(torch.randint(3, shape.vocab_size, (8,), generator=g).tolist())
        for j in range(algo.group_size):
            tokens = tuple(torch.randint(3, shape.vocab_size, (8,), generator=g).tolist())
            samples.append(Sample((0, i, j), prompt, tokens, (-12.0,) * 8, "length", 0, 0.0, 0.0, 8))
            advantages[(0, i, j)] = float(j) - 1.5
    sync(device)
    t0 = time.perf_counter()
    for _ in range(2):  # the second step has AdamW's state from the first: the steady peak
        trainer.train_step(samples, advantages)
    sync(device)
    seconds = (time.perf_counter() - t0) / 2
    peak = peak_bytes(device)
    return {"phase": "train-step", "dtype": "float32", "params": params, "context": 16, "kv_cache_bytes": 0,
            "seconds": seconds, "tokens_per_s": len(samples) * 16 / seconds, "peak_bytes": peak,
            "bytes_per_param": peak / params}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (Qwen2.5-0.5B: 24)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (Qwen2.5: 151,936)")
    parser.add_argument("--requests", type=int, default=64, help="engine requests (prompts of 16-47 tokens)")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--samples", type=int, default=16, help="train samples of 8 + 8 tokens (a multiple of 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args()
    if args.samples < 4 or args.samples % 4:
        print(f"gpu_memory: --samples {args.samples} must be a positive multiple of 4", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_memory: --device cuda, but torch {torch.__version__} sees no CUDA device; use --device cpu "
              "or a CUDA build of torch", file=sys.stderr)
        return 2
    shape = qwen25_05b_shape(args.layers, args.vocab)
    rows = engine_rows(args, shape, device) + [train_row(args, shape, device)]
    print(f"{'phase':<16}{'dtype':<10}{'params':>12}{'context':>9}{'KV cache MiB':>14}{'seconds':>9}"
          f"{'tokens/s':>10}{'peak MiB':>10}{'B/param':>9}")
    for r in rows:
        print(f"{r['phase']:<16}{r['dtype']:<10}{r['params']:>12,}{r['context']:>9}{r['kv_cache_bytes'] / 2**20:>14.1f}"
              f"{r['seconds']:>9.2f}{r['tokens_per_s']:>10.0f}{r['peak_bytes'] / 2**20:>10.0f}"
              f"{r['bytes_per_param']:>9.1f}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    write_results("gpu_memory", {"device": name, "torch": torch.__version__, "args": vars(args), "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
