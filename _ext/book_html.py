"""Local Sphinx extension: small fixes to the HTML of the book's theme.

* The jupyter-book theme stack registers some inline scripts twice (sphinx-thebe's
  ``const THEBE_JS_URL = ...`` and sphinx-togglebutton's selector). A second ``const``
  declaration of the same name is a ``SyntaxError`` in the browser console on every page,
  which would hide real errors from ``tests/test_browser.py``: exact duplicates are dropped.
* Sphinx adds MathJax (1.2 MB) to a page whose toctree *includes* a page with math, so the
  landing page and the API index loaded it for nothing: it is kept only on pages whose own
  content has math.
* pydata-sphinx-theme links Font Awesome twice: as CSS with web fonts and as a 1.5 MB
  script that redraws every icon as SVG. The CSS alone draws the same icons, so the script
  tag is removed from the written pages.
* ``static/book.css`` and ``static/book.js``: content that fits its column (words wrap at
  word boundaries, wide tables and equations scroll in their box with a visible cue), long
  outputs that fold, phone drawers that close after a tap, no stale search highlights,
  40 px tap targets, no fullscreen button on phones, code lines that wrap in print; code
  and outputs on a phone wrap at token boundaries only, and no number breaks at its ".".
* API signatures show defaults as written in the source (``math.nan``, ``list()``, the
  lambda's text) instead of their reprs (``nan``, ``<factory>``, ``<function <lambda>>``):
  ``autodoc_preserve_defaults`` covers functions, :func:`readable_signature` the
  generated ``__init__`` of dataclasses.
* The Colab launch button opens the chapter's clean copy under ``colab/`` (written by
  ``scripts/colab_copies.py``: no MyST syntax), not the book's source notebook.
* Search ranks the glossary entry named by the query first, then the chapters by
  relevance, one result per page (``search_scorer.js``, :func:`use_search_scorer`; the
  chapters' data comes from ``book_search.py``).
* The "Open issue" button's new issue names the page instead of the theme's "Your issue
  content here." (:func:`issue_body`); on a chapter the header's ".ipynb" download is the
  clean notebook of ``downloads/``, not the MyST source (:func:`notebook_download`).
* When ``make pdf`` has written ``_build/pdf/book.pdf``, the page's download menu links the
  whole-book PDF (copied into the site); without that file there is no link.

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_html: _ext}``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import quote

from docutils import nodes
from sphinx.application import Sphinx

STATIC = Path(__file__).resolve().parent / "static"
# Sphinx's html_search_scorer: read by the builder, inlined into search.html's scripts.
SCORER = STATIC.parent / "search_scorer.js"
ROOT = STATIC.parent.parent
# The whole-book PDF that `make pdf` writes, and its name in the site.
BOOK_PDF = ROOT / "_build" / "pdf" / "book.pdf"
SITE_PDF = "book.pdf"
# Folder of the Colab copies of the chapters (scripts/colab_copies.py).
COLAB_DIR = "colab"
COLAB_LINK = re.compile(
    r'(href="https://colab\.research\.google\.com/github/[^"]*?/blob/[^/"]+/)([^"]*?)([^/"]+\.ipynb)"'
)
PRINT_BUTTON = re.compile(r'(<li>\s*<button onclick="window\.print\(\)")')
# Reprs Python gives defaults that say nothing: a dataclass field's default_factory, a
# function, a lambda, NaN and infinities.
OPAQUE_DEFAULT = re.compile(r"^(<factory>|<function .*>|<.* object at 0x[0-9a-f]+>|nan|-?inf)$")
FONTAWESOME_JS = re.compile(r'\s*<script src="[^"]*/fontawesome/[^"]*/all\.min\.js[^"]*"></script>')
# TeX delimiters MathJax looks for in raw HTML (e.g. an output's text/html).
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")
# A chapter's page name (its notebook has a clean copy in downloads/, _ext/book_actions.py).
CHAPTER_PAGE = re.compile(r"^book/\d\d_\w+$")


def _script_key(script: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Identity of a script entry: its file name plus all attributes (incl. an inline body)."""
    filename = str(getattr(script, "filename", script) or "")
    attributes = getattr(script, "attributes", {}) or {}
    return filename, tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def has_math(doctree: nodes.Node | None) -> bool:
    """Whether a page's own content has math (math nodes, or TeX in raw HTML)."""
    if doctree is None:
        return False
    for node in doctree.findall():
        if isinstance(node, (nodes.math, nodes.math_block)):
            return True
        if isinstance(node, nodes.raw) and RAW_TEX.search(node.astext()):
            return True
    return False


def is_mathjax(script: Any, mathjax_path: str) -> bool:
    """Whether a script entry is MathJax itself or its inline ``window.MathJax`` config."""
    filename = str(getattr(script, "filename", script) or "")
    body = str((getattr(script, "attributes", {}) or {}).get("body", ""))
    if body.startswith("window.MathJax"):
        return True
    name = Path(filename).name
    return bool(filename) and (filename == mathjax_path or name == Path(mathjax_path).name)


def tidy_scripts(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Keep the first of identical ``<script>`` entries; drop MathJax from pages without math."""
    scripts = context.get("script_files")
    if not scripts:
        return
    keep_mathjax = has_math(doctree)
    mathjax_path = str(app.config.mathjax_path or "")
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key in seen or (not keep_mathjax and is_mathjax(script, mathjax_path)):
            continue
        seen.add(key)
        unique.append(script)
    context["script_files"] = unique


def drop_fontawesome_script(app: Sphinx, exception: Exception | None) -> None:
    """Remove the Font Awesome SVG script from every written page (the CSS draws the icons)."""
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        slim = FONTAWESOME_JS.sub("", text)
        if slim != text:
            page.write_text(slim, encoding="utf-8")


def add_static(app: Sphinx) -> None:
    """Serve ``_ext/static`` and link the book's stylesheet and script on every page."""
    app.config.html_static_path.append(str(STATIC))
    app.add_css_file("book.css")
    app.add_js_file("book.js")


def _split_params(signature: str) -> list[str]:
    """The top-level comma-separated parts of ``(a, b=f(1, 2), c=[3])``, without the parens."""
    inner = signature.strip()[1:-1]
    parts, depth, start, quote = [], 0, 0, ""
    for i, char in enumerate(inner):
        if quote:
            quote = "" if char == quote and inner[i - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    return [p for p in parts if p]


def _source_default(node: ast.expr, source: str) -> str | None:
    """A field's default as written: ``field(default_factory=list)`` reads ``list()``."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        for keyword in node.keywords:
            if keyword.arg == "default_factory":
                text = ast.get_source_segment(source, keyword.value)
                return None if text is None else f"{text}()"
            if keyword.arg == "default":
                return ast.get_source_segment(source, keyword.value)
        return None
    return ast.get_source_segment(source, node)


def field_defaults(cls: type) -> dict[str, str]:
    """Each dataclass field's default as written in the class body, by field name."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target = getattr(node.target, "id", None)
            text = _source_default(node.value, source)
            if target and text and "\n" not in text:
                found[target] = text
    return found


def readable_signature(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    """Replace opaque default reprs of a dataclass's signature with the source's text."""
    if not signature or not (inspect.isclass(obj) and dataclasses.is_dataclass(obj)):
        return None
    written = field_defaults(obj)
    parts = []
    for part in _split_params(signature):
        key, sep, value = part.partition("=")
        if sep and OPAQUE_DEFAULT.match(value.strip()) and key.strip() in written:
            part = f"{key}={written[key.strip()]}"
        parts.append(part)
    return f"({', '.join(parts)})", return_annotation


def colab_copy_links(app: Sphinx, exception: Exception | None) -> None:
    """Point each page's Colab button at the chapter's clean copy in ``colab/``."""
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if "colab.research.google.com" not in text:
            continue
        new = COLAB_LINK.sub(lambda m: f'{m.group(1)}{COLAB_DIR}/{m.group(3)}"', text)
        if new != text:
            page.write_text(new, encoding="utf-8")


def link_book_pdf(app: Sphinx, exception: Exception | None) -> None:
    """Copy ``make pdf``'s book into the site and add it to every page's download menu."""
    if exception is not None or app.builder.name != "html" or not BOOK_PDF.is_file():
        return
    out = Path(app.outdir)
    shutil.copyfile(BOOK_PDF, out / SITE_PDF)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if 'class="btn-book-pdf' in text:
            continue
        href = "../" * (len(page.relative_to(out).parts) - 1) + SITE_PDF
        item = (f'<li><a href="{href}" class="btn btn-sm btn-book-pdf dropdown-item" '
                'title="The whole book as one PDF"><span class="btn__icon-container">'
                '<i class="fas fa-book"></i></span>'
                '<span class="btn__text-container">Whole book (PDF)</span></a></li>\n')
        new = PRINT_BUTTON.sub(lambda m, item=item: item + m.group(1), text, count=1)
        if new != text:
            page.write_text(new, encoding="utf-8")


def issue_body(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """The "Open issue" button's new issue names the page's address and asks what is wrong
    (sphinx-book-theme writes the body "Your issue content here.")."""
    page = f"{str(app.config.html_baseurl or '').rstrip('/')}/{pagename}.html"
    body = quote(f"Page: {page}\n\nWhat is wrong or unclear (quote the sentence, code or "
                 "output; say which browser or Colab):\n\n", safe="")

    def fix(buttons: list[dict[str, Any]]) -> None:
        for button in buttons:
            if isinstance(button, dict) and button.get("buttons"):
                fix(button["buttons"])
            elif isinstance(button, dict) and button.get("label") == "source-issues-button":
                button["url"] = re.sub(r"&body=[^&]*", f"&body={body}", button["url"])

    fix(context.get("header_buttons") or [])


def notebook_download(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """On a chapter, the header's "Download this page -> .ipynb" gives the same clean
    notebook as the labelled "Download notebook" button (``downloads/``, the Colab copy),
    not the MyST source under ``_sources/`` with its raw ``{term}`` roles."""
    if not CHAPTER_PAGE.match(pagename):
        return
    target = context["pathto"](f"downloads/{pagename.rsplit('/', 1)[-1]}.ipynb", 1)

    def fix(buttons: list[dict[str, Any]]) -> None:
        for button in buttons:
            if isinstance(button, dict) and button.get("buttons"):
                fix(button["buttons"])
            elif isinstance(button, dict) and str(button.get("url", "")).endswith(
                    f"_sources/{pagename}.ipynb"):
                button["url"] = target

    fix(context.get("header_buttons") or [])


def use_search_scorer(app: Sphinx, config: Any) -> None:
    """Rank search results with ``search_scorer.js``: the glossary entry named by the query,
    then the chapters, then the rest (Sphinx ranked API objects and a second glossary entry
    first, and indexed each term twice: as an index entry and as an object)."""
    config.html_search_scorer = str(SCORER)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", use_search_scorer)
    app.connect("builder-inited", add_static)
    app.connect("autodoc-process-signature", readable_signature)
    app.connect("build-finished", colab_copy_links)
    app.connect("build-finished", link_book_pdf)
    # A late priority, so that scripts added by other handlers (MathJax's) are seen too.
    app.connect("html-page-context", tidy_scripts, priority=900)
    # After sphinx-book-theme's own header buttons (priority 501).
    app.connect("html-page-context", issue_body, priority=600)
    app.connect("html-page-context", notebook_download, priority=600)
    app.connect("build-finished", drop_fontawesome_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.2"}
