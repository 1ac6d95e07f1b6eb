"""The Records appendix: one MyST page per machine, every section the chapters render from
the committed records (``book/data/records``), written to ``book/records/<machine>.md``,
with ``book/records.md`` listing them.

Chapters 7, 9 and 10 show one reference machine (:mod:`convlab.lab.record.record_pages`); this
script runs the same ``from-records`` cells of chapters 7, 9 and 10 once per machine,
with :func:`convlab.lab.record.records.load_records` returning only that machine's records and
:func:`convlab.lab.record.record_pages.appendix_scope` on, and writes what they print and display.
The rendering code stays in the chapters: nothing here formats a record.

The pages are committed (``make book`` needs no extra step);
``tests/test_records_appendix.py`` fails when they are out of date.

Usage: python scripts/records_appendix.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ["07_backends_performance", "09_beyond", "10_determinism_accuracy"]
TAG = "from-records"
INDEX = "records"  # book/records.md; the pages in book/records/


class Sink(io.TextIOBase):
    """What a cell printed and displayed, in order: ("text", str) and ("obj", object)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self._text = io.StringIO()

    def write(self, s: str) -> int:
        return self._text.write(s)

    def _flush_text(self) -> None:
        text = self._text.getvalue()
        if text.strip():
            self.items.append(("text", text))
        self._text = io.StringIO()

    def display(self, *objs: Any, **_: Any) -> None:
        for obj in objs:
            self._flush_text()
            self.items.append(("obj", obj))

    def done(self) -> list[tuple[str, Any]]:
        self._flush_text()
        return self.items


def run_cell(source: str, ns: dict[str, Any], sink: Sink) -> None:
    """Execute one cell like a kernel: the value of a last bare expression is displayed."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    with contextlib.redirect_stdout(sink):
        exec(compile(tree, "<cell>", "exec"), ns)  # noqa: S102 - the chapter's own code
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)  # noqa: S307
            if value is not None:
                sink.display(value)


def heading_of(cell: nbformat.NotebookNode) -> str | None:
    """The last heading (without #) of a markdown cell, or None."""
    heads = [line.lstrip("#").strip() for line in cell.source.splitlines()
             if re.match(r"#{1,4} ", line)]
    return heads[-1] if heads else None


def chapter_sections(name: str, recs: list[Any]) -> tuple[str, list[tuple[str, list]]]:
    """The chapter's title and, per section heading, the outputs of its from-records cells
    run on ``recs`` only."""
    import matplotlib

    matplotlib.use("Agg")
    import IPython.display
    import matplotlib.pyplot as plt

    from convlab.lab.record import record_pages, records

    nb = nbformat.read(ROOT / "book" / f"{name}.ipynb", as_version=4)
    title = heading_of(nb.cells[0]) or name
    code = [c for c in nb.cells if c.cell_type == "code"]
    ns: dict[str, Any] = {"__name__": "__appendix__"}
    current = [Sink()]  # the sink of the cell running now
    sections: list[tuple[str, list]] = []
    heading = title
    saved = records.load_records, IPython.display.display
    records.load_records = lambda *a, **k: list(recs)
    # A cell's own `from IPython.display import display` gets the sink too.
    IPython.display.display = lambda *objs, **kw: current[0].display(*objs, **kw)
    try:
        with record_pages.appendix_scope():
            for cell in nb.cells:
                if cell.cell_type == "markdown":
                    heading = heading_of(cell) or heading
                    continue
                tagged = TAG in cell.metadata.get("tags", [])
                if cell is not code[1] and not tagged:
                    continue  # code[1]: the imports and setup() every chapter has
                sink = current[0] = Sink()
                ns["display"] = sink.display
                run_cell(cell.source, ns, sink)
                plt.close("all")
                ns["device"] = "cpu"  # the records are CPU runs, on a GPU machine too
                if tagged:
                    if not sections or sections[-1][0] != heading:
                        sections.append((heading, []))
                    sections[-1][1].extend(sink.done())
    finally:
        records.load_records, IPython.display.display = saved
    return title, sections


# On a phone a table stacks one card per row, one line per column: a part holds at most
# PHONE_LINES lines of cards (measured: about 47 px a line, so 150 lines are 8-9 screens of
# 844 px, under the 10-screen target).
PHONE_LINES = 150


def parts(table: Any) -> list[Any]:
    """``table`` (a :class:`convlab.lab.notebook.Table`) in parts of at most PHONE_LINES
    card lines, each captioned 'part i of n'; the table itself when it fits."""
    from convlab.lab.notebook import Table

    per_part = max(1, PHONE_LINES // (len(table.headers) + 1))
    if len(table.rows) <= per_part:
        return [table]
    chunks = [table.rows[i:i + per_part] for i in range(0, len(table.rows), per_part)]
    return [Table(table.headers, rows,
                  caption=f"{table.caption or 'Table'} (part {k} of {len(chunks)})")
            for k, rows in enumerate(chunks, 1)]


def render(items: list[tuple[str, Any]]) -> list[str]:
    out = []
    for kind, value in items:
        if kind == "text":
            out += ["```text", value.rstrip("\n"), "```", ""]
        elif hasattr(value, "headers") and hasattr(value, "rows"):
            if not value.rows:
                continue  # a machine without that section: its text says so
            for part in parts(value):
                out += [part._repr_markdown_(), ""]
        elif hasattr(value, "_repr_markdown_"):
            out += [value._repr_markdown_(), ""]
        elif hasattr(value, "savefig"):
            continue  # a figure: the chapters show the reference machine's
        else:
            out += ["```text", repr(value), "```", ""]
    return out


def machine_page(slug: str, recs: list[Any]) -> str:
    from convlab.lab.method import machine
    from convlab.lab.record import record_method

    name = recs[0].machine_name
    lines = [f"({INDEX}-{slug})=", f"# {name}", "",
             "Generated by `scripts/records_appendix.py` from this machine's committed "
             f"records (`book/data/records/{slug}__*.json`): the chapters' record cells, "
             "run on this machine's records only. Do not edit; run the script.", ""]
    lines += [f"- {r.isa_name}: {machine.fingerprint_line(r.fingerprint)}, measured "
              f"{r.created}" for r in recs]
    lines += ["", "## How the records were taken", "",
              "Per timed section: the method (the earlier one ran each section in one "
              "process), the within-run A/A band (two candidates of the same kernel inside "
              "one process), the between-process spread of the section's ratios (of its "
              "GF/s where it has no ratio; the same section in fresh processes) and how "
              "busy the machine was while it ran.", ""]
    lines += render([("obj", record_method.taken_table(recs))])
    for chapter in CHAPTERS:
        title, sections = chapter_sections(chapter, recs)
        if not any(items for _, items in sections):
            continue
        lines += [f"## {title}", "", f"From {{doc}}`../{chapter}`.", ""]
        for heading, items in sections:
            if items:
                lines += [f"### {heading}" if heading != title else "### Records", ""]
                lines += render(items)
    return "\n".join(lines).rstrip("\n") + "\n"


def pages() -> dict[Path, str]:
    """Every page of the appendix: ``{path: text}``."""
    from convlab.lab.record import record_pages, records

    every = records.load_records()
    by: dict[str, list[Any]] = {}
    for r in every:
        by.setdefault(r.machine, []).append(r)
    ref = record_pages.REFERENCE_MACHINE
    index = ["(records-appendix)=", "# Records", "",
             "Every measurement the chapters render from the committed records "
             "(`book/data/records`, written by `make records`), one page per machine and "
             "every section. Chapters 7, 9 and 10 show the reference machine"
             + (f", {by[ref][0].machine_name}," if ref in by else "")
             + " and link here for the others.", ""]
    out: dict[Path, str] = {}
    for slug, recs in by.items():
        out[ROOT / "book" / INDEX / f"{slug}.md"] = machine_page(slug, recs)
        index.append(f"- {{doc}}`{INDEX}/{slug}`: {len(recs)} record(s), "
                     + ", ".join(r.isa_name for r in recs))
    out[ROOT / "book" / f"{INDEX}.md"] = "\n".join(index) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a page differs from what the records give")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    print(("stale: " if args.check else "written: ") + (", ".join(stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
