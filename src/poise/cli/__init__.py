"""`poise` command line: train | config | sft | simulate | plan | sweep | report | completions | profile | export | eval.

Each subcommand lives in its own module with `add_parser(subparsers)` and `run(args) -> int`;
modules are imported only when their subcommand runs, so `poise simulate` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from poise import interrupt
from poise.errors import PoiseError

# subcommand -> (module, one-line help). Plain data so grep finds every entry point.
SUBCOMMANDS = {
    "train": ("poise.cli.train", "run RL post-training (GRPO/PPO) from a YAML config"),
    "config": ("poise.cli.config", "print the resolved training config, every key with its help and default"),
    "sft": ("poise.cli.sft", "supervised warm start of a model on the built-in tasks"),
    "simulate": ("poise.cli.simulate", "simulate a scenario on a virtual clock"),
    "plan": ("poise.cli.plan", "recommend a split and say whether live resizing pays"),
    "sweep": ("poise.cli.sweep", "sweep controller parameters over a scenario"),
    "report": ("poise.cli.report", "draw a run directory's report: summary, timeline, training curves, completions"),
    "completions": ("poise.cli.completions", "show what the model wrote: a run's sampled prompts and completions"),
    "profile": ("poise.cli.profile", "measure the rollout engine's cost model as JSON"),
    "export": ("poise.cli.export", "write a run's checkpoint as an HF model directory"),
    "eval": ("poise.cli.eval", "evaluate a run's checkpoint or an HF model directory on held-out problems"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="poise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"poise: error: unknown command '{argv[0]}'; choose one of {', '.join(SUBCOMMANDS)}",
                  file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    try:  # a Ctrl-C from here on, even while a module imports, ends in one line and exit 130
        return _run(argv[0], argv[1:])
    except KeyboardInterrupt:
        if not interrupt.stopped_at_once():  # else its line said why already
            print("poise: interrupted", file=sys.stderr)
        return 130


def _run(name: str, argv: list[str]) -> int:
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("poise.cli."):
            print(f"poise: error: '{name}' is not available in this build", file=sys.stderr)
            return 2
        raise
    cmd_parser = argparse.ArgumentParser(prog=f"poise {name}", description=SUBCOMMANDS[name][1])
    module.add_parser(cmd_parser)
    args = cmd_parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except PoiseError as e:
        print(f"poise: error: {e}", file=sys.stderr)
        return e.exit_code


def program() -> int:
    """The `poise` executable (and `python -m poise`): `main`, and a Ctrl-C during the exit that
    follows it still ends in exit 130 after the teardown (poise/interrupt.py `command`)."""
    return interrupt.command(main)


if __name__ == "__main__":
    sys.exit(program())
