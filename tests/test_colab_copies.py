"""The Colab copies of the chapters (``colab/``, written by ``scripts/colab_copies.py``).

Each copy must exist, be up to date with its chapter, carry no MyST syntax (Colab shows it
as raw text), and keep the chapter's code cells exactly. The converter itself is checked on
a sample of every construct the chapters use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import colab_copies  # noqa: E402
from toc_notebooks import toc_notebooks  # noqa: E402

CHAPTERS = toc_notebooks()
REGENERATE = "run `.venv/bin/python scripts/colab_copies.py` (after `make book`)"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def included_file(rel: str) -> Path:
    """A file a chapter inlines, by its path in the repository. convlab's own files are
    read from the convlab that is imported: the checkout's, or an installed wheel's (which
    carries ``convlab/aten/csrc/*.cpp`` as package data, pyproject.toml), as on Colab and
    in ``make installed``, where the checkout's ``convlab/`` is gone."""
    if rel.startswith("convlab/"):
        import convlab

        return Path(convlab.__file__).resolve().parent / rel.removeprefix("convlab/")
    return ROOT / rel


def copy_of(source: Path) -> nbformat.NotebookNode:
    path = colab_copies.copy_path(source)
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: {REGENERATE}"
    return read(path)


def markdown_texts(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(where, text) of every Markdown cell and every Markdown output."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found.append((f"cell {i}", cell.source))
        for output in cell.get("outputs", []):
            if "text/markdown" in output.get("data", {}):
                found.append((f"cell {i} output", output["data"]["text/markdown"]))
    return found


def test_every_chapter_has_a_copy_and_nothing_else_is_there() -> None:
    assert CHAPTERS, "no notebook in _toc.yml"
    wanted = {colab_copies.copy_path(p).name for p in CHAPTERS}
    present = {p.name for p in colab_copies.OUT_DIR.glob("*.ipynb")}
    assert wanted - present == set(), f"missing copies {sorted(wanted - present)}: {REGENERATE}"
    assert present - wanted == set(), f"copies of no chapter: {sorted(present - wanted)}"


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_copy_is_up_to_date(source: Path) -> None:
    meta = copy_of(source).metadata.get(colab_copies.META_KEY, {})
    assert meta.get("source") == source.relative_to(ROOT).as_posix()
    assert meta.get("source_sha256") == colab_copies.sha256(source), (
        f"{source.name} changed after its Colab copy was written: {REGENERATE}"
    )
    for rel, digest in meta.get("included_sha256", {}).items():
        assert colab_copies.sha256(included_file(rel)) == digest, (
            f"{rel}, which {source.name} includes, changed after the copy was written: "
            f"{REGENERATE}")


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_copy_has_no_myst_syntax(source: Path) -> None:
    problems = [
        f"{where}: {kind}: ...{text[max(m.start() - 30, 0) : m.end() + 30]!r}"
        for where, text in markdown_texts(copy_of(source))
        for kind, pattern in colab_copies.MYST_LEFTOVERS.items()
        for m in pattern.finditer(text)
    ]
    assert not problems, "\n".join(problems[:30])


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_copy_keeps_the_code_cells(source: Path) -> None:
    """Same code, tags and outputs (only Markdown outputs are converted)."""
    original, copy = read(source), copy_of(source)
    code = [c for c in original.cells if c.cell_type == "code"]
    copied = [c for c in copy.cells if c.cell_type == "code"]
    assert len(copied) == len(code), f"{len(copied)} code cells, the chapter has {len(code)}"
    assert len(copy.cells) == len(original.cells)
    for i, (a, b) in enumerate(zip(code, copied, strict=True)):
        assert b.source == a.source, f"code cell {i} differs"
        assert b.metadata.get("tags", []) == a.metadata.get("tags", []), f"code cell {i} tags"
        assert len(b.get("outputs", [])) == len(a.get("outputs", []))
        for out_a, out_b in zip(a.get("outputs", []), b.get("outputs", []), strict=True):
            keys = set(out_a.get("data", {})) - {"text/markdown"}
            for key in keys:
                assert out_b["data"][key] == out_a["data"][key], f"code cell {i}: {key}"
            assert out_b.get("text") == out_a.get("text"), f"code cell {i}: stream text"


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_copy_links_point_at_pages_of_the_book(source: Path) -> None:
    """Every link into the site names a page the book builds (a toc source file exists)."""
    import re

    problems = []
    for where, text in markdown_texts(copy_of(source)):
        for url in re.findall(r"\]\((https?://[^)\s]+)\)", text):
            if not url.startswith(colab_copies.SITE):
                continue
            page = urlsplit(url).path[len(urlsplit(colab_copies.SITE).path):]
            stem = ROOT / page.removesuffix(".html")
            if not any(stem.with_suffix(s).is_file() for s in (".ipynb", ".md")):
                problems.append(f"{where}: {url}")
    assert not problems, "\n".join(problems[:30])


INVENTORY = {
    "std:term": {"finput": ("book/glossary.html#term-finput", "finput")},
    "std:label": {"copy-box": ("book/05_calling_native.html#copy-box", "Copy this")},
    "std:doc": {
        "book/02_from_scratch": ("book/02_from_scratch.html", "From scratch"),
        "book/bibliography": ("book/bibliography.html", "Bibliography"),
    },
    "py:function": {
        "convlab.scratch.reference.convolution_backward": (
            "book/api/reference.html#convlab.scratch.reference.convolution_backward", "-"),
    },
}
SAMPLE = """(sec-start)=
# Title

A {term}`buffer <finput>`, {term}`finput`, {doc}`02_from_scratch`, {ref}`copy-box`,
{py:func}`~convlab.scratch.reference.convolution_backward`, {cite}`pr64280,pr70661`,
and [next](02_from_scratch.ipynb#loops).

$$ a = b $$ (eq-one)

```{admonition} What we saw
:class: tip
- one {term}`finput`
```

:::{note}
A note.
:::

```python
x = "{term}`kept`"
```"""


def test_converter_turns_every_construct_into_markdown() -> None:
    converter = colab_copies.Converter(INVENTORY, "book/01_math", lambda p: "")
    text = converter.markdown(SAMPLE)
    site = colab_copies.SITE
    assert not converter.unresolved
    assert "(sec-start)=" not in text and "(eq-one)" not in text
    assert f"[buffer]({site}book/glossary.html#term-finput)" in text
    assert f"[finput]({site}book/glossary.html#term-finput)" in text
    assert f"[From scratch]({site}book/02_from_scratch.html)" in text
    assert f"[Copy this]({site}book/05_calling_native.html#copy-box)" in text
    assert f"[`convolution_backward()`]({site}book/api/reference.html#" in text
    assert f"[[pr64280]]({site}book/bibliography.html)" in text
    assert f"[next]({site}book/02_from_scratch.html#loops)" in text
    assert "> **What we saw**" in text and f"> - one [finput]({site}" in text
    assert "> **Note**\n>\n> A note." in text
    assert 'x = "{term}`kept`"' in text  # code blocks are copied untouched


def test_converter_reports_what_it_cannot_resolve() -> None:
    converter = colab_copies.Converter(INVENTORY, "book/01_math", lambda p: "")
    text = converter.markdown("{term}`nothing` and {py:func}`convlab.nope`")
    assert text == "nothing and `convlab.nope()`"
    assert converter.unresolved == ["term:nothing", "py:func:convlab.nope"]


def test_literalinclude_keeps_only_the_lines_it_names() -> None:
    source = "one\nstart here\ntwo\nthree\nstop here\nfour\n"
    converter = colab_copies.Converter(INVENTORY, "book/05_calling_native",
                                       lambda p: source)
    text = converter.markdown(
        "```{literalinclude} ../x.cpp\n:language: cpp\n:start-after: start here\n"
        ":end-before: stop here\n```\n")
    assert "```cpp\ntwo\nthree\n```" in text and "one" not in text and "four" not in text
    assert not converter.unresolved
    converter.markdown("```{literalinclude} ../x.cpp\n:end-before: missing\n```\n")
    assert converter.unresolved == ["literalinclude x.cpp end-before: missing"]


def test_inlined_files_are_fingerprinted() -> None:
    """Chapter 5 inlines the extension's source: its copy must go stale when that does."""
    (ch5,) = [p for p in CHAPTERS if p.name.startswith("05_")]
    meta = copy_of(ch5).metadata[colab_copies.META_KEY]
    assert "convlab/aten/csrc/convlab_ext.cpp" in meta["included_sha256"]
