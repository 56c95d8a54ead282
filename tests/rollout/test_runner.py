"""The runner's forward equals the HF model's in every attention layout it chooses."""

from __future__ import annotations

import pytest
import torch

from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs, _Norm, plan_decode_groups


def hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("live", [(0, 1, 2, 3), (0, 1, 3), (3,), (1, 2)], ids=["all", "hole", "one", "middle"])
def test_prefill_then_decode_matches_hf(arch, live, request):
    model = request.getfixturevalue(arch)
    runner = DecoderRunner(model)
    cache = KVCache(runner.cache_shape(4, 64), runner.dtype, runner.device)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16, 17, 18, 19]]
    logits = runner.forward(StepInputs(prefills=list(enumerate(prompts))), cache)  # 4 prompts: one by one
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


def test_plan_cuts_a_long_tail_into_length_groups():
    # 2 long rows (positions 200, 190) beside 8 short ones (~20): one cut, longest group first
    slots, positions = list(range(10)), [20, 200, 18, 22, 190, 19, 21, 17, 20, 16]
    plans = plan_decode_groups(slots, positions, overhead=512)
    assert [(p.rows, p.length) for p in plans] == [((1, 4), 201), ((0, 2, 3, 5, 6, 7, 8, 9), 23)]
    assert plans[0].gather and not plans[1].gather  # slots 1, 4 lie apart; 0-9 minus them idles 1/5
    # the same rows in lockstep (what a static batch does): nothing to save, one view
    (plan,) = plan_decode_groups(slots, [50] * 10, overhead=512)
    assert plan.rows == tuple(range(10)) and plan.length == 51 and (plan.lo, plan.hi, plan.gather) == (0, 10, False)
    # a cut must save more than the overhead, and there are at most max_groups groups
    assert len(plan_decode_groups(slots, positions, overhead=2000)) == 1
    assert len(plan_decode_groups(slots, list(range(0, 100, 10)), overhead=0, max_groups=3)) == 3


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ragged_decode_groups_match_hf(arch, request):
    """Every group layout (views with and without idle slots, gathers) gives HF's logits."""
    model = request.getfixturevalue(arch)
    runner = DecoderRunner(model)
    runner.group_overhead = 0  # cut wherever it saves anything
    cache = KVCache(runner.cache_shape(8, 64), runner.dtype, runner.device)
    g = torch.Generator().manual_seed(0)
    lengths = [28, 39, 45, 36, 41, 34, 4, 23]
    prompts = [torch.randint(3, 60, (n,), generator=g).tolist() for n in lengths]
    logits = runner.forward(StepInputs(prefills=list(enumerate(prompts))), cache)  # 8 prompts: padded into one batch
    for slot, p in enumerate(prompts):
        assert torch.allclose(logits[slot], hf_last_logits(model, p), atol=1e-4)
    live = [0, 1, 2, 4, 5, 6, 7]  # slot 3 idles
    step = StepInputs(decode_slots=live, decode_tokens=[20 + s for s in live],
                      decode_positions=[lengths[s] for s in live])
    plans = plan_decode_groups(live, step.decode_positions, 0, runner.max_decode_groups)
    # slots 1, 2, 4, 5: a view with slot 3 idle inside; 0 and 7: a gather; 6: a view
    assert [([live[r] for r in p.rows], p.gather) for p in plans] == [([1, 2, 4, 5], False), ([0, 7], True),
                                                                       ([6], False)]
    logits = runner.forward(step, cache)
    for row, slot in enumerate(live):
        assert torch.allclose(logits[row], hf_last_logits(model, prompts[slot] + [20 + slot]), atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_runners_fused_norms_and_rope_table_are_hfs_math_bit_for_bit(arch, request):
    """The runner calls F.rms_norm and looks RoPE up in a table made once; both must give exactly
    the bits of the HF modules they replace, whatever the rows (a last-bit drift here would change
    every sample against an unpatched engine and against the trainer's forward)."""
    model = request.getfixturevalue(arch)
    runner = DecoderRunner(model)
    assert runner.fused_norm and runner.rope_table is not None
    g = torch.Generator().manual_seed(3)
    norms = [model.model.layers[0].input_layernorm, model.model.layers[1].post_attention_layernorm, model.model.norm]
    with torch.inference_mode():
        for rows in (1, 3, 4, 37):
            x = torch.randn((rows, model.config.hidden_size), generator=g) * 3
            for norm in norms:
                assert torch.equal(runner._norm(_Norm(norm), x), norm(x))
        positions = torch.tensor([0, 1, 5, 17, 63, 64, 95, 2, 2])
        cos, folded = runner._rope(torch.zeros(()), positions)
        hf_cos, hf_sin = model.model.rotary_emb(torch.zeros(()), positions[None])
        assert torch.equal(cos[:, 0], hf_cos[0])
        q = torch.randn((len(positions), 4, runner.head_dim), generator=g)
        half = runner.head_dim // 2
        hf_rotated = q * hf_cos[0, :, None] + torch.cat((-q[..., half:], q[..., :half]), -1) * hf_sin[0, :, None]
        assert torch.equal(q * cos + q.roll(half, -1) * folded, hf_rotated)
