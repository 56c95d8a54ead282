"""`poise config [CONFIG] [key=value ...] [--section NAME]`: the resolved config, every key with its help.

Prints YAML (a valid config file: `poise config > mine.yaml` starts one), each key under a comment
holding its help text and its default. Defaults are resolved as `poise train` would; the loss knobs
that `algorithm.loss`'s preset fills are written null (their value in the comment), so a template
whose `loss` is changed trains the new preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from typing import Any

import yaml

from poise.errors import PoiseError

WIDTH = 110


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (e.g. configs/demo.yaml); none = the defaults")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.loss=dapo")
    parser.add_argument("--section", metavar="NAME", help="print one section only, e.g. algorithm or "
                                                          "algorithm.sampling")


def run(args: argparse.Namespace) -> int:
    from poise.config import load_train_config

    from poise.cli.train import config_and_overrides

    config_path, overrides = config_and_overrides(args.config, args.overrides)
    cfg = load_train_config(config_path, overrides)
    print(render(cfg, args.section), end="")
    return 0


def render(cfg: Any, section: str | None = None) -> str:
    """`cfg` (a config dataclass) as commented YAML; `section`: a dotted path to one sub-section."""
    node, path = cfg, []
    for name in (section.split(".") if section else []):
        sections = [f.name for f in dataclasses.fields(node) if dataclasses.is_dataclass(getattr(node, f.name))]
        if name not in sections:
            where = ".".join(path) or "the config"
            raise PoiseError(f"--section {section}: {where} has no section '{name}'; choose one of "
                             f"{', '.join(sections)}")
        node, path = getattr(node, name), [*path, name]
    lines: list[str] = []
    indent = ""
    for depth, name in enumerate(path):  # the enclosing sections, so the output still loads as a config
        lines.append(f"{'  ' * depth}{name}:")
        indent = "  " * (depth + 1)
    _section(node, indent, lines)
    return "\n".join(lines) + "\n"


def _section(obj: Any, indent: str, lines: list[str]) -> None:
    from poise.config import AlgorithmConfig, preset_filled_knobs

    # A knob the loss preset fills is written null (its value in the comment): a template whose
    # `loss` is changed then trains the new preset, not this one's knobs under the new name.
    from_preset = preset_filled_knobs(obj) if isinstance(obj, AlgorithmConfig) else frozenset()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        help_text = f.metadata.get("help", "")
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:  # {help_text}" if help_text else f"{indent}{f.name}:")
            _section(value, indent + "  ", lines)
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        comment = f"{help_text} [default: {_scalar(default)}]" if help_text else f"[default: {_scalar(default)}]"
        if f.name in from_preset:
            comment += f" [now: {_scalar(value)}, from loss {obj.loss}]"
            value = None
        elif isinstance(obj, AlgorithmConfig) and f.name == "scale_rewards":
            value = True  # false or batch only spells an advantage, which `advantage` carries (or its preset fills)
        for line in textwrap.wrap(comment, WIDTH - len(indent) - 2, break_on_hyphens=False):
            lines.append(f"{indent}# {line}")
        lines.append(f"{indent}{f.name}: {_scalar(value)}")


def _scalar(value: Any) -> str:
    """A value as one line of YAML flow style (lists of sections as mappings)."""
    from poise.schema import to_dict

    text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=10 ** 6, sort_keys=False).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()
