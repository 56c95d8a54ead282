"""`poise report` learning curves: reward and response length per step (mean and the p10-p90 band
over the step's samples), the metrics fallback, and an HTML page that escapes what the log holds."""

import numpy as np
import pytest

from poise.report import draw_report
from poise.report.draw import load_run, step_curves
from poise.runlog import RunLog, read_jsonl

# step -> (output lengths, rewards) of its 10 samples
SAMPLES = {
    0: (list(range(10, 20)), [0.0] * 8 + [1.0, 1.0]),
    1: (list(range(20, 40, 2)), [0.0] * 5 + [1.0] * 5),
    2: ([5] * 9 + [95], [1.0] * 9 + [0.5]),
}


def _write_run(run_dir, with_rewards=True, decision_reason="growing queue"):
    with RunLog(run_dir) as log:
        for step, (lengths, rewards) in SAMPLES.items():
            for j, (n, r) in enumerate(zip(lengths, rewards)):
                log.event("sample", step + 0.5, id=[step, j // 2, j % 2], step=step, prompt_id=f"p{j // 2}",
                          output_length=n, weights_version=step, instance=0, submit=step, finish=step + 0.5,
                          **({"reward": r} if with_rewards else {}))
            log.event("interval", step + 1.0, device=0, role="rollout", phase="generate", step=step, start=step,
                      end=step + 1.0)
            log.event("step", step + 1.0, step=step, start=step, end=step + 1.0, rollout_s=0.6, train_s=0.4,
                      sync_s=0.0, reward_mean=sum(rewards) / 10, tokens=sum(lengths), split=None)
            log.metrics({"step": step, "reward_mean": 0.25 * step, "response_len_mean": 100.0 + step,
                         "step_s": 1.0, "tokens_per_s": 10.0})
        log.event("decision", 3.0, what="resize", step=2, **{"from": "<b>1:1</b>", "to": "2:0"},
                  reason=decision_reason, predicted_gain_s=1.0, predicted_cost_s=0.5)


def test_curves_from_sample_events(tmp_path):
    _write_run(tmp_path)
    events = list(read_jsonl(tmp_path / "events.jsonl"))
    lengths = step_curves(events, [], "output_length", "response_len_mean")
    rewards = step_curves(events, [], "reward", "reward_mean")
    assert lengths["step"] == rewards["step"] == [0, 1, 2]
    # by hand: step 0 lengths 10..19 -> mean 14.5, p10 = 10 + 0.9, p90 = 10 + 8.1 (linear interpolation)
    assert lengths["mean"] == pytest.approx([14.5, 29.0, 14.0])
    assert lengths["low"] == pytest.approx([10.9, 21.8, 5.0])
    assert lengths["high"] == pytest.approx([18.1, 36.2, 14.0])
    assert rewards["mean"] == pytest.approx([0.2, 0.5, 0.95])
    assert rewards["low"] == pytest.approx([0.0, 0.0, 0.95])
    assert rewards["high"] == pytest.approx([1.0, 1.0, 1.0])
    for k, (n, r) in SAMPLES.items():  # the same numbers numpy gives
        assert lengths["high"][k] == pytest.approx(np.percentile(n, 90))
        assert rewards["low"][k] == pytest.approx(np.percentile(r, 10))


def test_a_replayed_step_counts_its_samples_once(tmp_path):
    _write_run(tmp_path)
    with RunLog(tmp_path, append=True) as log:  # after --resume, step 2 runs again with the same ids
        for j, n in enumerate(SAMPLES[2][0]):
            log.event("sample", 9.0, id=[2, j // 2, j % 2], step=2, prompt_id="p", output_length=n,
                      weights_version=2, instance=0, submit=8.0, finish=9.0, reward=SAMPLES[2][1][j])
    curve = step_curves(list(read_jsonl(tmp_path / "events.jsonl")), [], "output_length", "response_len_mean")
    assert curve["mean"][2] == pytest.approx(14.0)


def test_report_draws_the_curves_into_the_page(tmp_path):
    _write_run(tmp_path)
    paths = draw_report(tmp_path)
    for name in ("reward", "response_length"):
        assert paths[name].suffix == ".png" and paths[name].stat().st_size > 2000, name
        assert f'src="{paths[name].name}"' in paths["html"].read_text()


def test_without_sample_rewards_the_reward_curve_comes_from_metrics(tmp_path):
    _write_run(tmp_path, with_rewards=False)
    run = load_run(tmp_path)
    curve = step_curves(run["events"], run["metrics"], "reward", "reward_mean")
    assert curve == {"step": [0, 1, 2], "mean": [0.0, 0.25, 0.5], "low": [], "high": []}
    assert "reward" in draw_report(tmp_path)


def test_a_log_without_rewards_or_lengths_draws_no_curves(tmp_path):
    with RunLog(tmp_path) as log:
        log.event("step", 1.0, step=0, start=0.0, end=1.0, tokens=10, split=[1, 1])
        log.metrics({"step": 0, "step_s": 1.0, "tokens_per_s": 10.0})
    paths = draw_report(tmp_path)
    assert "reward" not in paths and "response_length" not in paths and paths["html"].is_file()


def test_the_page_escapes_values_from_the_log(tmp_path):
    _write_run(tmp_path, decision_reason="<script>alert(1)</script> & more")
    with RunLog(tmp_path, append=True) as log:  # and a phase name that would close the timeline's script
        log.event("interval", 4.0, device=1, role="train", phase="</script><script>alert(2)</script>", step=3,
                  start=3.0, end=4.0)
    page = draw_report(tmp_path)["html"].read_text()
    assert "alert(1)</script>" not in page and "alert(2)</script>" not in page and "<b>" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the timeline's data and code only
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "&lt;b&gt;1:1&lt;/b&gt;" in page


def test_the_reward_band_is_the_standard_error_of_the_mean(tmp_path):
    """For 0/1 rewards p10-p90 spans 0-1 whatever the step; the standard error says how sure the
    mean is. By hand: step 0 = eight 0s and two 1s, mean 0.2, sample std sqrt(1.6 / 9) = 0.4216,
    s.e. 0.4216 / sqrt(10) = 0.1333."""
    _write_run(tmp_path)
    rewards = step_curves(list(read_jsonl(tmp_path / "events.jsonl")), [], "reward", "reward_mean", band="sem")
    assert rewards["mean"] == pytest.approx([0.2, 0.5, 0.95])
    sem = [np.sqrt(1.6 / 9) / np.sqrt(10), np.sqrt(2.5 / 9) / np.sqrt(10), np.sqrt(0.225 / 9) / np.sqrt(10)]
    assert sem[0] == pytest.approx(0.13333, abs=1e-5)
    assert rewards["low"] == pytest.approx([m - e for m, e in zip(rewards["mean"], sem)])
    assert rewards["high"] == pytest.approx([m + e for m, e in zip(rewards["mean"], sem)])


def test_the_rollout_trainer_mismatch_is_drawn_and_summarised(tmp_path):
    _write_run(tmp_path)
    rows = [m for m in read_jsonl(tmp_path / "metrics.jsonl")]
    with RunLog(tmp_path / "m") as log:
        for m, (mean, top, p05, p95) in zip(rows, [(1e-7, 4e-7, 1 - 3e-7, 1 + 2e-7), (3e-7, 2e-6, 1 - 1e-6, 1 + 5e-7),
                                                  (2e-7, 1e-6, 1.0, 1 + 4e-7)]):
            log.event("step", m["step"] + 1.0, step=m["step"], start=m["step"], end=m["step"] + 1.0, tokens=10,
                      split=None)
            log.metrics({**m, "mismatch/logp_abs_diff_mean": mean, "mismatch/logp_abs_diff_max": top,
                         "mismatch/ratio_p05": p05, "mismatch/ratio_p50": 1.0, "mismatch/ratio_p95": p95,
                         "mismatch/is_weight_mean": 1.0 - 1e-7 * m["step"], "mismatch/is_truncated_frac": 0.0})
    paths = draw_report(tmp_path / "m")
    assert paths["mismatch"].stat().st_size > 2000 and 'src="mismatch.png"' in paths["html"].read_text()
    page = paths["html"].read_text()
    # by hand: the mean of the steps' means 2e-7, the largest 2e-6, the widest step's p05 and the widest p95
    assert ("mean |diff| 2e-07, largest 2e-06; ratio p05-p95 1-1e-06 to 1+5e-07; importance weight mean "
            "1-1e-07, truncated 0% of tokens") in page
    assert "mismatch" not in draw_report(tmp_path)  # a log without it draws none
    assert "none logged: a simulation has no log-probs" in (tmp_path / "report" / "index.html").read_text()


def test_the_correction_weights_are_summarised(tmp_path):
    """A rollout_is preset's correction/ metrics reach the summary's mismatch row: the lowest
    step p05, the highest p95 and max, the mean masked share (by hand below)."""
    _write_run(tmp_path)
    rows = [m for m in read_jsonl(tmp_path / "metrics.jsonl")]
    with RunLog(tmp_path / "c") as log:
        for m, (p05, p95, top, masked) in zip(rows, [(0.8, 1.1, 1.5, 0.0), (0.6, 1.3, 4.0, 0.02),
                                                      (0.9, 1.2, 2.0, 0.04)]):
            log.event("step", m["step"] + 1.0, step=m["step"], start=m["step"], end=m["step"] + 1.0, tokens=10,
                      split=None)
            log.metrics({**m, "mismatch/logp_abs_diff_mean": 1e-3, "mismatch/logp_abs_diff_max": 1e-2,
                         "mismatch/ratio_p05": 0.9, "mismatch/ratio_p50": 1.0, "mismatch/ratio_p95": 1.1,
                         "correction/is_weight_p05": p05, "correction/is_weight_p50": 1.0,
                         "correction/is_weight_p95": p95, "correction/is_weight_max": top,
                         "correction/truncated_frac": 0.0, "correction/masked_frac": masked})
    page = draw_report(tmp_path / "c")["html"].read_text()
    assert "; correction weights p05-p95 0.6 to 1.3, max 4, masked 2% of tokens" in page
    assert "correction weights" not in draw_report(tmp_path)["html"].read_text()  # a run without a preset
