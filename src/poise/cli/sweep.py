"""`poise sweep SCENARIO [key=value ...] [--param key=v1,v2,...]`: sensitivity of the resize
controller's hysteresis parameters (the sensitivity analysis DynaResize's reviewers asked for).

Runs the dynamic scenario for every combination of the swept values, and once with the
initial split held static; prints a table (throughput gain vs static, resizes) and writes
sweep.json and sweep.png under --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import yaml

from poise.errors import PoiseError
from poise.sim import load_scenario, simulate

DEFAULT_PARAMS = ["controller.threshold=0.05,0.15,0.3", "controller.consecutive=1,3",
                  "controller.cooldown_steps=0,10"]


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario name or YAML")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    parser.add_argument("--param", action="append", default=None,
                        help="key=v1,v2,... to sweep (repeatable); a key without a dot is the controller's "
                             "(threshold = controller.threshold); default: " + " ".join(DEFAULT_PARAMS))
    parser.add_argument("--out", default=None, help="output directory (default: runs/sweep-<scenario>)")


def _parse(items: list[str]) -> dict[str, list]:
    grid = {}
    for item in items:
        if "=" not in item:
            raise PoiseError(f"--param '{item}' is not key=v1,v2,...; write e.g. controller.threshold=0.05,0.15")
        key, raw = item.split("=", 1)
        values = [yaml.safe_load(v) for v in raw.split(",") if v != ""]
        if not values:
            raise PoiseError(f"--param '{item}' has no values; write e.g. {key}=1,3,5")
        key = key.strip()
        grid[key if "." in key else f"controller.{key}"] = values  # the short names of --help
    return grid


def _check_grid(scenario: str, fixed: list[str], grid: dict[str, list]) -> None:
    """Every swept key and value loads into the scenario, before the first (possibly long)
    simulation: a typo fails in a second, not after the static baseline has run."""
    for key, values in grid.items():
        for value in values:
            try:
                load_scenario(scenario, fixed + [f"{key}={value}"])
            except PoiseError as e:
                raise PoiseError(f"--param {key}: {e}") from None


def run(args: argparse.Namespace) -> int:
    grid = _parse(args.param or DEFAULT_PARAMS)
    quiet = ["log.samples=false", "log.intervals=none"]
    base = load_scenario(args.scenario, args.overrides + quiet + ["resize.policy=controller"])
    _check_grid(args.scenario, args.overrides + quiet + ["resize.policy=controller"], grid)
    out = Path(args.out or f"runs/sweep-{base.name}")
    out.mkdir(parents=True, exist_ok=True)
    static = simulate(load_scenario(args.scenario, args.overrides + quiet + ["resize.policy=static"]))
    rows = []
    keys = list(grid)
    print(f"sweep {base.name}: static {static.initial_split} takes {static.total_s:,.0f} s")
    print("  ".join(f"{k:>26}" for k in keys) + f"  {'total s':>9} {'vs static':>9} {'resizes':>7}")
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values))
        s = simulate(load_scenario(args.scenario, args.overrides + quiet + ["resize.policy=controller"]
                                   + [f"{k}={v}" for k, v in params.items()]))
        gain = static.total_s / s.total_s - 1.0
        rows.append({"params": params, "total_s": s.total_s, "gain_vs_static": gain,
                     "resizes": len(s.resizes), "tokens_per_s": s.tokens_per_s})
        print("  ".join(f"{str(v):>26}" for v in values) + f"  {s.total_s:>9,.0f} {gain:>+9.1%} {len(s.resizes):>7}")
    (out / "sweep.json").write_text(json.dumps({"scenario": base.name, "static_total_s": static.total_s,
                                                "rows": rows}, indent=1))
    from poise.report import draw_sweep

    draw_sweep(rows, keys[0], "gain_vs_static", out / "sweep.png")
    print(f"wrote {out / 'sweep.json'} and {out / 'sweep.png'}")
    return 0
