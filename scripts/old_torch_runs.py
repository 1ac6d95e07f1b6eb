"""Run the repros of chapter 13 and the old calls of chapter 12 with another Python.

Usage: python scripts/old_torch_runs.py PYTHON [--timeout S]

PYTHON is an interpreter that has another torch installed (a throwaway venv, as
``make compat`` builds, or any other). Each code cell of ``book/13_bugs_found.ipynb`` whose
metadata has a ``repro`` name is self-contained; it runs in its own child process of
PYTHON, and its ``bug present: True/False`` line is collected. The old calls of
``book/12_migration_cookbook.ipynb`` (``OLD_CALLS`` below) run the same way and report the
exception each raises. The result is a plain-text table: one line per repro or call, with
the torch version PYTHON reports. With ``--record`` it also replaces that version's entry
in ``book/data/versions/old_torch_runs.json`` (:mod:`convlab.lab.record.version_runs`), which
chapters 12 and 13 render.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BUGS = ROOT / "book" / "13_bugs_found.ipynb"
PATH = re.compile(r"(/[^\s()'\"]+)+/")

# The "before" calls of chapter 12: each prints the exception it raises (or its result).
OLD_CALLS = {
    "jit cudnn_convolution_backward_weight": (
        "op = torch._C._jit_get_operation("
        "'aten::cudnn_convolution_backward_weight')\n"
        "op([4, 3, 3, 3], torch.randn(1, 4, 6, 6), torch.randn(1, 3, 8, 8),"
        " [0, 0], [1, 1], [1, 1], 1, False, False, False)"
    ),
    "torch._C._nn.thnn_conv2d_forward": "torch._C._nn.thnn_conv2d_forward",
    "aten.thnn_conv2d_backward": "torch.ops.aten.thnn_conv2d_backward",
    "aten.cudnn_convolution_backward_input": (
        "torch.ops.aten.cudnn_convolution_backward_input"
    ),
    "aten.mkldnn_convolution_backward": "torch.ops.aten.mkldnn_convolution_backward",
    "nn.grad._grad_input_padding": "from torch.nn.grad import _grad_input_padding",
}
WRAP = """
import torch
try:
{body}
    print("ran without error")
except Exception as err:
    print(type(err).__name__ + ": " + str(err).splitlines()[0])
"""


def repros(path: Path = BUGS) -> dict[str, str]:
    """The repro cells of a chapter: {metadata name: source}."""
    nb = nbformat.read(path, as_version=4)
    return {c.metadata["repro"]: c.source for c in nb.cells
            if c.cell_type == "code" and "repro" in c.metadata}


def run(python: str, source: str, timeout: float) -> str:
    """Run ``source`` in a child of ``python``; return its verdict line or how it ended."""
    try:
        done = subprocess.run([python, "-c", source], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    lines = done.stdout.strip().splitlines()
    verdict = [ln for ln in lines if ln.startswith("bug present:")]
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return f"exit {done.returncode}: {PATH.sub('.../', last)[:100]}"
    return verdict[-1] if verdict else PATH.sub(".../", lines[-1] if lines else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python", help="interpreter with the torch to test")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--record", action="store_true",
                        help="store the results as this torch version's entry")
    args = parser.parse_args(argv)
    if not Path(args.python).exists():
        print(f"old_torch_runs: error: no interpreter at {args.python}", file=sys.stderr)
        return 2
    version, python = run(args.python, "import sys, torch; print(torch.__version__, "
                          "'%d.%d' % sys.version_info[:2])", args.timeout).split()[:2]
    print(f"torch {version}")
    results = {}
    for name, source in repros().items():
        results[name] = run(args.python, source, args.timeout)
        print(f"{name:<38} {results[name]}")
    for name, body in OLD_CALLS.items():
        code = WRAP.format(body="\n".join("    " + ln for ln in body.splitlines()))
        results[name] = run(args.python, code, args.timeout)
        print(f"{name:<38} {results[name]}")
    if args.record:
        # imported here: convlab imports torch, which this script's own checks never need
        from convlab.lab.method import machine
        from convlab.lab.record import version_runs

        path = version_runs.store_run(version.split("+")[0], {
            "date": f"{dt.date.today():%Y-%m-%d}", "machine": machine.machine_slug(),
            "python": python, "results": results})
        print(f"stored in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
