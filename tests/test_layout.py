"""The package's layout is its architecture: three parts, each importing only those below it.

``convlab.scratch`` (from scratch) < ``convlab.aten`` (PyTorch's own code) < ``convlab.lab``
(measuring), with ``convlab.autograd`` and ``convlab.cli`` on top. Every import of a convlab
module, also inside functions, is read from the source with :mod:`ast`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "convlab"
RANK = {"scratch": 0, "aten": 1, "lab": 2, "autograd": 3, "cli": 4}
MAX_LINES = 500
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "csrc" not in p.parts)


def part_of(module: str) -> str | None:
    """``convlab.lab.timing`` -> ``lab``; the package root itself has no part."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[0] == "convlab" else None


def convlab_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a convlab module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("convlab")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "convlab":
                found += [(node.lineno, f"convlab.{a.name}") for a in node.names]
            elif node.module.startswith("convlab."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: use absolute convlab imports")
    return found


def test_every_module_belongs_to_a_part() -> None:
    loose = [p.name for p in MODULES if p.parent == PACKAGE and p.stem not in {"__init__",
                                                                               "__main__"}]
    assert not loose, f"modules outside the parts: {loose}"
    assert {p.relative_to(PACKAGE).parts[0] for p in MODULES if p.parent != PACKAGE} == set(RANK)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_part(path: Path) -> None:
    here = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else None
    if here is None:
        return
    upward = [
        f"line {line}: {module}"
        for line, module in convlab_imports(path)
        if part_of(module) in RANK and RANK[part_of(module)] > RANK[here]
    ]
    assert not upward, f"{here} must not import a higher part: {upward}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it by concept"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from convlab.lab import timing\n    from . import x\n")
    with pytest.raises(AssertionError, match="absolute"):
        convlab_imports(bad)
    bad.write_text("def f():\n    from convlab.lab import timing\n")
    assert convlab_imports(bad) == [(2, "convlab.lab")]
    assert part_of("convlab.lab.timing") == "lab" and part_of("convlab") is None
