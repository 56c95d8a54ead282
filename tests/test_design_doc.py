"""docs/design.md is the project's own design document: it names every package under src/poise/,
no docstring or test points to a design file outside the repository, and no comment or docstring
in src/ cites an issue number."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_design_doc_names_every_package():
    design = (ROOT / "docs" / "design.md").read_text()
    packages = sorted(p.name for p in (ROOT / "src" / "poise").iterdir() if (p / "__init__.py").is_file())
    assert len(packages) >= 10, packages
    missing = [p for p in packages if f"`{p}/`" not in design]
    assert not missing, f"docs/design.md does not name {missing}"


def test_nothing_points_to_a_design_file_outside_the_repository():
    stale = [f"{path.relative_to(ROOT)}:{n}" for folder in ("src", "tests") for path in (ROOT / folder).rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"(?<![/\w])DESIGN\.md", line)]
    assert not stale, stale
    assert "steering repository" not in (ROOT / "README.md").read_text()


# An issue number means nothing to a reader of the code; nor does a file that is not in the repository.
ISSUE_REF = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/#-])#\d+\b", re.I)  # not Exp#2, Exp#1-#3
OUTSIDE_REF = re.compile(r"(?<![/\w])(DESIGN|STYLE)\.md|\.\./shared\b")


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file; every line of a YAML file."""
    text = path.read_text()
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def references(pattern: re.Pattern, root: Path) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {m.group(0)}" for path in sorted(root.rglob("*"))
            if path.suffix in (".py", ".yaml") for line, text in comments_and_docstrings(path)
            for m in pattern.finditer(text)]


def test_no_comment_or_docstring_in_src_names_an_issue_or_a_file_outside_the_repository():
    assert not references(ISSUE_REF, ROOT / "src"), references(ISSUE_REF, ROOT / "src")
    assert not references(OUTSIDE_REF, ROOT / "src"), references(OUTSIDE_REF, ROOT / "src")


def test_the_reference_check_finds_them(tmp_path):
    design = "DESIGN" + ".md"  # spelled apart, or the check above would find it in this file
    (tmp_path / "m.py").write_text('"""Durable (issue 11): see STYLE.md."""\n\nCOLOR = "#999999"  # fixes #42\n\n\n'
                                   f'def f():\n    """Exp#2, Exp#1-#3 of the paper; ../shared/{design}."""\n')
    (tmp_path / "s.yaml").write_text(f"# as in {design}, Episodes; Issue 7\nsteps: 3\n")
    assert [r.split(": ", 1)[1] for r in references(ISSUE_REF, tmp_path)] == ["#42", "issue 11", "Issue 7"]
    assert [r.split(": ", 1)[1] for r in references(OUTSIDE_REF, tmp_path)] == \
        ["STYLE.md", "../shared", design]
