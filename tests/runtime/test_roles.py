"""EngineLoop: the engine generates on its own thread; the actor only hands work in and out."""

import time

import pytest

from poise.policy.cost import CostModel
from poise.runtime.emulated import EmulatedEngine
from poise.runtime.roles import EngineLoop
from poise.types import Request


def _engine(lengths: dict, slots: int = 4) -> EmulatedEngine:
    return EmulatedEngine(CostModel(), lambda sid: lengths[sid], slots, time_scale=1e-3)


def _drain(loop: EngineLoop, timeout: float = 5.0) -> tuple[list, list]:
    got, batches, deadline = [], [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples, in_flight, _busy = loop.take(0.5)
        if samples:
            batches.append(len(samples))
        got += samples
        if in_flight == 0:
            return got, batches
    raise AssertionError(f"engine loop still busy after {timeout} s; got {len(got)} samples")


def test_every_request_comes_back_once_under_the_cap():
    lengths = {(0, i, j): 5 + 37 * i + j for i in range(6) for j in range(3)}
    engine = _engine(lengths, slots=8)
    peak = []
    step = engine.step

    def watched_step():  # the cap holds inside the engine itself
        peak.append(engine.occupancy.running + engine.occupancy.queued)
        return step()

    engine.step = watched_step
    loop = EngineLoop(engine)
    loop.submit([Request(sid, (1, 2, 3)) for sid in lengths], cap=3)
    got, _ = _drain(loop)
    loop.close()
    assert sorted(s.sample_id for s in got) == sorted(lengths)
    assert [len(s.token_ids) for s in got] == sorted(len(s.token_ids) for s in got)  # shortest first, 3 at a time
    assert max(peak) == 3


def test_wait_idle_returns_once_every_request_is_out():
    """What a train device that generated (pipeline.assist) waits for before its update."""
    lengths = {(0, 0, j): 40 + 20 * j for j in range(4)}
    loop = EngineLoop(_engine(lengths, slots=2))
    loop.submit([Request(sid, (1, 2)) for sid in lengths], cap=2)
    loop.wait_idle()
    samples, in_flight, _busy = loop.take(0.0)
    loop.close()
    assert in_flight == 0 and sorted(s.sample_id for s in samples) == sorted(lengths)


def test_generation_goes_on_while_nobody_takes():
    lengths = {(0, 0, j): 10 for j in range(4)} | {(0, 1, j): 200 for j in range(4)}
    loop = EngineLoop(_engine(lengths, slots=8))
    loop.submit([Request(sid, (1,)) for sid in lengths], cap=8)
    time.sleep(1.0)  # the driver is away; the engine keeps decoding
    samples, in_flight, busy = loop.take(0.0)
    loop.close()
    assert len(samples) == 8 and in_flight == 0  # all finished without a single take
    assert len(busy) == 1 and busy[0][1] > busy[0][0]


def test_an_engine_error_reaches_the_caller_instead_of_a_hang():
    loop = EngineLoop(_engine({}, slots=2))  # no length known: the engine raises on submit
    loop.submit([Request((0, 0, 0), (1,))], cap=2)
    with pytest.raises(RuntimeError, match="rollout engine loop failed"):
        for _ in range(10):
            loop.take(0.5)
    loop.close()


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.001)


def test_abort_mid_generation_hands_every_sequence_on_exactly_once():
    """A live resize takes a rollout device while >= 3 sequences run on it: the abort takes effect
    within one engine step (the loop lets a waiting caller in between two steps, however fast the
    steps come), and its finished samples, partials and unstarted requests continue on another
    loop; every id ends once, at full length, and a partial keeps the tokens it had."""
    lengths = {(0, i, j): 40 + 13 * i + 5 * j for i in range(4) for j in range(4)}
    first = EngineLoop(EmulatedEngine(CostModel(), lengths.__getitem__, 8, time_scale=1.0))
    first.submit([Request(sid, (1, 2, 3)) for sid in lengths], cap=6)
    # mid-generation by engine progress, not by a wall-clock sleep: one step done, >= 3 running
    _wait_for(lambda: first.steps >= 1 and first.engine.occupancy.running >= 3)
    before = first.steps
    finished, partials, pending = first.abort()
    assert first.steps - before <= 1, f"abort waited {first.steps - before} engine steps"
    assert first.take(0.0)[1] == 0  # nothing left in flight on the device that left
    first.close()
    assert len(partials) >= 3 and any(p.token_ids for p in partials), (len(partials), len(pending))
    assert {p.finish_reason for p in partials} == {"abort"}
    had = {p.sample_id: len(p.token_ids) for p in partials}

    second = EngineLoop(EmulatedEngine(CostModel(), lengths.__getitem__, 8, time_scale=1e-3))
    second.resume(partials, pending, cap=8)
    got, _ = _drain(second)
    second.close()
    ids = [s.sample_id for s in finished + got]
    assert sorted(ids) == sorted(lengths)  # nothing lost, nothing twice
    for s in finished + got:
        assert len(s.token_ids) == lengths[s.sample_id]
    assert all(0 <= n < lengths[sid] for sid, n in had.items())


def test_a_waiting_caller_gets_the_engine_between_two_fast_steps():
    """The loop re-takes the engine lock at once after a step; a caller waiting for the engine
    (abort, a weight load, a checkpoint) must still get it before the next step, not after the
    generation ends (a plain lock lets the loop's thread win again and again on a fast CPU)."""
    lengths = {(0, 0, j): 1 + j for j in range(20000)}  # one finish a step, no sleep: many short steps
    loop = EngineLoop(EmulatedEngine(CostModel(), lengths.__getitem__, 4, time_scale=0.0))
    loop.submit([Request(sid, (1,)) for sid in lengths], cap=4)
    _wait_for(lambda: loop.steps >= 1)
    waits = []
    for _ in range(20):
        before = loop.steps
        loop.with_engine(lambda engine: None)
        waits.append(loop.steps - before)
    finished, partials, pending = loop.abort()
    loop.close()
    assert pending and partials, "the generation ended before the checks: make the steps more"
    assert max(waits) <= 1, waits


def test_linger_carries_samples_that_finish_close_together_in_one_reply():
    """`take(timeout, linger)`: the first finished sample waits up to `linger` for the ones right
    behind it; without linger, a take returns as soon as one is in. The last sample never waits."""
    lengths = {(0, 0, j): 20 + 40 * j for j in range(4)}  # each finishing 40 engine steps after the last
    for linger, expect_one_reply in ((0.0, False), (30.0, True)):
        loop = EngineLoop(EmulatedEngine(CostModel(), lengths.__getitem__, 4, time_scale=0.05))
        loop.submit([Request(sid, (1, 2)) for sid in lengths], cap=4)
        t = time.monotonic()
        samples, in_flight, _busy = loop.take(30.0, linger)
        waited = time.monotonic() - t
        rest, _ = _drain(loop)
        loop.close()
        assert sorted(s.sample_id for s in samples + rest) == sorted(lengths)
        if expect_one_reply:  # everything in one reply, as soon as the last one finished
            assert len(samples) == 4 and in_flight == 0 and waited < 10.0, (len(samples), waited)
        else:
            assert len(samples) < 4 and in_flight > 0, len(samples)
