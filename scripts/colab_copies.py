"""Write a Colab copy of each chapter: the same notebook with its MyST markup made Markdown.

Colab renders plain Markdown, so the book's MyST syntax shows there as raw text. Each copy
``colab/NN_name.ipynb`` keeps the chapter's code cells and outputs as they are and rewrites
its Markdown: roles (``{term}``, ``{py:func}``, ``{doc}``, ``{ref}``, ``{numref}``,
``{cite}``) become links to the book's site, directives (admonitions, literalinclude, math,
table) become blockquotes, code blocks and tables, labels ``(name)=`` go. Each exercise's
solution cell is folded (``FOLDED``: Colab's hidden code, the nbformat flags). Link targets come
from the built site's ``objects.inv``, so build the book first::

    make book && .venv/bin/python scripts/colab_copies.py

Each copy records the SHA-256 of its source notebook and of every file it inlines (a
``literalinclude``); ``tests/test_colab_copies.py`` fails when either changed after the
copy was written.
"""

from __future__ import annotations

import argparse
import hashlib
import posixpath
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_notebooks  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
SITE = CONFIG["html"]["baseurl"].rstrip("/") + "/"
REPO = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"].get("branch", "main")
OUT_DIR = ROOT / "colab"
META_KEY = "colab_copy"

ROLE = re.compile(r"\{(?P<role>[\w:+-]+)\}`(?P<text>[^`]+)`")
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*)$"
)
OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):\s*(?P<value>.*)$")
LABEL_LINE = re.compile(r"^\s*\([\w:.-]+\)=\s*$")
MATH_LABEL = re.compile(r"(\$\$)\s*\([\w:.-]+\)\s*$", re.M)
COMMENT_LINE = re.compile(r"^%")
LOCAL_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<href>(?!https?:|mailto:)[^)\s]+)\)")
ADMONITIONS = {
    "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important",
    "warning": "Warning", "caution": "Caution", "attention": "Attention",
    "danger": "Danger", "error": "Error", "seealso": "See also",
}
PY_TYPES = ("py:function", "py:method", "py:class", "py:module", "py:attribute",
            "py:data", "py:exception", "py:property")
# What is left of MyST after conversion would match one of these (the test uses them too).
MYST_LEFTOVERS = {
    "role": re.compile(r"\{[\w:+-]+\}`"),
    "directive": re.compile(r"^\s*(`{3,}|:{3,})\{", re.M),
    "colon fence": re.compile(r"^\s*:{3,}", re.M),
    "label": re.compile(r"^\s*\([\w:.-]+\)=\s*$", re.M),
    "equation label": MATH_LABEL,
}

Inventory = dict[str, dict[str, tuple[str, str]]]  # type -> name -> (uri, display name)


def load_inventory(site: Path) -> Inventory:
    """``{type: {name: (uri relative to the site, display name)}}`` from ``objects.inv``."""
    from sphinx.util.inventory import InventoryFile

    path = site / "objects.inv"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: build the book first (make book)")
    with path.open("rb") as stream:
        raw = InventoryFile.load(stream, "", posixpath.join)
    return {kind: {name: (entry[2], entry[3]) for name, entry in names.items()}
            for kind, names in raw.items()}


def site_url(uri: str) -> str:
    return SITE + uri.lstrip("/")


class Converter:
    """Turns one chapter's MyST Markdown into plain Markdown (links to the site)."""

    def __init__(self, inventory: Inventory, docname: str, read: Callable[[Path], str]):
        self.inventory = inventory
        self.docname = docname  # e.g. "book/01_math"
        self.read = read
        self.unresolved: list[str] = []

    # ---- roles ----
    def lookup(self, kinds: tuple[str, ...], name: str) -> tuple[str, str] | None:
        for kind in kinds:
            table = self.inventory.get(kind, {})
            for key in (name, name.lower()):
                if key in table:
                    return table[key]
        if kinds[0].startswith("py:"):  # a partial name: a unique dotted suffix
            hits = [entry for kind in kinds for key, entry in self.inventory.get(kind, {}).items()
                    if key.endswith("." + name)]
            if len(hits) == 1:
                return hits[0]
        return None

    def role(self, match: re.Match[str]) -> str:
        role, text = match.group("role"), match.group("text").strip()
        titled = TITLED.match(text)
        title, target = (titled.group("title"), titled.group("target")) if titled else (None, text)
        name = role.split(":", 1)[1] if role.startswith("py:") else role
        if role in ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts", "footcite"):
            bib = self.lookup(("std:doc",), "book/bibliography")
            url = site_url(bib[0]) if bib else site_url("book/bibliography.html")
            return ", ".join(f"[[{key.strip()}]]({url})" for key in target.split(","))
        if role == "math":
            return f"${text}$"
        if role in ("sub", "sup"):
            return f"<{role}>{text}</{role}>"
        if role == "term":
            entry, shown = self.lookup(("std:term",), target), title or target
        elif role in ("ref", "numref"):
            entry = self.lookup(("std:label",), target)
            shown = title or (entry[1] if entry and entry[1] != "-" else target)
            shown = shown.replace("{number}", "").replace("%s", "").strip() or target
        elif role == "doc":
            path = posixpath.normpath(posixpath.join(posixpath.dirname(self.docname), target))
            entry = self.lookup(("std:doc",), path.lstrip("/"))
            shown = title or (entry[1] if entry else target)
        elif role in ("eq",):
            entry, shown = self.lookup(("std:label",), target), title or "the equation"
        elif name in ("func", "meth", "class", "mod", "attr", "data", "exc", "obj"):
            plain = target.lstrip("~!")
            entry = self.lookup(PY_TYPES, plain)
            shown = title or (plain.rsplit(".", 1)[-1] if target.startswith("~") else plain)
            shown = f"`{shown}()`" if name in ("func", "meth") and not title else (
                title or f"`{shown}`")
        else:
            self.unresolved.append(f"{role}:{text}")
            return title or target
        if entry is None:
            self.unresolved.append(f"{role}:{target}")
            return shown
        return f"[{shown}]({site_url(entry[0])})"

    def local_link(self, match: re.Match[str]) -> str:
        text, href = match.group("text"), match.group("href")
        path, _, anchor = href.partition("#")
        if not path:
            page = f"{self.docname}.html"
        elif path.endswith((".ipynb", ".md")):
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(self.docname), path))
            page = rel.rsplit(".", 1)[0] + ".html"
        else:
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(self.docname), path))
            return f"[{text}]({REPO}/blob/{BRANCH}/{rel})"
        return f"[{text}]({site_url(page)}{'#' + anchor if anchor else ''})"

    def inline(self, text: str) -> str:
        text = ROLE.sub(self.role, text)
        return LOCAL_LINK.sub(self.local_link, text)

    # ---- blocks ----
    def directive(self, name: str, arg: str, options: dict[str, str], body: list[str]) -> list[str]:
        inner = self.convert(body)
        if name in ADMONITIONS or name == "admonition":
            title = arg.strip() or ADMONITIONS.get(name, "Note")
            lines = [f"> **{self.inline(title)}**", ">"]
            lines += [f"> {line}".rstrip() for line in inner]
            return lines
        if name == "literalinclude":
            path = (ROOT / posixpath.dirname(self.docname) / arg.strip()).resolve()
            rel = path.relative_to(ROOT).as_posix()
            code = self.excerpt(self.read(path).rstrip("\n").split("\n"), options, rel)
            language = options.get("language", "")
            return [f"From [`{rel}`]({REPO}/blob/{BRANCH}/{rel}):", "",
                    f"```{language}", *code, "```"]
        if name == "math":
            return ["$$", *body, "$$"]
        if name in ("code-block", "code", "sourcecode", "code-cell"):
            return [f"```{arg.strip()}", *body, "```"]
        if name in ("table", "list-table", "figure"):
            caption = [f"**{self.inline(arg.strip())}**", ""] if arg.strip() else []
            return caption + inner
        if name in ("toctree", "contents", "tableofcontents", "eval-rst", "glossary"):
            return []
        self.unresolved.append(f"directive {name}")
        return ([f"**{self.inline(arg.strip())}**", ""] if arg.strip() else []) + inner

    def excerpt(self, code: list[str], options: dict[str, str], rel: str) -> list[str]:
        """The lines a ``literalinclude`` shows: after the first line holding its
        ``start-after`` text, before the next one holding its ``end-before`` text (as
        Sphinx cuts them); a text not found is reported as unresolved."""
        for key in ("start-after", "end-before"):
            if key not in options:
                continue
            text = options[key]
            found = next((i for i, line in enumerate(code) if text in line), None)
            if found is None:
                self.unresolved.append(f"literalinclude {rel} {key}: {text}")
                continue
            code = code[found + 1:] if key == "start-after" else code[:found]
        return code

    def convert(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            opening = FENCE.match(line)
            if opening:
                fence, indent = opening.group("fence"), opening.group("indent")
                end = i + 1
                close = re.compile(
                    rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}\s*$"
                )
                depth = 0
                while end < len(lines):
                    nested = FENCE.match(lines[end])
                    if nested and nested.group("fence")[0] == fence[0]:
                        depth += 1
                    elif close.match(lines[end]):
                        if depth == 0:
                            break
                        depth -= 1
                    end += 1
                body = [b[len(indent):] if b.startswith(indent) else b for b in lines[i + 1:end]]
                options = {}
                while body and OPTION.match(body[0]):
                    option = OPTION.match(body[0])
                    options[option.group("key")] = option.group("value")
                    body = body[1:]
                out += [indent + b if b else b for b in
                        self.directive(opening.group("name"), opening.group("arg"), options, body)]
                i = end + 1
                continue
            if line.lstrip().startswith("```"):  # a plain code fence: copied untouched
                fence = line.lstrip()[: len(line.lstrip()) - len(line.lstrip().lstrip("`"))]
                end = i + 1
                while end < len(lines) and not lines[end].strip().startswith(fence):
                    end += 1
                out += lines[i:end + 1]
                i = end + 1
                continue
            if LABEL_LINE.match(line) or COMMENT_LINE.match(line):
                i += 1
                continue
            out.append(self.inline(line))
            i += 1
        return out

    def markdown(self, source: str) -> str:
        text = "\n".join(self.convert(source.split("\n")))
        text = MATH_LABEL.sub(r"\1", text)
        return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


# An exercise's solution: a code cell of the chapter's "## Exercises" section tagged
# hide-input (as _ext/book_solutions.py finds it for the site).
EXERCISES = re.compile(r"^(#{1,2})\s+Exercises\s*$", re.M)
HEADING = re.compile(r"^(#{1,6})\s", re.M)
SOLUTION_TAG = "hide-input"
# What a folded cell carries: Colab's own hide-code flag (`cellView: form`, its "Show code"
# bar), the nbformat standard that JupyterLab and VS Code read (`jupyter.source_hidden`,
# `jupyter.outputs_hidden`) and classic Jupyter's collapsed output.
FOLDED = {"cellView": "form", "collapsed": True,
          "jupyter": {"source_hidden": True, "outputs_hidden": True}}


def solution_cells(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the solution cells: code cells tagged hide-input in the Exercises section."""
    found, level = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            opening = EXERCISES.search(cell.source)
            if opening:
                level = len(opening.group(1))
                continue
            heading = HEADING.match(cell.source.lstrip())
            if level and heading and len(heading.group(1)) <= level:
                level = 0
        elif level and cell.cell_type == "code" and SOLUTION_TAG in cell.metadata.get("tags", []):
            found.append(i)
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def colab_copy(source: Path, inventory: Inventory) -> tuple[nbformat.NotebookNode, list[str]]:
    """The Colab copy of one chapter notebook, and the references it could not resolve."""
    nb = nbformat.read(source, as_version=4)
    docname = source.relative_to(ROOT).with_suffix("").as_posix()
    included: dict[str, str] = {}

    def read(path: Path) -> str:  # a literalinclude: its text goes into the copy
        included[path.relative_to(ROOT).as_posix()] = sha256(path)
        return path.read_text(encoding="utf-8")

    converter = Converter(inventory, docname, read)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = converter.markdown(cell.source)
        elif cell.cell_type == "code":
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "text/markdown" in data:
                    data["text/markdown"] = converter.markdown(data["text/markdown"])
    for i in solution_cells(nb):
        nb.cells[i].metadata.update(FOLDED)
    page = site_url(f"{docname}.html")
    nb.metadata[META_KEY] = {
        "source": source.relative_to(ROOT).as_posix(),
        "source_sha256": sha256(source),
        "included_sha256": included,
        "site_page": page,
        "written_by": "scripts/colab_copies.py",
    }
    return nb, converter.unresolved


def copy_path(source: Path) -> Path:
    return OUT_DIR / source.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--site", type=Path, default=ROOT / "_build" / "html",
                        help="built site whose objects.inv resolves references")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every toc chapter")
    args = parser.parse_args(argv)
    inventory = load_inventory(args.site)
    OUT_DIR.mkdir(exist_ok=True)
    sources = [p.resolve() for p in args.notebooks] or toc_notebooks()
    for source in sources:
        nb, unresolved = colab_copy(source, inventory)
        nbformat.write(nb, copy_path(source))
        note = f" (unresolved: {', '.join(sorted(set(unresolved)))})" if unresolved else ""
        print(f"{copy_path(source).relative_to(ROOT)}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
