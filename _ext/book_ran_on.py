"""Local Sphinx extension: each stored output that depends on the machine says where it ran.

A chapter's code cells tagged ``nbval-ignore-output`` are the ones whose output depends on
the machine (timings, the routing of this CPU, the claims' verdicts): nbval does not
compare them. ``scripts/run_notebooks.py`` stores the machine its kernel ran on in the
notebook's metadata (``convlab.ran_on``); here every such cell with an output gets one line
under it, "Stored output: <machine>", so a reader never takes another CPU's numbers for
their own, unless its output already says "this machine: ..." (the cells that print
:func:`convlab.lab.method.machine.stamp`, asked in the same kernel). A chapter executed
some other way has no ``ran_on``, and its live cells get "Stored output: machine not
recorded".

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_ran_on: _ext}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform

LIVE_TAG = "nbval-ignore-output"
CLASS = "ran-on"
SAYS_MACHINE = "this machine: "


def ran_on(notebook: Path) -> str | None:
    """The ``convlab.ran_on`` line of a notebook's metadata (None if absent)."""
    meta = json.loads(notebook.read_text(encoding="utf-8")).get("metadata", {})
    line = (meta.get("convlab") or {}).get("ran_on")
    return str(line) if line else None


def live_cells(document: nodes.Node) -> list[nodes.container]:
    """The code cells tagged ``nbval-ignore-output`` that have an output and do not print
    the machine themselves."""
    found = []
    for cell in document.findall(nodes.container):
        tags = (cell.get("cell_metadata") or {}).get("tags", [])
        if cell.get("nb_element") != "cell_code" or LIVE_TAG not in tags:
            continue
        outputs = [child for child in cell.findall(nodes.container)
                   if child.get("nb_element") == "cell_code_output"]
        if outputs and not any(SAYS_MACHINE in out.astext() for out in outputs):
            found.append(cell)
    return found


class StampLiveOutputs(SphinxTransform):
    """Append "Stored output: <machine>" to each live cell of a notebook page."""

    default_priority = 800

    def apply(self, **kwargs: Any) -> None:
        source = Path(self.env.doc2path(self.env.docname))
        if source.suffix != ".ipynb":
            return
        line = ran_on(source) or "machine not recorded"
        for cell in live_cells(self.document):
            cell += nodes.paragraph("", f"Stored output: {line}", classes=[CLASS])


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_transform(StampLiveOutputs)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
