"""`poise report` shows what a user tunes by and what the model wrote: curves of loss, KL, grad norm,
entropy, clip fraction and each reward function; a completions page; resize sections only where
something resized; one timeline section; a static split said as such."""

from __future__ import annotations

import re

import pytest

from poise.report import draw_report
from poise.runlog import RunLog

STEPS = 10


def _signals(step):
    return {"loss": 0.1 * step, "kl": 0.01 * step, "grad_norm": 1.0 + step, "entropy": 3.0 - 0.1 * step,
            "clip_frac": 0.02 * step, "reward/task": 0.05 * step, "reward/format": 1.0}


def _write_run(run_dir, policy="static", completions=()):
    """A real run's log on a fixed 2+2 split: per step an interval, a step event, a decision of the
    resize policy (none after the last step) and a metrics row with every training signal."""
    reason = {"static": "static split", "controller": "gain below threshold"}[policy]
    with RunLog(run_dir) as log:
        for step in range(STEPS):
            log.event("interval", step + 1.0, device=0, role="rollout", phase="generate", step=step, start=step,
                      end=step + 0.6)
            log.event("step", step + 1.0, step=step, start=step, end=step + 1.0, rollout_s=0.6, train_s=0.4,
                      sync_s=0.0, reward_mean=0.5, tokens=40, split=[2, 2])
            if step + 1 < STEPS:
                log.event("decision", step + 1.0, what="resize", action="hold", step=step, **{"from": [2, 2]},
                          to=[2, 2], reason=reason, predicted_gain_s=None, predicted_cost_s=None)
            if completions:
                log.completions([r for r in completions if r["step"] == step])
            log.metrics({"step": step, "reward_mean": 0.5, "step_s": 1.0, "tokens_per_s": 40.0, **_signals(step),
                         **({"eval": {"greedy": {"reward_mean": 0.1 * step}}} if step % 5 == 4 else {})})
    return run_dir


def _summary(page: str) -> dict[str, str]:
    table = page.split("<table border=1 cellpadding=3 id='summary'>", 1)[1].split("</table>", 1)[0]
    return dict(re.findall(r"<tr><th style='text-align:left'>(.*?)</th><td>(.*?)</td></tr>", table))


def test_every_training_signal_and_reward_function_is_drawn(tmp_path):
    paths = draw_report(_write_run(tmp_path))
    page = paths["html"].read_text()
    for name in ("signals", "reward_functions", "reward"):
        assert paths[name].suffix == ".png" and paths[name].stat().st_size > 2000, name
        assert f'src="{paths[name].name}"' in page, name
    assert "<h2>training signals</h2>" in page and "<h2>reward per function</h2>" in page
    assert "<h2>held-out evaluation</h2>" in page  # eval: its table, and its points on the reward curve


def test_the_series_are_the_logged_numbers_a_replayed_step_once(tmp_path):
    from poise.report.signals import SIGNALS, reward_functions, series

    metrics = [{"step": k, **_signals(k)} for k in range(3)] + [{"step": 2, **_signals(2)}]  # step 2 after --resume
    for key, _ in SIGNALS:
        steps, values = series(metrics, key)
        assert steps == [0, 1, 2] and values == pytest.approx([_signals(k)[key] for k in range(3)]), key
    assert reward_functions(metrics) == ["reward/task", "reward/format"]
    assert series([{"step": 0, "reward_mean": 1.0}], "loss") == ([], [])  # a simulation: no signals
    with RunLog(tmp_path) as log:
        log.event("step", 1.0, step=0, start=0.0, end=1.0, tokens=10, split=[1, 1])
        log.metrics({"step": 0, "step_s": 1.0, "tokens_per_s": 10.0})
    paths = draw_report(tmp_path)
    assert "signals" not in paths and "reward_functions" not in paths


def test_a_fixed_split_has_no_resize_section_and_says_it_is_static(tmp_path):
    page = draw_report(_write_run(tmp_path))["html"].read_text()
    assert "resize decisions</h2>" not in page and "<th>before step</th>" not in page
    assert _summary(page)["resize decisions"] == "none: a static split (resize.policy static)"
    assert "0 of 9" not in page


def test_a_controller_that_held_counts_its_decisions_but_draws_no_resize_table(tmp_path):
    page = draw_report(_write_run(tmp_path, "controller"))["html"].read_text()
    assert _summary(page)["resize decisions"] == "resize: 0 of 9; resizes done: 0"
    assert "resize decisions</h2>" not in page


def test_one_timeline_section_with_the_png_folded_in(tmp_path):
    page = draw_report(_write_run(tmp_path))["html"].read_text()
    assert len(re.findall(r"<h2>[^<]*timeline", page)) == 1, re.findall(r"<h2>[^<]*</h2>", page)
    assert 'src="timeline.png"' in page and "poise-timeline-data" in page


def test_the_completions_page_shows_what_the_model_wrote_escaped(tmp_path):
    rows = [{"step": k, "id": [k, 0, 0], "prompt_id": "p-0", "prompt": "arith 1+1",
             "completion": f"<script>alert({k})</script> & 2", "reward": 1.0, "rewards": {"task": 1.0}, "length": 5,
             "finish_reason": "eos", "weights_version": k, "truncated": False} for k in range(STEPS)]
    rows.append({**rows[-1], "id": [STEPS - 1, 1, 0], "completion": "go[observation]\nwall\n[/observation]back",
                 "turns": [{"role": "model", "text": "go"}, {"role": "observation", "text": "wall"},
                           {"role": "model", "text": "back"}]})
    paths = draw_report(_write_run(tmp_path, completions=rows))
    index = paths["html"].read_text()
    assert "<a href='completions.html'>" in index and index.count("<script") == 2  # the timeline's only
    page = paths["completions"].read_text()
    assert "<script" not in page and "&lt;script&gt;alert(3)&lt;/script&gt; &amp; 2" in page
    assert page.index("<h2 id='step-9'>") < page.index("<h2 id='step-0'>")  # newest first
    assert "<pre class='obs'>wall</pre>" in page and "<pre class='model'>back</pre>" in page
    assert f"{len(rows)} samples from {STEPS} steps" in page
    assert "completions" not in draw_report(_write_run(tmp_path / "none"))  # none logged: no page, no link
    assert "completions.html" not in (tmp_path / "none" / "report" / "index.html").read_text()
