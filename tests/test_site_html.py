"""The built site's files, read without a browser: links, downloads, search ranking, print.

Like ``tests/test_browser.py`` these need ``make book`` first and fail (they do not skip)
when ``_build/html`` is missing; where the book's toolchain is not installed (``make
compat``, which installs only the test tools) the site cannot be built, and they skip.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
import yaml

pytest.importorskip("jupyter_book", reason="jupyter-book is not installed: no site to read")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_notebooks  # noqa: E402

HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
# A bare dotted name as a link's whole text ("torch.mm", "x.yz"): what MyST's linkify made
# into http://torch.mm. A link the source wrote shows its own text or a full URL.
BARE_NAME = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+$")
DOWNLOADS = HTML / "downloads"
ZIP = DOWNLOADS / "convlab-book-notebooks.zip"


class _Links(HTMLParser):
    """``(href, text)`` of every ``<a href>`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._open: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open.append([dict(attrs).get("href") or "", ""])

    def handle_data(self, data: str) -> None:
        for link in self._open:
            link[1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open:
            href, text = self._open.pop()
            if href:
                self.links.append((href, text.strip()))


def autolinked_names(page_html: str) -> list[str]:
    """Links whose text is a bare dotted name and whose target is that name as a host."""
    parser = _Links()
    parser.feed(page_html)
    found = []
    for href, text in parser.links:
        if BARE_NAME.match(text) and re.match(
            rf"^https?://{re.escape(text)}/?$", href, re.I
        ):
            found.append(f"{text} -> {href}")
    return found


def pages() -> list[Path]:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no index.html: run `make book` first", pytrace=False)
    return sorted(
        p for p in HTML.rglob("*.html") if not NOT_PAGES & set(p.relative_to(HTML).parts)
    )


def test_the_autolink_detector_finds_what_linkify_made() -> None:
    """Guards the check below: the markup linkify wrote for ch7's "82.9 (torch.mm)"."""
    linkified = ('<td>82.9 (<a class="reference external" href="http://torch.mm">'
                 "torch.mm</a>)</td>")
    written = ('<a class="reference external" href="https://pytorch.org/docs/stable/'
               'generated/torch.mm.html">torch.mm</a> <a href="https://pytorch.org">'
               "https://pytorch.org</a>")
    assert autolinked_names(linkified) == ["torch.mm -> http://torch.mm"]
    assert autolinked_names(written) == []


def test_no_bare_dotted_name_is_autolinked() -> None:
    problems = [
        f"{page.relative_to(HTML)}: {link}"
        for page in pages()
        for link in autolinked_names(page.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not problems, "\n".join(problems[:30])


def test_linkify_is_off() -> None:
    """A bare ``x.yz`` in a table or output must stay text: MyST's linkify is not enabled."""
    extensions = CONFIG["parse"]["myst_enable_extensions"]
    assert "linkify" not in extensions, "linkify turns bare dotted names into links"


def chapter_names() -> list[str]:
    return [p.stem for p in toc_notebooks()]


def test_every_chapter_has_its_notebook_and_py_download() -> None:
    pages()
    problems = []
    for name in chapter_names():
        notebook, script = DOWNLOADS / f"{name}.ipynb", DOWNLOADS / f"{name}.py"
        if not notebook.is_file() or not script.is_file():
            problems.append(f"{name}: missing {notebook.name} or {script.name}")
            continue
        if notebook.read_bytes() != (ROOT / "colab" / f"{name}.ipynb").read_bytes():
            problems.append(f"{name}: the download is not the chapter's Colab copy")
        nb = nbformat.read(notebook, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        text = script.read_text(encoding="utf-8")
        try:
            ast.parse(text)
        except SyntaxError as error:
            problems.append(f"{name}.py does not parse: {error}")
        if text.count("# %%\n") != len(code):
            problems.append(f"{name}.py has {text.count('# %%')} code cells, not {len(code)}")
    assert not problems, "\n".join(problems)


def test_the_zip_holds_every_chapter_notebook_and_script() -> None:
    pages()
    assert ZIP.is_file(), f"{ZIP} was not written by the build"
    with zipfile.ZipFile(ZIP) as archive:
        names = set(archive.namelist())
        assert archive.testzip() is None
    want = {f"convlab-book/{n}{ext}" for n in chapter_names() for ext in (".ipynb", ".py")}
    assert want <= names, f"missing from the zip: {sorted(want - names)[:5]}"


def test_search_page_carries_the_book_scorer() -> None:
    """Sphinx inlines html_search_scorer into language_data.js (search.html loads it)."""
    pages()
    data = (HTML / "_static" / "language_data.js").read_text(encoding="utf-8")
    assert "var Scorer" in data and "book/glossary" in data, "the search scorer is missing"
