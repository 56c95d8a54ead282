"""Partial rollouts in the engine: a per-sample window hands a sample back unfinished, and a
sample carrying per-token versions continues under newer weights, its prefix's cache rebuilt
under them and its tokens and behaviour log-probs kept (docs/partial-rollouts.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from poise.rollout.engine import Engine, EngineConfig, RequestError
from poise.rollout.runner import DecoderRunner
from poise.rollout.sampling import SamplingConfig
from poise.types import Sample

from test_engine import STOCHASTIC, by_id, fake_clock, requests


def _engine(model, slots: int, version: int = 0, invariant: bool = True) -> Engine:
    return Engine(model, EngineConfig(num_slots=slots, batch_invariant=invariant), STOCHASTIC, seed=7, eos_id=None,
                  clock=fake_clock(), weights_version=version)


def _fresh(request) -> Sample:
    """A request as a partial rollout with no token yet (how the pool starts a sample)."""
    return Sample(request.sample_id, tuple(request.prompt_ids), (), (), "abort", 0, 0.0, 0.0,
                  request.max_new_tokens, token_versions=())


def _windows(engines, partials, window: int) -> tuple[list[Sample], int]:
    """Run `partials` window after window, each window on the next engine, until all finish."""
    done, windows = [], 0
    while partials:
        eng = engines[windows % len(engines)]
        eng.resume(partials, {p.sample_id: window for p in partials})
        out = list(eng.stream())
        partials = [s for s in out if s.finish_reason == "abort"]
        assert all(len(s.token_ids) % window == 0 for s in partials)  # each came back at its window's end
        done += [s for s in out if s.finish_reason != "abort"]
        windows += 1
    return done, windows


@pytest.mark.parametrize("mode", ["bitwise rows", "bitwise tiles"])
def test_windows_under_one_version_change_no_token(qwen2, mode, monkeypatch):
    if mode == "bitwise tiles":
        monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    reqs = requests(12)
    reference = by_id(_engine(qwen2, 4).generate(reqs))
    done, windows = _windows([_engine(qwen2, 7), _engine(qwen2, 3)], [_fresh(r) for r in reqs], 5)
    assert windows >= 4  # the longest budget (24 tokens) took several windows
    assert sorted(s.sample_id for s in done) == sorted(reference)
    for s in done:
        ref = reference[s.sample_id]
        assert (s.token_ids, s.logprobs) == (ref.token_ids, ref.logprobs), s.sample_id
        assert s.token_versions == (0,) * len(s.token_ids)


def _moved(model) -> torch.nn.Module:
    moved = type(model)(model.config)
    moved.load_state_dict(model.state_dict())
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return moved.eval()


def test_a_partial_continues_under_newer_weights_keeping_its_prefix(qwen2):
    reqs = [dataclasses.replace(r, max_new_tokens=16) for r in requests(8)]
    reference = by_id(_engine(qwen2, 4).generate(reqs))
    first = _engine(qwen2, 5)
    first.resume([_fresh(r) for r in reqs], {r.sample_id: 4 for r in reqs})
    partials = list(first.stream())
    assert {p.finish_reason for p in partials} == {"abort"} and {len(p.token_ids) for p in partials} == {4}
    newer = _moved(qwen2)
    runs = []
    for slots in (2, 8):  # a different batch company: the same bits
        eng = _engine(newer, slots, version=1)
        eng.resume(partials)
        runs.append(by_id(eng.stream()))
    assert runs[0].keys() == runs[1].keys() == reference.keys()
    for sid, s in runs[0].items():
        assert (s.token_ids, s.logprobs, s.token_versions) == (runs[1][sid].token_ids, runs[1][sid].logprobs,
                                                               runs[1][sid].token_versions)
        ref = reference[sid]
        assert s.token_ids[:4] == ref.token_ids[:4] and s.logprobs[:4] == ref.logprobs[:4]  # the prefix is kept
        assert s.token_versions == (0,) * 4 + (1,) * (len(s.token_ids) - 4)
        assert s.weights_version == 1
    # the continuation is the newer weights' own: some token or log-prob after the prefix differs
    assert any(runs[0][sid].logprobs[4:] != reference[sid].logprobs[4:] for sid in reference)


def test_versions_only_move_forward(qwen2):
    reqs = requests(2)
    first = _engine(qwen2, 2, version=3)
    first.resume([_fresh(r) for r in reqs], {r.sample_id: 2 for r in reqs})
    partials = list(first.stream())
    with pytest.raises(RequestError, match="weights version 3 but this engine holds the older version 2"):
        _engine(qwen2, 2, version=2).resume(partials)
    plain = [dataclasses.replace(p, token_versions=None) for p in partials]  # an abort's partial: same weights only
    with pytest.raises(RequestError, match="resume it where the weights match"):
        _engine(qwen2, 2, version=4).resume(plain)
