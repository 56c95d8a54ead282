"""The sizes docs/design.md sets for the source ("Layers"): no module over 600 lines, no function
over 80. A module near the limit is split by concept before it grows, not squeezed."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "poise"
MODULE_LINES, FUNCTION_LINES = 600, 80


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert len(_modules()) > 100 and not long, long


def test_no_function_is_over_80_lines():
    long = {}
    for path in _modules():
        for f in _functions(ast.parse(path.read_text())):
            lines = f.end_lineno - f.lineno + 1  # decorators aside, docstring and body included
            if lines > FUNCTION_LINES:
                long[f"{path.relative_to(SRC)}:{f.lineno} {f.name}"] = lines
    assert not long, long
