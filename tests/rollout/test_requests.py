"""One admission check for both rollout engines (rollout/requests.py): Poise's engine and the vLLM
engine take and refuse the same requests, with the same line. The vLLM engine cannot be built
without vLLM, so its check runs unbound on a stand-in holding what the check reads."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from poise.rollout.engine import Engine, EngineConfig
from poise.rollout.requests import RequestError, admit
from poise.rollout.sampling import SamplingConfig
from poise.rollout.vllm_engine import VllmEngine

VOCAB = 60  # tests/rollout/conftest.py builds the tiny models with the char tokenizer's vocabulary
CONTEXT = 32
BUDGET = 8
ROLLOUT = Path(__file__).resolve().parents[2] / "src" / "poise" / "rollout"

# (sample id, prompt, max new tokens or None, partial tokens, turn)
CASES = {
    "plain": ((0, 1, 0), [4, 5, 6], None, [], 0),
    "numpy ids": ((0, 1, 0), list(np.array([4, 5, 6], dtype=np.int64)), None, [], 0),
    "numpy int32 ids": ((0, 1, 0), [np.int32(4), np.int32(5)], 3, [], 0),
    "0-d tensor ids": ((0, 1, 0), [torch.tensor(4), torch.tensor(5)], None, [], 0),
    "a partial": ((0, 1, 0), [4, 5], None, [7, 8], 0),
    "a later turn": ((0, 1, 0), [4, 5], 2, [], 2),
    "float ids": ((0, 1, 0), [4, 2.5], None, [], 0),
    "id outside the vocabulary": ((0, 1, 0), [4, VOCAB], None, [], 0),
    "negative id": ((0, 1, 0), [4, -1], None, [], 0),
    "empty prompt": ((0, 1, 0), [], None, [], 0),
    "prompt fills the context": ((0, 1, 0), [4] * CONTEXT, None, [], 0),
    "zero budget": ((0, 1, 0), [4], 0, [], 0),
    "float budget": ((0, 1, 0), [4], 2.0, [], 0),
    "partial past its budget": ((0, 1, 0), [4], 2, [5, 6], 0),
    "partial fills the context": ((0, 1, 0), [4] * (CONTEXT - 2), None, [5, 6], 0),
    "negative turn": ((0, 1, 0), [4], None, [], -1),
    "sample id of two": ((0, 1), [4], None, [], 0),
    "numpy sample id": ((np.int64(0), 1, 0), [4], None, [], 0),
    "already queued": ((0, 0, 0), [4], None, [], 0),
}


def _poise_check(model, case):
    engine = Engine(model, EngineConfig(num_slots=2, max_context=CONTEXT), SamplingConfig(max_new_tokens=BUDGET),
                    seed=0, eos_id=None, clock=itertools.count().__next__)
    engine._admit_check((0, 0, 0), [4], None)  # (0, 0, 0) is queued
    sample_id, prompt, max_new, tokens, turn = case
    return engine._admit_check(sample_id, prompt, max_new, tokens, turn).prompt


def _vllm_check(case):
    stand_in = SimpleNamespace(_known={(0, 0, 0)}, vocab_size=VOCAB, context=CONTEXT,
                               clock=itertools.count().__next__)
    sample_id, prompt, max_new, tokens, turn = case
    budget = BUDGET if max_new is None else max_new  # as VllmEngine.submit resolves it
    return VllmEngine._check(stand_in, sample_id, prompt, budget, tokens, turn).prompt


def _outcome(check, *args):
    try:
        prompt = check(*args)
    except RequestError as e:
        return "refused", str(e)
    assert all(type(t) is int for t in prompt), prompt  # plain ints go on, whatever came in
    return "taken", prompt


@pytest.mark.parametrize("name", CASES)
def test_both_engines_take_and_refuse_the_same_requests(qwen2, name):
    poise, vllm = _outcome(_poise_check, qwen2, CASES[name]), _outcome(_vllm_check, CASES[name])
    assert poise == vllm, name
    refused = name not in ("plain", "numpy ids", "numpy int32 ids", "0-d tensor ids", "a partial", "a later turn")
    assert (poise[0] == "refused") == refused, poise
    if refused:
        assert "\n" not in poise[1] and poise[1].startswith(f"request {CASES[name][0]}"), poise


def test_numpy_prompt_ids_are_taken_as_ints():
    assert admit((0, 0, 0), list(np.arange(3, 6)), 4, [], 0, known=set(), vocab_size=VOCAB, context=CONTEXT) == \
        [3, 4, 5]


@pytest.mark.parametrize("module,method", [("engine.py", "_admit_check"), ("vllm_engine.py", "_check")])
def test_each_engine_checks_with_the_shared_admission(module, method):
    """Each engine's check calls `admit` and raises no RequestError of its own (a second copy of the
    rules would drift again)."""
    tree = ast.parse((ROLLOUT / module).read_text())
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == method]
    calls = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "admit" in calls and "RequestError" not in calls, calls
