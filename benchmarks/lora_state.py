"""What LoRA moves and keeps, against full fine-tuning: optimizer state, a live resize's optimizer
transfer, a weight sync and a checkpoint's weights, in bytes.

    .venv/bin/python benchmarks/lora_state.py [--r 8] [--targets q_proj,k_proj,...]

Rows: the demo's model (the built-in tiny Qwen2 of configs/demo.yaml, char vocabulary) built for
real, and a model of Qwen2.5-0.5B's shape built on the meta device (shapes only, no memory). Each
is taken full and with `model.lora` attached (train/lora.py `attach_adapter`, peft), and the bytes
come from the trainer's own tensors (`PolicyTrainer.fresh_state`: what AdamW holds per trainable
parameter after its first update and what a live resize's staging fills, fp32): no formula of ours.
  optimizer   AdamW state on a train device, unsharded (step, exp_avg, exp_avg_sq)
  resize      what one device joining the trainer receives (OptimizerTransfer: every state tensor)
  sync        what one rollout device receives per weight sync (the trained parameters, float32)
  checkpoint  a checkpoint's model.safetensors payload (the trained parameters)
The demo row also takes one real AdamW step and checks its state's bytes against `optimizer`.

Writes bench-results/lora_state-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from results import write_results  # benchmarks/results.py

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True)


def _demo_model():
    from poise.config import TinyModelConfig
    from poise.data.tokenizer import CharTokenizer
    from poise.model.loading import build_tiny

    tok = CharTokenizer()
    return build_tiny(TinyModelConfig(), tok.vocab_size, 0, tok.eos_id, tok.pad_id, tok.bos_id)


def _qwen_shape():
    from transformers import AutoModelForCausalLM, Qwen2Config

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_05B), dtype=torch.float32)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(model, lora) -> dict:
    from poise.config import AlgorithmConfig
    from poise.model.lora import attach_adapter, trained_parameters
    from poise.training.trainer import PolicyTrainer

    if lora is not None:
        attach_adapter(model, lora, seed=0)
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    states = [trainer.fresh_state(p) for p in trainer.params]
    row = {"parameters": sum(p.numel() for p in model.parameters()),
           "trained": trainer.numel,
           "optimizer_bytes": sum(_bytes(s.values()) for s in states),
           "resize_bytes": sum(_bytes(s[k] for k in ("step", *trainer.state_fields())) for s in states),
           "sync_bytes": _bytes(p for _, p in trained_parameters(model)),
           "checkpoint_bytes": _bytes(p for _, p in trained_parameters(model))}
    if next(model.parameters()).device.type != "meta":  # one real AdamW step: the state it made
        norm = trainer.apply_update([torch.full(s, 1e-3) for s in trainer.shapes], 1.0)
        held = sum(_bytes(t for t in st.values() if torch.is_tensor(t)) for st in trainer.optimizer.state.values())
        assert held == row["optimizer_bytes"] and norm > 0, (held, row["optimizer_bytes"])
    return row


def main() -> int:
    from poise.config import LORA_PROJECTIONS, LoraConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--targets", default=",".join(LORA_PROJECTIONS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    lora = LoraConfig(r=args.r, alpha=2.0 * args.r, target_modules=tuple(args.targets.split(",")))
    rows = []
    for name, build in (("demo (tiny qwen2)", _demo_model), ("Qwen2.5-0.5B shape", _qwen_shape)):
        for mode, cfg in (("full", None), (f"lora r={args.r}", lora)):
            rows.append({"model": name, "mode": mode, **measure(build(), cfg)})
    header = f"{'model':<20} {'mode':<10} {'params':>12} {'trained':>12} {'optimizer':>12} {'resize':>12} " \
             f"{'sync':>12} {'checkpoint':>12}"
    print(header)
    for r in rows:
        print(f"{r['model']:<20} {r['mode']:<10} {r['parameters']:>12,} {r['trained']:>12,} "
              f"{_fmt(r['optimizer_bytes']):>12} {_fmt(r['resize_bytes']):>12} {_fmt(r['sync_bytes']):>12} "
              f"{_fmt(r['checkpoint_bytes']):>12}")
    for model in dict.fromkeys(r["model"] for r in rows):
        full, adapted = [r for r in rows if r["model"] == model]
        print(f"{model}: LoRA holds {adapted['optimizer_bytes'] / full['optimizer_bytes']:.2%} of the full "
              f"optimizer state; a resize moves {adapted['resize_bytes'] / full['resize_bytes']:.2%} of the bytes")
    write_results("lora_state", {"r": args.r, "targets": args.targets.split(","), "rows": rows})
    return 0


def _fmt(n: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
