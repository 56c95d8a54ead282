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


SUMMARY_LABELS = ["steps", "wall time", "log-prob mismatch, trainer vs rollout", "generated tokens/s",
                   "samples/s", "split", "resize decisions", "failures"]


def _summary(page: str) -> dict[str, str]:
    import re

    table = page.split("<table border=1 cellpadding=3 id='summary'>", 1)[1].split("</table>", 1)[0]
    return dict(re.findall(r"<tr><th style='text-align:left'>(.*?)</th><td>(.*?)</td></tr>", table))


def test_real_and_simulated_pages_open_with_the_same_summary(tmp_path):
    import re

    simulate(load_scenario("dynaresize-8xh20", ["steps=30"]), tmp_path / "sim")
    sim_page = draw_report(tmp_path / "sim")["html"].read_text()
    with RunLog(tmp_path / "real") as log:
        for step in range(12):
            split = [2, 2] if step < 6 else [3, 1]
            log.event("interval", step + 1.0, device=0, role="rollout", phase="generate", step=step, start=step,
                      end=step + 0.6)
            for j in range(4):
                log.event("sample", step + 0.5, id=[step, 0, j], step=step, prompt_id="p", output_length=10,
                          weights_version=step, instance=0, submit=step, finish=step + 0.5, reward=float(j % 2))
            log.event("step", step + 1.0, step=step, start=step, end=step + 1.0, rollout_s=0.6, train_s=0.4,
                      sync_s=0.0, reward_mean=0.1 * step, tokens=40, split=split)
            log.metrics({"step": step, "reward_mean": 0.1 * step, "step_s": 1.0, "tokens_per_s": 40.0})
        log.event("decision", 6.0, what="resize", action="resize", step=5, **{"from": "2:2", "to": "3:1"},
                  reason="rollout-bound", predicted_gain_s=0.123456789, predicted_cost_s=2.0)
        log.event("recovery", 8.0, step=7, phase="step", devices=[2], source=1, detect_s=None, recover_s=3.0)
    real_page = draw_report(tmp_path / "real")["html"].read_text()
    sim, real = _summary(sim_page), _summary(real_page)
    for summary in (sim, real):
        assert [k for k in summary if not k.startswith("reward")] == SUMMARY_LABELS
    # by hand for the real log: 12 steps over 12 s, 40 tokens and 4 samples a step
    assert real["steps"] == "12 (0-11)" and real["wall time"] == "12.0 s"
    assert real["reward, mean of the last 10 steps"] == "0.650 (first 10: 0.450)"
    assert real["generated tokens/s"] == "40" and real["samples/s"] == "4"
    assert real["split"] == "2+2, changes: 1 (2+2 -&gt; 3+1 before step 6)"
    assert real["failures"] == "workers lost and recovered: 1; reward calls failed: 0"
    # the resize decision observed step 5 and resized before step 6, as `at_step: 6` would say
    assert "<tr><td>6</td><td>2:2</td><td>3:1</td><td>0.123</td>" in real_page
    for page in (sim_page, real_page):  # no raw floats such as 2795.548775755725 anywhere in the tables
        tables = "".join(part.split("</table>")[0] for part in page.split("<table")[1:])
        assert not re.search(r"\d\.\d{5,}", tables), tables
    assert "poise-timeline-data" in real_page and "poise-timeline-data" in sim_page  # zoom and pan


def test_timeline_data_holds_every_interval_once(tmp_path):
    from poise.report.draw import load_run
    from poise.report.timeline import timeline_data

    simulate(load_scenario("dynaresize-8xh20", ["steps=10"]), tmp_path)
    events = load_run(tmp_path)["events"]
    intervals = [e for e in events if e["kind"] == "interval"]
    data = timeline_data(events)
    assert len(data["intervals"]) == sum(e.get("devices", 1) for e in intervals)
    assert data["t1"] == pytest.approx(max(e["end"] for e in intervals), abs=1e-6)


def test_report_of_a_multi_turn_run_shows_turns_and_environment_waits_per_device(tmp_path):
    """Episode metrics (what a run with env.name logs) become the `episodes` section: turns, tokens,
    environment time and failures summed over the steps, and each rollout device's turns and waits."""
    with RunLog(tmp_path) as log:
        for step in range(2):
            log.event("step", step + 1.0, step=step, start=float(step), end=step + 1.0, rollout_s=0.6, train_s=0.4,
                      sync_s=0.0, reward_mean=0.5, tokens=100, split=[2, 2])
            log.metrics({"step": step, "reward_mean": 0.5, "step_s": 1.0, "tokens_per_s": 100.0,
                         "episode/turns_mean": 2.0 + step, "episode/turns_max": 3 + step,
                         "episode/model_tokens": 50, "episode/observation_tokens": 70, "episode/env_calls": 40,
                         "episode/env_s": 1.5, "env_failures": step, "episode/tool_calls": 4, "episode/tool_errors": 1,
                         "episode/end_done": 10, "episode/end_max_turns": 6 - step, "episode/end_env_failure": step,
                         "episode/turns_by_device": {"0": 20, "1": 12 + step},
                         "episode/env_wait_s_by_device": {"0": 0.25, "1": 0.5}})
    page = draw_report(tmp_path)["html"].read_text()
    section = page[page.index("<h2>episodes</h2>"):]
    assert "mean 2.50, max 4" in section and "100 / 140" in section, section
    assert "80 calls, 3.0 s summed; failures 1" in section and "4 (1 errors)" not in section
    assert "8 (2 errors)" in section and "done 20" in section and "max_turns 11" in section
    assert "<tr><td>0</td><td>40</td><td>0.5</td></tr>" in section
    assert "<tr><td>1</td><td>25</td><td>1</td></tr>" in section


def test_a_single_turn_run_has_no_episodes_section(tmp_path):
    with RunLog(tmp_path) as log:
        log.event("step", 1.0, step=0, start=0.0, end=1.0, rollout_s=0.6, train_s=0.4, sync_s=0.0,
                  reward_mean=0.5, tokens=100, split=[2, 2])
        log.metrics({"step": 0, "reward_mean": 0.5, "step_s": 1.0, "tokens_per_s": 100.0})
    assert "<h2>episodes</h2>" not in draw_report(tmp_path)["html"].read_text()
