"""Local Sphinx extension: small fixes to the HTML of the book's theme.

The jupyter-book theme stack registers some inline scripts twice (sphinx-thebe's
``const THEBE_JS_URL = ...`` and sphinx-togglebutton's selector). A second ``const``
declaration of the same name is a ``SyntaxError`` in the browser console on every page,
which would hide real errors from ``tests/test_browser.py``. This extension drops exact
duplicates from each page's script list before the page is rendered.

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_html: _ext}``.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def _script_key(script: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Identity of a script entry: its file name plus all attributes (incl. an inline body)."""
    filename = str(getattr(script, "filename", script) or "")
    attributes = getattr(script, "attributes", {}) or {}
    return filename, tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def drop_duplicate_scripts(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Keep only the first of several identical ``<script>`` entries of a page."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app: Sphinx) -> dict[str, Any]:
    # A late priority, so that scripts added by other extensions' handlers are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
