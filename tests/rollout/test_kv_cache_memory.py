"""The KV cache is what the run needs, held only while a device generates: built at the engine's
first step (a train device never builds one), freed by `release` (a device leaving the rollout
role), sized by the run's prompts + max_new_tokens rather than the model's whole position range,
and within `rollout.kv_cache_gb` by running fewer slots, never by changing a token.
"""

from __future__ import annotations

import os

import pytest
import torch

from poise.config import EngineConfig, ModelConfig, TinyModelConfig, load_train_config
from poise.data.prompts import fitted_context
from poise.errors import ConfigError, PoiseError
from poise.model.loading import build_tiny
from poise.rollout.engine import Engine
from poise.rollout.sampling import SamplingConfig
from poise.types import Request

from sharpened import sharpen

VOCAB = 60
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=10)
WIDE = TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=64,
                       max_positions=512)




def _requests(n: int) -> list[Request]:
    g = torch.Generator().manual_seed(4)
    return [Request((0, i, 0), torch.randint(3, VOCAB, (3 + i % 5,), generator=g).tolist()) for i in range(n)]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_cache_exists_only_while_the_engine_generates():
    model = sharpen(build_tiny(WIDE, VOCAB, seed=2), 2)
    cfg = EngineConfig(num_slots=32, max_context=512, batch_invariant=True)
    cache_bytes = model.config.num_hidden_layers * 2 * 33 * 4 * 512 * 64 * 4  # keys + values, 32 slots + scratch
    assert cache_bytes > 100 * 2**20  # big enough to see in the resident memory
    rss0 = _rss()
    engine = Engine(model, cfg, SAMPLING, seed=0, eos_id=None)
    assert engine.cache is None  # a device that never generates holds no cache
    assert _rss() - rss0 < cache_bytes // 4
    first = engine.generate(_requests(6))
    assert engine.cache is not None and engine.cache.shape.bytes(torch.float32) == cache_bytes
    held = _rss()
    engine.release()  # the device leaves the rollout role
    assert engine.cache is None and engine.cache_bytes == 0
    assert held - _rss() > cache_bytes * 3 // 4, "releasing the engine did not return the cache's memory"
    again = engine.generate(_requests(6))  # back to rollout: built again, same tokens and logprobs
    assert [(s.token_ids, s.logprobs) for s in again] == [(s.token_ids, s.logprobs) for s in first]


def test_release_refuses_while_sequences_run():
    engine = Engine(build_tiny(WIDE, VOCAB, seed=2), EngineConfig(num_slots=2, max_context=64), SAMPLING, 0, None)
    for r in _requests(2):
        engine.submit(r)
    engine.step()
    with pytest.raises(PoiseError, match="idle engine"):
        engine.release()


def test_kv_cache_gb_runs_fewer_slots_and_the_same_tokens():
    model = sharpen(build_tiny(WIDE, VOCAB, seed=2), 2)
    full = Engine(model, EngineConfig(num_slots=16, max_context=128, batch_invariant=True), SAMPLING, 0, None)
    per_slot = 2 * 4 * 4 * 128 * 64 * 4
    capped_cfg = EngineConfig(num_slots=16, max_context=128, batch_invariant=True, kv_cache_gb=6 * per_slot / 2**30)
    capped = Engine(model, capped_cfg, SAMPLING, 0, None)
    assert capped.num_slots == 5  # 6 slots' worth, one of them the scratch row
    reference = full.generate(_requests(12))
    assert capped.cache_bytes <= capped_cfg.kv_cache_gb * 2**30 + (capped.noise.table.nbytes if capped.noise else 0)
    assert [(s.token_ids, s.logprobs) for s in capped.generate(_requests(12))] == \
        [(s.token_ids, s.logprobs) for s in reference]
    assert capped.cache.shape.bytes(torch.float32) <= capped_cfg.kv_cache_gb * 2**30
    with pytest.raises(PoiseError) as e:
        Engine(model, EngineConfig(num_slots=4, max_context=128, kv_cache_gb=per_slot / 2**30), SAMPLING, 0, None)
    assert "\n" not in str(e.value) and "rollout.kv_cache_gb" in str(e.value)


def test_the_context_is_the_runs_need_not_the_models_maximum():
    tiny = ModelConfig(tiny=TinyModelConfig(max_positions=32768))  # a Qwen2.5-sized position range
    assert fitted_context(tiny, 0, longest_prompt=40, max_new_tokens=80) == 128
    assert fitted_context(tiny, 0, longest_prompt=10, max_new_tokens=20) == 64  # the smallest key bucket
    assert fitted_context(tiny, 0, longest_prompt=30000, max_new_tokens=4000) == 32768  # the model's limit
    assert fitted_context(tiny, 300, longest_prompt=40, max_new_tokens=80) == 300  # rollout.max_context wins


def test_the_colocated_loop_sizes_its_engine_by_the_prompts(tmp_path):
    from poise.training.colocated import ColocatedLoop

    cfg = load_train_config(None, ["pipeline.mode=colocated", "run.progress=false", f"run.dir={tmp_path}",
                                   "algorithm.sampling.max_new_tokens=12", "model.tiny.max_positions=1024"])
    loop = ColocatedLoop(cfg, tmp_path)
    try:
        longest = loop.steps.longest_prompt()
        assert longest + 12 <= loop.engine.context < 1024 and loop.engine.context == fitted_context(
            cfg.model, 0, longest, 12)
    finally:
        loop.steps.rewards.close()


@pytest.mark.parametrize("value", [-1, float("inf")])
def test_kv_cache_gb_is_validated(value):
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        load_train_config(None, [f"rollout.kv_cache_gb={value}"])
