"""Input hardening (issue 11): a model path that is a file, and model directories holding pickle
weights, each get one line and exit 2 with nothing written; weights load from safetensors only."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def _model_dir(path: Path, *files: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    for name in files:
        (path / name).write_bytes(b"\x80\x04not really weights")
    return path


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_model_path_naming_a_file(tmp_path):
    model = tmp_path / "passwd"
    model.write_text("root:x:0:0:root:/root:/bin/bash\n")
    before = _snapshot(tmp_path)
    result = poise("train", f"model.path={model}", "model.sft_if_missing=true", f"run.dir={tmp_path}/run",
                   "run.progress=false", "pipeline.mode=colocated")
    assert_one_line_error(result, "model.path", str(model), "a file, not a directory")
    assert _snapshot(tmp_path) == before  # nothing written: no run directory, no warm start


def test_sft_out_naming_a_file(tmp_path):
    out = tmp_path / "passwd"
    out.write_text("x\n")
    assert_one_line_error(poise("sft", "--out", str(out), "run.progress=false"), str(out), "a file, not a directory")
    assert out.read_text() == "x\n"


@pytest.mark.parametrize("files", [
    ("pytorch_model.bin",),
    ("decoy.safetensors", "pytorch_model.bin"),  # a decoy beside the pickle must not let it through
    ("model.safetensors", "weights.pt"),
])
def test_model_directory_with_pickle_weights(tmp_path, files):
    model = _model_dir(tmp_path / "model", *files)
    before = _snapshot(tmp_path)
    result = poise("train", f"model.path={model}", f"run.dir={tmp_path}/run", "run.progress=false",
                   "pipeline.mode=colocated")
    pickle = next(f for f in files if not f.endswith(".safetensors"))
    assert_one_line_error(result, "model.path", pickle, "safetensors weights only")
    assert _snapshot(tmp_path) == before


def test_loader_refuses_pickles_and_reads_safetensors_only(tmp_path, monkeypatch):
    """load_model (also behind `poise profile --model`) refuses the directory; and with that check
    switched off, from_pretrained(use_safetensors=True) still never falls back to the pickle."""
    import torch

    from poise.config import TinyModelConfig
    from poise.errors import PoiseError
    from poise.model import loading

    real = tmp_path / "real"
    model = loading.build_tiny(TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1), 40, seed=0)
    model.config.to_json_file(str(_model_dir(real) / "config.json"))
    torch.save(model.state_dict(), real / "pytorch_model.bin")  # loadable weights, as a pickle
    (real / "decoy.safetensors").write_bytes(b"")
    with pytest.raises(PoiseError, match="pytorch_model.bin"):
        loading.load_model(real)
    monkeypatch.setattr(loading, "check_model_dir", lambda path: None)
    with pytest.raises(PoiseError, match="cannot load model"):
        loading.load_model(real)
