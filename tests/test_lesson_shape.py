"""Each chapter ends like a lesson: a summary, exercises with runnable solutions, a link.

The shape, shared by every chapter notebook listed in ``_toc.yml``:

- a ``## Summary`` section with 4-7 points, each pointing to the section or cell that
  proves it (a ``{ref}``/``{numref}`` role, a ``#anchor`` link, or "the cell under ...");
- a ``## Exercises`` section of 2-4 ``### Exercise N`` headings (N = 1, 2, ...), each a
  question followed by its solution: an executed code cell tagged ``hide-input`` (hidden
  on the site, checked by nbval) that can fail (an ``assert`` or a ``check(...)`` call);
- then the line ``[Discuss or report a problem](<repository>/issues...)``;
- and no Markdown paragraph in the chapter longer than ``MAX_WORDS`` words.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_notebooks  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
ISSUES_URL = CONFIG["repository"]["url"].rstrip("/") + "/issues"
CHAPTERS = toc_notebooks()
SUMMARY = "## Summary"
EXERCISES = "## Exercises"
EXERCISE = re.compile(r"^### Exercise (\d+)\s*$", re.M)
REPORT = re.compile(r"\[Discuss or report a problem\]\((?P<url>[^)\s]+)\)")
SOLUTION_TAG = "hide-input"
# A solution that cannot fail proves nothing: it must assert (or call the book's check()).
CAN_FAIL = re.compile(r"^\s*assert\b|\bcheck\(", re.M)
# A point names its proof: a cross-reference role, a local anchor, or "the cell under".
PROOF = re.compile(r"\{(ref|numref)\}`[^`]+`|\]\(#[\w-]+\)|the cell under", re.I)
POINT = re.compile(r"^- ", re.M)
MIN_POINTS, MAX_POINTS = 4, 7
MIN_EXERCISES, MAX_EXERCISES = 2, 4
# The issue asks to split paragraphs longer than about 120 words.
MAX_WORDS = 120
FENCE = re.compile(r"^\s*(`{3,}|:{3,})(\S*)")
CODE_DIRECTIVES = ("{code-block}", "{code-cell}", "{code}", "{literalinclude}", "{math}")
WORD = re.compile(r"\w")


def _cells(path: Path) -> list[nbformat.NotebookNode]:
    return nbformat.read(path, as_version=4).cells


def _heading_index(cells: list[nbformat.NotebookNode], heading: str) -> int:
    """Index of the Markdown cell that has ``heading`` as a line, or -1."""
    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown" and heading in cell.source.splitlines():
            return i
    return -1


def _section(cells: list[nbformat.NotebookNode], start: int) -> list[nbformat.NotebookNode]:
    """Cells from ``start`` up to the next ``## `` heading (exclusive)."""
    out = [cells[start]]
    for cell in cells[start + 1:]:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.M):
            break
        out.append(cell)
    return out


def paragraphs(markdown: str) -> list[str]:
    """Prose blocks of a Markdown cell: blank-line separated, one per list item.

    Code fences (but not directive fences such as ``{admonition}``, whose body is
    prose), tables, headings, display math and directive options are left out.
    """
    blocks: list[list[str]] = [[]]
    code_fence = ""
    directives: list[str] = []
    in_math = False
    for line in markdown.splitlines():
        stripped = line.strip()
        fence = FENCE.match(line)
        if code_fence:
            if fence and fence.group(1) == code_fence and not fence.group(2):
                code_fence = ""
            continue
        if in_math:
            in_math = not stripped.endswith("$$")
            continue
        if fence:
            mark, name = fence.groups()
            if not name and directives and directives[-1] == mark:
                directives.pop()
            elif name.startswith("{") and name not in CODE_DIRECTIVES:
                directives.append(mark)
            else:
                code_fence = mark
            blocks.append([])
            continue
        if stripped.startswith("$$"):
            in_math = not (len(stripped) > 2 and stripped.endswith("$$"))
            blocks.append([])
            continue
        if not stripped or stripped.startswith(("|", "#", ":")):
            blocks.append([])
            continue
        if re.match(r"^\s*(?:[-*+]|\d+[.)])\s", line):
            blocks.append([])
        blocks[-1].append(stripped)
    return [" ".join(b) for b in blocks if b]


def word_count(text: str) -> int:
    return sum(1 for token in text.split() if WORD.search(token))


def test_paragraphs_are_split_as_the_reader_sees_them() -> None:
    """The splitter itself: list items and blank lines separate, code is skipped."""
    text = ("One two.\nthree\n\n- a b\n- c\n\n```python\nx = 1\n```\n"
            "```{admonition} T\n:class: tip\n- inside box\n```\n$$\na + b\n$$\nlast")
    assert paragraphs(text) == ["One two. three", "- a b", "- c", "- inside box", "last"]
    assert word_count("a `b` $c$ -- d") == 4


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_summary_points_name_their_proof(path: Path) -> None:
    cells = _cells(path)
    start = _heading_index(cells, SUMMARY)
    assert start >= 0, f"no {SUMMARY!r} heading"
    text = "\n".join(c.source for c in _section(cells, start) if c.cell_type == "markdown")
    points = [p for p in POINT.split(text)[1:]]
    assert MIN_POINTS <= len(points) <= MAX_POINTS, (
        f"{len(points)} summary points, want {MIN_POINTS}-{MAX_POINTS}"
    )
    unproved = [p[:60] for p in points if not PROOF.search(p)]
    assert not unproved, f"points without a link to their proof: {unproved}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_exercises_have_hidden_solutions_that_can_fail(path: Path) -> None:
    cells = _cells(path)
    summary, start = _heading_index(cells, SUMMARY), _heading_index(cells, EXERCISES)
    assert start >= 0, f"no {EXERCISES!r} heading"
    assert start > summary, "the exercises come after the summary"
    section = _section(cells, start)
    numbers: list[int] = []
    for i, cell in enumerate(section):
        if cell.cell_type != "markdown":
            continue
        found = EXERCISE.findall(cell.source)
        if not found:
            continue
        assert len(found) == 1, "one exercise per Markdown cell (its solution follows it)"
        numbers.append(int(found[0]))
        solution = next((c for c in section[i + 1:] if c.cell_type == "code"), None)
        label = f"Exercise {found[0]}"
        assert solution is not None, f"{label} has no solution cell"
        assert SOLUTION_TAG in solution.metadata.get("tags", []), (
            f"{label}: tag the solution {SOLUTION_TAG!r} so the site hides it"
        )
        assert CAN_FAIL.search(solution.source), f"{label}: the solution asserts nothing"
        assert solution.execution_count is not None, f"{label}: solution never executed"
        errors = [o for o in solution.outputs if o.output_type == "error"]
        assert not errors, f"{label}: the stored solution raised"
    assert MIN_EXERCISES <= len(numbers) <= MAX_EXERCISES, (
        f"{len(numbers)} exercises, want {MIN_EXERCISES}-{MAX_EXERCISES}"
    )
    assert numbers == list(range(1, len(numbers) + 1)), f"exercises numbered {numbers}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_ends_with_the_report_link(path: Path) -> None:
    cells = _cells(path)
    last_md = [c for c in cells if c.cell_type == "markdown"][-1].source
    match = REPORT.search(last_md)
    assert match, "the last Markdown cell must hold '[Discuss or report a problem](URL)'"
    assert match.group("url").startswith(ISSUES_URL), (
        f"the report link must go to {ISSUES_URL}, not {match.group('url')}"
    )
    assert _heading_index(cells, EXERCISES) < cells.index(
        next(c for c in reversed(cells) if c.cell_type == "markdown")
    ), "the report link comes after the exercises"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_no_paragraph_is_too_long(path: Path) -> None:
    long = []
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type != "markdown":
            continue
        for para in paragraphs(cell.source):
            if (n := word_count(para)) > MAX_WORDS:
                long.append(f"cell {i}: {n} words: {para[:50]!r}")
    assert not long, "paragraphs over ~120 words (split them):\n" + "\n".join(long)
