"""Optimizer state restored from a checkpoint lands on its parameter's device and dtype, as
`torch.optim.Optimizer.load_state_dict` would place it: the next step on that parameter works.

On CUDA the failure was a device mismatch at the first `optimizer.step()` after any resume; here
the checkpoint is loaded into a model of another dtype (float64), which fails the same way on CPU.
"""

from __future__ import annotations

import torch

from poise.config import TinyModelConfig
from poise.model.loading import build_tiny
from poise.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from poise.training.optim_state import place_state


def _model_and_optimizer(dtype: torch.dtype):
    model = build_tiny(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=32, max_positions=32), 40, seed=3).to(dtype)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model, optimizer) -> None:
    ids = torch.arange(1, 9).reshape(1, 8)
    model(input_ids=ids).logits.float().square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_loaded_optimizer_state_follows_the_parameters_dtype(tmp_path):
    model, optimizer = _model_and_optimizer(torch.float32)
    _step(model, optimizer)
    path = save_checkpoint(tmp_path, model, optimizer, TrainState(1, 1))

    other, other_opt = _model_and_optimizer(torch.float64)  # the state was not saved from this dtype
    load_checkpoint(path, other, other_opt)
    for p in other.parameters():
        state = other_opt.state[p]
        assert state["exp_avg"].dtype == p.dtype and state["exp_avg"].device == p.device
        assert state["exp_avg_sq"].dtype == p.dtype
        assert state["step"].dtype == torch.float32 and state["step"].device.type == "cpu"
    saved = dict(model.named_parameters())
    for name, p in other.named_parameters():  # the moments are the saved ones, cast
        torch.testing.assert_close(other_opt.state[p]["exp_avg"], optimizer.state[saved[name]]["exp_avg"].double())
    before = [p.detach().clone() for p in other.parameters()]
    _step(other, other_opt)  # a mismatched dtype fails inside AdamW here
    assert any(not torch.equal(a, p) for a, p in zip(before, other.parameters()))


def test_place_state_moves_to_the_meta_device_and_copies():
    param = torch.nn.Parameter(torch.zeros(3, device="meta", dtype=torch.bfloat16))
    optimizer = torch.optim.AdamW([param])
    saved = {"step": torch.tensor(2.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
    placed = place_state(optimizer, param, saved)
    # beside a bf16 parameter the moments stay fp32 (model.dtype=bfloat16 keeps fp32 optimizer state)
    assert placed["exp_avg"].device.type == "meta" and placed["exp_avg"].dtype == torch.float32
    assert placed["step"].device.type == "cpu" and placed["step"].item() == 2.0
    assert placed["step"].data_ptr() != saved["step"].data_ptr()  # never aliases the loaded tensors
