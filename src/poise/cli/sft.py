"""`poise sft [CONFIG] [key=value ...] [--out DIR]`: the supervised warm start."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poise.errors import PoiseError


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config whose model.sft and data sections are used")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.sft.steps=500")
    parser.add_argument("--out", help="output directory (default: model.path of the config)")


def run(args: argparse.Namespace) -> int:
    from poise.config import load_train_config

    overrides = list(args.overrides)
    config_path = args.config
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)
        config_path = None
    cfg = load_train_config(config_path, overrides)
    out = args.out or cfg.model.path
    if out is None:
        raise PoiseError("no output directory: pass --out DIR or set model.path in the config")
    from poise.model.files import check_model_dir

    check_model_dir(out)  # a file there would end in a raw FileExistsError after the whole warm start

    from poise.training.sft import run_sft

    path = run_sft(cfg.model, cfg.data, Path(out),
                   progress=cfg.run.progress)
    print(f"poise: warm-start checkpoint written to {path}", file=sys.stderr)
    return 0
