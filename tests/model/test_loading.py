import os
import subprocess
import sys

import pytest
import torch

from poise.errors import PoiseError
from poise.model.loading import TinyModelConfig, build_tiny, load_model, save_model


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_round_trips_through_safetensors(tmp_path, arch):
    model = build_tiny(TinyModelConfig(arch=arch, hidden_size=32, intermediate_size=64), vocab_size=50, seed=3)
    save_model(model, tmp_path / "m")
    assert (tmp_path / "m/model.safetensors").is_file() and (tmp_path / "m/config.json").is_file()
    loaded = load_model(tmp_path / "m")
    assert loaded.config.model_type == arch
    for (name, a), (name_b, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name_b and torch.equal(a, b), name
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_build_tiny_is_a_function_of_the_seed():
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64)
    a, b, c = build_tiny(cfg, 50, seed=1), build_tiny(cfg, 50, seed=1), build_tiny(cfg, 50, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "does not exist"),
    (lambda d: d.mkdir(), "has no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{}")), "has no *.safetensors"),
])
def test_bad_model_directories(tmp_path, setup, message):
    directory = tmp_path / "model"
    setup(directory)
    with pytest.raises(PoiseError, match=message.replace("*", r"\*")):
        load_model(directory)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_a_checkpoint_loaded_in_bf16_is_the_float32_one_rounded_bit_for_bit(tmp_path, arch):
    """Loading straight in bfloat16 must give what loading in float32 and casting gives (every
    parameter and buffer, RoPE's included), and loading in float32 what transformers' own
    from_pretrained gives: a bf16 run starts from the checkpoint rounded once."""
    from transformers import AutoModelForCausalLM

    model = build_tiny(TinyModelConfig(arch=arch, hidden_size=32, intermediate_size=64), vocab_size=50, seed=3)
    save_model(model, tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 7, 9]])
    for dtype in (torch.float32, torch.bfloat16):
        loaded, reference = load_model(tmp_path / "m", dtype), hf.to(dtype)
        mine = {**loaded.state_dict(), **dict(loaded.named_buffers())}
        theirs = {**reference.state_dict(), **dict(reference.named_buffers())}
        assert mine.keys() == theirs.keys()
        for name, tensor in mine.items():
            assert tensor.dtype == theirs[name].dtype, name
            assert torch.equal(tensor.view(torch.uint8), theirs[name].view(torch.uint8)), name
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # still tied
        assert not loaded.training  # as from_pretrained leaves it
        assert torch.equal(loaded(ids).logits, reference(ids).logits)


def test_loading_on_meta_checks_names_and_shapes_and_reads_nothing(tmp_path):
    from safetensors.torch import load_file, save_file

    model = build_tiny(TinyModelConfig(hidden_size=32, intermediate_size=64), vocab_size=50, seed=3)
    save_model(model, tmp_path / "m")
    assert load_model(tmp_path / "m", device="meta").model.norm.weight.is_meta
    tensors = load_file(tmp_path / "m/model.safetensors")
    tensors["model.norm.weight"] = torch.ones(7)
    save_file(tensors, tmp_path / "m/model.safetensors")
    with pytest.raises(PoiseError, match=r"'model.norm.weight' has shape \(7,\), the config makes \(32,\)"):
        load_model(tmp_path / "m", device="meta")
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "m/model.safetensors")
    with pytest.raises(PoiseError, match="hold no 'model.norm.weight'"):
        load_model(tmp_path / "m")


# Loads a ~100M-parameter float32 checkpoint in bfloat16 in a fresh process and prints the peak
# of its resident memory over the load, less what it held before (imports included).
_PEAK_SCRIPT = """
import sys, torch
import transformers.models.qwen2.modeling_qwen2
from poise.model.loading import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) restarts from here
before = status("VmRSS")
model = load_model(sys.argv[1], torch.bfloat16)
print(status("VmHWM") - before, sum(p.numel() for p in model.parameters()))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
def test_loading_a_checkpoint_in_bf16_makes_no_float32_copy(tmp_path):
    """N device processes on one node load the model at once: none may hold the float32 checkpoint
    (7B: 28 GB) in host memory on the way to its bfloat16 copy. Measured as the peak resident
    memory of the load in a fresh process; a float32 copy alone would be 2x the bf16 model."""
    from safetensors.torch import save_file

    from poise.model.loading import tiny_hf_config

    cfg = TinyModelConfig(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, intermediate_size=2816)
    config = tiny_hf_config(cfg, vocab_size=8192, eos_id=2, pad_id=0, bos_id=1)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(p.shape, generator=g) * 0.02 for name, p in skeleton.named_parameters()}
    path = tmp_path / "m"
    path.mkdir()
    config.to_json_file(str(path / "config.json"))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path)], capture_output=True, text=True,
                         check=True).stdout.split()
    peak, params = int(out[-2]), int(out[-1])
    assert params > 90e6
    float32_bytes, bf16_bytes = 4 * params, 2 * params
    # the bf16 model itself plus at most one tensor in flight (here the embedding: 32 MB); loading
    # in float32 and casting peaked at 575 MB (fp32 + bf16 + the mapped file's pages)
    assert peak < bf16_bytes + float32_bytes // 4, f"{peak / 2**20:.0f} MB for a {bf16_bytes / 2**20:.0f} MB model"
