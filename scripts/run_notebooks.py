"""Re-execute notebooks in place with the current interpreter's kernel (nbclient).

Usage: python scripts/run_notebooks.py [book/x.ipynb ...]   (default: every notebook in _toc.yml)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toc_notebooks import toc_notebooks  # noqa: E402


def execute(path: Path, timeout: int = 900) -> float:
    """Execute one notebook in its own folder and write it back; return seconds taken."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3", "language": "python"
    }
    start = time.perf_counter()
    resources = {"metadata": {"path": str(path.parent)}}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=resources)
    client.execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or toc_notebooks()
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        print(f"  done in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
