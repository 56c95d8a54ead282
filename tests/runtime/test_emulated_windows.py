"""The emulated engine honours partial rollouts' windows as the real one does: a sample comes
back unfinished after its window, and one with per-token versions continues under newer weights."""

import pytest

from poise.policy.cost import CostModel
from poise.runtime.emulated import EmulatedEngine
from poise.types import Sample

LENGTHS = {0: 7, 1: 2, 2: 12}


def _fresh(i: int) -> Sample:
    return Sample((0, i, 0), (5, 6), (), (), "abort", 0, 0.0, 0.0, 16, token_versions=())


def _drain(engine) -> dict:
    out = {}
    while not engine.occupancy.idle:
        out.update((s.sample_id[1], s) for s in engine.step())
    return out


def test_windows_hand_samples_back_and_versions_accumulate():
    engine = EmulatedEngine(CostModel(), lambda sid: LENGTHS[sid[1]], 2, time_scale=0.0)
    engine.resume([_fresh(i) for i in LENGTHS], {(0, i, 0): 5 for i in LENGTHS})
    first = _drain(engine)
    assert {i: (s.finish_reason, len(s.token_ids)) for i, s in first.items()} == {
        0: ("abort", 5), 1: ("length", 2), 2: ("abort", 5)}
    assert all(s.token_versions == (0,) * len(s.token_ids) for s in first.values())
    engine.load_weights((), 1)
    engine.resume([first[0], first[2]], {(0, 2, 0): 4})  # sample 0 runs to its end, sample 2 one more window
    second = _drain(engine)
    assert (second[0].finish_reason, second[0].token_versions) == ("length", (0,) * 5 + (1,) * 2)
    assert (second[2].finish_reason, second[2].token_versions) == ("abort", (0,) * 5 + (1,) * 4)
    with pytest.raises(RuntimeError, match="tokens of weights version 1, this engine holds the older 0"):
        EmulatedEngine(CostModel(), lambda sid: 12, 2, time_scale=0.0).resume([second[2]])
