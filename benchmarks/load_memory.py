"""Host memory of loading a checkpoint in bfloat16: Poise's loader against loading in float32 and
casting (what every device did before) and transformers' own `from_pretrained(dtype=bfloat16)`.

    .venv/bin/python benchmarks/load_memory.py [--layers 8] [--hidden 1024] [--vocab 8192]

Writes a random float32 Qwen2 checkpoint of that shape (default 98.6M parameters) to a temporary
directory, then loads it in bf16 on the CPU in a fresh process per way, three rounds, interleaved,
and reports the peak resident memory of the load itself (VmHWM after the load less VmRSS before
it, the peak reset first), the median over rounds. It is what each of N device processes on one
node holds in host memory at start-up. Prints a table and writes bench-results/load-memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

WAYS = {
    "poise load_model": "from poise.model.loading import load_model; m = load_model(path, torch.bfloat16)",
    "float32, then cast": "from transformers import AutoModelForCausalLM; "
                          "m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(torch.bfloat16)",
    "HF bf16 from_pretrained": "from transformers import AutoModelForCausalLM; "
                               "m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)",
}

SCRIPT = """
import sys, torch
import transformers.models.qwen2.modeling_qwen2
path = sys.argv[1]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
{load}
print(status("VmHWM") - before)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from poise.config import TinyModelConfig
    from poise.model.loading import tiny_hf_config

    cfg = TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.hidden // 64,
                          num_kv_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 11 // 4)
    config = tiny_hf_config(cfg, args.vocab, eos_id=2, pad_id=0, bos_id=1)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in skeleton.parameters())
    peaks: dict[str, list[int]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(0)
        save_file({name: torch.randn(p.shape, generator=g) * 0.02 for name, p in skeleton.named_parameters()},
                  str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        config.to_json_file(str(Path(tmp) / "config.json"))
        for round_ in range(args.rounds):
            for way in list(WAYS) if round_ % 2 == 0 else list(WAYS)[::-1]:
                out = subprocess.run([sys.executable, "-c", SCRIPT.replace("{load}", WAYS[way]), tmp],
                                     capture_output=True, text=True, check=True).stdout.split()
                peaks[way].append(int(out[-1]))
    mb = 2**20
    print(f"{params / 1e6:.1f}M parameters: float32 {4 * params / mb:.0f} MB, bf16 {2 * params / mb:.0f} MB")
    print(f"{'way':<26}{'peak MB':>9}{'x bf16':>8}")
    results = {}
    for way, runs in peaks.items():
        peak = statistics.median(runs)
        results[way] = {"peak_bytes": peak, "runs": runs, "over_bf16": peak / (2 * params)}
        print(f"{way:<26}{peak / mb:>9.0f}{peak / (2 * params):>8.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"load-memory-{stamp}.json"
    path.write_text(json.dumps({"command": "benchmarks/load_memory.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv),
                                "args": vars(args), "parameters": params, "torch": torch.__version__,
                                "results": results}, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
