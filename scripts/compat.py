"""Run the book and the tests on another torch, the way a Colab reader would.

Usage: python scripts/compat.py --torch 2.9.1 [--keep] [--record]

1. a throwaway venv under .cache/compat/torch-VERSION with that torch from the package
   registry (pip's constraints file on some machines caps torch: it is lifted for this
   one install) and the pinned test tools of requirements.txt;
2. convlab installed non-editable from a copy of the repository, whose own ``convlab/``
   folder is then removed, so every import sees the installed package (as on Colab);
3. every chapter of _toc.yml executed with nbclient (outputs not compared: the stored
   outputs belong to the pinned torch; an exception fails the chapter);
4. the test suite run in the copy.

Exit status 0 only if every chapter ran and no test failed. With ``--record`` the result
becomes one row of book/data/compat.csv (the intro's "Tested with" table).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "book" / "data" / "compat.csv"
FIELDS = ["torch", "python", "chapters run", "tests", "date"]
# Test tools only: the book build (jupyter-book) and the pinned torch are not installed.
SKIP_REQUIREMENTS = ("torch", "jupyter-book", "sphinx", "-e", "playwright")
EXECUTE_CHAPTERS = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
"""


def run(cmd: list[str], log: Path, **kwargs: object) -> subprocess.CompletedProcess:
    """Run ``cmd``, appending its output to ``log``; never raises on failure."""
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(cmd)}\n")
        sink.flush()
        return subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                              check=False, **kwargs)


def requirements() -> list[str]:
    """The pinned test tools of requirements.txt (no torch, no book build)."""
    keep = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith(SKIP_REQUIREMENTS):
            keep.append(line)
    return keep


def chapters() -> list[Path]:
    """The notebooks listed in _toc.yml."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from toc_notebooks import toc_notebooks

    return [Path(p) for p in toc_notebooks()]


def copy_repository(dest: Path) -> None:
    """The tracked files of the working tree (what a clone would hold), without .venv."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def summary(pytest_output: str) -> str:
    """pytest's closing counts, e.g. '812 passed, 80 skipped'."""
    lines = [ln for ln in pytest_output.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    if not lines:
        return "no result"
    counts = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", lines[-1])
    return ", ".join(f"{n} {what}" for n, what in counts)


def record(row: dict[str, str]) -> None:
    """Replace the row for ``row['torch']`` in book/data/compat.csv (sorted by version)."""
    rows = []
    if CSV.exists():
        with CSV.open() as f:
            rows = [r for r in csv.DictReader(f) if r["torch"] != row["torch"]]
    rows.append(row)
    rows.sort(key=lambda r: tuple(int(x) for x in re.findall(r"\d+", r["torch"])[:3]))
    CSV.parent.mkdir(parents=True, exist_ok=True)
    with CSV.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="torch version, e.g. 2.9.1")
    parser.add_argument("--keep", action="store_true", help="keep the venv for a rerun")
    parser.add_argument("--install-only", action="store_true",
                        help="only create the venv (implies --keep)")
    parser.add_argument("--record", action="store_true",
                        help="write the result into book/data/compat.csv")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.torch):
        parser.error(f"--torch must be a version like 2.9.1, got {args.torch!r}")

    work = ROOT / ".cache" / "compat" / f"torch-{args.torch}"
    venv, repo, log = work / "venv", work / "repo", work / "log.txt"
    shutil.rmtree(repo, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    log.write_text(f"compat run for torch {args.torch}, {dt.datetime.now():%Y-%m-%d %H:%M}\n")
    print(f"log: {log}", flush=True)
    py = venv / "bin" / "python"
    env = dict(os.environ, PIP_CONSTRAINT="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    # the kernelspec's "python" must be this venv's interpreter
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    start = time.perf_counter()

    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    steps = [
        [str(py), "-m", "pip", "install", "-q", f"torch=={args.torch}", *requirements()],
    ]
    for cmd in steps:
        if run(cmd, log, env=env).returncode:
            print(f"install failed: see {log}", file=sys.stderr)
            return 1
    if args.install_only:
        return 0
    copy_repository(repo)
    if run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(repo)], log,
           env=env).returncode:
        print(f"installing convlab failed: see {log}", file=sys.stderr)
        return 1
    shutil.rmtree(repo / "convlab")
    version = subprocess.run([str(py), "-c", "import torch, sys; print(torch.__version__, "
                              "'%d.%d' % sys.version_info[:2])"], capture_output=True,
                             text=True, env=env, check=True).stdout.split()
    print(f"torch {version[0]} on Python {version[1]}", flush=True)

    ok, total = 0, 0
    for nb in chapters():
        total += 1
        copy = repo / nb.relative_to(ROOT)
        t0 = time.perf_counter()
        result = run([str(py), "-c", EXECUTE_CHAPTERS, str(copy), str(copy.parent)], log,
                     env=env, cwd=copy.parent)
        status = "ok" if result.returncode == 0 else "FAILED"
        ok += result.returncode == 0
        print(f"  {nb.name}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)

    tests = subprocess.run([str(py), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                           cwd=repo, env=env, capture_output=True, text=True, check=False)
    with log.open("a") as sink:
        sink.write(tests.stdout + tests.stderr)
    counts = summary(tests.stdout)
    print(f"  tests: {counts} (exit {tests.returncode})", flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)

    passed = ok == total and tests.returncode == 0
    if args.record:
        record({"torch": version[0].split("+")[0], "python": version[1],
                "chapters run": f"{ok} of {total}", "tests": counts,
                "date": f"{dt.date.today():%Y-%m-%d}"})
    if not args.keep:
        shutil.rmtree(work / "repo", ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
