"""The Records appendix (``book/records.md``, ``book/records/<machine>.md``), written by
``scripts/records_appendix.py`` from the committed records and the chapters' record cells:
up to date, in the table of contents, and linked from the chapters that show only the
reference machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import records_appendix  # noqa: E402

REGENERATE = "run `.venv/bin/python scripts/records_appendix.py`"


@pytest.fixture(scope="module")
def pages() -> dict[Path, str]:
    return records_appendix.pages()


def test_pages_are_up_to_date(pages: dict[Path, str]) -> None:
    stale = [p.relative_to(ROOT).as_posix() for p, text in pages.items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"out of date: {', '.join(stale)}; {REGENERATE}"
    on_disk = set((ROOT / "book" / records_appendix.INDEX).glob("*.md"))
    extra = on_disk - set(pages)
    assert not extra, f"pages of no machine: {sorted(p.name for p in extra)}; delete them"


def test_every_page_is_in_the_toc(pages: dict[Path, str]) -> None:
    toc = (ROOT / "_toc.yml").read_text()
    missing = [p for p in pages
               if f"file: {p.relative_to(ROOT).with_suffix('').as_posix()}\n" not in toc]
    assert not missing, f"not in _toc.yml: {missing}"


def test_each_machine_page_holds_every_chapter_with_records(pages: dict[Path, str]) -> None:
    machine_pages = [t for p, t in pages.items() if p.parent.name == records_appendix.INDEX]
    assert machine_pages
    for text in machine_pages:
        for chapter in ("07_backends_performance", "10_determinism_accuracy"):
            assert f"{{doc}}`../{chapter}`" in text


@pytest.mark.parametrize("chapter", ["07_backends_performance", "09_beyond",
                                     "10_determinism_accuracy"])
def test_chapters_link_to_the_appendix(chapter: str) -> None:
    text = (ROOT / "book" / f"{chapter}.ipynb").read_text()
    assert "{doc}`Records appendix <records>`" in text
