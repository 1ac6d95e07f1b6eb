"""Shared setup and checks for the book's notebooks.

Every chapter calls :func:`setup` once so that printed outputs are the same on every
machine (nbval compares them): fixed seeds, print options, thread count and plot style,
and no library warnings that would print local paths into stderr.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

THREADS = 2
LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def setup(seed: int = 0, threads: int = THREADS) -> None:
    """Seed every RNG, fix torch's print options and thread count, set the plot style.

    The thread count is fixed because oneDNN's reduction order (and so the last bits of
    grad_weight) depends on it.
    """
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds the legacy global RNG notebooks may use
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional outside the book
        return
    plt.rcParams.update(PLOT_STYLE)
    _inline_svg()


# Figures are SVG (sharp at any zoom). On a 390 px phone the column is about 358 px wide and
# a figure shrinks to fit it, so text stays >= 10 px only if font size (pt) per inch of
# figure width is >= 2: 10 pt text in a 5 inch figure, 14 pt in a 7 inch one.
PLOT_STYLE = {
    "figure.figsize": (5.0, 3.0),
    "figure.dpi": 100,
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 11,
    "image.cmap": "viridis",
    # Deterministic SVG: nbval compares image/svg+xml outputs (unlike image/png), so ids
    # come from a fixed salt and the file carries no date or version.
    "svg.hashsalt": "convlab",
    "svg.fonttype": "path",
}
SVG_METADATA = {"Date": None, "Creator": None}


def _inline_svg() -> None:
    """In a notebook kernel, show figures as deterministic SVG instead of PNG."""
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    if get_ipython() is None:  # a plain Python process: no inline figures
        return
    set_matplotlib_formats("svg", bbox_inches="tight", metadata=SVG_METADATA)


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute element-wise difference (``0.0`` for empty tensors)."""
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected).to(actual.dtype)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {list(actual.shape)} vs {list(expected.shape)}")
    if actual.numel() == 0:
        return 0.0
    return (actual - expected).abs().max().item()


def check(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-10) -> None:
    """Assert ``actual`` matches ``expected`` within ``tol`` and print a stable one-line verdict.

    The printed line does not contain the (machine-dependent) difference itself, only the
    bound it satisfied, so stored notebook outputs stay reproducible.
    """
    diff = max_abs_diff(actual, expected)
    if not diff <= tol:
        raise AssertionError(f"{name}: max abs diff {diff:.3e} exceeds {tol:.0e}")
    print(f"{name}: match (max abs diff < {tol:.0e})")


class Table:
    """A table that renders as a real (Markdown) table on the site and as text elsewhere.

    ``rows`` is a sequence of rows, each a sequence of cells (converted with ``str``);
    ``headers`` names the columns. Cells given as ``code(...)`` strings are shown in
    monospace. ``caption`` (one line of MyST Markdown) titles the table: on the site it
    becomes a numbered "Table N" caption, in plain text a first line. The plain-text form
    is what a terminal and nbval see, so a notebook's stored output still records every
    cell's value. ``label`` (with a caption) names the table for ``{numref}`label```.

    >>> Table(["backend", "kernel"], [["Slow2d", "slow_conv2d"]],
    ...       caption="One backend")
    One backend
    backend | kernel
    ------- | -----------
    Slow2d  | slow_conv2d
    """

    def __init__(
        self,
        headers: list[str],
        rows: list[list[object]],
        caption: str | None = None,
        label: str | None = None,
    ) -> None:
        if caption is not None:
            if not isinstance(caption, str):
                raise TypeError(f"caption must be a str or None, got {type(caption).__name__}")
            caption = caption.strip()
            if not caption or "\n" in caption:
                raise ValueError("caption must be one non-empty line")
        if label is not None and (caption is None or not LABEL.fullmatch(str(label))):
            raise ValueError(
                "label needs a caption and must look like 'tbl-name' (letters, digits, -_)"
            )
        self.caption = caption
        self.label = label
        self.headers = [str(h) for h in headers]
        self.rows = [[str(c) for c in row] for row in rows]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.headers):
                raise ValueError(
                    f"rows[{i}] has {len(row)} cells, expected {len(self.headers)}"
                )

    def __repr__(self) -> str:
        widths = [max([len(h)] + [len(r[j]) for r in self.rows])
                  for j, h in enumerate(self.headers)]
        lines = [" | ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=True))]
        lines.append(" | ".join("-" * w for w in widths))
        for row in self.rows:
            lines.append(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if self.caption is not None:
            lines.insert(0, self.caption)
        return "\n".join(line.rstrip() for line in lines)

    def _repr_markdown_(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|")

        lines = ["| " + " | ".join(cell(h) for h in self.headers) + " |",
                 "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        if self.caption is None:
            return "\n".join(lines)
        # A MyST {table} directive: the site numbers it ("Table N") and shows the caption.
        # A colon fence: a backtick fence's info string may not hold inline code.
        name = [] if self.label is None else [f":name: {self.label}"]
        return "\n".join([":::{table} " + self.caption, *name, *lines, ":::"])


def short_machine_names(recs: Sequence[Any]) -> dict[str, str]:
    """``{machine_name: shortest unique name}`` of records
    (:class:`convlab.lab.record.records.Record`) for table cells: the vendor alone where
    the records hold one machine of it (``AMD``), the vendor and the name's parenthesis
    where that tells its machines apart
    (``Intel (L3 480 MiB)``), else the whole names.

    The parenthesis (last-level cache, cpuid family and model) is the part of a name that
    tells two hosts of one reported model apart.
    """
    names = list(dict.fromkeys(r.machine_name for r in recs))
    vendor = {n: n.partition(" ")[0] for n in names}
    out: dict[str, str] = {}
    for v in dict.fromkeys(vendor.values()):
        group = [n for n in names if vendor[n] == v]
        if len(group) == 1:
            out[group[0]] = v
            continue
        short = {n: f"{v} {n[n.index('('):] if '(' in n else ''}".strip() for n in group}
        out.update(short if len(set(short.values())) == len(group) else {n: n for n in group})
    return out
