"""The rollout engine on a CUDA device: HF equivalence and bitwise batch invariance.

Skipped (with the reason) where torch sees no CUDA device; benchmarks/gpu_check.sh runs them on a
GPU machine. On CUDA batch_invariant uses fixed-shape tiles (cuBLAS picks kernels by the number
of rows, so the runner finds no row quantum).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from poise.rollout.engine import Engine, EngineConfig
from poise.rollout.sampling import SamplingConfig
from poise.types import Request

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (benchmarks/gpu_check.sh runs these on a GPU machine)"),
]

VOCAB = 60
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
STOCHASTIC = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=24)


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(2, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_greedy_equals_hf_generate_on_cuda(qwen2):
    model = qwen2.to("cuda")
    ps = prompts(7, seed=3)
    samples = Engine(model, EngineConfig(num_slots=3), GREEDY, seed=0, eos_id=2).generate(
        [Request((0, i, 0), p) for i, p in enumerate(ps)])
    distinct = set()
    for sample, p in zip(samples, ps):
        with torch.inference_mode():
            out = model.generate(torch.tensor([p], device="cuda"), do_sample=False, eos_token_id=2, pad_token_id=0,
                                 attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
                                 max_new_tokens=GREEDY.max_new_tokens)
        expected = out[0, len(p):].tolist()
        assert list(sample.token_ids) == expected, f"prompt {p}"
        distinct.add(tuple(expected))
    assert len(distinct) > 1  # not a comparison of degenerate outputs


def test_batch_invariant_bitwise_on_cuda(qwen2):
    model = qwen2.to("cuda")
    reqs = [Request((0, i, i % 3), p, 4 + i % 20) for i, p in enumerate(prompts(24, seed=5))]
    others = [Request((1, i, 0), p, 16) for i, p in enumerate(prompts(12, seed=6))]

    def run(slots: int, batch: list[Request]) -> dict:
        eng = Engine(model, EngineConfig(num_slots=slots, batch_invariant=True, invariant_tile=4), STOCHASTIC,
                     seed=7, eos_id=None)
        assert eng.row_quantum == 0  # tiles on CUDA
        return {s.sample_id: (s.token_ids, s.logprobs) for s in eng.generate(batch)}

    alone = run(1, reqs)
    assert run(7, reqs) == alone
    crowded = run(32, others + reqs[::-1])  # other slots, reversed order, other company
    assert {sid: crowded[sid] for sid in alone} == alone


def test_tiles_spanning_key_buckets_stay_bitwise_on_cuda(qwen2):
    """Responses that run to the end of the 96-position context: a tile's rows fall in the key
    buckets 64 and 96, and attend in one call per bucket; still the same bytes in any company."""
    model = qwen2.to("cuda")
    reqs = [Request((2, i, 0), p, 90) for i, p in enumerate(prompts(10, seed=8))]

    def run(slots: int, batch: list[Request]) -> dict:
        eng = Engine(model, EngineConfig(num_slots=slots, batch_invariant=True, invariant_tile=4), STOCHASTIC,
                     seed=7, eos_id=None)
        return {s.sample_id: (s.token_ids, s.logprobs) for s in eng.generate(batch)}

    alone = run(1, reqs)
    assert max(len(tokens) for tokens, _ in alone.values()) > 64
    assert run(7, reqs[::-1]) == alone


@pytest.mark.parametrize("invariant", [False, True], ids=["fast", "bitwise tiles"])
def test_a_decode_step_syncs_the_host_at_most_once_on_cuda(qwen2, invariant):
    """rollout/transfer.py: a step's index copies to the GPU queue without waiting; the one sync
    left is the read of the sampled tokens (torch's sync debug mode warns at each sync)."""
    model = qwen2.to("cuda")
    eng = Engine(model, EngineConfig(num_slots=4, batch_invariant=invariant, invariant_tile=4), STOCHASTIC,
                 seed=7, eos_id=None)
    for i, p in enumerate(prompts(8, seed=5)):
        eng.submit(Request((0, i, 0), p))
    eng.step()  # the cache, the noise table and the pinned-memory cache are made here
    torch.cuda.synchronize()
    steps = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            while not eng.occupancy.idle:
                eng.step()
                steps += 1
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert steps > 10 and len(syncs) <= steps, [str(w.message) for w in syncs[:3]]
