"""The reader's PDF (``make pdf``): printed whole, with no near-blank page, chapters that
open a page, an outline with the chapters at its top level, and no link to the print
server or a local file.

Builds the single-page book into the book's own ``_build`` (as ``make pdf`` does: after
``make book`` Sphinx reuses that build's parsed pages, so this writes the page in about a
minute instead of reading every notebook again) and prints it to a temporary file with the
system Chromium; ``scripts/book_pdf.py`` itself refuses web controls that
would print, code boxes cut at the page edge, figure text under 8 pt, near-blank pages,
links to 127.0.0.1 or a file, chapters that start below a page's top and an outline whose
top level is not the book's title and its chapters. Each PDF check is first shown to catch
what it looks for, in small PDFs printed here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyter_book", reason="jupyter-book is not installed: no book to print")
pytest.importorskip("pypdf")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import book_pdf  # noqa: E402
from toc_notebooks import toc_files  # noqa: E402

PARAGRAPH = "<p>" + "A line of the book's text, long enough to fill pages. " * 60 + "</p>"


def print_html(html: str, out: Path) -> None:
    """Print ``html`` as ``make pdf`` prints the book (A4, its margins, an outline)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(book_pdf.CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.set_content(html)
            page.pdf(path=str(out), format="A4", outline=True, tagged=True,
                     margin={"top": "16mm", "bottom": "16mm", "left": "14mm",
                             "right": "14mm"})
        finally:
            browser.close()


def test_local_links_finds_links_to_the_print_server_and_files(tmp_path: Path) -> None:
    pdf = tmp_path / "links.pdf"
    print_html('<p><a href="http://127.0.0.1:38157/_images/fig.svg">a figure</a> '
               '<a href="file:///tmp/x.html">a file</a> '
               '<a href="https://conv-backward.github.io/conv-backward-book/">the site</a> '
               '<a href="#here">here</a></p><p id="here">Here.</p>', pdf)
    assert [uri for _, uri in book_pdf.local_links(pdf)] == [
        "http://127.0.0.1:38157/_images/fig.svg", "file:///tmp/x.html"]


def test_outline_and_chapter_starts_are_checked(tmp_path: Path) -> None:
    """A chapter nested under the book's title, starting mid-page (as the single page
    printed before), fails every check; one at the top level on its own page passes."""
    brk = "break-before: page"
    nested = tmp_path / "nested.pdf"
    print_html(f"<h1>The book</h1>{PARAGRAPH}<h2>1. The math</h2>{PARAGRAPH}"
               f"<h2>2. From scratch</h2>{PARAGRAPH}", nested)
    assert [(d, t) for d, t, _, _ in book_pdf.outline(nested)] == [
        (0, "The book"), (1, "1. The math"), (1, "2. From scratch")]
    assert book_pdf.late_starts(nested) == []  # no chapter at the top level to check
    problems = book_pdf.check_pdf(nested, ["The book", "1. The math", "2. From scratch"])
    assert len(problems) == 1 and problems[0].startswith("outline's top level"), problems
    mid = tmp_path / "mid.pdf"
    print_html(f"<h1>The book</h1>{PARAGRAPH}<h1>1. The math</h1>{PARAGRAPH}", mid)
    assert book_pdf.late_starts(mid) == [("1. The math", 1)]
    good = tmp_path / "good.pdf"
    print_html(f"<h1>The book</h1>{PARAGRAPH}<h1 style='{brk}'>1. The math</h1>{PARAGRAPH}"
               f"<h1 style='{brk}'>2. From scratch</h1>{PARAGRAPH}", good)
    assert book_pdf.check_pdf(good, ["The book", "1. The math", "2. From scratch"]) == []


def test_a_chapters_short_last_page_is_not_near_blank_but_an_empty_one_is(
        tmp_path: Path) -> None:
    brk = "break-before: page"
    short = tmp_path / "short.pdf"
    print_html(f"<h1>The book</h1>{PARAGRAPH}<p>A short tail.</p>"
               f"<h1 style='{brk}'>1. The math</h1>{PARAGRAPH}", short)
    assert book_pdf.near_blank_pages(short) == []
    empty = tmp_path / "empty.pdf"
    print_html(f"<h1>The book</h1>{PARAGRAPH}<div style='{brk}'></div>"
               f"<h1 style='{brk}'>1. The math</h1>{PARAGRAPH}", empty)
    assert book_pdf.near_blank_pages(empty) == [2]


def test_near_blank_pages_finds_a_mostly_empty_page(tmp_path: Path) -> None:
    brk = '<div style="break-after: page"></div>'
    pdf = tmp_path / "three.pdf"
    print_html(f"{PARAGRAPH}{brk}<p>A short tail.</p>{brk}{PARAGRAPH}{brk}{PARAGRAPH}", pdf)
    assert book_pdf.near_blank_pages(pdf) == [2]
    captioned = tmp_path / "figure.pdf"
    print_html(f"{PARAGRAPH}{brk}<p>Fig. 3.1 A drawing.</p>{brk}{PARAGRAPH}", captioned)
    assert book_pdf.near_blank_pages(captioned) == []


def test_the_book_prints_with_no_near_blank_page(tmp_path: Path) -> None:
    out = tmp_path / "book.pdf"
    assert book_pdf.main(["--out", str(out)]) == 0
    from pypdf import PdfReader

    pages = len(PdfReader(str(out)).pages)
    # The reader's PDF is the chapters, not every record (they stay on the site), printed
    # at a book's type sizes (book.css @media print): at most 350 A4 pages.
    assert 100 < pages <= 350, f"the book printed to {pages} pages"
    assert book_pdf.near_blank_pages(out) == []
    assert book_pdf.local_links(out) == []
    assert book_pdf.late_starts(out) == []
    top = [title for depth, title, _, _ in book_pdf.outline(out) if depth == 0]
    chapters = [t for t in top if t[:1].isdigit()]
    numbered = [f for f in toc_files() if re.match(r"book/\d\d_", f)]
    assert [int(t.split(".")[0]) for t in chapters] == list(range(1, len(numbered) + 1)), top
    assert "Solutions" not in top and "Contents" not in top, top
    # The online-only parts each leave one note (title and address), none of their pages.
    assert {"Records", "API reference"} <= set(top), top
    text = " ".join(" ".join(page.extract_text().split())
                    for page in PdfReader(str(out)).pages)
    # Each Records page names the script that writes it (5 times in a PDF that had them).
    assert "records_appendix.py" not in text
    assert all("  " not in t and "inPyTorch" not in t for t in top), top
