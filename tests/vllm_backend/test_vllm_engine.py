"""The vLLM backend as a RolloutEngine, on a tiny model this test makes (no Ray): streaming,
abort/resume, weights updated in place (greedy tokens = transformers' generate under the new
weights), release. One vLLM engine for the module (starting one costs ~20 s here).

Runs where vLLM is installed: `make test-vllm` (.venv-vllm)."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch

from poise.config import EngineConfig, SamplingConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.rollout.engine import EngineBusyError
from poise.rollout.vllm_engine import VllmEngine
from poise.types import Request

EOS = 2
VOCAB = 64
PROMPTS = [[1, 5 + i, 9, 11 + i, 7] for i in range(8)]


@pytest.fixture(scope="module")
def engine():
    model = build_tiny(TinyModelConfig(), VOCAB, seed=3, eos_id=EOS)
    eng = VllmEngine(model, EngineConfig(backend="vllm", num_slots=8, max_context=64),
                     SamplingConfig(temperature=1.0, max_new_tokens=24), seed=0, eos_id=EOS)
    yield eng
    if eng.occupancy.idle:
        eng.release()


def _drain(eng) -> tuple[list, list[int]]:
    """Every sample, and the engine step at which each finished (in the order they came)."""
    out, at = [], []
    while not eng.occupancy.idle:
        finished = eng.step()
        out += finished
        at += [eng.steps] * len(finished)
    return out, at


def _greedy(eng, prompt, budget, sample_id):
    eng.sampling = dataclasses.replace(eng.sampling, temperature=0.0)
    try:
        (sample,) = eng.generate([Request(sample_id, prompt, budget)])
    finally:
        eng.sampling = dataclasses.replace(eng.sampling, temperature=1.0)
    return list(sample.token_ids)


def _hf_greedy(model, prompt, budget) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=budget, do_sample=False, eos_token_id=EOS,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_samples_stream_out_as_they_finish(engine):
    budgets = [3, 6, 9, 12, 15, 18, 21, 24]
    for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets)):
        engine.submit(Request((0, i, 0), prompt, budget))
    samples, at = _drain(engine)
    assert sorted(s.sample_id for s in samples) == [(0, i, 0) for i in range(8)]
    assert len(set(at)) > 1, f"every sample came out at one engine step {at}: nothing streamed"
    for s in samples:
        assert len(s.logprobs) == len(s.token_ids) >= 1
        assert all(lp <= 0 for lp in s.logprobs)
        assert s.finish_reason in ("eos", "length")
        assert s.finish_reason == "eos" or len(s.token_ids) == s.max_new_tokens
        assert s.weights_version == 0 and s.finish_time >= s.submit_time
    assert engine.tokens_generated >= sum(len(s.token_ids) for s in samples)


def test_abort_hands_on_partials_that_resume_to_whole_samples(engine):
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.submit(Request((1, i, 0), prompt, 20))
    early = []
    for _ in range(8):  # until every running sequence holds 2 tokens (one may end early, at EOS)
        early += engine.step()
        if engine._live and min(len(r.tokens) for r in engine._live.values()) >= 2:
            break
    partials = engine.abort()
    assert engine.occupancy.idle
    assert sorted(s.sample_id for s in partials + early) == [(1, i, 0) for i in range(4)]
    assert len(partials) >= 2
    assert all(p.finish_reason == "abort" and len(p.logprobs) == len(p.token_ids) >= 2 for p in partials)
    engine.resume(partials)
    samples, _ = _drain(engine)
    by_id = {s.sample_id: s for s in samples}
    assert by_id.keys() == {p.sample_id for p in partials}
    for p in partials:
        s = by_id[p.sample_id]
        assert s.token_ids[:len(p.token_ids)] == p.token_ids and s.logprobs[:len(p.logprobs)] == p.logprobs
        assert len(s.token_ids) > len(p.token_ids) and s.submit_time == p.submit_time
        assert s.finish_reason == "eos" or len(s.token_ids) == 20


def test_greedy_continuation_after_abort_is_the_uninterrupted_one(engine):
    straight = _greedy(engine, PROMPTS[0], 16, (2, 0, 0))
    engine.sampling = dataclasses.replace(engine.sampling, temperature=0.0)
    try:
        engine.submit(Request((2, 0, 1), PROMPTS[0], 16))
        while not engine._live or not next(iter(engine._live.values())).tokens:
            engine.step()
        (partial,) = engine.abort()
        engine.resume([partial])
        (resumed,), _ = _drain(engine)
    finally:
        engine.sampling = dataclasses.replace(engine.sampling, temperature=1.0)
    assert 0 < len(partial.token_ids) < len(straight)
    assert list(resumed.token_ids) == straight


def test_new_weights_change_the_output_to_their_greedy_tokens(engine):
    model = engine.model
    before = _greedy(engine, PROMPTS[1], 12, (3, 0, 0))
    assert before == _hf_greedy(model, PROMPTS[1], 12)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(7)
        update = {name: p + 0.5 * torch.randn(p.shape, generator=gen) for name, p in model.named_parameters()}
    loads = len(engine.weight_loads)
    engine.load_weights(update.items(), 1)
    after = _greedy(engine, PROMPTS[1], 12, (3, 0, 1))
    assert len(engine.weight_loads) == loads + 1, "vLLM did not take the new weights"
    assert after == _hf_greedy(model, PROMPTS[1], 12), "vLLM's greedy tokens are not the new weights'"
    assert after != before, "the update did not change the greedy tokens: pick another perturbation"
    engine.submit(Request((3, 1, 0), PROMPTS[2], 8))
    engine.step()
    with pytest.raises(EngineBusyError):
        engine.set_weights_version(2)  # a sample in flight under version 1
    (sample,), _ = _drain(engine)
    assert sample.weights_version == 1


def test_release_ends_the_vllm_process(engine):
    me = psutil.Process()
    engine.submit(Request((4, 0, 0), PROMPTS[3], 4))
    _drain(engine)
    # multiprocessing's resource tracker serves the whole process (started once, with the first spawn)
    started = {p.pid for p in me.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())}
    assert started, "vLLM runs no process of its own"
    assert engine.cache_bytes > 0
    engine.release()
    assert engine.cache_bytes == 0
    gone, alive = psutil.wait_procs([psutil.Process(pid) for pid in started if psutil.pid_exists(pid)], timeout=30)
    assert not alive, f"vLLM processes {[(p.pid, p.cmdline()) for p in alive]} outlived release"
