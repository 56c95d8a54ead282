"""Built-in reward functions with TRL's signature: `fn(prompts, completions, **columns) -> list[float]`.

`columns` are the row's other fields as lists, one entry per completion: `answer` (the reference),
`reward_kind` (the row's built-in kind, "exact" or "items") and every other dataset column (e.g.
`tests`). Every function here scores each completion on its own, from its own row only.

- `task`:  the row's own kind (`reward_kind`): what the built-in tasks and datasets score by default
- `exact`: 1 if the stripped completion equals the stripped answer, else 0
- `items`: fraction of space-separated items in the right position, over the longer list
- `math`:  GSM8K-style: the completion's final number equals the answer's (see `final_number`)
- `code`:  Python code execution: the fraction of the row's `tests` that pass (see `code`)

Pure Python, no torch: the driver-side data layer uses `exact_score`/`items_score` too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from typing import Any, Callable, Sequence

# --- scalar scores (answer, response) -> float ------------------------------------------------


def exact_score(answer: str, response: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


def items_score(answer: str, response: str) -> float:
    """Fraction of space-separated items in the right position, over the longer list."""
    ref, got = answer.split(), response.split()
    if not ref and not got:
        return 1.0
    hits = sum(1 for r, g in zip(ref, got) if r == g)
    return hits / max(len(ref), len(got))


SCALAR: dict[str, Callable[[str, str], float]] = {"exact": exact_score, "items": items_score}

# --- math ----------------------------------------------------------------------------------------

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\$?\.\d+"
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_ANY = re.compile(_NUMBER)
_FRAC = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def _parse_number(text: str) -> Fraction | None:
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    frac = _FRAC.fullmatch(text)
    if frac:
        text = f"{frac.group(1)}/{frac.group(2)}"
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def final_number(text: str) -> Fraction | None:
    """The final answer of a GSM8K-style text, exactly: the number after the last `#### `, else
    the content of the last `\\boxed{...}` (a number, `a/b` or `\\frac{a}{b}`), else the last number
    in the text. Commas and `$` are ignored ("$1,200" is 1200)."""
    hashes = _HASHES.findall(text)
    if hashes:
        return _parse_number(hashes[-1])
    boxed = _BOXED.findall(text)
    if boxed:
        inner = boxed[-1]
        value = _parse_number(inner)
        if value is not None:
            return value
        numbers = _ANY.findall(inner)
        return _parse_number(numbers[-1]) if numbers else None
    numbers = _ANY.findall(text)
    return _parse_number(numbers[-1]) if numbers else None


# --- code ----------------------------------------------------------------------------------------

CODE_TIMEOUT_S = 5.0  # one candidate's program and all its tests, in a fresh interpreter
CODE_TEST_TIMEOUT_S = 2.0  # one test
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs in a fresh `python -I` (stdin: JSON {program, tests}) that never runs the candidate itself:
# each test runs, after the program, in a process of its own with every fd closed and its output on
# /dev/null, and passes only by exiting with the status this harness drew at random for it
# (sys.exit(0), os._exit, a crash or a timeout fail it). That process is PID 1 of a PID namespace
# of its own (in a user namespace of its own: no privilege needed), so whatever the candidate
# starts (a double-forked daemon included) sees no process outside, not the harness nor another
# candidate's, and dies with it at the end of the test; where the kernel refuses the namespaces it
# runs in a session of its own, killed at the end of the test (a daemon that calls setsid()
# escapes that). The harness is not dumpable and a test process holds no capability, so it cannot
# open the harness's fds or memory through /proc (not even as root); the harness writes one mark
# per test, "P" or "F", on its stdout, which no test process holds.
_HARNESS = r"""
import ctypes, json, os, random, signal, sys
libc = ctypes.CDLL(None)
libc.prctl(4, 0, 0, 0, 0)
class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
job = json.load(sys.stdin)
marks = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
draw = random.SystemRandom()
def alarm(signum, frame):
    raise TimeoutError("test timed out")
signal.signal(signal.SIGALRM, alarm)
def run(test, code):
    try:
        if libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (ctypes.c_uint32 * 6)()) != 0:
            os._exit(1)
        scope = {"__name__": "__main__"}
        signal.setitimer(signal.ITIMER_REAL, job["test_timeout"])
        exec(compile(job["program"], "<candidate>", "exec"), scope)
        signal.setitimer(signal.ITIMER_REAL, job["test_timeout"])
        exec(compile(test, "<test>", "exec"), scope)
        signal.setitimer(signal.ITIMER_REAL, 0)
        os._exit(code)
    except BaseException:
        os._exit(1)
    finally:
        os._exit(1)
def isolated(test, code):
    os.closerange(3, 1 << 16)
    os.setsid()  # a session of its own: what the harness kills after the test
    if libc.unshare(0x10000000 | 0x20000000) != 0:  # CLONE_NEWUSER | CLONE_NEWPID refused
        run(test, code)
    pid = os.fork()  # PID 1 of the new namespace: everything in it dies when it ends
    if pid == 0:
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: dies when the harness kills its parent
        os.setsid()
        run(test, code)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
def passes(test):
    code = draw.randrange(3, 120)
    pid = os.fork()
    if pid == 0:
        try:
            isolated(test, code)
        finally:
            os._exit(1)
    try:
        signal.setitimer(signal.ITIMER_REAL, 2 * job["test_timeout"] + 0.5)
        _, status = os.waitpid(pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = None
    try:
        os.killpg(pid, signal.SIGKILL)  # without the namespaces: what the test left in its session
    except OSError:
        pass
    return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == code
for test in job["tests"]:
    os.write(marks, b"P" if passes(test) else b"F")
os._exit(0)
"""


def extract_program(completion: str) -> str:
    """The candidate program: the last ```python fenced block of the completion, else all of it."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def run_tests(program: str, tests: Sequence[str], timeout_s: float = CODE_TIMEOUT_S) -> float:
    """Fraction of `tests` (Python statements, typically `assert f(2) == 4`) that pass after running
    `program`: each test in a process of its own, forked by a harness (`python -I`) that runs the
    program, then the test, with a per-test alarm (see _HARNESS). A program that fails to run passes
    no test. A harness that dies before reporting every test (killed from outside) or a report that
    is not one mark per test at most raises (the call fails, counted): a 0 would hide it."""
    if not tests:
        return 0.0
    job = json.dumps({"program": program, "tests": list(tests), "test_timeout": CODE_TEST_TIMEOUT_S})
    try:
        out = subprocess.run([sys.executable, "-I", "-c", _HARNESS], input=job, capture_output=True, text=True,
                             timeout=timeout_s, cwd=os.getcwd())
    except subprocess.TimeoutExpired as e:  # the marks written before the hang still count
        return score_marks(e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), len(tests))
    if out.returncode != 0:
        how = f"was killed by signal {-out.returncode}" if out.returncode < 0 else f"exited {out.returncode}"
        raise RuntimeError(f"the code harness {how} after {len(out.stdout)} of {len(tests)} tests; not scored")
    return score_marks(out.stdout, len(tests))


def score_marks(marks: str, tests: int) -> float:
    """The fraction of passes in the harness's report; anything but one "P" or "F" per test (at
    most `tests` of them) means the report was tampered with, and raises."""
    if len(marks) > tests or marks.strip("PF"):
        raise RuntimeError(f"the code harness reported {marks[:40]!r} for {tests} tests; not scored")
    return marks.count("P") / tests


def _tests_of(row_tests: Any) -> list[str]:
    if isinstance(row_tests, str):  # one string: one statement per non-empty line
        return [line for line in row_tests.splitlines() if line.strip()]
    if isinstance(row_tests, (list, tuple)) and all(isinstance(t, str) for t in row_tests):
        return list(row_tests)
    raise TypeError(f"the `tests` column must be a list of Python statements or one string of them, "
                    f"got {type(row_tests).__name__}")


# --- the functions (TRL signature) ----------------------------------------------------------------


def task(prompts: list[str], completions: list[str], answer: list[str], reward_kind: list[str] | None = None,
         **_: list) -> list[float]:
    """The row's own built-in kind (`reward_kind`, "exact" when absent): the default reward."""
    kinds = reward_kind if reward_kind is not None else ["exact"] * len(completions)
    return [SCALAR[k](a, c) for k, a, c in zip(kinds, answer, completions)]


def exact(prompts: list[str], completions: list[str], answer: list[str], **_: list) -> list[float]:
    """1.0 if the stripped completion equals the stripped answer, else 0.0."""
    return [exact_score(a, c) for a, c in zip(answer, completions)]


def items(prompts: list[str], completions: list[str], answer: list[str], **_: list) -> list[float]:
    """Fraction of space-separated items in the right position, over the longer list."""
    return [items_score(a, c) for a, c in zip(answer, completions)]


def math(prompts: list[str], completions: list[str], answer: list[str], **_: list) -> list[float]:
    """1.0 if the completion's final number (`final_number`: `#### N`, else `\\boxed{N}`, else the
    last number) equals the answer's, compared as exact fractions; the answer may be a bare number
    or GSM8K-formatted ("...reasoning...\\n#### 42"). No number in either scores 0.0."""
    out = []
    for a, c in zip(answer, completions):
        ref, got = final_number(str(a)), final_number(c)
        out.append(1.0 if ref is not None and got is not None and ref == got else 0.0)
    return out


def code(prompts: list[str], completions: list[str], tests: list, **_: list) -> list[float]:
    """Python code execution: the fraction of the row's `tests` that pass.

    The program is the completion's last ```python block (else the whole completion); `tests` is a
    list of Python statements, usually asserts (`["assert add(1, 2) == 3", ...]`), or one string
    with one statement per line. Each test runs in a copy of the program's globals in a fresh
    `python -I` started inside the reward sandbox, CODE_TEST_TIMEOUT_S per test and CODE_TIMEOUT_S
    for the whole program (keep reward.timeout_s above it). The harness guards against crashes,
    exits, hangs, a program that writes marks or reaches the harness, and one that reaches the
    tests of other candidates (each test is PID 1 of a PID namespace of its own, and everything it
    started ends with it); not against a program that makes its own test pass from inside (an
    object whose `__eq__` is always True, or one that reads the exit status it must give from its
    process's memory): that games its own score only.
    """
    return [run_tests(extract_program(c), _tests_of(t)) for c, t in zip(completions, tests)]


BUILTINS: dict[str, Callable[..., list[float]]] = {"task": task, "exact": exact, "items": items, "math": math,
                                                   "code": code}

__all__ = ["BUILTINS", "SCALAR", "task", "exact", "items", "math", "code", "exact_score", "items_score",
           "final_number", "extract_program", "run_tests", "score_marks"]
