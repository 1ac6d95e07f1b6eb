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
* ``static/book.css``: content that fits its column (inline code that can break, tables of
  ``convlab.lab.notebook.Table`` outputs, display math that never widens the page).

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_html: _ext}``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

STATIC = Path(__file__).resolve().parent / "static"
FONTAWESOME_JS = re.compile(r'\s*<script src="[^"]*/fontawesome/[^"]*/all\.min\.js[^"]*"></script>')
# TeX delimiters MathJax looks for in raw HTML (e.g. an output's text/html).
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")


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
    """Serve ``_ext/static`` and link the book's stylesheet on every page."""
    app.config.html_static_path.append(str(STATIC))
    app.add_css_file("book.css")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", add_static)
    # A late priority, so that scripts added by other handlers (MathJax's) are seen too.
    app.connect("html-page-context", tidy_scripts, priority=900)
    app.connect("build-finished", drop_fontawesome_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.1"}
