"""The built-in reward functions, called as TRL would call them (lists of prompts, completions and
columns), and the per-row task reward that keeps the built-in tasks' numbers unchanged."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from poise.config.reward import REWARD_BUILTINS
from poise.data.tasks import FAMILIES, Phase, TaskSource, reward
from poise.rewards import builtin
from poise.rewards.builtin import code, exact, final_number, items, math, task


def test_exact_and_items_score_as_before():
    assert exact(["p"] * 3, ["19", " 19 ", "18"], answer=["19"] * 3) == [1.0, 1.0, 0.0]
    # items: the fraction of positions right, over the longer list
    assert items(["p"] * 4, ["1 2 5 9", "1 2 9 5", "1 2", ""], answer=["1 2 5 9"] * 4) == [1.0, 0.5, 0.5, 0.0]
    assert items(["p"], [""], answer=[""]) == [1.0]


def test_task_reward_equals_the_problems_own_reward():
    """`task` (the default reward function) gives every built-in problem what `reward(problem, r)`
    gave it, for right, partly right and wrong responses."""
    source = TaskSource(3, (Phase(mix={f: 1.0 for f in FAMILIES}),), pool_size=64)
    rng = random.Random(0)
    problems = source.pool(0)
    kinds = {p.reward_name for p in problems}
    assert kinds == {"exact", "items"}
    for p in problems:
        words = p.answer.split()
        responses = [p.answer, " ".join(words[:-1]), " ".join(rng.sample(words, len(words))), "x"]
        got = task([p.prompt] * 4, responses, answer=[p.answer] * 4, reward_kind=[p.reward_name] * 4)
        assert got == [reward(p, r) for r in responses]
    assert task(["p"], ["a"], answer=["a"]) == [1.0]  # no reward_kind column: exact


@pytest.mark.parametrize("completion, expected", [
    ("She has 48-15=33 pencils.\n#### 33", 1.0),
    ("#### 33.0", 1.0),
    ("The answer is \\boxed{33}.", 1.0),
    ("so \\boxed{\\frac{66}{2}}", 1.0),
    ("#### 1,033", 0.0),
    ("first 12, then 33", 1.0),  # no marker: the last number
    ("#### 34 (but 33 earlier)", 0.0),  # the marker wins over later numbers
    ("\\boxed{32} and then 33", 0.0),  # so does \\boxed
    ("no number at all", 0.0),
])
def test_math_extracts_the_final_answer(completion, expected):
    answer = "Mia buys 4*12=<<4*12=48>>48 pencils.\nShe has 48-15=<<48-15=33>>33 pencils.\n#### 33"
    assert math(["q"], [completion], answer=[answer]) == [expected]


def test_math_reference_forms():
    assert math(["q"] * 3, ["#### 1200", "\\boxed{0.5}", "#### -7"], answer=["$1,200", "1/2", "#### -7"]) == [1.0] * 3
    assert final_number("#### 3/4") == Fraction(3, 4)
    assert final_number("") is None


PROGRAM = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'", "assert add(2, 2) == 5"]


def test_code_scores_the_fraction_of_tests_passed():
    wrong = "def add(a, b):\n    return 5 if a == 2 else a - b"  # passes only the wrong test
    crashing = "raise SystemExit(0)\ndef add(a, b):\n    return a + b"
    noisy = "print('#### P P P')\nimport sys\nprint('P', file=sys.stderr)\ndef add(a, b):\n    return a + b"
    got = code(["p"] * 4, [PROGRAM, wrong, crashing, noisy], tests=[TESTS] * 4)
    assert got == [0.75, 0.25, 0.0, 0.75]  # the candidate's prints cannot forge passes


def test_code_tests_as_one_string_and_hanging_tests():
    hang = "def add(a, b):\n    while a == 0:\n        pass\n    return a + b"
    got = code(["p"] * 2, [PROGRAM, hang], tests=["assert add(1, 2) == 3\n\nassert add(5, 5) == 10",
                                                    ["assert add(1, 2) == 3", "assert add(0, 1) == 1"]])
    assert got == [1.0, 0.5]  # the hanging test fails on its own alarm; the other passes


def test_builtins_are_listed():
    assert list(builtin.BUILTINS) == ["task", "exact", "items", "math", "code"]
    assert tuple(builtin.BUILTINS) == REWARD_BUILTINS  # the config checks reward.functions by these names
