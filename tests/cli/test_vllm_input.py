"""Bad `rollout.backend: vllm` input: one line, exit 2, before the run directory exists (so before
Ray starts). These run in the main venv; the vLLM backend itself is tested in tests/vllm_backend (its own
venv: `make test-vllm`)."""

import subprocess
import sys

from blocker import blocker_source  # tests/blocker.py
from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def test_vllm_with_bitwise_is_refused(tmp_path):
    assert_one_line_error(poise("train", "configs/demo.yaml", "rollout.backend=vllm", f"run.dir={tmp_path}/run"),
                          "rollout.backend", "'vllm'", "determinism=semantic", "rollout.backend=poise")
    assert not (tmp_path / "run").exists()


def test_what_vllm_cannot_take_is_refused(tmp_path):
    for override, fragment in (("rollout.stop_strings=[x]", "rollout.stop_strings"),
                               ("model.lora.r=4", "LoRA"),
                               ("cluster.compute=emulated", "emulated")):
        result = poise("train", "configs/demo.yaml", "rollout.backend=vllm", "determinism=semantic", override,
                       f"run.dir={tmp_path}/run")
        assert_one_line_error(result, fragment, "rollout.backend=poise")
    assert not (tmp_path / "run").exists()


def test_vllm_missing_names_the_install(tmp_path):
    """Where vLLM cannot be imported (blocked here, so the test holds in the vLLM venv too)."""
    code = blocker_source("vllm") + (
        "import sys\nfrom poise.cli import main\n"
        f"sys.argv = ['poise', 'train', 'configs/demo.yaml', 'rollout.backend=vllm', 'determinism=semantic', "
        f"'run.dir={tmp_path}/run']\nsys.exit(main())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "rollout.backend=vllm needs vLLM", "make vllm", "rollout.backend=poise")
    assert not (tmp_path / "run").exists()
