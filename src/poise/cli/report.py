"""`poise report RUN_DIR`: draw a run as one HTML page and its PNGs: summary, timeline, step time, split,
throughput, learning curves and training signals, and a page of what the model wrote (docs/report.md)."""

from __future__ import annotations

import argparse

from poise.report import draw_report


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory with events.jsonl (simulated or real)")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/report)")


def run(args: argparse.Namespace) -> int:
    paths = draw_report(args.run_dir, args.out)
    for name, path in paths.items():
        print(f"{name:15s} {path}")
    return 0
