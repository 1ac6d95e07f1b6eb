"""Local Sphinx extension: labelled buttons that say what they do, and the files they get.

The theme hides Colab behind a rocket icon and labels its print button ".pdf" (it prints the
current page). Under each chapter's title this adds a row of labelled links: "Run on Colab",
"Download notebook", "Download .py", "All notebooks (.zip)" and, when ``make pdf`` has
written it, "Whole book (PDF)"; the landing page gets the two whole-book links. The print
button of the theme's download menu reads "Print this page".

The files are written by the ``html`` build (``make book``) into ``_build/html/downloads/``:
each chapter's Colab copy (``colab/NN_name.ipynb``: plain Markdown, no MyST syntax, so it
reads well in any Jupyter), a ``.py`` copy in the percent format (``# %%`` cells; IPython
magics become ``get_ipython()`` calls, so the file parses as Python; a cell's shown result,
a ``Table`` or a figure, goes to ``display()``, so ``python NN_name.py`` prints the tables),
and one zip of them all.

Enabled in ``_config.yml`` under ``sphinx: local_extensions``.
"""

from __future__ import annotations

import ast
import html
import re
import zipfile
from pathlib import Path
from typing import Any

import nbformat
from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parent.parent
COLAB = ROOT / "colab"
BOOK_PDF = ROOT / "_build" / "pdf" / "book.pdf"
DOWNLOADS = "downloads"
ZIP_NAME = "convlab-book-notebooks.zip"
# A fixed timestamp for the zip entries: the same sources give the same bytes.
ZIP_DATE = (2026, 1, 1, 0, 0, 0)
MAGIC = re.compile(r"^(?P<indent>\s*)(?P<kind>%%?|!)(?P<name>\w*)\s?(?P<rest>.*)$")
H1_END = re.compile(r"</h1>")


def chapter_names(app: Sphinx) -> dict[str, str]:
    """Docname -> file name (``book/03_dispatch`` -> ``03_dispatch``) of the chapters that
    have a Colab copy: the notebooks of the book."""
    found = {}
    for docname in sorted(app.env.found_docs):
        name = Path(docname).name
        if (ROOT / f"{docname}.ipynb").is_file() and (COLAB / f"{name}.ipynb").is_file():
            found[docname] = name
    return found


def _magic_line(line: str) -> str:
    """``%pip install x`` -> ``get_ipython().run_line_magic('pip', 'install x')`` (and ``!``)."""
    match = MAGIC.match(line)
    if not match:
        return line
    indent, kind = match["indent"], match["kind"]
    if kind == "!":
        command = f"{match['name']} {match['rest']}".strip()
        return f"{indent}get_ipython().system({command!r})"
    if kind == "%%":  # a cell magic cannot run from a script: keep it as a comment
        return f"{indent}# {line.strip()}"
    return f"{indent}get_ipython().run_line_magic({match['name']!r}, {match['rest']!r})"


# The script's first lines: what the file is, and the display() its cells' results go to.
PY_HEADER = """\
# A chapter of "Convolution backward in PyTorch, from the inside" as a percent-format
# script: each "# %%" starts a cell (VS Code, PyCharm and Jupytext open it as a notebook),
# the text is in comments. `python {name}.py` runs it top to bottom;
# the result a notebook shows under a cell (a table, a figure) is passed to display(),
# which prints it as text.
try:
    from IPython.display import display
except ImportError:  # plain Python without IPython
    display = print
"""


def _display_last(lines: list[str]) -> list[str]:
    """A cell's code with its last statement, when it is an expression a notebook would
    show (not a call of print/display, not ending in ";"), passed to ``display()``: a
    script run with ``python`` otherwise drops the tables and figures of the chapter."""
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return lines
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or isinstance(last.value, ast.Constant):
        return lines
    call = last.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in (
            "print", "display"):
        return lines
    if lines[last.end_lineno - 1].rstrip().endswith(";"):
        return lines
    first, end = last.lineno - 1, last.end_lineno - 1
    out = list(lines)
    # ast's column offsets count UTF-8 bytes.
    start = len(out[first].encode()[:last.col_offset].decode())
    stop = len(out[end].encode()[:last.end_col_offset].decode())
    out[end] = out[end][:stop] + ")" + out[end][stop:]
    out[first] = out[first][:start] + "display(" + out[first][start:]
    return out


def notebook_to_py(nb: nbformat.NotebookNode, name: str = "chapter") -> str:
    """A notebook as a percent-format script: ``# %%`` code cells, Markdown as comments,
    each cell's shown result passed to ``display()`` (:data:`PY_HEADER`)."""
    parts = [PY_HEADER.format(name=name).rstrip("\n")]
    for cell in nb.cells:
        source = cell.source.rstrip("\n")
        if cell.cell_type == "code":
            lines = _display_last([_magic_line(line) for line in source.splitlines()])
            parts.append("# %%\n" + "\n".join(lines))
        elif cell.cell_type == "markdown":
            text = "\n".join(f"# {line}".rstrip() for line in source.splitlines())
            parts.append("# %% [markdown]\n" + text)
    return "\n\n".join(parts) + "\n"


def write_downloads(app: Sphinx, exception: Exception | None) -> None:
    """Copy each chapter's Colab notebook into ``downloads/``, add its ``.py``, zip them."""
    if exception is not None or app.builder.name != "html":
        return
    out = Path(app.outdir) / DOWNLOADS
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name in chapter_names(app).values():
        notebook = (COLAB / f"{name}.ipynb").read_bytes()
        script = notebook_to_py(nbformat.reads(notebook.decode("utf-8"), as_version=4), name)
        (out / f"{name}.ipynb").write_bytes(notebook)
        (out / f"{name}.py").write_text(script, encoding="utf-8")
        files += [f"{name}.ipynb", f"{name}.py"]
    with zipfile.ZipFile(out / ZIP_NAME, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            info = zipfile.ZipInfo(f"convlab-book/{file}", date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, (out / file).read_bytes())


def _button(href: str, label: str, icon: str, css: str, title: str, download: bool) -> str:
    attrs = ' download=""' if download else ""
    return (f'<a class="book-action {css}" href="{html.escape(href)}" '
            f'title="{html.escape(title)}"{attrs}><i class="{icon}" aria-hidden="true"></i>'
            f"<span>{html.escape(label)}</span></a>")


def colab_url(context: dict[str, Any]) -> str | None:
    """The Colab link of the theme's launch menu on this page (None if it has none)."""
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            url = str(button.get("url", ""))
            if url.startswith("https://colab.research.google.com/"):
                return url
    return None


def action_bar(app: Sphinx, pagename: str, context: dict[str, Any]) -> str | None:
    """The row of labelled buttons for a page, or None for pages without one."""
    pathto = context["pathto"]
    name = chapter_names(app).get(pagename)
    buttons = []
    if name:
        colab = colab_url(context)
        if colab:
            buttons.append(_button(colab, "Run on Colab", "fas fa-rocket", "btn-run-colab",
                                   "Open this chapter in Google Colab and run it", False))
        buttons.append(_button(pathto(f"{DOWNLOADS}/{name}.ipynb", 1), "Download notebook",
                               "fas fa-code", "btn-get-notebook",
                               "This chapter as a Jupyter notebook", True))
        buttons.append(_button(pathto(f"{DOWNLOADS}/{name}.py", 1), "Download .py",
                               "fas fa-file-code", "btn-get-py",
                               "This chapter's code as a Python script", True))
    elif pagename != app.config.root_doc:
        return None
    if BOOK_PDF.is_file():
        buttons.append(_button(pathto("book.pdf", 1), "Whole book (PDF)", "fas fa-book",
                               "btn-get-book-pdf", "The whole book as one PDF", False))
    buttons.append(_button(pathto(f"{DOWNLOADS}/{ZIP_NAME}", 1), "All notebooks (.zip)",
                           "fas fa-file-zipper", "btn-get-zip",
                           "Every chapter as a notebook and a .py script, zipped", True))
    return ('<div class="book-actions" role="group" aria-label="Run or download">'
            + "".join(buttons) + "</div>")


def add_action_bar(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Put the labelled buttons under the page title; name the print button for what it does."""
    if app.builder.name != "html":
        return
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            if button.get("label") == "download-pdf-button":
                button["text"] = "Print this page"
                button["tooltip"] = "Print this page"
    bar = action_bar(app, pagename, context)
    body = context.get("body")
    if bar and body and H1_END.search(body):
        context["body"] = H1_END.sub(lambda m: m.group(0) + bar, body, count=1)


def setup(app: Sphinx) -> dict[str, Any]:
    # After the theme's own handlers (header and launch buttons).
    app.connect("html-page-context", add_action_bar, priority=901)
    app.connect("build-finished", write_downloads)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
