"""The report's training signals: the numbers a user tunes by, per step, from metrics.jsonl.

    paths = draw_signals(metrics, out)   # {"signals": ..., "reward_functions": ...}, each only if logged

`signals`: one panel per logged update statistic (loss, KL, grad norm, entropy, clip fraction:
docs/events.md has what each means); `reward_functions`: each reward function's mean per step
(`reward/<name>`, fallbacks included). A simulation logs none of them and draws neither.
"""

from __future__ import annotations

from pathlib import Path

SIGNALS = (("loss", "loss"), ("kl", "KL per response token"), ("grad_norm", "grad norm (before clipping)"),
           ("entropy", "entropy per response token"), ("clip_frac", "clip fraction (share of tokens)"))
COLUMNS = 3  # panels per row of the signals figure


def series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a numeric metrics key; a step replayed after --resume once (its last row)."""
    by_step = {m["step"]: float(m[key]) for m in metrics
               if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)}
    steps = sorted(by_step)
    return steps, [by_step[k] for k in steps]


def reward_functions(metrics: list[dict]) -> list[str]:
    """The `reward/<name>` keys of the run, in first-logged order."""
    names: dict[str, None] = {}
    for m in metrics:
        names.update((k, None) for k, v in m.items() if k.startswith("reward/") and isinstance(v, (int, float)))
    return list(names)


def draw_signals(metrics: list[dict], out: Path) -> dict[str, Path]:
    from poise.report.draw import _legend_outside, _plt, _save, _step_axes

    plt = _plt()
    paths: dict[str, Path] = {}
    logged = [(key, title) for key, title in SIGNALS if series(metrics, key)[0]]
    if logged:
        rows = -(-len(logged) // COLUMNS)
        fig, axes = plt.subplots(rows, COLUMNS, figsize=(12, 2.8 * rows), squeeze=False)
        for ax, (key, title) in zip(axes.flat, logged):
            steps, values = series(metrics, key)
            ax.plot(steps, values, lw=1.3, marker="o" if len(steps) < 20 else None, ms=3, color="#4C72B0")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.xaxis.get_major_locator().set_params(integer=True)
        for ax in list(axes.flat)[len(logged):]:
            ax.set_visible(False)
        paths["signals"] = _save(fig, out / "signals.png")
    names = reward_functions(metrics)
    if names:
        fig, ax = plt.subplots(figsize=(10, 3.0))
        for name in names:
            steps, values = series(metrics, name)
            ax.plot(steps, values, lw=1.3, marker="o" if len(steps) < 20 else None, ms=3, label=name[len("reward/"):])
        _step_axes(ax, "mean reward", "Reward per function (mean over the step's samples)")
        _legend_outside(ax)
        paths["reward_functions"] = _save(fig, out / "reward_functions.png")
    return paths
