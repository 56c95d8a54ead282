"""Draw a run directory (simulated or real, same JSONL: docs/events.md) as PNGs and one HTML page.

    paths = draw_report(run_dir, out_dir=None)   # default out_dir: RUN_DIR/report/

The page opens with one summary table, the same for a real run and a simulation (report/summary.py),
then an interactive timeline (report/timeline.py: zoom and pan, self-contained, nothing fetched when
viewed) and the figures: per-device timeline (the static copy), step time, split per step,
throughput, and the learning curves: reward per step (mean and +-1 standard error over the step's
samples: for 0/1 rewards a percentile band would span 0-1) and response length (mean and the
p10-p90 band), a real run's training signals (loss, KL, grad norm, entropy, clip fraction; each
reward function's mean: report/signals.py) and rollout/trainer log-prob mismatch, and a page of
what the model wrote (completions.html: report/completions.py). Resize sections appear only where
something resized. Steps count from 0 everywhere,
as in metrics.jsonl; a resize between steps k and k+1 is "before step k+1", as
`resize.schedule`'s `at_step` says. Reads only events.jsonl,
metrics.jsonl and (if present) summary.json, so a real run and a simulation are drawn by the same
code. matplotlib with the Agg backend: no display needed.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from poise.errors import PoiseError
from poise.report.completions import index_section, write_completions_page
from poise.report.signals import draw_signals
from poise.runlog import read_jsonl

ROLE_COLORS = {"rollout": "#4C72B0", "train": "#DD8452", "resize": "#C44E52", "idle": "#DDDDDD"}
MAX_TIMELINE_ROWS = 64  # beyond this a per-device chart is unreadable; rows are sampled



def _save(fig, path: Path) -> Path:
    """Every figure of the report: tight layout, 90 dpi PNG, figure closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

def load_run(run_dir: str | Path) -> dict[str, Any]:
    run = Path(run_dir)
    events_path, metrics_path = run / "events.jsonl", run / "metrics.jsonl"
    if not run.is_dir() or not events_path.is_file():
        raise PoiseError(f"'{run}' is not a run directory (no events.jsonl); pass the directory "
                         "that `poise train` or `poise simulate --out` wrote")
    try:
        events = list(read_jsonl(events_path))
        metrics = list(read_jsonl(metrics_path)) if metrics_path.is_file() else []
    except json.JSONDecodeError as e:
        raise PoiseError(f"'{run}' has a malformed JSONL line ({e}); was the run interrupted "
                         "mid-write? remove the last line and retry") from None
    summary = {}
    if (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text())
    return {"events": events, "metrics": metrics, "summary": summary}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_timeline(events: list[dict], path: Path) -> None:
    plt = _plt()
    intervals = [e for e in events if e.get("kind") == "interval"]
    rows: dict[int, list[dict]] = {}
    for e in intervals:
        for d in range(int(e["device"]), int(e["device"]) + int(e.get("devices", 1))):
            rows.setdefault(d, []).append(e)
    devices = sorted(rows)
    if len(devices) > MAX_TIMELINE_ROWS:
        stride = -(-len(devices) // MAX_TIMELINE_ROWS)
        devices = devices[::stride]
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.25 * max(1, len(devices))))
    for y, d in enumerate(devices):
        by_role: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for e in rows[d]:
            key = (e["role"], bool(e.get("background")))
            by_role.setdefault(key, []).append((e["start"], e["end"] - e["start"]))
        for (role, background), spans in by_role.items():
            h, off = (0.3, 0.55) if background else (0.8, 0.1)
            ax.broken_barh(spans, (y + off - 0.5, h), facecolors=ROLE_COLORS.get(role, "#999999"),
                           hatch="//" if role == "resize" else None, linewidth=0)
    for e in events:
        if e.get("kind") == "resize":
            ax.axvline(e.get("start", e["t"]), color=ROLE_COLORS["resize"], lw=0.8, ls="--")
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels([str(d) for d in devices], fontsize=7)
    ax.set_xlabel("seconds from run start")
    ax.set_ylabel("device")
    ax.set_title("Per-device timeline (gaps are idle; hatched: resize phases)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=r) for r, c in ROLE_COLORS.items()], loc="upper right",
              fontsize=7, ncol=4)
    _save(fig, path)


def _steps(events: list[dict], metrics: list[dict]) -> list[dict]:
    steps = [e for e in events if e.get("kind") == "step"]
    if steps:
        return steps
    # A log without step events: derive what we can from metrics rows.
    out, t = [], 0.0
    for m in metrics:
        dt = float(m.get("step_s") or 0.0)
        out.append({"step": m["step"], "start": t, "end": t + dt, "tokens": None,
                    "split": m.get("split")})
        t += dt
    return out


def draw_series(events: list[dict], metrics: list[dict], out: Path) -> dict[str, Path]:
    plt = _plt()
    steps = _steps(events, metrics)
    paths = {}
    xs = [s["step"] for s in steps]
    step_s = [s["end"] - s["start"] for s in steps]
    # a resize happens after its `step` and before the next: drawn between the two
    resize_steps = [e["step"] + 0.5 for e in events if e.get("kind") == "resize" and isinstance(e.get("step"), int)]

    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(xs, step_s, lw=1.2, label="step time")
    if steps and "rollout_s" in steps[0]:
        ax.plot(xs, [s.get("rollout_s") for s in steps], lw=0.8, alpha=0.7, label="rollout")
        ax.plot(xs, [s.get("train_s") for s in steps], lw=0.8, alpha=0.7, label="train")
    for r in resize_steps:
        ax.axvline(r, color=ROLE_COLORS["resize"], lw=0.8, ls="--")
    _step_axes(ax, "seconds", "Step time (dashed: resizes)")
    _legend_outside(ax)
    paths["step_time"] = _save(fig, out / "step_time.png")

    fig, ax = plt.subplots(figsize=(10, 2.8))
    splits = [s.get("split") or [None, None] for s in steps]
    # steps on x, as the other figures (the timeline has the seconds)
    ax.step(xs, [sp[0] for sp in splits], where="mid", label="rollout devices", color=ROLE_COLORS["rollout"])
    ax.step(xs, [sp[1] for sp in splits], where="mid", label="train devices", color=ROLE_COLORS["train"])
    _step_axes(ax, "devices", "Split per step")
    ax.yaxis.get_major_locator().set_params(integer=True)
    _legend_outside(ax)
    paths["split"] = _save(fig, out / "split.png")

    fig, ax = plt.subplots(figsize=(10, 2.8))
    tput = []
    for s, dt in zip(steps, step_s):
        tok = s.get("tokens")
        tput.append(tok / dt if tok and dt > 0 else None)
    if not any(v is not None for v in tput):
        tput = [m.get("tokens_per_s") for m in metrics][: len(xs)]
    ax.plot(xs[: len(tput)], tput, lw=1.2, color="#55A868")
    ax.set_xlabel("step")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Throughput")
    paths["throughput"] = _save(fig, out / "throughput.png")
    return paths


BAND = (10.0, 90.0)  # the percentile band drawn around the response length's mean


def _step_axes(ax, ylabel: str, title: str) -> None:
    """Label a per-step plot: steps (whole numbers) along x, `ylabel` up, `title` above."""
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)


def _legend_outside(ax) -> None:
    """The legend right of the axes, never over a curve."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def step_curves(events: list[dict], metrics: list[dict], field: str, fallback: str,
                band: str = "percentile") -> dict[str, list[float]]:
    """Per step: the mean of `field` ("reward", "output_length") over the step's `sample` events and
    a band: `percentile` p10-p90, or `sem` mean +- 1 standard error of the mean (what says how
    sure the mean is when the values are 0 or 1). A log whose samples lack `field` gives the mean
    from metrics.jsonl's `fallback` key and no band. Returns {"step", "mean", "low", "high"} lists
    (low/high empty without a band)."""
    import numpy as np

    by_id: dict[tuple, tuple[int, float]] = {}  # a step replayed after --resume logs its samples again
    for e in events:
        if e.get("kind") == "sample" and isinstance(e.get(field), (int, float)):
            by_id[tuple(e["id"])] = (int(e["step"]), float(e[field]))
    if by_id:
        per_step: dict[int, list[float]] = {}
        for step, value in by_id.values():
            per_step.setdefault(step, []).append(value)
        steps = sorted(per_step)
        values = [np.asarray(per_step[k]) for k in steps]
        means = [float(v.mean()) for v in values]
        if band == "sem":
            sem = [float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0 for v in values]
            return {"step": steps, "mean": means, "low": [m - e for m, e in zip(means, sem)],
                    "high": [m + e for m, e in zip(means, sem)]}
        return {"step": steps, "mean": means,
                "low": [float(np.percentile(v, BAND[0])) for v in values],
                "high": [float(np.percentile(v, BAND[1])) for v in values]}
    rows = [m for m in metrics if isinstance(m.get(fallback), (int, float))]
    return {"step": [m["step"] for m in rows], "mean": [float(m[fallback]) for m in rows], "low": [], "high": []}


def eval_curves(metrics: list[dict]) -> dict[str, dict[str, list[float]]]:
    """The held-out evaluations of a run (metrics rows with `eval`, eval.every): per series
    ("greedy", "sampled": mean reward; "pass@k") {"step": [...], "value": [...]}, at the step whose
    weights were evaluated. A run without evaluation gives {}."""
    out: dict[str, dict[str, list[float]]] = {}
    by_step = {m["step"]: m["eval"] for m in metrics if isinstance(m.get("eval"), dict)}  # a replayed step once
    for step in sorted(by_step):
        e = by_step[step]
        points = [(mode, e[mode].get("reward_mean")) for mode in ("greedy", "sampled") if isinstance(e.get(mode), dict)]
        points += [(k, v) for k, v in e.items() if k.startswith("pass@")]
        for name, value in points:
            if isinstance(value, (int, float)):
                series = out.setdefault(name, {"step": [], "value": []})
                series["step"].append(step)
                series["value"].append(float(value))
    return out


TITLES = {"signals": "training signals", "reward_functions": "reward per function",
          "response_length": "response length", "step_time": "step time", "split": "split per step"}
EVAL_HEADER = {"greedy": "greedy: mean reward", "sampled": "sampled: mean reward"}
EVAL_STYLE = {"greedy": ("#DD8452", "o", "held-out eval, greedy: mean reward"),
              "sampled": ("#55A868", "s", "held-out eval, sampled: mean reward")}


def draw_learning(events: list[dict], metrics: list[dict], out: Path) -> dict[str, Path]:
    """Reward and response length per step; a log with neither (a simulation has no rewards) draws none."""
    plt = _plt()
    paths = {}
    for name, field, fallback, ylabel, color, band, band_label in (
            ("reward", "reward", "reward_mean", "reward", "#8172B2", "sem", "+-1 standard error of the mean"),
            ("response_length", "output_length", "response_len_mean", "response tokens", "#4C72B0", "percentile",
             f"p{BAND[0]:.0f}-p{BAND[1]:.0f} over the step's samples")):
        curve = step_curves(events, metrics, field, fallback, band)
        if not curve["step"]:
            continue
        fig, ax = plt.subplots(figsize=(10, 3.0))
        evals = eval_curves(metrics) if name == "reward" else {}  # held-out evaluation next to training's reward
        ax.plot(curve["step"], curve["mean"], lw=1.4, color=color, label="training: mean" if evals else "mean")
        if evals:
            for mode, series in evals.items():
                if mode in EVAL_STYLE:
                    c, marker, label = EVAL_STYLE[mode]
                    ax.plot(series["step"], series["value"], lw=1.2, color=c, marker=marker, ms=4, label=label)
        if curve["low"]:
            ax.fill_between(curve["step"], curve["low"], curve["high"], color=color, alpha=0.25, lw=0,
                            label=band_label)
        _step_axes(ax, ylabel, f"{ylabel.capitalize()} per step")
        _legend_outside(ax)
        paths[name] = _save(fig, out / f"{name}.png")
    return paths


MISMATCH = "mismatch/logp_abs_diff_mean"  # a real run's rollout/trainer log-prob mismatch (policy/mismatch.py)


def draw_mismatch(metrics: list[dict], out: Path) -> dict[str, Path]:
    """The rollout/trainer log-prob mismatch per step: the mean and largest |trainer logp - rollout
    logp| over the first mini-batch's tokens, and the ratio's p05/p50/p95 as ratio - 1 (symlog: it
    is 0 where engine and trainer agree bit for bit). A log without it (a simulation) draws none."""
    rows = {m["step"]: m for m in metrics if isinstance(m.get(MISMATCH), (int, float))}  # a replayed step once
    if not rows:
        return {}
    plt = _plt()
    steps = sorted(rows)
    value = lambda key: [rows[k].get(key) for k in steps]  # noqa: E731
    fig, (diff_ax, ratio_ax) = plt.subplots(1, 2, figsize=(10, 3.0))
    diff_ax.plot(steps, value(MISMATCH), lw=1.4, color="#4C72B0", label="mean")
    diff_ax.plot(steps, value("mismatch/logp_abs_diff_max"), lw=1.0, color="#C44E52", label="max")
    diff_ax.set_yscale("symlog", linthresh=1e-9)
    diff_ax.set_title("|trainer logp - rollout logp|")
    for q, color, lw in (("p05", "#8172B2", 0.9), ("p50", "#4C72B0", 1.4), ("p95", "#8172B2", 0.9)):
        ratios = value(f"mismatch/ratio_{q}")
        ratio_ax.plot(steps, [r - 1 if isinstance(r, (int, float)) else None for r in ratios], lw=lw, color=color,
                      label=q)
    ratio_ax.set_yscale("symlog", linthresh=1e-9)
    ratio_ax.set_title("ratio exp(trainer - rollout logp) - 1")
    for ax in (diff_ax, ratio_ax):
        ax.set_xlabel("step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    return {"mismatch": _save(fig, out / "mismatch.png")}


def draw_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Draw every figure and index.html; returns name -> path."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"timeline": out / "timeline.png"}
    draw_timeline(run["events"], paths["timeline"])
    paths.update(draw_series(run["events"], run["metrics"], out))
    paths.update(draw_learning(run["events"], run["metrics"], out))
    paths.update(draw_signals(run["metrics"], out))
    paths.update(draw_mismatch(run["metrics"], out))
    completions = write_completions_page(Path(run_dir), out)
    if completions is not None:
        paths["completions"] = completions
    paths["html"] = out / "index.html"
    paths["html"].write_text(_html(Path(run_dir), run, paths))
    return paths


def _html(run_dir: Path, run: dict[str, Any], paths: dict[str, Path]) -> str:
    from poise.report.summary import episode_summary, run_summary
    from poise.report.timeline import timeline_section

    esc = lambda value: html.escape(str(value))  # noqa: E731 - every value read from the log
    summary_rows = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(v)}</td></tr>"
                           for k, v in run_summary(run["events"], run["metrics"]))
    evals = eval_curves(run["metrics"])
    eval_steps = sorted({k for series in evals.values() for k in series["step"]})
    eval_rows = "".join(
        f"<tr><td>{esc(k)}</td>" + "".join(
            f"<td>{esc(_num(dict(zip(s['step'], s['value'])).get(k)))}</td>" for s in evals.values()) + "</tr>"
        for k in eval_steps)
    eval_head = "".join(f"<th>{esc(EVAL_HEADER.get(name, name))}</th>" for name in evals)
    eval_table = (f"<h2>held-out evaluation</h2><table border=1 cellpadding=3 id='eval'><tr><th>after step</th>"
                  f"{eval_head}</tr>{eval_rows}</table>") if evals else ""
    simulated = "".join(f"<tr><td>{esc(k)}</td><td>{esc(_value(v))}</td></tr>"
                        for k, v in run["summary"].items() if k not in ("resizes", "joins"))
    decisions = [e for e in run["events"] if e.get("kind") == "decision" and e.get("what") == "resize"
                 and e.get("action", "resize") == "resize"]
    resize_rows = "".join(
        f"<tr><td>{esc(_before(d.get('step')))}</td><td>{esc(d.get('from'))}</td><td>{esc(d.get('to'))}</td>"
        f"<td>{esc(_num(d.get('predicted_gain_s')))}</td><td>{esc(_num(d.get('predicted_cost_s')))}</td>"
        f"<td>{esc(d.get('reason'))}</td></tr>" for d in decisions)
    timeline = timeline_section(run["events"])
    if timeline and "timeline" in paths:  # one timeline section: the zoomable one, the PNG folded under it
        timeline += (f"<details><summary>static copy (PNG)</summary><img src=\"{esc(paths['timeline'].name)}\" "
                     f"style=\"max-width:100%\"></details>")
    imgs = "".join(f'<h2>{esc(TITLES.get(name, name.replace("_", " ")))}</h2><img src="{esc(p.name)}" '
                   f'style="max-width:100%">' for name, p in paths.items()
                   if p.suffix == ".png" and not (name == "timeline" and timeline))
    resizes = (f"<h2>resize decisions</h2><table border=1 cellpadding=3><tr><th>before step</th>"
               f"<th>from</th><th>to</th><th>predicted gain s/step</th><th>resize cost s</th><th>reason</th></tr>"
               f"{resize_rows}</table>") if decisions else ""  # a fixed split has no resize section
    episode_rows, episode_devices = episode_summary(run["metrics"])
    episodes = (f"<h2>episodes</h2><table border=1 cellpadding=3 id='episodes'>"
                + "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in episode_rows)
                + "</table><table border=1 cellpadding=3 id='episode-devices'><tr><th>device</th><th>turns generated"
                  "</th><th>environment wait after them, s</th></tr>"
                + "".join(f"<tr><td>{esc(d)}</td><td>{esc(n)}</td><td>{esc(_num(w))}</td></tr>"
                          for d, n, w in episode_devices) + "</table>") if episode_rows else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>poise report: "
            f"{html.escape(run_dir.name)}</title></head><body style='font-family:sans-serif'>"
            f"<h1>{html.escape(str(run_dir))}</h1>"
            f"<h2>summary</h2><table border=1 cellpadding=3 id='summary'>{summary_rows}</table>"
            + eval_table + episodes
            + (f"<h2>simulator summary</h2><table border=1 cellpadding=3>{simulated}</table>" if simulated else "")
            + index_section(run_dir, paths.get("completions")) + resizes + timeline + imgs + "</body></html>")


def _before(step: Any) -> Any:
    """A decision observed step k; its resize comes before step k + 1 (`at_step: k + 1`)."""
    return step + 1 if isinstance(step, int) else step


def _num(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "" if value is None else str(value)


def _value(value: Any) -> str:
    """A summary.json value as a reader wants it: numbers to 4 significant digits, lists and dicts
    with their numbers rounded the same way."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def draw_sweep(rows: list[dict[str, Any]], param: str, metric: str, path: Path) -> None:
    """Sensitivity plot for `poise sweep`: `metric` against the value of `param`."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    groups: dict[str, list[tuple[Any, float]]] = {}
    for r in rows:
        others = ", ".join(f"{k}={v}" for k, v in r["params"].items() if k != param)
        groups.setdefault(others or "all", []).append((r["params"][param], r[metric]))
    for label, pts in groups.items():
        pts.sort(key=lambda p: p[0])
        ax.plot([str(p[0]) for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    if len(groups) > 1:
        ax.legend(fontsize=7)
    _save(fig, path)
