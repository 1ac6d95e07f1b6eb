"""The reader's PDF (``make pdf``): printed whole, with no near-blank page.

Builds the single-page book into a temporary folder and prints it with the system
Chromium, as ``make pdf`` does; ``scripts/book_pdf.py`` itself refuses web controls that
would print, code boxes cut at the page edge and near-blank pages. The near-blank check is
first shown to catch a page that is one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyter_book", reason="jupyter-book is not installed: no book to print")
pytest.importorskip("pypdf")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import book_pdf  # noqa: E402

PARAGRAPH = "<p>" + "A line of the book's text, long enough to fill pages. " * 60 + "</p>"


def print_html(html: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(book_pdf.CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.set_content(html)
            page.pdf(path=str(out), format="A4")
        finally:
            browser.close()


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
    assert book_pdf.main(["--path-output", str(tmp_path), "--out", str(out)]) == 0
    from pypdf import PdfReader

    pages = len(PdfReader(str(out)).pages)
    assert pages > 100, f"the book printed to {pages} pages"
    assert book_pdf.near_blank_pages(out) == []
