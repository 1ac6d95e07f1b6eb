"""``_ext/book_compat.py``: the intro's sentence on what changed since the compat runs,
computed from git in a small repository made here."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("sphinx", reason="the book's toolchain is not installed")
# A Sphinx extension of the book (_ext/), not a package: loaded from its file.
_SPEC = importlib.util.spec_from_file_location("book_compat", ROOT / "_ext" / "book_compat.py")
book_compat = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(book_compat)

HEADER = "torch,python,chapters run,tests,Colab copies outside a checkout,date,commit\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if subprocess.run(["git", "--version"], capture_output=True, check=False).returncode:
        pytest.skip("no git")
    git(tmp_path, "init", "-q")
    (tmp_path / "convlab").mkdir()
    (tmp_path / "convlab" / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("words\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def table(repo: Path, *commits: str) -> Path:
    path = repo / "compat.csv"
    path.write_text(HEADER + "".join(f"2.{i}.0,3.11,13 of 13,1 passed,ok,2026-12-06,{c}\n"
                                     for i, c in enumerate(commits)))
    return path


def test_no_change_since_the_runs_says_they_test_this_build(repo: Path) -> None:
    one = git(repo, "rev-parse", "--short=7", "HEAD")
    (repo / "README.md").write_text("other words\n")  # not code: does not count
    git(repo, "commit", "-qam", "docs")
    text = book_compat.sentence(repo, table(repo, one, one))
    assert "2 runs at " + one + ": nothing `make compat` runs has changed" in text


def test_a_code_change_since_the_runs_is_counted(repo: Path) -> None:
    one = git(repo, "rev-parse", "--short=7", "HEAD")
    (repo / "convlab" / "a.py").write_text("x = 2\n")
    git(repo, "commit", "-qam", "code")
    text = book_compat.sentence(repo, table(repo, one))
    assert "1 run at " + one + ": 1 of the files" in text and "1 in convlab" in text
    assert "has changed since" in text and "so it does not test this build's code" in text
    (repo / "convlab" / "a.py").write_text("x = 3\n")
    assert "with uncommitted changes" in book_compat.sentence(repo, table(repo, one))


def test_rows_without_a_commit_or_with_an_unknown_one_say_so(repo: Path) -> None:
    text = book_compat.sentence(repo, table(repo, "", "0000000"))
    assert "1 run names no commit" in text
    assert "1 run at 0000000, which this checkout's history lacks" in text


def test_the_committed_table_names_a_commit_per_row() -> None:
    rows = (ROOT / book_compat.TABLE).read_text().splitlines()
    assert rows[0].endswith(",commit")
    assert all(len(r.rsplit(",", 1)[1]) >= 7 for r in rows[1:]), rows
