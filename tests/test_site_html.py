"""The built site's files, read without a browser: links, downloads, search ranking, print.

Like ``tests/test_browser.py`` these need ``make book`` first and fail (they do not skip)
when ``_build/html`` is missing; where the book's toolchain is not installed (``make
compat``, which installs only the test tools) the site cannot be built, and they skip.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

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


def test_search_page_alone_loads_the_chapter_data() -> None:
    """_ext/book_search.py: search.html loads _static/search_data.js (titles, headings and
    word weights of every chapter, the glossary's links to chapters); other pages do not."""
    found = pages()
    search = (HTML / "search.html").read_text(encoding="utf-8")
    assert "_static/search_data.js" in search, "search.html does not load search_data.js"
    text = (HTML / "_static" / "search_data.js").read_text(encoding="utf-8")
    data = json.loads(text.removeprefix("var BOOK_SEARCH = ").rstrip().rstrip(";"))
    chapters = [n for n in data["pages"] if re.match(r"book/\d\d_", n)]
    assert len(chapters) == len(chapter_names()), f"search data for {len(chapters)} chapters"
    assert all(data["pages"][n]["headings"] for n in chapters), "a chapter without headings"
    assert data["words"], "no word weights"
    loading = [p.name for p in found if p.name != "search.html"
               and "search_data.js" in p.read_text(encoding="utf-8")]
    assert not loading, f"pages that load the search data for nothing: {loading[:5]}"


def test_downloaded_notebooks_fold_the_solutions() -> None:
    """Each chapter's Colab copy (the download) folds its three exercise solutions: Colab's
    hidden code (cellView: form) and the nbformat flags JupyterLab reads."""
    import colab_copies

    pages()
    problems = []
    for name in chapter_names():
        nb = nbformat.read(DOWNLOADS / f"{name}.ipynb", as_version=4)
        found = colab_copies.solution_cells(nb)
        if len(found) != 3:
            problems.append(f"{name}: {len(found)} solution cells, not 3")
        for i in found:
            meta = nb.cells[i].metadata
            if meta.get("cellView") != "form" or not meta.get("jupyter", {}).get(
                    "source_hidden") or not meta.get("jupyter", {}).get("outputs_hidden"):
                problems.append(f"{name}: cell {i} is a solution but not folded: {dict(meta)}")
    assert not problems, "\n".join(problems)


def test_issue_button_names_the_page() -> None:
    """The "Open issue" button's new issue names the page, not "Your issue content here."."""
    problems = []
    for path in pages():
        page = path.relative_to(HTML).as_posix()
        for href in re.findall(r'href="([^"]*/issues/new[^"]*)"', path.read_text("utf-8")):
            body = unquote(href.replace("&amp;", "&").split("&body=", 1)[-1])
            if "Your issue content here" in body or page not in body:
                problems.append(f"{page}: issue body {body[:60]!r}")
    assert not problems, "\n".join(problems[:20])


def test_header_ipynb_download_is_the_clean_notebook() -> None:
    """On a chapter the header's ".ipynb" download is ``downloads/NN.ipynb`` (the notebook
    the labelled button gives), not the MyST source under ``_sources/``."""
    pages()
    problems = []
    for name in chapter_names():
        page = HTML / "book" / f"{name}.html"
        html = page.read_text(encoding="utf-8")
        if f"_sources/book/{name}.ipynb" in html:
            problems.append(f"{name}: links _sources/book/{name}.ipynb")
        if f'href="../downloads/{name}.ipynb"' not in html:
            problems.append(f"{name}: no link to downloads/{name}.ipynb")
    assert not problems, "\n".join(problems)


MACHINE = re.compile(r"x\d+ \(L\d [\d.]+ [KMG]iB, family \d+ model \d+\), ATen \w+, oneDNN ")


def _output_text(cell: nbformat.NotebookNode) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.outputs)


def _live_cells_with_output(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.outputs
            and "nbval-ignore-output" in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: p.stem)
def test_every_live_output_names_the_machine_it_ran_on(path: Path) -> None:
    """Each stored output that depends on the machine (an ``nbval-ignore-output`` cell)
    names the machine that ``make notebooks`` stored for that chapter (model, cores,
    last-level cache, cpuid family and model, ISA): in its own output ("this machine:
    ...", :func:`convlab.lab.method.machine.stamp`) or in "Stored output: <machine>" under
    it on the page (``_ext/book_ran_on.py``), never both."""
    nb = nbformat.read(path, as_version=4)
    live = _live_cells_with_output(nb)
    printed = [" ".join(_output_text(c).split()) for c in live]
    printed = [t[t.index("this machine: ") + 14:] for t in printed if "this machine: " in t]
    page = (HTML / "book" / f"{path.stem}.html").read_text(encoding="utf-8")
    stamps = re.findall(r'<p class="ran-on">Stored output: ([^<]*)</p>', page)
    assert len(stamps) + len(printed) == len(live), (path.stem, len(stamps), len(printed))
    if live:
        ran_on = nb.metadata.get("convlab", {}).get("ran_on", "")
        assert MACHINE.search(ran_on), f"{path.stem}: run it with `make notebooks`: {ran_on!r}"
        name = ran_on[:ran_on.index("),") + 1]
        assert all(text.startswith(name) for text in printed), (path.stem, name, printed)
        assert set(stamps) <= {ran_on.replace("&", "&amp;")}
