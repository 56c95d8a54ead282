"""Training state as strategies (poise.training.state): the mode is read once, the trainer takes a
micro-batch's gradients through an explicit consumer (never a hook set on it from outside), and
the torch layer's state package imports no Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.training.state import strategy_for
from poise.training.state.fully_sharded import FullySharded
from poise.training.state.optimizer_sharded import OptimizerSharded
from poise.training.state.replicated import Replicated
from poise.training.trainer import PolicyTrainer
from poise.types import Sample

SHAPE = TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32,
                        max_positions=32)


def _trainer(**algo) -> PolicyTrainer:
    return PolicyTrainer(build_tiny(SHAPE, 20, seed=0), AlgorithmConfig(**algo), pad_id=0)


def _samples() -> list[Sample]:
    return [Sample((0, 0, j), (3, 4, 5), (6, 7 + j, 8), (-1.0, -1.2, -0.9), "length", 0, 0.0, 0.0, 3)
            for j in range(2)]


class Recording:
    """A gradient consumer that keeps a copy of every gradient it is given, and when."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.grads: dict[int, torch.Tensor] = {}

    def begin_backward(self) -> None:
        self.events.append("begin")

    def take(self, index: int, grad: torch.Tensor) -> None:
        self.events.append("take")
        self.grads[index] = grad.detach().clone()

    def end_backward(self) -> None:
        self.events.append("end")


@pytest.mark.parametrize("mode, kind", [("none", Replicated), ("optimizer", OptimizerSharded),
                                        ("full", FullySharded)])
def test_the_mode_picks_its_strategy_once(mode, kind):
    assert type(strategy_for(mode, _trainer(), None, torch.device("cpu"), 0, True)) is kind


def test_an_unknown_mode_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"^cluster.shard='fsdp': expected one of none, optimizer, full$"):
        strategy_for("fsdp", _trainer(), None, torch.device("cpu"), 0, True)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_a_consumer_takes_every_gradient_the_flat_buffer_would_hold(checkpointing):
    """The same micro-batch twice, weights unchanged: the consumer's gradients, in parameter
    order, are the flat buffer's bits, taken between begin_backward and end_backward."""
    trainer = _trainer(gradient_checkpointing=checkpointing)
    advantages = torch.tensor([1.0, -0.5])
    flat = trainer.micro_batch_grad(0, _samples(), advantages).flat_grad
    consumer = Recording()
    result = trainer.micro_batch_grad(0, _samples(), advantages, consumer)
    assert result.flat_grad.numel() == 0  # consumed: no flat buffer is made
    assert consumer.events[0] == "begin" and consumer.events[-1] == "end"
    assert consumer.events.count("begin") == consumer.events.count("end") == 1
    assert flat.abs().sum() > 0  # the gradients are not all zero
    taken = torch.cat([consumer.grads[i].reshape(-1).float() if i in consumer.grads
                       else torch.zeros(p.numel()) for i, p in enumerate(trainer.params)])
    assert torch.equal(taken, flat)
    assert not hasattr(trainer, "grad_sink") and not hasattr(trainer, "in_backward")


def test_the_state_package_imports_no_ray():
    code = "import sys; sys.modules['ray'] = None; import poise.training.state; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
