"""docs/design.md is the project's own design document: it names every package under src/poise/,
and no docstring or test points to a design file outside the repository."""

from __future__ import annotations

import re
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
