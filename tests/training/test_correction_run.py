"""Colocated runs with a masking correction: the preset reaches the update, every step's row
carries the `correction/...` metrics, and the same seed gives the same bytes and metrics. Poise's
fp32 engine and the trainer differ by about 1e-7 a token, so IcePop's band is pinned to [1, 1]:
a token whose log-probs differ at all is masked."""

from poise.config import load_train_config
from poise.training.colocated import train_colocated

from test_colocated import FAST  # tests/training

STEPS = 2
RECOMPUTE = ["algorithm.old_logprobs=recompute"]
ICEPOP = [*RECOMPUTE, "algorithm.rollout_is=icepop", "algorithm.rollout_is_low=1.0", "algorithm.rollout_is_high=1.0"]


def _run(run_dir, warm_start, read_run, knobs):
    train_colocated(load_train_config(None, [*FAST, *warm_start.overrides, f"run.dir={run_dir}", f"run.steps={STEPS}",
                                             "run.checkpoint_every=1", *knobs]))
    run = read_run(run_dir)
    run.assert_learned(warm_start)
    return run


def _correction(run) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("correction/")} for r in run.rows]


def test_an_icepop_run_masks_reports_and_repeats(tmp_path, warm_start, read_run):
    run = _run(tmp_path / "icepop", warm_start, read_run, ICEPOP)
    rows = _correction(run)
    assert len(rows) == STEPS
    for row in rows:
        assert set(row) == {"correction/is_weight_p05", "correction/is_weight_p50", "correction/is_weight_p95",
                            "correction/is_weight_max", "correction/truncated_frac", "correction/masked_frac"}, row
        assert row["correction/truncated_frac"] == 0.0
        assert row["correction/is_weight_max"] == 1.0  # a kept token's ratio is exactly 1
    assert any(0.0 < row["correction/masked_frac"] < 1.0 for row in rows), rows
    # the masking changed the updates: not the bytes of the same run without a correction
    plain = _run(tmp_path / "plain", warm_start, read_run, RECOMPUTE)
    assert _correction(plain) == [{}] * STEPS
    assert run.digest(1, "model.safetensors") != plain.digest(1, "model.safetensors")
    again = _run(tmp_path / "again", warm_start, read_run, ICEPOP)
    again.assert_bitwise_equal(run, "icepop, same seed")
    assert _correction(again) == rows
