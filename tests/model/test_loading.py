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
