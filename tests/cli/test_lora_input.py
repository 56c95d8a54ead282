"""Bad `model.lora` input: one line, exit 2, before the run directory exists (so before Ray)."""

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


@pytest.mark.parametrize("override, fragments", [
    ("model.lora.target_modules=[q_proj,lm_head]",
     ("model.lora.target_modules", "'lm_head'", "choose from q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                                "down_proj")),
    ("model.lora.r=0", ("model.lora.r", "got 0", ">= 1")),
    ("model.lora.dropout=0.1", ("model.lora.dropout", "bitwise needs 0", "determinism: semantic")),
])
def test_bad_lora_input_is_one_line_before_any_work(tmp_path, override, fragments):
    assert_one_line_error(poise("train", "configs/demo.yaml", override, f"run.dir={tmp_path}/run"), *fragments)
    assert not (tmp_path / "run").exists()
