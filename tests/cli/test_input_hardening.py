"""Input hardening: a model path that is a file, and model directories holding pickle
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


def _tiny_model(directory: Path) -> Path:
    """A real tiny checkpoint (config.json, model.safetensors, the char tokenizer)."""
    from poise.config import TinyModelConfig
    from poise.data.tokenizer import CharTokenizer
    from poise.model.loading import build_tiny, save_model

    tok = CharTokenizer()
    save_model(build_tiny(TinyModelConfig(), tok.vocab_size, 0, tok.eos_id, tok.pad_id, tok.bos_id), directory, tok)
    return directory


@pytest.mark.parametrize("command", ["train", "eval"])
def test_safetensors_header_length_beyond_the_file(tmp_path, command):
    """A header length of 2^62 would be read as one 4 EiB buffer (MemoryError, a traceback)."""
    model = _tiny_model(tmp_path / "model")
    weights = model / "model.safetensors"
    with open(weights, "r+b") as f:
        f.write((2 ** 62).to_bytes(8, "little"))
    args = (["train", f"model.path={model}", f"run.dir={tmp_path}/run", "run.progress=false",
             "pipeline.mode=colocated"] if command == "train" else ["eval", str(model), "--out", f"{tmp_path}/e.json"])
    assert_one_line_error(poise(*args), "model.safetensors", str(2 ** 62), "save the model again")


def test_config_json_whose_layer_count_disagrees_with_its_layer_types(tmp_path):
    import json
    model = _tiny_model(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    assert len(config["layer_types"]) == config["num_hidden_layers"]  # the tiny model has them, consistent
    config["num_hidden_layers"] += 1
    (model / "config.json").write_text(json.dumps(config))
    result = poise("train", f"model.path={model}", f"run.dir={tmp_path}/run", "run.progress=false",
                   "pipeline.mode=colocated")
    assert_one_line_error(result, "config.json", "layer_types")


@pytest.mark.parametrize("content, fragments", [
    (b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "1"}\n', [":2", "UTF-8"]),
    (b'{"prompt": "1+1", "answer": "2"}\n' + b"[" * 200_000 + b"]" * 200_000 + b"\n", [":2", "nested"]),
], ids=["not-utf8", "deep-nesting"])
def test_dataset_that_is_not_utf8_or_nests_too_deep(tmp_path, content, fragments):
    data = tmp_path / "d.jsonl"
    data.write_bytes(content)
    result = poise("train", f"data.dataset={data}", f"run.dir={tmp_path}/run", "run.progress=false",
                   "pipeline.mode=colocated")
    assert_one_line_error(result, str(data), *fragments)
    assert not (tmp_path / "run").exists()
