"""The rollout engine: HF equivalence, streaming, invariance, migration, weights, bad input."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from poise.data.tokenizer import CharTokenizer
from poise.errors import PoiseError
from poise.rollout import engine as engine_module
from poise.rollout import weights as weights_module
from poise.rollout.engine import Engine, EngineBusyError, EngineConfig, RequestError, WeightsError
from poise.rollout.occupancy import Occupancy
from poise.rollout.runner import DecoderRunner, key_bucket
from poise.rollout.sampling import NoiseTable, SamplingConfig
from poise.types import Request

VOCAB = 60  # tests/rollout/conftest.py builds the tiny models with the char tokenizer's vocabulary

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
STOCHASTIC = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=24)


def prompts(n: int, seed: int = 0, low: int = 2, high: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def requests(n: int, seed: int = 0, step: int = 0) -> list[Request]:
    """n requests with varied prompt lengths and token budgets 1..24."""
    g = torch.Generator().manual_seed(seed + 1000)
    return [Request((step, i, i % 3), p, int(torch.randint(1, 25, (1,), generator=g)))
            for i, p in enumerate(prompts(n, seed))]


def fake_clock():
    counter = itertools.count()
    return lambda: float(next(counter))


def engine(model, sampling=STOCHASTIC, seed=7, eos_id=None, **cfg) -> Engine:
    return Engine(model, EngineConfig(**cfg), sampling, seed=seed, eos_id=eos_id, clock=fake_clock())


def by_id(samples):
    return {s.sample_id: s for s in samples}


# ---- HF equivalence ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equals_hf_generate_token_for_token(arch, request):
    model = request.getfixturevalue(arch)
    ps = prompts(7, seed=3)
    # 3 slots for 7 prompts: slots are reused and prefills mix into running decode steps
    eng = engine(model, GREEDY, num_slots=3, eos_id=2)
    samples = eng.generate([Request((0, i, 0), p) for i, p in enumerate(ps)])
    distinct = set()
    for sample, p in zip(samples, ps):
        with torch.inference_mode():
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=GREEDY.max_new_tokens, eos_token_id=2,
                                 pad_token_id=0)
        expected = out[0, len(p):].tolist()
        assert list(sample.token_ids) == expected, f"prompt {p}"
        assert sample.finish_reason == ("eos" if expected[-1] == 2 else "length")
        distinct.add(tuple(expected))
    assert len(distinct) > 1  # the comparison is not between degenerate outputs


def test_greedy_logprobs_match_hf_scores(qwen2):
    p = prompts(1, seed=4)[0]
    sample = engine(qwen2, GREEDY, num_slots=2).generate([Request((0, 0, 0), p, 8)])[0]
    with torch.inference_mode():
        logits = qwen2(torch.tensor([p + list(sample.token_ids)])).logits[0, len(p) - 1:-1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sample.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)


# ---- streaming ------------------------------------------------------------------------------------


def test_samples_stream_out_as_they_finish(qwen2):
    seen = []
    eng = Engine(qwen2, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=None, clock=fake_clock(),
                 on_sample=seen.append, weights_version=5)
    eng.submit(Request((1, 0, 0), [5, 6, 7], 12))
    eng.submit(Request((1, 1, 0), [8, 9], 2))
    eng.submit(Request((1, 2, 0), [10], 3))  # queued until a slot frees
    first = eng.step()
    assert first == [] and eng.occupancy == Occupancy(running=2, queued=1)
    second = eng.step()
    assert [s.sample_id for s in second] == [(1, 1, 0)]  # the short one leaves after 2 tokens
    assert seen == second
    rest = list(eng.stream())
    assert [s.sample_id for s in rest] == [(1, 2, 0), (1, 0, 0)]  # the queued one took the freed slot
    assert eng.occupancy.idle and [s.sample_id for s in seen] == [(1, 1, 0), (1, 2, 0), (1, 0, 0)]
    for s in seen:
        assert s.finish_reason == "length" and len(s.token_ids) == len(s.logprobs) == s.max_new_tokens
        assert s.weights_version == 5 and s.finish_time > s.submit_time
        assert all(lp <= 0 for lp in s.logprobs)


def test_generate_returns_every_sample_sorted_by_id(qwen2):
    reqs = requests(12)
    samples = engine(qwen2, num_slots=4).generate(reversed(reqs))
    assert [s.sample_id for s in samples] == sorted(r.sample_id for r in reqs)
    assert [len(s.token_ids) for s in samples] == [r.max_new_tokens for r in sorted(reqs, key=lambda r: r.sample_id)]


def test_eos_ends_a_sample_and_frees_its_slot(qwen2):
    p = [4, 5, 6]
    free_run = engine(qwen2, GREEDY, num_slots=1).generate([Request((0, 0, 0), p, 10)])[0]
    eos = free_run.token_ids[3]
    stop_at = free_run.token_ids.index(eos)
    samples = engine(qwen2, GREEDY, num_slots=1, eos_id=eos).generate(
        [Request((0, 0, 0), p, 10), Request((0, 1, 0), p, 10)])
    for s in samples:
        assert s.finish_reason == "eos" and s.token_ids == free_run.token_ids[:stop_at + 1]


def test_stop_string_ends_a_sample(qwen2):
    tok = CharTokenizer()
    p = tok.encode("sort 3 1 2\n")
    free_run = engine(qwen2, GREEDY, num_slots=2).generate([Request((0, 0, 0), p, 20)])[0]
    text = tok.decode(list(free_run.token_ids))
    stop = text[5:7]
    assert len(stop) == 2
    eng = Engine(qwen2, EngineConfig(num_slots=2, stop_strings=(stop,)), GREEDY, seed=7, eos_id=None,
                 tokenizer=tok)
    sample = eng.generate([Request((0, 0, 0), p, 20)])[0]
    first = next(k for k in range(1, 21) if stop in tok.decode(list(free_run.token_ids[:k])))
    assert sample.finish_reason == "stop" and sample.token_ids == free_run.token_ids[:first]
    assert tok.decode(list(sample.token_ids)).endswith(stop)


def test_a_response_stops_at_the_context(qwen2):
    eng = engine(qwen2, GREEDY, num_slots=2, max_context=32)
    sample = eng.generate([Request((0, 0, 0), list(range(3, 23)), 50)])[0]
    assert sample.finish_reason == "length" and len(sample.token_ids) == 32 - 20


# ---- invariance -----------------------------------------------------------------------------------


def _run(model, reqs, slots, invariant=True, threads=1):
    torch.set_num_threads(threads)
    return by_id(engine(model, num_slots=slots, batch_invariant=invariant).generate(reqs))


@pytest.fixture(params=["rows", "tiles"])
def mechanism(request, monkeypatch):
    """batch_invariant's two mechanisms: row quantum + key buckets (CPU), fixed-shape tiles (CUDA's
    fallback, forced here by a runner that finds no row quantum)."""
    if request.param == "tiles":
        monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    return request.param


def test_batch_invariant_rows_run_one_forward_per_step(qwen2):
    eng = engine(qwen2, num_slots=7, batch_invariant=True)
    assert eng.row_quantum > 0  # this CPU's BLAS has one (MKL's sgemm, AVX2: 4); else tiles
    forwards = []
    forward = eng.runner.forward
    eng.runner.forward = lambda step, cache: (forwards.append(step), forward(step, cache))[1]
    eng.generate(requests(20))
    assert len(forwards) == eng.steps  # not one per tile and one per admission, as the tiles run
    assert all(step.row_quantum == eng.row_quantum for step in forwards)
    assert any(len(step.prefills) > 1 and step.decode_slots for step in forwards)  # admissions ride along


def test_key_buckets_are_a_function_of_the_position_alone():
    buckets = [key_bucket(p, 1000) for p in range(1000)]
    assert all(b > p for p, b in enumerate(buckets))  # every row sees its own keys
    assert sorted(set(buckets)) == [64, 128, 256, 512, 1000]  # few buckets: few attention calls
    assert buckets == sorted(buckets) and key_bucket(40, 64) == 64


def test_batch_invariant_tokens_and_logprobs_under_batch_size_slot_order_and_company(qwen2, mechanism):
    reqs = requests(40)
    reference = _run(qwen2, reqs, 1)
    runs = {
        "7 slots": _run(qwen2, reqs, 7),
        "32 slots": _run(qwen2, reqs, 32),
        "32 slots, reversed order": _run(qwen2, reqs[::-1], 32),
        "7 slots, other company": _run(qwen2, requests(30, seed=9, step=1) + reqs[::3], 7),
    }
    for name, run in runs.items():
        for sid, sample in run.items():
            if sid in reference:
                assert sample.token_ids == reference[sid].token_ids, f"{name}: {sid}"
                assert sample.logprobs == reference[sid].logprobs, f"{name}: {sid}"


def test_tiles_attend_over_each_rows_key_bucket_not_the_whole_context(qwen2, monkeypatch):
    """The fixed-shape tiles (CUDA's fallback, forced) attend over the positions in use, bucketed
    by position (context 96: buckets 64 and 96), and tiles whose rows span both buckets keep
    tokens and logprobs bit-identical under batch size, slot order and company."""
    monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    sampling = dataclasses.replace(STOCHASTIC, max_new_tokens=80)  # most run to the context's end
    reqs = [Request((0, i, 0), p) for i, p in enumerate(prompts(12, seed=5, low=2, high=40))]
    other = [Request((1, i, 1), p) for i, p in enumerate(prompts(12, seed=6, low=2, high=40))]
    keys_read = []
    attend = DecoderRunner._attend
    monkeypatch.setattr(DecoderRunner, "_attend",
                        lambda self, q, k, v, m: (keys_read.append(k.shape[2]), attend(self, q, k, v, m))[1])

    def run(requests, slots):
        eng = engine(qwen2, sampling, num_slots=slots, batch_invariant=True, invariant_tile=4)
        assert eng.row_quantum == 0 and eng.context == 96
        return by_id(eng.generate(requests))

    reference = run(reqs, 1)
    assert set(keys_read) == {64, 96} and keys_read.count(64) > keys_read.count(96)  # not the context every step
    assert max(len(p.prompt_ids) + len(s.token_ids) for p, s in zip(reqs, reference.values())) > 90
    for name, got in {"8 slots": run(reqs, 8), "12 slots, reversed": run(reqs[::-1], 12),
                      "6 slots, other company": run(other[:7] + reqs[::2] + other[7:], 6)}.items():
        for sid, sample in got.items():
            if sid in reference:
                assert (sample.token_ids, sample.logprobs) == (reference[sid].token_ids, reference[sid].logprobs), \
                    f"{name}: {sid}"


def test_fast_mode_tokens_do_not_depend_on_the_batch(qwen2):
    reqs = requests(30)
    one, many = _run(qwen2, reqs, 1, invariant=False), _run(qwen2, reqs[::-1], 16, invariant=False)
    assert {sid: s.token_ids for sid, s in one.items()} == {sid: s.token_ids for sid, s in many.items()}
    for sid, s in one.items():  # logprobs agree to float noise (bitwise needs batch_invariant)
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(many[sid].logprobs), atol=1e-5)


def test_batch_invariance_with_two_threads(qwen2):
    # bitwise holds at a fixed thread count per device (docs/design.md invariant 1), here two: threaded
    # kernels must not make a row depend on its batch. Across thread counts MKL may split a
    # reduction differently (seen on an AMD EPYC host), which no invariant promises.
    reqs = requests(10)
    reference = _run(qwen2, reqs, 1, threads=2)
    two = _run(qwen2, reqs[::-1], 8, threads=2)
    assert {sid: (s.token_ids, s.logprobs) for sid, s in two.items()} == \
           {sid: (s.token_ids, s.logprobs) for sid, s in reference.items()}


def test_sampling_seed_changes_tokens(qwen2):
    reqs = requests(8)
    a = by_id(engine(qwen2, num_slots=4, seed=1).generate(reqs))
    b = by_id(engine(qwen2, num_slots=4, seed=2).generate(reqs))
    assert any(a[sid].token_ids != b[sid].token_ids for sid in a)


@pytest.mark.parametrize("mode", ["bitwise rows", "bitwise tiles", "fast"])
def test_the_noise_table_changes_no_token(qwen2, mode, monkeypatch):
    """Gumbel noise made a few positions ahead (rollout/sampling.py NoiseTable) must sample what
    per-step noise samples: long responses cross many refills, and 20 requests on 6 slots reuse
    slots."""
    invariant = mode != "fast"
    if mode == "bitwise tiles":
        monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    sampling = dataclasses.replace(STOCHASTIC, max_new_tokens=60)
    reqs = [dataclasses.replace(r, max_new_tokens=None) for r in requests(20)]
    per_step = engine(qwen2, sampling, num_slots=6, batch_invariant=invariant)
    per_step.noise = None
    reference = by_id(per_step.generate(reqs))
    ahead = engine(qwen2, sampling, num_slots=6, batch_invariant=invariant)
    rows = ahead.noise.table.shape[0]
    ahead.noise = NoiseTable(rows, 5, VOCAB, torch.device("cpu"))  # a short span: a refill every 5 tokens
    run = by_id(ahead.generate(reqs))
    assert max(len(s.token_ids) for s in run.values()) > 20  # many refills per sequence
    assert ahead.noise.refilled >= sum(len(s.token_ids) for s in run.values()) // 5
    assert {sid: (s.token_ids, s.logprobs) for sid, s in run.items()} == \
           {sid: (s.token_ids, s.logprobs) for sid, s in reference.items()}


@pytest.mark.parametrize("mode", ["bitwise rows", "bitwise tiles", "fast"])
def test_a_step_reads_the_device_once_and_copies_to_it_without_waiting(qwen2, mode, monkeypatch):
    """On a GPU every read of a device tensor, and every `torch.tensor(..., device=...)` (a copy
    from pageable memory, which torch waits for), stalls the host behind the queued kernels. A
    decode step reads its sampled tokens and logprobs once, and makes its index copies with
    rollout/transfer.py (pinned, non-blocking). Counted here on the CPU, where the same calls run."""
    invariant = mode != "fast"
    if mode == "bitwise tiles":
        monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    eng = engine(qwen2, num_slots=6, batch_invariant=invariant)
    for r in requests(20):
        eng.submit(r)
    reads, waited = [], []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _o=original, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])
    tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: (k.get("device") is None or waited.append(k["device"]),
                                                          tensor(*a, **k))[1])
    steps = 0
    while not eng.occupancy.idle:
        eng.step()
        steps += 1
    monkeypatch.undo()
    assert steps > 20
    assert reads == ["tolist"] * steps  # one read a step
    assert waited == []  # no waiting copy to the device


# ---- migration ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bitwise rows", "bitwise tiles", "fast"])
def test_abort_and_resume_on_another_engine_equals_the_uninterrupted_run(qwen2, mode, monkeypatch):
    invariant = mode != "fast"
    if mode == "bitwise tiles":
        monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)
    reqs = requests(24)
    reference = _run(qwen2, reqs, 4, invariant)
    first = engine(qwen2, num_slots=7, batch_invariant=invariant)
    for r in reqs:
        first.submit(r)
    done = []
    for _ in range(6):
        done += first.step()
    partials = first.abort()
    assert first.occupancy.idle and {p.finish_reason for p in partials} == {"abort"}
    assert any(p.token_ids for p in partials) and any(not p.token_ids for p in partials)  # running and queued
    assert len(done) + len(partials) == len(reqs)

    second = engine(qwen2, num_slots=32, batch_invariant=invariant)
    second.resume(partials[::2])
    for _ in range(2):  # abort again, in the middle of a batch_invariant replay
        done += second.step()
    again = second.abort()
    third = engine(qwen2, num_slots=3, batch_invariant=invariant)
    third.resume(again + partials[1::2])
    done += list(third.stream())

    assert sorted(s.sample_id for s in done) == sorted(reference)  # nothing lost, nothing twice
    for sample in done:
        ref = reference[sample.sample_id]
        assert sample.token_ids == ref.token_ids, sample.sample_id
        if invariant:
            assert sample.logprobs == ref.logprobs, sample.sample_id
    assert second.replay_mismatches == third.replay_mismatches == 0


def test_abort_selected_ids_keeps_the_rest_running(qwen2):
    reqs = requests(6)
    eng = engine(qwen2, num_slots=4)
    for r in reqs:
        eng.submit(r)
    eng.step()
    partials = eng.abort([reqs[0].sample_id, reqs[5].sample_id])
    assert [p.sample_id for p in partials] == [reqs[0].sample_id, reqs[5].sample_id]
    rest = list(eng.stream())
    assert sorted(s.sample_id for s in rest) == sorted(r.sample_id for r in reqs[1:5])
    with pytest.raises(PoiseError, match=r"\(0, 0, 0\)"):
        eng.abort([reqs[0].sample_id])


def test_resume_refuses_a_partial_from_other_weights(qwen2):
    eng = engine(qwen2, num_slots=2)
    eng.submit(Request((0, 0, 0), [4, 5], 10))
    eng.step()
    (partial,) = eng.abort()
    other = Engine(qwen2, EngineConfig(num_slots=2), STOCHASTIC, seed=7, eos_id=None, weights_version=3)
    with pytest.raises(RequestError, match="version 0 .* version 3"):
        other.resume([partial])
    assert other.occupancy.idle
    fine = Engine(qwen2, EngineConfig(num_slots=2), STOCHASTIC, seed=7, eos_id=None)
    with pytest.raises(RequestError, match="only aborted"):  # all or nothing
        fine.resume([partial, dataclasses.replace(partial, sample_id=(0, 1, 0), finish_reason="length")])
    assert fine.occupancy.idle
    fine.resume([partial])
    assert len(list(fine.stream())) == 1


# ---- weights -------------------------------------------------------------------------------------


def test_load_weights_in_place_and_stamp_the_version(monkeypatch, qwen2, other_qwen2):
    new = other_qwen2
    reqs = requests(6)
    expected = by_id(engine(new, num_slots=3).generate(reqs))
    eng = engine(qwen2, num_slots=3, weight_bucket_mb=0.01)  # many small buckets
    before = by_id(eng.generate(reqs))
    staged = []
    original = weights_module._copy_bucket
    monkeypatch.setattr(weights_module, "_copy_bucket", lambda bucket: (
        staged.append(sum(t.numel() * t.element_size() for t, _ in bucket)), original(bucket)))
    eng.load_weights(dict(new.named_parameters()), version=1)
    after = by_id(eng.generate(reqs))
    assert len(staged) > 3 and max(staged) <= 0.01 * 2**20 + max(p.numel() * 4 for p in new.parameters())
    assert all(s.weights_version == 0 for s in before.values())
    assert all(s.weights_version == 1 for s in after.values())
    assert {sid: s.token_ids for sid, s in after.items()} == {sid: s.token_ids for sid, s in expected.items()}
    # a state_dict (with the tied lm_head alias) is accepted too
    eng.load_weights(new.state_dict(), version=2)
    assert eng.version == 2


@pytest.mark.parametrize("breakage", ["missing", "misshaped", "unknown"])
def test_bad_weights_name_the_tensor_and_the_engine_keeps_serving(qwen2, other_qwen2, breakage):
    reqs = requests(8)
    expected = by_id(engine(qwen2, num_slots=3).generate(reqs))
    tensors = dict(other_qwen2.named_parameters())
    name = "model.layers.1.self_attn.k_proj.weight"
    if breakage == "missing":
        del tensors[name]
    elif breakage == "misshaped":
        tensors[name] = torch.zeros(3, 5)
    else:
        name = "model.layers.9.mlp.up_proj.weight"
        tensors[name] = torch.zeros(1)
    eng = engine(qwen2, num_slots=3)
    for r in reqs:
        eng.submit(r)
    done = eng.step()
    with pytest.raises(WeightsError, match=name.replace(".", r"\.")):
        eng.load_weights(tensors, version=1)
    done += list(eng.stream())
    assert eng.version == 0
    assert {s.sample_id: s.token_ids for s in done} == {sid: s.token_ids for sid, s in expected.items()}


def test_load_weights_refuses_while_sequences_are_in_flight(qwen2, other_qwen2):
    eng = engine(qwen2, num_slots=2)
    eng.submit(Request((0, 0, 0), [4, 5], 10))
    eng.step()
    with pytest.raises(EngineBusyError, match="in flight"):
        eng.load_weights(dict(other_qwen2.named_parameters()), version=1)
    with pytest.raises(EngineBusyError, match="in flight"):
        eng.set_weights_version(1)
    assert eng.version == 0 and len(list(eng.stream())) == 1
    eng.set_weights_version(4)  # colocated: the shared module was updated in place
    assert eng.generate([Request((0, 1, 0), [4, 5], 2)])[0].weights_version == 4


# ---- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [
    (Request((0, 9, 0), list(range(3, 60)) * 2), r"\(0, 9, 0\).*prompt of 114 tokens.*context of 96"),
    (Request((0, 9, 0), [4, 5], 0), r"\(0, 9, 0\).*max_new_tokens=0"),
    (Request((0, 9, 0), [4, 5], -3), r"\(0, 9, 0\).*max_new_tokens=-3"),
    (Request((0, 9, 0), []), r"\(0, 9, 0\).*empty prompt"),
    (Request((0, 9, 0), [4, VOCAB + 1]), r"\(0, 9, 0\).*outside the vocabulary"),
    (Request((0, 9, 0), [4, 2.5]), r"\(0, 9, 0\).*must be integers"),
    (Request((0, 0, 0), [4, 5]), r"\(0, 0, 0\).*already queued or running"),
])
def test_bad_requests_name_themselves_and_the_rest_are_served(qwen2, bad, match):
    reqs = requests(6)
    expected = by_id(engine(qwen2, num_slots=3).generate(reqs))
    eng = engine(qwen2, num_slots=3)
    for r in reqs:
        eng.submit(r)
    done = eng.step()
    with pytest.raises(RequestError, match=match) as err:
        eng.submit(bad)
    assert isinstance(err.value, PoiseError) and err.value.sample_id == bad.sample_id
    done += list(eng.stream())
    assert {s.sample_id: (s.token_ids, s.logprobs) for s in done} == \
           {sid: (s.token_ids, s.logprobs) for sid, s in expected.items()}


def test_generate_checks_every_request_before_running_any(qwen2):
    eng = engine(qwen2, num_slots=3)
    with pytest.raises(RequestError, match=r"\(0, 1, 0\)"):
        eng.generate([Request((0, 0, 0), [4]), Request((0, 1, 0), [4], 0)])
    assert eng.occupancy.idle and eng.steps == 0
    assert len(eng.generate([Request((0, 0, 0), [4], 3)])) == 1  # the good id is free again


def test_config_errors_say_how_to_fix(qwen2):
    with pytest.raises(PoiseError, match="num_slots"):
        EngineConfig(num_slots=0)
    with pytest.raises(PoiseError, match="max_context 500 exceeds"):
        engine(qwen2, max_context=500)
    with pytest.raises(PoiseError, match="need a tokenizer"):
        Engine(qwen2, EngineConfig(stop_strings=("x",)), GREEDY, seed=0, eos_id=None)


def test_prefill_budget_spreads_admissions_over_steps(qwen2):
    eng = engine(qwen2, GREEDY, num_slots=8, max_prefill_tokens=10)
    for i in range(4):
        eng.submit(Request((0, i, 0), [4] * 6, 5))  # 6-token prompts: one admission per step fits
    eng.step()
    assert eng.occupancy == Occupancy(running=1, queued=3)
    eng.step()
    assert eng.occupancy.running == 2
    assert len(list(eng.stream())) == 4 and eng.tokens_generated == 20


def test_prompt_ids_may_be_a_tensor(qwen2):
    as_list = engine(qwen2, GREEDY, num_slots=1).generate([Request((0, 0, 0), [4, 5, 6], 4)])
    as_tensor = engine(qwen2, GREEDY, num_slots=1).generate([Request((0, 0, 0), torch.tensor([4, 5, 6]), 4)])
    assert as_list[0].token_ids == as_tensor[0].token_ids and as_tensor[0].prompt_ids == (4, 5, 6)


def test_generate_needs_an_idle_engine(qwen2):
    eng = engine(qwen2, num_slots=2)
    eng.submit(Request((0, 0, 0), [4, 5], 3))
    with pytest.raises(EngineBusyError, match="1 queued"):
        eng.generate([Request((0, 1, 0), [4], 2)])
    assert len(list(eng.stream())) == 1
