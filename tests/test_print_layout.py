"""Layout rules of ``_ext/static/book.css`` checked in Chromium, apart from the site-wide
browser test: the print rules the whole-book PDF relies on (``make pdf``), and tables on a
laptop screen.

* Print (a page made here, with book.css): each chapter of the single-page book opens a
  page, and a tall SVG figure prints its smallest text at 8 pt or more (shrunk to 170 mm,
  Fig 3.1's 9.5 pt labels printed at 6.3 pt).
* The ``.py`` download of a chapter prints each cell's shown result.
* Desktop (every chapter of ``_build/html`` at 1366 px): no table is wider than its box.
  Code in a cell used to stay on one line, so Tables 8.3 and 12.1 ran 50-80 px past the
  column and cut their last column at the box edge.

The desktop check reads the build (``make book``; ``BOOK_HTML`` names another folder) and
fails without it, as tests/test_browser.py does. Both skip without Playwright or Chromium.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements.txt)"
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import book_pdf  # noqa: E402

CSS = ROOT / "_ext" / "static" / "book.css"
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
CHROMIUM = Path("/usr/bin/chromium")
# A4 less book_pdf's 14 mm side margins, in CSS px: the print layout's column.
PRINT_WIDTH = 688
# Fig 3.1 as matplotlib draws it: 271.7 x 728.64 pt, its smallest labels at 9.5 pt (glyph
# paths under scale(s -s), s = size / 100).
TALL_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="271.7pt" height="728.64pt" '
    'viewBox="0 0 271.7 728.64"><rect width="271.7" height="728.64" fill="#eee"/>'
    '<g transform="translate(20 40) scale(0.095 -0.095)"><path d="M0 0 L60 0 L60 70 Z"/>'
    "</g></svg>"
)
TALL_SRC = "data:image/svg+xml;base64," + base64.b64encode(TALL_SVG.encode()).decode()
PARAGRAPH = "<p>" + "Text of a chapter, long enough to fill some lines. " * 20 + "</p>"
SINGLE_PAGE = f"""<!doctype html><html><head><style>{{css}}</style></head><body>
<div class="bd-article"><section id="intro"><h1>The book</h1>{PARAGRAPH}
<div class="toctree-wrapper">
<span id="document-book/01_math"></span><section id="the-math"><h2>1. The math</h2>
{PARAGRAPH}
<figure><img alt="tall" src="{TALL_SRC}">
<figcaption><p><span class="caption-number">Fig. 3.1 </span>A tall figure.</p></figcaption>
</figure>
</section>
<span id="document-book/02_from_scratch"></span><section id="from-scratch">
<h2>2. From scratch</h2>{PARAGRAPH}</section>
</div></section></div></body></html>"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: run `make system-deps`")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def printed(browser: object) -> object:
    """The single-page sample with book.css, laid out as ``make pdf`` prints it."""
    page = browser.new_page(viewport={"width": PRINT_WIDTH, "height": 1000})
    page.set_content(SINGLE_PAGE.replace("{css}", CSS.read_text(encoding="utf-8")))
    page.emulate_media(media="print")
    page.wait_for_function("() => [...document.images].every(i => i.complete)")
    yield page
    page.close()


def test_each_chapter_opens_a_page_in_print(printed: object) -> None:
    breaks = printed.evaluate(
        "() => [...document.querySelectorAll('span[id^=\"document-\"] + section')]"
        ".map(s => getComputedStyle(s).breakBefore)"
    )
    assert breaks == ["page", "page"], f"chapters' break-before in print: {breaks}"


def test_tall_figure_text_prints_at_8_pt_or_more(printed: object) -> None:
    figures = printed.evaluate(book_pdf.FIGURE_TEXT_JS)
    assert [f["figure"] for f in figures] == ["Fig. 3.1"], figures
    pt = figures[0]["pt"]
    assert pt >= book_pdf.MIN_FIGURE_PT, (
        f"Fig. 3.1's 9.5 pt labels print at {pt:.1f} pt ({figures[0]['heightMm']:.0f} mm "
        "tall): book.css @media print shrinks tall figures too much"
    )


def chapter_pages() -> list[Path]:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no index.html: run `make book` first", pytrace=False)
    pages = sorted((HTML / "book").glob("[0-9][0-9]_*.html"))
    assert pages, f"no chapter pages under {HTML}/book"
    return pages


# Each table (outside API signatures): how far it is wider than its box.
TABLES_JS = """
() => [...document.querySelectorAll('.bd-article table')]
  .filter(t => t.checkVisibility() && !t.closest('.sig, dl.field-list'))
  .map(t => {
    const box = t.closest('div.pst-scrollable-table-container, .table-wrapper')
      || t.parentElement;
    return {caption: (t.caption ? t.caption.textContent : '').trim().slice(0, 40),
            hidden: Math.round(t.getBoundingClientRect().width - box.clientWidth)};
  })
"""


def test_no_table_is_cut_at_1366(browser: object) -> None:
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    cut, seen = [], 0
    try:
        for path in chapter_pages():
            page.goto(path.as_uri(), wait_until="load")
            tables = page.evaluate(TABLES_JS)
            seen += len(tables)
            cut += [f"{path.name}: {t['caption']} ({t['hidden']} px past its box)"
                    for t in tables if t["hidden"] > 1]
    finally:
        page.close()
    assert seen, "no table on any chapter page: the check saw nothing"
    assert not cut, f"tables wider than their box at 1366 px: {cut}"


def test_py_download_displays_each_cells_result() -> None:
    """The ``.py`` download (_ext/book_actions.py) passes a cell's shown result (a Table, a
    figure) to display(), so ``python NN_name.py`` prints the chapter's tables; before,
    86 tables and figures were a bare last expression that a script drops."""
    import ast

    import nbformat

    sys.path.insert(0, str(ROOT / "_ext"))
    from book_actions import notebook_to_py

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |"),
        nbformat.v4.new_code_cell('rows = [["é", 1]]\nTable(["name", "n"], rows,\n'
                                  '      caption="ü")'),
        nbformat.v4.new_code_cell("print(1)"),
        nbformat.v4.new_code_cell("fig;"),
        nbformat.v4.new_code_cell("x = 1"),
    ])
    script = notebook_to_py(nb, "01_math")
    ast.parse(script)
    assert script.count("# %%\n") == 4
    assert 'display(Table(["name", "n"], rows,\n      caption="ü"))' in script
    assert "\nprint(1)\n" in script and "\nfig;\n" in script and "\nx = 1\n" in script
    assert "`python 01_math.py`" in script and "import display" in script
