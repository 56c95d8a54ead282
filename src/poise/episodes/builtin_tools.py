"""Built-in tools: `calculator` (exact arithmetic, no code) and `python` (a program in a process of
its own). Name them in `env.args.tools` by these names.

Both take model text, which is adversarial. The calculator walks the expression's syntax tree and
allows numbers and arithmetic only, with limits on exponents and result sizes, so no input can
run code or take long. The python tool runs the program in a fresh isolated interpreter with a
wall-clock deadline, CPU, memory and file-size limits and an output cap, and kills the program's
whole process group when the call ends. Environments already run in the reward sandbox (no
network, scratch files only, a task limit for all its processes); this adds a process boundary
and a deadline per call on top.
"""

from __future__ import annotations

import ast
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
# Below Python's 4,300-digit limit on int -> str (about 14,280 bits), so every result prints.
MAX_RESULT_BITS = 13_000

PYTHON_TIMEOUT_S = 5.0
PYTHON_MEMORY_MB = 512
PYTHON_OUTPUT_CHARS = 10_000  # the head of stdout kept
STDERR_TAIL_CHARS = 2_000  # the tail of stderr kept: where a traceback says what went wrong
FILE_LIMIT_BYTES = 16 * 2**20


# --- calculator ---------------------------------------------------------------------------------


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: + - * / // % ** and parentheses on integers and decimals.

    Args:
        expression: the expression, for example (12 + 3) * 4 / 5 or 2 ** 100
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression has {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise ValueError(f"not an arithmetic expression: {expression.strip()[:60]!r}") from None
    try:
        value = _evaluate(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    return str(value) if isinstance(value, int) else repr(value)


_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise ValueError(f"only numbers are allowed, not {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINARY):
        return _apply(node.op, _evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed: {node.id}")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed")
    if isinstance(node, ast.Attribute):
        raise ValueError("attributes are not allowed")
    what = type(node.op if isinstance(node, (ast.UnaryOp, ast.BinOp)) else node).__name__  # LShift, not BinOp
    raise ValueError(f"{what} is not allowed: use numbers, + - * / // % ** and parentheses")


def _apply(op: ast.operator, a: int | float, b: int | float) -> int | float:
    if isinstance(op, ast.Pow):
        _check_power(a, b)
    if isinstance(op, ast.Mult) and isinstance(a, int) and isinstance(b, int) \
            and a.bit_length() + b.bit_length() > MAX_RESULT_BITS + 1:
        raise ValueError(f"the product has more than {MAX_RESULT_BITS} bits")
    try:
        if isinstance(op, ast.Div) and isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
            return _checked(a // b)  # exact: 10**30 / 10**10 stays an integer
        operations = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                      ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b,
                      ast.Pow: lambda: a ** b}
        return _checked(operations[type(op)]())
    except OverflowError:
        raise ValueError("the result is too large for a decimal number") from None


def _check_power(a: int | float, b: int | float) -> None:
    if abs(b) > MAX_EXPONENT:
        raise ValueError(f"the exponent {_short(b)} is above the limit of {MAX_EXPONENT}")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and (abs(a).bit_length() - 1) * b > MAX_RESULT_BITS:
        raise ValueError(f"the power has more than {MAX_RESULT_BITS} bits")


def _checked(value: object) -> int | float:
    """A real, finite result within the size limit."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large for a decimal number")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise ValueError(f"the result has more than {MAX_RESULT_BITS} bits")
    return value  # type: ignore[return-value]


def _short(value: int | float) -> str:
    text = str(value) if isinstance(value, int) and value.bit_length() <= MAX_RESULT_BITS else repr(float(value))
    return text if len(text) <= 30 else text[:12] + "..." + text[-6:]


# --- python -------------------------------------------------------------------------------------

# Runs in the child before the user's program: limits first, then the program from stdin. Like
# `-I -S` (no user or site packages, no current directory on the path; the environment is scrubbed
# instead of ignored) but with a fixed hash seed: set order must not differ between two runs of
# one episode (docs/design.md, Episodes: an interrupted episode resumes with the same tokens).
_FLAGS = ("-s", "-S", "-P")
_BOOT = r"""
import resource, sys
cpu_s, memory, fsize = (int(a) for a in sys.argv[1:4])
for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    try:
        resource.setrlimit(limit, (value, value))
    except (OSError, ValueError):
        pass
source = sys.stdin.read()
del sys.argv[1:]
exec(compile(source, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def python(code: str) -> str:
    """Run a Python program in a fresh interpreter and return what it prints (stdout, then the end of stderr).

    Args:
        code: the program; print the values you need
    """
    return run_python(code)


def run_python(code: str, timeout_s: float = PYTHON_TIMEOUT_S, memory_mb: int = PYTHON_MEMORY_MB,
               max_output_chars: int = PYTHON_OUTPUT_CHARS) -> str:
    """`python` with its limits as arguments. A program past `timeout_s` (wall clock) returns
    'error: timed out after N s'; the program's process group is killed when the call ends."""
    limits = [str(math.ceil(timeout_s) + 1), str(memory_mb * 2**20), str(FILE_LIMIT_BYTES)]
    with tempfile.TemporaryDirectory(prefix="poise-python-tool-") as scratch:
        child = subprocess.Popen([sys.executable, *_FLAGS, "-c", _BOOT, *limits], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=scratch,
                                 env={"PATH": os.defpath, "HOME": scratch, "TMPDIR": scratch, "PYTHONHASHSEED": "0"},
                                 start_new_session=True)  # its own process group: killed whole below
        stdout = _Capped(child.stdout, max_output_chars, keep="head")
        stderr = _Capped(child.stderr, STDERR_TAIL_CHARS, keep="tail")
        try:
            _send(child, code)
            child.wait(timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(child)
        stdout.join()
        stderr.join()
    if timed_out:
        return f"error: timed out after {timeout_s:g} s"
    return _output(stdout, stderr, child.returncode)


def _send(child: subprocess.Popen, code: str) -> None:
    try:
        child.stdin.write(code.encode("utf-8", errors="replace"))  # type: ignore[union-attr]
        child.stdin.close()  # type: ignore[union-attr]
    except (BrokenPipeError, OSError):
        pass  # the child died before reading its program: its exit status says why


def _kill_group(child: subprocess.Popen) -> None:
    """SIGKILL to the program and everything it started that stayed in its group."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    child.wait()


def _output(stdout: "_Capped", stderr: "_Capped", returncode: int) -> str:
    text = stdout.text() + (f"...(output cut at {stdout.limit} characters)\n" if stdout.cut else "")
    err = stderr.text()
    if err:
        text += ("" if not text or text.endswith("\n") else "\n") + ("..." if stderr.cut else "") + err
    if returncode < 0:
        text += f"(killed by {signal.Signals(-returncode).name})"
    elif returncode > 0 and not err:
        text += f"(exit status {returncode})"
    return text or "(no output)"


class _Capped:
    """Reads a pipe to its end on a thread of its own (so the child never blocks on a full pipe),
    keeping only its first or last `limit` characters."""

    def __init__(self, pipe: IO[bytes] | None, limit: int, keep: str):
        self.limit, self.keep, self.cut = limit, keep, False
        self._data = b""
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes] | None) -> None:
        assert pipe is not None
        # 4 bytes per character at most in UTF-8: keep enough bytes for `limit` characters
        room = 4 * self.limit
        for chunk in iter(lambda: pipe.read1(65536), b""):  # type: ignore[attr-defined]
            if self.keep == "head":
                self._data += chunk[:max(0, room - len(self._data))]
            else:
                self._data = (self._data + chunk)[-room:]
        pipe.close()

    def join(self) -> None:
        # a process that left the group may still hold the pipe: it is not waited for
        self._thread.join(timeout=2.0)

    def text(self) -> str:
        text = self._data.decode("utf-8", errors="replace")
        if len(text) > self.limit:
            self.cut = True
            text = text[:self.limit] if self.keep == "head" else text[-self.limit:]
        return text


__all__ = ["calculator", "python", "run_python"]
