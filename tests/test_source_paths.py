"""Every source file the book names exists: in this checkout, in the installed wheel, or on
the list of files checked against a stored copy of their project's repository
(``tests/fixtures/source_paths.json``, each with the commit it was found at).

A name the book prints may be a whole path (``aten/src/ATen/native/Convolution.cpp``) or its
tail (``mkldnn/Conv.cpp``, ``ConvolutionMM2d.cpp``); a tail must fit exactly one listed path.
Brace lists (``cuda/NaiveConvolutionTranspose{2,3}d.cu``) name each file they expand to.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
LIST = json.loads((Path(__file__).parent / "fixtures" / "source_paths.json").read_text())
TORCH_DIR = Path(torch.__file__).parent
# A path-like token: optional folders, then a name with a source extension.
TOKEN = re.compile(r"(?<![\w./{}-])((?:[\w.-]+/|\{[\w,]+\}/?)*[\w.{},-]*"
                   r"\.(?:cpp|cu|cuh|h|hpp|mm|yaml|cmake|in|py))(?!\w)")
GITHUB_BLOB = re.compile(r"^//github\.com/[\w.-]+/[\w.-]+/blob/[\w.-]+/")


def book_texts() -> Iterator[tuple[str, str]]:
    """(file name, text) of every markdown page and every notebook cell's source."""
    pages = [p for p in sorted(BOOK.glob("*.md")) if p.name != "bibliography.md"]
    for page in pages:
        yield page.name, page.read_text()
    for nb in sorted(BOOK.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            yield nb.name, "".join(cell["source"])


def expand_braces(token: str) -> list[str]:
    """``a{2,3}b`` -> ``["a2b", "a3b"]``; several brace lists give their product."""
    parts = re.split(r"(\{[^{}]*\})", token)
    options = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(combo) for combo in itertools.product(*options)]


@functools.cache
def named_paths() -> dict[str, set[str]]:
    """Each file name the book prints -> the pages that print it."""
    found: dict[str, set[str]] = {}
    for page, text in book_texts():
        for match in TOKEN.finditer(text):
            token = GITHUB_BLOB.sub("", match.group(1))
            if token.startswith(".") and "/" not in token:
                continue  # an extension on its own (".py", ".h")
            for path in expand_braces(token):
                found.setdefault(path, set()).add(page)
    return found


def listed_paths() -> list[str]:
    return [path for files in LIST["verified"].values() for path in files]


def fits(tail: str, path: str) -> bool:
    return path == tail or path.endswith("/" + tail)


def resolve(name: str) -> str | None:
    """Where ``name`` is found (a short description), or None."""
    if name in LIST["not_paths"]:
        return "not a path"
    for base in (ROOT, BOOK):
        if (base / name).is_file():
            return f"checkout: {(base / name).resolve().relative_to(ROOT)}"
        # a page's relative path into convlab/, whose files may be the installed wheel's
        where = Path(os.path.normpath(base / name))
        if where.is_relative_to(ROOT) and where.relative_to(ROOT).as_posix() in checkout_files():
            return f"checkout: {where.relative_to(ROOT).as_posix()}"
    ours = [p for p in checkout_files() if fits(name, p)]
    if len(ours) == 1:
        return f"checkout: {ours[0]}"
    listed = [p for p in listed_paths() if fits(name, p)]
    if len(listed) == 1:
        return f"listed: {listed[0]}"
    generated = [p for p in LIST["generated"] if fits(name, p)]
    if len(generated) == 1 and LIST["generated"][generated[0]] in listed_paths():
        return f"generated from {LIST['generated'][generated[0]]}"
    wheel = installed_match(name)
    if wheel:
        return f"installed: {wheel}"
    return None


@functools.cache
def checkout_files() -> tuple[str, ...]:
    """This project's own source files (the folders a page may name a file of); convlab's
    from the package imported, which is the checkout's or, installed (``make compat``, as
    on Colab), the wheel's."""
    import convlab

    folders = {"convlab": Path(convlab.__file__).resolve().parent,
               **{name: ROOT / name for name in ("cpp", "scripts", "tests")}}
    return tuple(f"{name}/{p.relative_to(base).as_posix()}" for name, base in folders.items()
                 for p in base.rglob("*") if p.is_file())


def installed_match(name: str) -> str | None:
    """``name`` as a path or tail of a file in the installed torch (headers, the CMake
    config) or torchgen (the packaged yaml), if exactly one file fits."""
    for base in (TORCH_DIR.parent, TORCH_DIR, TORCH_DIR / "include",
                 TORCH_DIR.parent / "torchgen"):
        if (base / name).is_file():
            return str((base / name).relative_to(TORCH_DIR.parent))
    hits = [p for p in installed_files() if fits(name, p)]
    return hits[0] if len(hits) == 1 else None


@functools.cache
def installed_files() -> tuple[str, ...]:
    """Files of the installed torch's headers and CMake config, and torchgen's yaml."""
    files = [p for sub in ("include", "share") for p in (TORCH_DIR / sub).rglob("*")]
    files += (TORCH_DIR.parent / "torchgen").rglob("*.yaml")  # not its templates
    return tuple(str(p.relative_to(TORCH_DIR.parent)) for p in files if p.is_file())


def test_the_list_names_a_commit_for_every_file() -> None:
    for repo, files in LIST["verified"].items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo), repo
        for path, commit in files.items():
            assert re.fullmatch(r"[0-9a-f]{40}", commit), (repo, path, commit)
    for made, template in LIST["generated"].items():
        assert template in listed_paths(), (made, template)


def test_the_scan_finds_the_names_it_must() -> None:
    names = named_paths()
    # The intro's kernel tables and ch5's C++ program: if these go missing, the scan broke.
    for must in ("aten/src/ATen/native/Convolution.cpp", "ConvolutionMM3d.cpp",
                 "cuda/NaiveConvolutionTranspose2d.cu", "cuda/NaiveConvolutionTranspose3d.cu"):
        assert must in names, must


def test_a_file_that_does_not_exist_is_caught() -> None:
    assert resolve("SlowConvTranspose2d.cpp") is None
    assert resolve("cuda/SlowConvTranspose3d.cu") is None
    assert resolve("Conv.cpp") is None  # fits two listed files: ambiguous


@pytest.mark.parametrize("name", sorted(named_paths()))
def test_every_named_file_exists(name: str) -> None:
    pages = ", ".join(sorted(named_paths()[name]))
    assert resolve(name) is not None, (
        f"{name} (named in {pages}) is neither in the checkout, nor in the installed wheel, "
        "nor on tests/fixtures/source_paths.json")
