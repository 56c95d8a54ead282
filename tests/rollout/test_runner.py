"""The runner's forward equals the HF model's in every attention layout it chooses."""

from __future__ import annotations

import pytest
import torch

from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs


def hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("live", [(0, 1, 2, 3), (0, 1, 3), (3,), (1, 2)], ids=["dense", "scatter", "gather", "gather2"])
def test_prefill_then_decode_matches_hf(arch, live, request):
    model = request.getfixturevalue(arch)
    runner = DecoderRunner(model)
    cache = KVCache(runner.cache_shape(4, 64), runner.dtype, runner.device)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16, 17, 18, 19]]
    logits = runner.forward(StepInputs(prefills=list(enumerate(prompts))), cache)  # padded multi-prompt prefill
    for row, p in enumerate(prompts):
        assert torch.allclose(logits[row], hf_last_logits(model, p), atol=1e-4)
    nxt = {slot: 20 + slot for slot in live}
    step = StepInputs(decode_slots=list(live), decode_tokens=[nxt[s] for s in live],
                      decode_positions=[len(prompts[s]) for s in live], attend_lo=0, attend_hi=4,
                      attend_len=max(len(prompts[s]) for s in live) + 1)
    logits = runner.forward(step, cache)
    assert logits.shape[0] == len(live)
    for row, slot in enumerate(live):
        assert torch.allclose(logits[row], hf_last_logits(model, prompts[slot] + [nxt[slot]]), atol=1e-4)


def test_fixed_shape_keeps_one_row_per_slot_and_leaves_idle_slots_alone(qwen2):
    runner = DecoderRunner(qwen2)
    cache = KVCache(runner.cache_shape(4, 32), runner.dtype, runner.device)
    runner.forward(StepInputs(prefills=[(0, [5, 6]), (2, [7, 8, 9])]), cache)
    before = [k.clone() for k in cache.keys]
    step = StepInputs(decode_slots=[2], decode_tokens=[10], decode_positions=[3], attend_lo=0, attend_hi=4,
                      attend_len=32, fixed_shape=True)
    logits = runner.forward(step, cache)
    assert logits.shape[0] == 4
    assert torch.allclose(logits[2], hf_last_logits(qwen2, [7, 8, 9, 10]), atol=1e-4)
    for layer, k in enumerate(cache.keys):  # padding rows wrote to the scratch row only
        assert torch.equal(k[:2], before[layer][:2]) and torch.equal(k[2, :, :3], before[layer][2, :, :3])
