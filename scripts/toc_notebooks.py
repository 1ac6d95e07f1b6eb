"""Print the notebooks listed in _toc.yml, one path per line (used by `make nbval`)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """All `file:` entries of a Jupyter Book toc, in order, without suffix."""
    toc = yaml.safe_load(toc_path.read_text())
    found: list[str] = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return found


def toc_notebooks() -> list[Path]:
    """Paths of the toc entries that are notebooks."""
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


if __name__ == "__main__":
    sys.stdout.write("\n".join(str(p.relative_to(ROOT)) for p in toc_notebooks()) + "\n")
