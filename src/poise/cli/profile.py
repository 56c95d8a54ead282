"""`poise profile`: measure this machine's cost model as `poise-profile/1` JSON: the rollout
engine's decode and prefill, the trainer's update, and (with --resize) live and hard resizes.

    poise profile                              # the built-in tiny Qwen2, CPU
    poise profile --resize --out runs/profile.json   # + resizes of a real 4-device job (2-6 min)
    poise profile --model runs/sft/model --device cuda --dtype bfloat16 --out profile.json

The simulator's cost model reads the file (`cost.profile: profile.json`), and so does the resize
controller of a real job (`cluster.profile: profile.json`); docs/profile-format.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from poise.errors import PoiseError


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers, e.g. 1,2,4,8")
    if not values:
        raise argparse.ArgumentTypeError("give at least one integer")
    return values


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="local HF checkpoint directory (Llama/Qwen2); default: the built-in tiny Qwen2")
    parser.add_argument("--out", default="runs/profile.json", help="where to write the JSON (default: %(default)s)")
    parser.add_argument("--batches", type=_ints, default=(1, 2, 4, 8, 16, 32), help="decode batch sizes, comma-separated (default: 1,2,4,8,16,32)")
    parser.add_argument("--contexts", type=_ints, default=(32, 64, 128, 224), help="decode context lengths (default: 32,64,128,224)")
    parser.add_argument("--prompts", type=_ints, default=(8, 16, 32, 64, 128), help="prefill prompt lengths (default: 8,16,32,64,128)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point, median kept (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (pin it: results depend on it)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--no-train", dest="train", action="store_false",
                        help="skip the trainer's table (forward+backward+optimizer per update)")
    parser.add_argument("--resize", action="store_true",
                        help="also measure live and hard resizes on a real 4-device Ray job of this model "
                             "(starts Ray; 2-6 minutes on 2 CPU cores)")
    parser.add_argument("--resize-devices", type=int, default=4,
                        help="devices of the --resize job (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import torch

    from poise.model.loading import TinyModelConfig, build_tiny, load_model
    from poise.rollout.profile import ProfileConfig, profile_model

    if args.resize and args.resize_devices < 4:
        raise PoiseError(f"--resize-devices {args.resize_devices}: the resize job needs at least 4 devices "
                         "(it resizes 2+2 -> 1+3 -> 3+1); use 4")
    out = Path(args.out)
    try:  # before minutes of measuring
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PoiseError(f"--out {out}: cannot create its directory ({e.strerror}); choose another path") from None
    if out.is_dir():
        raise PoiseError(f"--out {out} is a directory; give a file path, e.g. {out / 'profile.json'}")
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise PoiseError(f"--device {args.device}: no CUDA device is available here; use --device cpu")
    dtype = getattr(torch, args.dtype)
    cfg = ProfileConfig(batch_sizes=args.batches, contexts=args.contexts, prompt_lengths=args.prompts,
                        repeats=args.repeats)
    if args.model:
        model, name = load_model(args.model, dtype, args.device), Path(args.model).name
    else:
        tiny = TinyModelConfig()
        model, name = build_tiny(tiny, vocab_size=60, seed=0).to(dtype), f"tiny-{tiny.arch}"
    model = model.to(args.device)

    interactive = sys.stderr.isatty()

    def progress(done: int, total: int, what: str) -> None:
        line = f"profile [{done}/{total}] {what}"
        if interactive:
            print(f"\r{line:<60}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    profile = profile_model(model, cfg, name, progress=progress)
    if args.train:
        from poise.training.profile import TrainProfileConfig, profile_train

        profile["train"] = profile_train(model, TrainProfileConfig(), model.config.vocab_size,
                                         progress=lambda what: progress(1, 1, what))
    if args.resize:
        from poise.runtime.resize import measure_resizes

        print("profile: measuring live and hard resizes on a real job ...", file=sys.stderr, flush=True)
        profile["resize"] = measure_resizes(args.model, args.resize_devices, Path(args.out).parent / "profile-resize")
    out.write_text(json.dumps(profile, indent=2) + "\n")
    top = max(cfg.batch_sizes)
    print(f"{name} on {profile['device']}: {profile['tokens_per_second']:,.0f} tokens/s at batch {top}; "
          f"decode step {min(r['seconds_per_step'] for r in profile['decode']) * 1e3:.2f}-"
          f"{max(r['seconds_per_step'] for r in profile['decode']) * 1e3:.2f} ms; wrote {out}")
    if "train" in profile:
        rows = profile["train"]
        print(f"train update: {rows[0]['seconds']:.3f} s over {rows[0]['tokens']:,} tokens to "
              f"{rows[-1]['seconds']:.3f} s over {rows[-1]['tokens']:,} tokens")
    for mode, r in profile.get("resize", {}).items():
        print(f"{mode} resize: {sum(r['phases'].values()):.3f} s on the critical path (median of {r['n']})")
    return 0
