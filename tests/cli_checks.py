"""What every bad-input test of the CLI checks: `poise` in a subprocess, and its one-line error."""

from __future__ import annotations

import subprocess
import sys


def poise(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poise", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2, no traceback, exactly one line `poise: error: ...` holding every fragment."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("poise: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
