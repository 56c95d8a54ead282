"""The decode step's cheaper host work gives exactly what the slower form gave: the same tensors
from `to_device`, the same decode bias, the same logits with ops called as functions."""

from __future__ import annotations

import pytest
import torch

from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs
from poise.rollout.transfer import to_device

CPU = torch.device("cpu")


@pytest.mark.parametrize("values", [[0, 1, 2], [7], [-3, 2**63 - 1, -2**63], [True, 2], [[1, 2], [3, 4]], [1, 2.5],
                                    [], [2**63]], ids=["ints", "one", "int64-range", "bool", "rows", "float",
                                                       "empty", "overflow"])
def test_to_device_makes_torch_tensors_values(values):
    try:
        want = torch.tensor(values, dtype=torch.int64)
    except (RuntimeError, OverflowError, ValueError) as error:  # what torch refuses, to_device refuses too
        with pytest.raises(type(error)):
            to_device(values, CPU)
        return
    got = to_device(values, CPU)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    got[...] = 0  # its own memory: writing it changes no other tensor made from the same list
    assert torch.equal(to_device(values, CPU), want)


def reference_bias(length: int, positions: torch.Tensor) -> torch.Tensor:
    """The decode bias as zeros filled with -inf beyond each row's position."""
    allowed = torch.arange(length)[None, :] <= positions[:, None]
    return torch.zeros((len(positions), 1, 1, length)).masked_fill_(~allowed[:, None, None, :], float("-inf"))


def test_decode_bias_is_zero_up_to_each_rows_position_and_minus_inf_beyond(qwen2):
    runner = DecoderRunner(qwen2)
    positions = torch.tensor([0, 5, 63, 17])
    for length in (64, 18, 200):  # 200: longer than the model's positions
        got = runner._decode_mask(length, positions)
        assert got.dtype == runner.dtype and torch.equal(got, reference_bias(length, positions))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ops_called_as_functions_give_the_modules_bits(arch, request):
    """Embedding, SiLU and the output head called as functions against the same runner calling the
    modules, over a step of decode rows and prefills (a changed bit would change every sample)."""
    model = request.getfixturevalue(arch)
    fast, modules = DecoderRunner(model), DecoderRunner(model)
    assert fast._layers[0].act is torch.nn.functional.silu  # the function is what runs
    modules._embed, modules._head = model.model.embed_tokens, model.lm_head
    for layer, module in zip(modules._layers, model.model.layers):
        layer.act = module.mlp.act_fn
    logits = []
    for runner in (fast, modules):
        cache = KVCache(runner.cache_shape(4, 64), runner.dtype, runner.device)
        runner.forward(StepInputs(prefills=[(0, [5, 6, 7]), (1, [8, 9]), (3, [10, 11, 12, 13])]), cache)
        step = StepInputs(decode_slots=[0, 1, 3], decode_tokens=[20, 21, 22], decode_positions=[3, 2, 4],
                          prefills=[(2, [14, 15, 16, 17, 18])])
        logits.append(runner.forward(step, cache))
    assert torch.equal(logits[0], logits[1])
