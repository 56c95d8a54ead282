"""A model vLLM cannot run: one line, exit 2, before the run directory (so before Ray). Needs vLLM
installed (it is vLLM's registry and kernels that say no): `make test-vllm`."""

import json


from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.config import TinyModelConfig
from poise.model.loading import build_tiny, save_model

SEMANTIC = ("rollout.backend=vllm", "determinism=semantic")


def test_an_architecture_vllm_does_not_know(tmp_path):
    model_dir = tmp_path / "model"
    save_model(build_tiny(TinyModelConfig(), 64, seed=0), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["MadeUpForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    result = poise("train", "configs/demo.yaml", *SEMANTIC, f"model.path={model_dir}", f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "cannot load", "['MadeUpForCausalLM']", "rollout.backend=poise")
    assert not (tmp_path / "run").exists()


def test_a_head_size_without_a_cpu_kernel(tmp_path):
    result = poise("train", "configs/demo.yaml", *SEMANTIC, "model.path=null", "model.tiny.hidden_size=64",
                   "model.tiny.num_heads=4", f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "head size 16", "rollout.backend=poise")
    assert not (tmp_path / "run").exists()
