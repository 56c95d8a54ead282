"""`poise report` draws a simulated run and a real-run-shaped log with the same code."""

from __future__ import annotations


import pytest

from poise.errors import PoiseError
from poise.report import draw_report
from poise.runlog import RunLog
from poise.sim import load_scenario, simulate


def _check(paths):
    for name in ("timeline", "step_time", "split", "throughput"):
        assert paths[name].suffix == ".png" and paths[name].stat().st_size > 2000, name
    page = paths["html"].read_text()
    assert all(f'src="{paths[n].name}"' in page for n in ("timeline", "step_time", "split", "throughput"))
    return page


def test_report_of_a_simulated_run_with_a_resize(tmp_path):
    simulate(load_scenario("dynaresize-8xh20", ["steps=30"]), tmp_path)
    page = _check(draw_report(tmp_path))
    assert "6:2 -&gt; 4:4" in page  # the resize decision and its reason are on the page


def test_report_of_a_real_run_log(tmp_path):
    # What the runtime writes: wall-clock `t`, per-device intervals, step events, metrics.
    with RunLog(tmp_path) as log:
        t = 0.0
        for step in range(5):
            for dev, role in ((0, "rollout"), (1, "rollout"), (2, "train")):
                log.event("interval", t + 1.0, device=dev, role=role, phase=role, step=step,
                          start=t + (0.0 if role == "rollout" else 0.6), end=t + (0.6 if role == "rollout" else 1.0))
            log.event("step", t + 1.0, step=step, start=t, end=t + 1.0, rollout_s=0.6, train_s=0.4,
                      sync_s=0.0, reward_mean=0.5, tokens=1000, split=[2, 1])
            log.metrics({"step": step, "reward_mean": 0.5, "step_s": 1.0, "tokens_per_s": 1000.0})
            t += 1.0
    _check(draw_report(tmp_path, tmp_path / "out"))


def test_not_a_run_directory(tmp_path):
    with pytest.raises(PoiseError, match="not a run directory"):
        draw_report(tmp_path)
    (tmp_path / "events.jsonl").write_text('{"t": 1, "kind": "step"\n')
    with pytest.raises(PoiseError, match="malformed JSONL"):
        draw_report(tmp_path)
