"""Layers hold (docs/design.md, Layers): every import under src/poise, lazy ones inside functions
and relative ones included, points to the importer's own package or file or to a lower rank of the
design doc's layer table; a row that says "only `x/` imports it" is imported by nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Imports that point up on purpose, as "importer module -> imported module": keep this empty.
ALLOWED_UPWARD: frozenset[str] = frozenset()


def layer_table(design: str) -> tuple[dict[str, int], dict[str, set[str]]]:
    """{unit: rank} of the design doc's layer table, and {unit: the only units that import it}."""
    section = design.split("## Layers", 1)[1].split("\n## ", 1)[0]
    ranks: dict[str, int] = {}
    importers: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        for unit in re.findall(r"`([^`]+)`", cells[1]):
            assert unit not in ranks, f"docs/design.md places {unit} twice"
            ranks[unit] = int(cells[0])
            only = re.search(r"only ((?:`[^`]+`(?:,\s*|\s+and\s+)?)+) imports? it", cells[2])
            if only:
                importers[unit] = set(re.findall(r"`([^`]+)`", only.group(1)))
    return ranks, importers


def unit_of(module: str, src: Path) -> str:
    """The layer-table name of module `poise....`: `pkg/` for a subpackage, `name.py` for a
    top-level module, `__init__.py` for the package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (src / "poise" / parts[1]).is_dir() else f"{parts[1]}.py"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, src: Path) -> list[tuple[int, str]]:
    """(line, module) of every poise import in `path`, at any depth; `from a import b` names a.b
    where b is a module, and a relative import is resolved against the file's package."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                is_module = (src / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                    (src / Path(*sub.split("."))).is_dir()
                out.append((node.lineno, sub if is_module else base))
    return sorted({(line, m) for line, m in out if m == "poise" or m.startswith("poise.")})


def layer_violations(src: Path, ranks: dict[str, int], importers: dict[str, set[str]]) -> list[str]:
    """Each import that breaks the table, as 'file:line: importer -> imported (why)'."""
    found = []
    for path in sorted((src / "poise").rglob("*.py")):
        importer = module_name(path, src)
        mine = unit_of(importer, src)
        if mine not in ranks:
            found.append(f"{path.relative_to(src)}: {mine} is in no row of the layer table; place it there")
            continue
        for line, target in imported_modules(path, src):
            theirs = unit_of(target, src)
            if theirs == mine or f"{importer} -> {target}" in ALLOWED_UPWARD:
                continue
            where = f"{path.relative_to(src)}:{line}: {importer} -> {target}"
            if theirs not in ranks:
                found.append(f"{where} ({theirs} is in no row of the layer table)")
            elif ranks[theirs] >= ranks[mine]:
                found.append(f"{where} ({mine} rank {ranks[mine]} imports {theirs} rank {ranks[theirs]})")
            elif theirs in importers and mine not in importers[theirs]:
                found.append(f"{where} (only {', '.join(sorted(importers[theirs]))} may import {theirs})")
    return found


def test_no_module_imports_a_higher_or_sibling_layer():
    ranks, importers = layer_table((ROOT / "docs" / "design.md").read_text())
    assert len(ranks) >= 15 and "config/" in ranks and ranks["cli/"] > ranks["runtime/"] > ranks["policy/"], ranks
    src = ROOT / "src"
    present = {unit_of(module_name(p, src), src) for p in (src / "poise").rglob("*.py")}
    assert not set(ranks) - present, f"the layer table names what src/poise lacks: {sorted(set(ranks) - present)}"
    violations = layer_violations(src, ranks, importers)
    assert not violations, "imports that break docs/design.md's layer table:\n" + "\n".join(violations)


def test_the_checker_finds_upward_sibling_lazy_and_relative_imports(tmp_path):
    # A tiny tree with one import of each kind that must be caught, and the allowed ones beside them.
    files = {
        "poise/__init__.py": "",
        "poise/errors.py": "",
        "poise/low/__init__.py": "from poise import errors\nfrom . import inner\n",
        "poise/low/inner.py": "def f():\n    from ..high import top\n",          # lazy, relative, upward
        "poise/side/__init__.py": "import poise.low.inner\nfrom poise.peer import x\n",  # down; sideways
        "poise/peer/__init__.py": "x = 1\n",
        "poise/high/__init__.py": "",
        "poise/high/top.py": "from poise.low import inner\nfrom poise.report import draw\n",  # down; not allowed
        "poise/report/__init__.py": "",
        "poise/report/draw.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    ranks, importers = layer_table("## Layers\n\n| rank | package | what |\n| --- | --- | --- |\n"
                                   "| 3 | `high/` | top |\n| 2 | `side/`, `peer/` | siblings |\n"
                                   "| 1 | `low/` | low |\n| 1 | `report/` | only `side/` imports it |\n"
                                   "| 0 | `errors.py`, `__init__.py` | base |\n\n## Next\n")
    assert importers == {"report/": {"side/"}} and ranks["high/"] == 3
    found = layer_violations(tmp_path, ranks, importers)
    assert [f.split(": ", 1)[1] for f in found] == [
        "poise.high.top -> poise.report.draw (only side/ may import report/)",
        "poise.low.inner -> poise.high.top (low/ rank 1 imports high/ rank 3)",
        "poise.side -> poise.peer (side/ rank 2 imports peer/ rank 2)",
    ], found
