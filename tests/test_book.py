"""Tests of the book itself: toc, executed notebooks, the Colab cell, portable outputs.

nbval passes a code cell whose outputs and execution count are empty, so these checks
are what make the nbval run meaningful.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_files  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
NOTEBOOKS = sorted(
    p for p in (ROOT / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
)
# Local paths or thread-dependent noise that would make stored outputs machine-specific.
NON_PORTABLE = re.compile(r"(site-packages|/\.venv/|/root/|/home/\w+|/tmp/|/work/)")
# Notebook conventions: the summary box, the code width, the nbval tag, API links.
SUMMARY_BOX = "```{admonition} What we saw"
SUMMARY_HEADING = "## Summary"
MAX_CODE_LINE = 80
IGNORE_OUTPUT_TAG = "nbval-ignore-output"
HAND_NUMBER = re.compile(r"^\s*(chapter\s+)?\d+\s*[.:)\-–]\s", re.I)
API_ROLE = re.compile(r"\{py:(func|class|mod|meth|data|attr|obj)\}`[~!]?convlab\.")


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "book/ has no notebooks"


def test_every_toc_entry_exists() -> None:
    for entry in toc_files():
        candidates = [ROOT / f"{entry}{suffix}" for suffix in (".md", ".ipynb")]
        assert any(c.exists() for c in candidates), f"_toc.yml lists {entry} but no file exists"


def test_every_notebook_is_in_the_toc() -> None:
    listed = {str(ROOT / f"{entry}.ipynb") for entry in toc_files()}
    missing = [str(p.relative_to(ROOT)) for p in NOTEBOOKS if str(p) not in listed]
    assert not missing, f"notebooks missing from _toc.yml: {missing}"


def test_book_markdown_pages_are_in_the_toc() -> None:
    listed = {str(ROOT / f"{entry}.md") for entry in toc_files()}
    pages = [p for p in (ROOT / "book").rglob("*.md")]
    missing = [str(p.relative_to(ROOT)) for p in pages if str(p) not in listed]
    assert not missing, f"pages missing from _toc.yml: {missing}"


def test_every_module_has_an_api_page() -> None:
    pages = "".join(p.read_text() for p in (ROOT / "book" / "api").glob("*.md"))
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts)
               for p in sorted((ROOT / "convlab").rglob("*.py")) if not p.name.startswith("_")]
    missing = [m for m in modules if f"automodule:: {m}\n" not in pages]
    assert not missing, f"modules without a book/api page: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_executed_without_errors(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    counts = []
    for i, cell in enumerate(code_cells(nb)):
        if not cell.source.strip():
            continue
        assert cell.execution_count is not None, f"code cell {i} was never executed"
        counts.append(cell.execution_count)
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"code cell {i} stored an error: {errors[0].get('ename')}"
    assert counts == sorted(counts) and len(set(counts)) == len(counts), (
        "execution counts are not increasing: run the whole notebook with `make notebooks`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_the_colab_install(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    first = code_cells(nb)[0].source
    assert '"google.colab" in sys.modules' in first, "the first code cell must be the Colab install"
    assert f'REPO = "{REPO_URL}"' in first and "git+{REPO}" in first, (
        f"the Colab install must use {REPO_URL} from _config.yml"
    )
    assert "pip install" in first and "--no-deps" in first, "Colab keeps its own torch"
    assert "remove-input" in code_cells(nb)[0].metadata.get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_portable(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(code_cells(nb)):
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stderr":
                raise AssertionError(f"code cell {i} writes to stderr: {out.text[:200]!r}")
            texts = [out.get("text", "")]
            texts += [v for k, v in out.get("data", {}).items() if k.startswith("text/")]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else text
                match = NON_PORTABLE.search(text)
                assert not match, f"code cell {i} prints a local path: {match.group(0)!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_the_shared_setup(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    sources = "\n".join(c.source for c in code_cells(nb)[:3])
    assert "setup(" in sources, "call convlab.lab.notebook.setup() in the first cells"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_summary_section_holds_the_what_we_saw_box(path: Path) -> None:
    """The chapter's ``## Summary`` cell is its "What we saw" box (exercises follow it)."""
    nb = nbformat.read(path, as_version=4)
    summaries = [c.source for c in nb.cells
                 if c.cell_type == "markdown" and SUMMARY_HEADING in c.source.splitlines()]
    assert len(summaries) == 1, f"want one {SUMMARY_HEADING!r} cell, found {len(summaries)}"
    assert SUMMARY_BOX in summaries[0], f"the summary cell must hold {SUMMARY_BOX!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_harness_comments_and_code_fits_the_column(path: Path) -> None:
    """Cell tags, not ``# NBVAL_...`` comments; code lines of at most 80 characters."""
    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        if "NBVAL_" in cell.source:
            problems.append(f"code cell {i}: NBVAL_ comment (use the cell tag instead)")
        for n, line in enumerate(cell.source.splitlines(), start=1):
            if len(line) > MAX_CODE_LINE:
                problems.append(f"code cell {i} line {n}: {len(line)} characters")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_title_has_no_hand_number(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    titles = [
        line for c in nb.cells if c.cell_type == "markdown"
        for line in c.source.splitlines() if line.startswith("# ")
    ]
    assert titles, "no '# Title' heading"
    assert not HAND_NUMBER.match(titles[0][2:]), f"hand-numbered title {titles[0]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_links_the_glossary_and_the_api(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "{term}`" in text, "no {term} link to the glossary"
    assert API_ROLE.search(text), "no {py:func}`convlab.…` (or class/mod) link to the API pages"


def _nbval(tmp_path: Path, tags: list[str]) -> subprocess.CompletedProcess[str]:
    """Run nbval on a one-cell notebook whose stored output differs from what it prints."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('fresh')", metadata={"tags": tags})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stale\n")]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "tagged.ipynb"
    nbformat.write(nb, path)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )


def test_nbval_honours_the_ignore_output_tag(tmp_path: Path) -> None:
    """The cell tag that replaced ``# NBVAL_IGNORE_OUTPUT`` comments really is obeyed."""
    untagged = _nbval(tmp_path, [])
    assert untagged.returncode != 0, "nbval did not notice a changed output (the guard)"
    tagged = _nbval(tmp_path, [IGNORE_OUTPUT_TAG])
    assert tagged.returncode == 0, f"nbval ignored the tag:\n{tagged.stdout[-2000:]}"


# Words that name an instruction set, a oneDNN implementation or a blocked layout: in a
# compared output they make nbval fail on another CPU (REVIEW: "block of 8" vs 16 vs 1).
ISA_TOKEN = re.compile(
    r"(AVX-?512|AVX2|SSE4(?:\.?[12])?|\bisa:|\bjit:|\bblock of \d+"
    r"|\b(?=[a-fA-F]*[A-F])(?=[a-fA-F]*[a-f])[a-fA-F]{2,6}(?:\d+[a-fA-F])+\b)",
    re.IGNORECASE,
)
# Cells whose code reads the committed measurement records print the same text on every
# machine (the records are data in the repository): their outputs may name ISAs. A cell
# reads them when its code says so, uses a name (function or variable) defined by a cell
# that does, or is tagged FROM_RECORDS_TAG. (The second nbval run, under the SSE4.1
# setting, is the full check.)
FROM_RECORDS_TAG = "from-records"
READS_RECORDS = re.compile(r"\b(load_records|records?)\b|\.section\(", re.IGNORECASE)
DEFINED = re.compile(r"^(?:def|class)\s+(\w+)|^(\w+)\s*(?::[^=\n]*)?=(?!=)|^for\s+(\w+)\s",
                     re.MULTILINE)


def _record_cells(cells: list[nbformat.NotebookNode]) -> set[int]:
    names: set[str] = set()
    found = set()
    for i, cell in enumerate(cells):
        used = re.findall(r"\b\w+\b", cell.source)
        tagged = FROM_RECORDS_TAG in cell.metadata.get("tags", [])
        if READS_RECORDS.search(cell.source) or names.intersection(used) or tagged:
            found.add(i)
            names |= {n for m in DEFINED.findall(cell.source) for n in m if n}
    return found


def _compared_texts(cell: nbformat.NotebookNode) -> list[str]:
    texts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            texts.append(out.text)
        for key, value in out.get("data", {}).items():
            if key.startswith("text/"):
                texts.append("".join(value) if isinstance(value, list) else value)
    return texts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_compared_outputs_name_no_instruction_set(path: Path) -> None:
    """No compared (not ``nbval-ignore-output``) output may print an ISA name, a oneDNN
    ``isa:``/``jit:`` string, a blocked layout such as aBcd8b, or a block size: those
    differ between CPUs (and between ISA settings of one CPU), so nbval would fail there.
    Outputs rendered from the committed records are exempt (``READS_RECORDS``)."""
    nb = nbformat.read(path, as_version=4)
    cells = code_cells(nb)
    from_records = _record_cells(cells)
    found = []
    for i, cell in enumerate(cells):
        if IGNORE_OUTPUT_TAG in cell.metadata.get("tags", []) or i in from_records:
            continue
        for text in _compared_texts(cell):
            for match in ISA_TOKEN.finditer(text):
                found.append(f"code cell {i}: {match.group(0)!r}")
    assert not found, "ISA-dependent words in compared outputs: " + ", ".join(found[:10])


# A cell that times something, tells the claims' verdicts or runs the DP-SGD step prints the
# machine it ran on first (:func:`convlab.lab.method.machine.stamp`), so its stored output
# says whose it is wherever the notebook is read (Colab, GitHub, the site).
MEASURES = ("interleaved(", "claims.report(", "dpsgd.compare(")
NOT_RUN = ("No CUDA device", "not usable here")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_measuring_cells_print_the_machine(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    missing = []
    for i, cell in enumerate(code_cells(nb)):
        if not any(call in cell.source for call in MEASURES) or not cell.outputs:
            continue
        text = "\n".join(_compared_texts(cell))
        if "this machine: " not in text and not any(s in text for s in NOT_RUN):
            missing.append(f"code cell {i}")
    assert not missing, "measuring cells that do not print the machine: " + ", ".join(missing)



# A link into PyTorch's source names the release it was read at: a line number on a
# moving branch (main, master, viable/strict) points at other code within weeks.
PYTORCH_BLOB = re.compile(
    r"github\.com/pytorch/pytorch/blob/(?P<ref>[^/\s)\"'>]+)/(?P<path>[^\s)\"'>#]+)"
    r"(?P<anchor>#L\d+(?:-L\d+)?)?")
RELEASE_TAG = re.compile(r"v\d+\.\d+\.\d+")
CITING_FILES = sorted(
    [*NOTEBOOKS, *(ROOT / "book").glob("*.md"), *(ROOT / "convlab").rglob("*.py"),
     *(ROOT / "cpp").rglob("*.cpp"), *(ROOT / "convlab").rglob("*.cpp")])


def _source_text(path: Path) -> str:
    """Markdown and code of a notebook (not its outputs), or a file's text."""
    if path.suffix != ".ipynb":
        return path.read_text()
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)


def pytorch_links_without_tag(text: str) -> list[str]:
    """The pytorch/pytorch source links with a line anchor whose ref is not a release
    tag (``v2.13.0``), e.g. ``blob/main/...#L10`` or ``blob/954cecd/...#L10``."""
    return [m.group(0) for m in PYTORCH_BLOB.finditer(text)
            if m.group("anchor") and not RELEASE_TAG.fullmatch(m.group("ref"))]


def test_line_links_rule_is_checkable() -> None:
    tagged = "https://github.com/pytorch/pytorch/blob/v2.13.0/a/Convolution.cpp#L725"
    assert pytorch_links_without_tag(tagged) == []
    assert pytorch_links_without_tag(tagged.replace("v2.13.0", "main")) != []
    assert pytorch_links_without_tag(tagged.replace("v2.13.0", "954cecd")) != []
    assert pytorch_links_without_tag(tagged.split("#")[0]) == []


@pytest.mark.parametrize("path", CITING_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pytorch_line_links_carry_a_release_tag(path: Path) -> None:
    """Every ``pytorch/pytorch/blob/REF/PATH#LNN`` in the book, the package and the C++
    sources has a release tag as REF, so its line numbers stay true."""
    bad = pytorch_links_without_tag(_source_text(path))
    assert not bad, f"line links without a release tag: {bad[:5]}"
