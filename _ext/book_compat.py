"""Local Sphinx extension: whether the code changed since the compat runs, from git.

``book/data/compat.csv`` (the intro's "Tested with" table, written by ``make compat
RECORD=1``) names the commit each row ran at. The directive ``compat-since`` turns that into
a sentence when the book is built: for each commit of the table, how many of the files that
``make compat`` runs (``CODE``: the package, its tests, the scripts, the C++ program, the
pins and the chapters) differ between it and the files being built, by ``git diff``. So the
intro never says "tested" of code the runs did not see. The page is read again on every
build (its text depends on git, not on its source).

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_compat: _ext}``.
"""

from __future__ import annotations

import csv
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

TABLE = Path("book") / "data" / "compat.csv"
# What `make compat` runs, as git pathspecs.
CODE = ("convlab", "tests", "scripts", "cpp", "pyproject.toml", "requirements.txt",
        "book/*.ipynb")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=False)


def changed_since(root: Path, commit: str) -> list[str] | None:
    """The files of ``CODE`` that differ between ``commit`` and the working tree (None if
    git or the commit is not there)."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return None
    diff = _git(root, "diff", "--name-only", commit, "--", *CODE)
    return None if diff.returncode else [f for f in diff.stdout.splitlines() if f]


def sentence(root: Path, table: Path) -> str:
    """What the intro says under the compat table (module docstring)."""
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    head = _git(root, "rev-parse", "--short=7", "HEAD")
    if head.returncode:
        return "Whether the code changed since these runs cannot be told: no git history here."
    commits = Counter(r.get("commit") or "" for r in rows)
    parts = []
    for commit, count in sorted(commits.items(), key=lambda kv: -kv[1]):
        runs = f"{count} run{'s' * (count != 1)}"
        if not commit:
            verb = "names" if count == 1 else "name"
            parts.append(f"{runs} {verb} no commit, so what changed since cannot be told.")
            continue
        files = changed_since(root, commit)
        if files is None:
            parts.append(f"{runs} at {commit}, which this checkout's history lacks.")
        elif not files:
            they = "it tests" if count == 1 else "they test"
            parts.append(f"{runs} at {commit}: nothing `make compat` runs has changed "
                         f"since, so {they} this build's code.")
        else:
            kinds = Counter("chapters" if f.startswith("book/") else f.split("/")[0]
                            for f in files)
            what = ", ".join(f"{n} in {k}" for k, n in kinds.most_common())
            have = "has" if len(files) == 1 else "have"
            they = "it does" if count == 1 else "they do"
            parts.append(f"{runs} at {commit}: {len(files)} of the files `make compat` "
                         f"runs {have} changed since ({what}), so {they} not test this "
                         "build's code.")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *CODE)
    built = head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")
    return f"This book was built from {built}. " + " ".join(parts)


class CompatSince(SphinxDirective):
    """``compat-since``: a paragraph from :func:`sentence`."""

    def run(self) -> list[nodes.Node]:
        root = Path(self.env.srcdir)
        self.env.note_dependency(str(root / TABLE))
        box = nodes.container()
        self.state.nested_parse(StringList([sentence(root, root / TABLE)]),
                                self.content_offset, box)
        for paragraph in box.findall(nodes.paragraph):
            paragraph["classes"].append("compat-since")
        return list(box.children)


def _always(app: Sphinx, env: Any, added: set, changed: set, removed: set) -> list[str]:
    return [doc for doc, found in getattr(env, "compat_since_docs", {}).items() if found]


def _remember(app: Sphinx, doctree: nodes.document) -> None:
    docs = app.env.__dict__.setdefault("compat_since_docs", {})
    docs[app.env.docname] = bool(list(doctree.findall(
        lambda n: isinstance(n, nodes.paragraph) and "compat-since" in n["classes"])))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("compat-since", CompatSince)
    app.connect("doctree-read", _remember)
    app.connect("env-get-outdated", _always)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
