"""Local Sphinx extension: each exercise's solution folds whole, under "Solution".

A chapter's solutions are the code cells of its "Exercises" section tagged ``hide-input``
(``tests/test_lesson_shape.py`` checks that each exercise has one). ``hide-input`` folds
only the code, so the printed answer showed right under the question, behind a toggle that
read "Show code cell source". Here such a cell folds its code *and* its output (myst-nb's
``hide-cell`` mode) under a toggle labelled "Solution", and gets the class ``solution``
(``scripts/book_pdf.py`` moves the solutions to the end of each chapter in the PDF). The
notebooks keep their tags and outputs as they are; the Colab copies fold the same cells
(``scripts/colab_copies.py``).

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_solutions: _ext}``.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

EXERCISES_TITLE = "Exercises"
SOLUTION_TAG = "hide-input"
SHOW = "Solution"
HIDE = "Hide the solution"
SOLUTION_CLASS = "solution"


def solution_cells(document: nodes.Node) -> list[nodes.container]:
    """The code cells of every "Exercises" section that are tagged ``hide-input``."""
    found = []
    for section in document.findall(nodes.section):
        if not section.children or not isinstance(section[0], nodes.title):
            continue
        if section[0].astext().strip() != EXERCISES_TITLE:
            continue
        for cell in section.findall(nodes.container):
            tags = (cell.get("cell_metadata") or {}).get("tags", [])
            if cell.get("nb_element") == "cell_code" and SOLUTION_TAG in tags:
                found.append(cell)
    return found


class FoldSolutions(SphinxPostTransform):
    """Before myst-nb wraps hidden cells (its ``HideInputCells``, priority 199), turn each
    solution's ``input`` fold into a fold of the whole cell, labelled "Solution"."""

    default_priority = 150
    formats = ("html",)

    def run(self, **kwargs: Any) -> None:
        for cell in solution_cells(self.document):
            cell["hide_mode"] = "all"
            cell["prompt_show"] = SHOW
            cell["prompt_hide"] = HIDE
            if SOLUTION_CLASS not in cell["classes"]:
                cell["classes"].append(SOLUTION_CLASS)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_post_transform(FoldSolutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
