"""The summary that opens a report: the same rows for a real run and a simulation, from the same
JSONL (docs/events.md), each number rounded to what it can mean."""

from __future__ import annotations

from typing import Any

STATIC = "static split"  # the reason of every decision of resize.policy static (policy/controller.py StaticSplit)
LAST_N = 10  # the final reward is the mean over this many last steps: one step's mean is noise


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _split(split: Any) -> str:
    return f"{split[0]}+{split[1]}" if isinstance(split, (list, tuple)) and len(split) == 2 else "-"


def _ratio(value: float) -> str:
    """A ratio near 1 as 1 +- its distance (0.9999997 would round to 1)."""
    if value == 1:
        return "1"
    return f"1{value - 1:+.2g}" if abs(value - 1) < 1e-3 else f"{value:.4g}"


def _mismatch(metrics: list[dict]) -> str:
    """The rollout/trainer log-prob mismatch over the run (metrics' mismatch/...: policy/mismatch.py):
    the mean over steps of each step's mean |difference|, the largest difference, and the widest
    step's ratio p05-p95; with a rollout_is correction, the mean weight and the truncated share."""
    rows = [m for m in metrics if isinstance(m.get("mismatch/logp_abs_diff_mean"), (int, float))]
    if not rows:
        return "- (none logged: a simulation has no log-probs)"
    mean = sum(m["mismatch/logp_abs_diff_mean"] for m in rows) / len(rows)
    largest = max(float(m.get("mismatch/logp_abs_diff_max") or 0.0) for m in rows)
    low = min(float(m.get("mismatch/ratio_p05", 1.0)) for m in rows)
    high = max(float(m.get("mismatch/ratio_p95", 1.0)) for m in rows)
    text = f"mean |diff| {mean:.2g}, largest {largest:.2g}; ratio p05-p95 {_ratio(low)} to {_ratio(high)}"
    weighted = [m for m in rows if isinstance(m.get("mismatch/is_weight_mean"), (int, float))]
    if weighted:
        weight = sum(m["mismatch/is_weight_mean"] for m in weighted) / len(weighted)
        cut = sum(float(m.get("mismatch/is_truncated_frac") or 0.0) for m in weighted) / len(weighted)
        text += f"; importance weight mean {_ratio(weight)}, truncated {100 * cut:.2g}% of tokens"
    return text + _correction(metrics)


def _correction(metrics: list[dict]) -> str:
    """The rollout_is preset's weights over the run (metrics' correction/...: algo/corrections.py):
    the lowest step p05, the highest step p95 and max, and the mean share of masked tokens."""
    rows = [m for m in metrics if isinstance(m.get("correction/is_weight_p05"), (int, float))]
    if not rows:
        return ""
    low = min(float(m["correction/is_weight_p05"]) for m in rows)
    high = max(float(m.get("correction/is_weight_p95") or 0.0) for m in rows)
    top = max(float(m.get("correction/is_weight_max") or 0.0) for m in rows)
    masked = sum(float(m.get("correction/masked_frac") or 0.0) for m in rows) / len(rows)
    return (f"; correction weights p05-p95 {_ratio(low)} to {_ratio(high)}, max {top:.3g}, "
            f"masked {100 * masked:.2g}% of tokens")


def run_summary(events: list[dict], metrics: list[dict]) -> list[tuple[str, str]]:
    """(label, value) rows: steps, wall time, reward, log-prob mismatch, tokens/s, samples/s, split
    changes, resize decisions, failures. A value the log does not have is "-"."""
    steps = sorted((e for e in events if e.get("kind") == "step"), key=lambda e: e["step"])
    wall = max((float(e["end"]) for e in steps), default=0.0) if steps else \
        sum(float(m.get("step_s") or 0.0) for m in metrics)
    n_steps = len(steps) or len(metrics)
    rows = [("steps", f"{n_steps} (0-{n_steps - 1})" if n_steps else "0"),
            ("wall time", _duration(wall))]  # the run's clock: a resumed run's segments end to end

    rewards = [m["reward_mean"] for m in sorted(metrics, key=lambda m: m.get("step", 0))
               if isinstance(m.get("reward_mean"), (int, float))]
    if rewards:
        n = min(LAST_N, len(rewards))
        first, last = sum(rewards[:n]) / n, sum(rewards[-n:]) / n
        rows.append((f"reward, mean of the last {n} steps", f"{last:.3f} (first {n}: {first:.3f})"))
    else:
        rows.append(("reward", "- (none logged: a simulation has no rewards)"))

    rows.append(("log-prob mismatch, trainer vs rollout", _mismatch(metrics)))

    tokens = sum(int(e.get("tokens") or 0) for e in steps)
    rows.append(("generated tokens/s", _rate(tokens / wall) if tokens and wall > 0 else "-"))
    sample_ids = {tuple(e["id"]) for e in events if e.get("kind") == "sample" and isinstance(e.get("id"), list)}
    rows.append(("samples/s", _rate(len(sample_ids) / wall) if sample_ids and wall > 0 else "-"))

    changes, previous = [], None
    for e in steps:
        split = e.get("split")
        if previous is not None and split != previous:
            changes.append(f"{_split(previous)} -> {_split(split)} before step {e['step']}")
        previous = split
    first_split = _split(steps[0].get("split")) if steps else "-"
    rows.append(("split", f"{first_split}, changes: {len(changes)}" + (" (" + "; ".join(changes) + ")" if changes else "")))

    decisions = [e for e in events if e.get("kind") == "decision" and e.get("what", "resize") == "resize"]
    resizes = [e for e in decisions if e.get("action", "resize") == "resize"]
    done = [e for e in events if e.get("kind") == "resize"]
    if decisions and not resizes and not done and all(e.get("reason") == STATIC for e in decisions):
        rows.append(("resize decisions", "none: a static split (resize.policy static)"))  # no policy decided anything
    else:
        rows.append(("resize decisions", f"resize: {len(resizes)} of {len(decisions)}; resizes done: {len(done)}"
                     if decisions else f"none logged; resizes done: {len(done)}"))

    recoveries = sum(1 for e in events if e.get("kind") == "recovery")
    reward_failures = sum(1 for e in events if e.get("kind") == "reward_failure")
    rows.append(("failures", f"workers lost and recovered: {recoveries}; reward calls failed: {reward_failures}"))
    return rows


def episode_summary(metrics: list[dict]) -> tuple[list[tuple[str, str]], list[tuple[str, int, float]]]:
    """A multi-turn run's (env.name) summary rows (turns, tokens, environment time and failures, tool
    calls, why episodes ended) and its per-device rows (device, turns generated, environment wait
    seconds after those turns); both empty for a single-turn run."""
    rows_with = [m for m in metrics if "episode/turns_mean" in m]
    if not rows_with:
        return [], []
    total = lambda key: sum(float(m.get(key) or 0) for m in rows_with)  # noqa: E731
    turns = sum(m["episode/turns_mean"] for m in rows_with) / len(rows_with)
    rows = [("turns per episode", f"mean {turns:.2f}, max {max(m['episode/turns_max'] for m in rows_with)}"),
            ("model / observation tokens", f"{int(total('episode/model_tokens'))} / "
                                           f"{int(total('episode/observation_tokens'))}"),
            ("environment", f"{int(total('episode/env_calls'))} calls, {total('episode/env_s'):.1f} s summed; "
                            f"failures {int(total('env_failures'))}"),
            ("tool calls", f"{int(total('episode/tool_calls'))} ({int(total('episode/tool_errors'))} errors)"),
            ("episodes ended by", ", ".join(f"{k[len('episode/end_'):]} {int(total(k))}" for k in sorted(rows_with[0])
                                           if k.startswith("episode/end_")))]
    turns_by, waits_by = {}, {}
    for m in rows_with:
        for d, n in (m.get("episode/turns_by_device") or {}).items():
            turns_by[d] = turns_by.get(d, 0) + int(n)
        for d, w in (m.get("episode/env_wait_s_by_device") or {}).items():
            waits_by[d] = waits_by.get(d, 0.0) + float(w)
    devices = [(d, turns_by.get(d, 0), waits_by.get(d, 0.0)) for d in sorted(set(turns_by) | set(waits_by), key=int)]
    return rows, devices
