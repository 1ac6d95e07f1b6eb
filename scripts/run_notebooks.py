"""Re-execute notebooks in place with the current interpreter's kernel (nbclient).

Usage: python scripts/run_notebooks.py [book/x.ipynb ...]   (default: every notebook in _toc.yml)

The machine the kernel ran on (:func:`convlab.lab.method.machine.identity_line`, asked in
that kernel after the last cell) is stored in the notebook's metadata as
``convlab.ran_on``; the book prints it under every stored output that depends on the
machine (``_ext/book_ran_on.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toc_notebooks import toc_notebooks  # noqa: E402

# Run in the notebook's kernel after its last cell, then removed: the machine it ran on.
PROBE = ("from convlab.lab.method import machine as _m\n"
         "print(_m.identity_line(_m.fingerprint()))")


def execute(path: Path, timeout: int = 900) -> float:
    """Execute one notebook in its own folder, store the machine it ran on in its metadata
    and write it back; return seconds taken."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3", "language": "python"
    }
    start = time.perf_counter()
    resources = {"metadata": {"path": str(path.parent)}}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=resources)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client.execute()
    probe = nb.cells.pop()
    text = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
    if not text.strip():
        raise SystemExit(f"{path}: the machine probe printed nothing: {probe.outputs}")
    nb.metadata.setdefault("convlab", {})["ran_on"] = text.strip()
    keep_metadata_edited_meanwhile(nb, nbformat.read(path, as_version=4), path)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def keep_metadata_edited_meanwhile(ran: nbformat.NotebookNode, now: nbformat.NotebookNode,
                                   path: Path) -> None:
    """Carry cell metadata (tags) changed on disk while ``ran`` executed into ``ran``; refuse
    to write over a cell whose source changed meanwhile (that edit would be lost)."""
    on_disk = {cell.get("id"): cell for cell in now.cells}
    if list(on_disk) != [cell.get("id") for cell in ran.cells]:
        raise SystemExit(f"{path}: cells were added or removed while it ran; nothing written, "
                         "run it again")
    for cell in ran.cells:
        current = on_disk.get(cell.get("id"))
        if current is None or current.source != cell.source:
            raise SystemExit(f"{path}: cell {cell.get('id')} changed on disk while it ran; "
                             "nothing written, run it again")
        cell.metadata = current.metadata


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or toc_notebooks()
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        print(f"  done in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
