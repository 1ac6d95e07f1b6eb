"""Run the book and the tests on another torch, the way a Colab reader would.

Usage: python scripts/compat.py --torch 2.9.1 [--keep] [--record] [--cpp-only]
       python scripts/compat.py --pinned [--rehearse] [TEST ...]   (``make installed``)

1. a throwaway venv under .cache/compat/torch-VERSION with that torch from the package
   registry (pip's constraints file on some machines caps torch: it is lifted for this
   one install) and the pinned test tools of requirements.txt;
2. convlab installed non-editable from a copy of the repository, whose own ``convlab/``
   folder is then removed, so every import sees the installed package (as on Colab);
3. every chapter of _toc.yml executed with nbclient, two at a time (outputs not compared:
   the stored outputs belong to the pinned torch; an exception fails the chapter);
4. the test suite run in the copy, in two pytest-xdist workers;
5. the standalone libtorch program (cpp/standalone) built with CMake against that torch and
   run: its routes must agree (a CUDA wheel without the CUDA toolkit is reported as skipped);
6. a Colab rehearsal: the Colab copies (colab/) of the chapters that read the measurement
   records executed in an empty folder outside any checkout, so only the installed package's
   data can feed them; each must draw its figures and never print "No records".

``--cpp-only`` does step 5 alone, with nothing but torch installed: the C++ program claims
libtorch 2.0 and later, older than convlab's own floor (2.4), and this checks that claim.

``--pinned`` is the installed mode on this venv's own (pinned) torch, with nothing
downloaded, for ``make test``: a throwaway venv under .cache/installed on the same base
Python reads the running venv's site-packages (torch, the test tools) through a ``.pth``
file, convlab is installed into it as in step 2 (built offline with the running venv's
setuptools), and the TEST files (default: all of tests/) run in the copy, so a test that
reads the checkout's ``convlab/`` folder fails there; ``--rehearse`` adds step 6.

Exit status 0 only if every chapter ran, no test failed and the C++ program agreed. With
``--record`` the result becomes one row of book/data/compat.csv (the intro's "Tested with" table),
naming the commit it ran at (refused with uncommitted changes); the intro says, computed
from git when the book is built, what changed since (``_ext/book_compat.py``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "book" / "data" / "compat.csv"
FIELDS = ["torch", "python", "chapters run", "tests", "Colab copies outside a checkout",
          "date", "commit"]
# The chapters whose figures are drawn from book/data/records (package data once installed).
RECORD_CHAPTERS = ("07_backends_performance", "09_beyond", "10_determinism_accuracy")
# Test tools only: the book build (jupyter-book) and the pinned torch are not installed.
SKIP_REQUIREMENTS = ("torch", "jupyter-book", "sphinx", "-e", "playwright")
# Opacus and BackPACK (convlab[dp]) are pinned for the main torch; on another torch they
# are installed where pip finds versions that keep it (else tests/test_dpsgd.py skips).
DP_PACKAGES = ("opacus", "backpack-for-pytorch")
EXECUTE_CHAPTERS = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
if len(sys.argv) > 3:
    nbformat.write(nb, sys.argv[3])
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
        if line and not line.startswith(SKIP_REQUIREMENTS + DP_PACKAGES):
            keep.append(line)
    return keep


def chapters() -> list[Path]:
    """The notebooks listed in _toc.yml."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from toc_notebooks import toc_notebooks

    return [Path(p) for p in toc_notebooks()]


def copy_repository(dest: Path) -> None:
    """The files of the working tree that a commit of it would hold (tracked, or new and
    not ignored: no .venv, no caches)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_symlink():  # e.g. convlab/lab/data/records -> book/data/records
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def install_convlab(py: Path, repo: Path, env: dict[str, str], log: Path,
                    offline: bool = False) -> bool:
    """Install convlab non-editable from the copy ``repo`` into ``py``'s venv, then remove
    ``repo/convlab``, so every import in the copy sees the installed package (as on Colab).

    ``offline``: no index and no build isolation (the build uses the setuptools ``py``
    already sees), and a convlab that ``py`` sees outside its own venv (the running venv's
    editable one, through :func:`pinned_venv`'s ``.pth``) is ignored, not uninstalled.
    """
    cmd = [str(py), "-m", "pip", "install", "-q", "--no-deps", str(repo)]
    if offline:
        cmd[5:5] = ["--no-index", "--no-build-isolation", "--ignore-installed"]
    if run(cmd, log, env=env).returncode:
        return False
    shutil.rmtree(repo / "convlab")
    return True


def pinned_venv(venv: Path) -> Path:
    """A fresh venv at ``venv`` on this interpreter's base Python that also reads this
    interpreter's site-packages (one ``.pth`` line: the pinned torch and the test tools,
    nothing downloaded); returns its interpreter.

    Its own site-packages comes first on ``sys.path``, and the ``.pth`` files of the venv it
    reads are not run, so the editable convlab of that venv stays out of sight.
    """
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; "
                              "print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "pinned-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return py


def standalone_program(py: Path, repo: Path, env: dict[str, str], log: Path) -> str:
    """Build cpp/standalone with ``py``'s torch and run it: "ok", "FAILED" or "skipped ...".

    The build folder is ``repo/.cache/cpp-standalone/<torch version>`` (cpp/standalone/build.py).
    "ok" means it built, exited 0, printed "match" for both out= routes, and its
    ``out-limits`` mode ran to the end.
    """
    builder = repo / "cpp" / "standalone" / "build.py"
    built = subprocess.run([str(py), str(builder)], capture_output=True, text=True,
                           env=env, cwd=repo, check=False)
    with log.open("a") as sink:
        sink.write(f"\n$ {py} {builder}\n{built.stdout}{built.stderr}")
    if built.returncode != 0:
        if "is a CUDA build" in built.stderr:
            return "skipped (CUDA wheel, no CUDA toolkit)"
        return "FAILED (build)"
    program = built.stdout.strip().splitlines()[-1]
    outputs = []
    for cmd in ([program], [program, "out-limits"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        with log.open("a") as sink:
            sink.write(f"\n$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        outputs.append(done)
    agreed = outputs[0].stdout.count("vs convolution_backward: match") == 2
    ran = all(done.returncode == 0 for done in outputs)
    return "ok" if ran and agreed else "FAILED"


def colab_rehearsal(py: Path, env: dict[str, str], work: Path, log: Path) -> str:
    """Execute the Colab copies of RECORD_CHAPTERS in ``work/colab`` (no checkout there:
    the install cell only acts on Colab, so the venv's installed convlab is what runs).

    Returns e.g. "3 of 3 (14 figures)", or "FAILED: <chapter> <why>".
    """
    folder = work / "colab"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    figures = 0
    for stem in RECORD_CHAPTERS:
        copy = folder / f"{stem}.ipynb"
        shutil.copy2(ROOT / "colab" / copy.name, copy)
        done = folder / f"{stem}.executed.ipynb"
        result = run([str(py), "-c", EXECUTE_CHAPTERS, str(copy), str(folder), str(done)],
                     log, env=env, cwd=folder)
        if result.returncode:
            return f"FAILED: {stem} raised (see the log)"
        outputs = [o for cell in json.loads(done.read_text())["cells"]
                   for o in cell.get("outputs", [])]
        text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get(
            "text/plain", "")) for o in outputs)
        drawn = sum(bool({"image/svg+xml", "image/png"} & set(o.get("data", {})))
                    for o in outputs)
        if "No records" in text or "no records" in text:
            return f"FAILED: {stem} found no records"
        if not drawn:
            return f"FAILED: {stem} drew no figure"
        figures += drawn
    return f"{len(RECORD_CHAPTERS)} of {len(RECORD_CHAPTERS)} ({figures} figures)"


def summary(pytest_output: str) -> str:
    """pytest's closing counts, e.g. '812 passed, 80 skipped'."""
    lines = [ln for ln in pytest_output.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    if not lines:
        return "no result"
    counts = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", lines[-1])
    return ", ".join(f"{n} {what}" for n, what in counts)


def clean_commit() -> tuple[str, str]:
    """The checkout's commit (short hash) and, if the row could not name it, why: tracked
    files changed and not committed (the compat table itself aside)."""
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if head.returncode:
        return "", f"not a git checkout ({head.stderr.strip()})"
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    dirty = [line[3:] for line in changed.splitlines()
             if line[3:] != str(CSV.relative_to(ROOT))]
    if dirty:
        return "", f"commit first; changed: {', '.join(dirty[:5])}"
    return head.stdout.strip(), ""


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


def installed_here(tests: list[str], rehearse: bool) -> int:
    """``--pinned``: the installed mode on this venv's torch (module docstring). The venv
    and the copy are made anew each run; the C++ extension's build folder is kept."""
    work = ROOT / ".cache" / "installed"
    venv, repo, log = work / "venv", work / "repo", work / "log.txt"
    shutil.rmtree(repo, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    log.write_text(f"installed-mode run, {dt.datetime.now():%Y-%m-%d %H:%M}\n")
    start = time.perf_counter()
    py = pinned_venv(venv)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    copy_repository(repo)
    if not install_convlab(py, repo, env, log, offline=True):
        print(f"installing convlab failed: see {log}", file=sys.stderr)
        return 1
    where = subprocess.run([str(py), "-c", "import convlab; print(convlab.__file__)"],
                           capture_output=True, text=True, env=env, cwd=repo, check=False)
    if where.returncode or not Path(where.stdout.strip()).is_relative_to(venv):
        print(f"convlab is not imported from {venv}: {where.stdout}{where.stderr}",
              file=sys.stderr)
        return 1
    # pip writes the files with the time of the install: give the C++ sources the
    # checkout's times, so the kept extension build is reused while they are unchanged
    package = Path(where.stdout.strip()).parent
    for src in (ROOT / "convlab" / "aten" / "csrc").glob("*.[ch]*"):
        installed = package / "aten" / "csrc" / src.name
        if installed.is_file() and installed.read_bytes() == src.read_bytes():
            shutil.copystat(src, installed)
    print(f"convlab installed in {venv.relative_to(ROOT)}, the copy's convlab/ removed "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    tests_run = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                *tests], cwd=repo, env=env, check=False)
    colab = colab_rehearsal(py, env, work, log) if rehearse else "not run"
    if rehearse:
        print(f"Colab copies outside a checkout: {colab}", flush=True)
    print(f"installed mode done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0 if tests_run.returncode == 0 and not colab.startswith("FAILED") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", help="torch version, e.g. 2.9.1")
    parser.add_argument("--pinned", action="store_true",
                        help="installed mode on this venv's torch, nothing downloaded")
    parser.add_argument("--rehearse", action="store_true",
                        help="with --pinned: also the Colab rehearsal (step 6)")
    parser.add_argument("tests", nargs="*", help="with --pinned: the test files to run")
    parser.add_argument("--keep", action="store_true", help="keep the venv for a rerun")
    parser.add_argument("--install-only", action="store_true",
                        help="only create the venv (implies --keep)")
    parser.add_argument("--cpp-only", action="store_true",
                        help="only build and run the standalone C++ program")
    parser.add_argument("--record", action="store_true",
                        help="write the result into book/data/compat.csv")
    args = parser.parse_args(argv)
    if args.pinned:
        if args.torch or args.record or args.cpp_only or args.install_only:
            parser.error("--pinned runs on this venv's torch: no --torch, --record, "
                         "--cpp-only or --install-only")
        return installed_here(args.tests or ["tests"], args.rehearse)
    if args.tests or args.rehearse:
        parser.error("test files and --rehearse go with --pinned")
    if args.torch is None:
        parser.error("one of --torch VERSION or --pinned is required")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.torch):
        parser.error(f"--torch must be a version like 2.9.1, got {args.torch!r}")

    commit = ""
    if args.record:
        commit, problem = clean_commit()
        if problem:
            parser.error(f"--record names the commit the row ran at: {problem}")

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
    tools = [] if args.cpp_only else requirements()
    steps = [[str(py), "-m", "pip", "install", "-q", f"torch=={args.torch}", *tools]]
    for cmd in steps:
        if run(cmd, log, env=env).returncode:
            print(f"install failed: see {log}", file=sys.stderr)
            return 1
    if run([str(py), "-m", "pip", "install", "-q", f"torch=={args.torch}", *DP_PACKAGES],
           log, env=env).returncode:
        print(f"  {', '.join(DP_PACKAGES)}: not installable with torch {args.torch} "
              f"(see {log})", flush=True)
    if args.install_only:
        return 0
    copy_repository(repo)
    if args.cpp_only:
        status = standalone_program(py, repo, env, log)
        print(f"  C++ program: {status}", flush=True)
        if not args.keep:
            shutil.rmtree(repo, ignore_errors=True)
        return 0 if status == "ok" else 1
    if not install_convlab(py, repo, env, log):
        print(f"installing convlab failed: see {log}", file=sys.stderr)
        return 1
    version = subprocess.run([str(py), "-c", "import torch, sys; print(torch.__version__, "
                              "'%d.%d' % sys.version_info[:2])"], capture_output=True,
                             text=True, env=env, check=True).stdout.split()
    print(f"torch {version[0]} on Python {version[1]}", flush=True)

    def execute(nb: Path) -> bool:
        """Run one chapter's copy in its own kernel; its output goes to its own log."""
        copy = repo / nb.relative_to(ROOT)
        t0 = time.perf_counter()
        result = run([str(py), "-c", EXECUTE_CHAPTERS, str(copy), str(copy.parent)],
                     work / f"log-{nb.stem}.txt", env=env, cwd=copy.parent)
        status = "ok" if result.returncode == 0 else f"FAILED (see log-{nb.stem}.txt)"
        print(f"  {nb.name}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)
        return result.returncode == 0

    # two chapters at a time, as `make test` runs its notebooks
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(execute, chapters()))
    ok, total = sum(done), len(done)

    # two workers, as `make test` runs them (pytest-xdist is one of the pinned test tools)
    tests = subprocess.run([str(py), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                            "-n", "2", "--dist", "loadfile"],
                           cwd=repo, env=env, capture_output=True, text=True, check=False)
    with log.open("a") as sink:
        sink.write(tests.stdout + tests.stderr)
    counts = summary(tests.stdout)
    print(f"  tests: {counts} (exit {tests.returncode})", flush=True)
    cpp = standalone_program(py, repo, env, log)
    print(f"  C++ program: {cpp}", flush=True)
    colab = colab_rehearsal(py, env, work, log)
    print(f"  Colab copies outside a checkout: {colab}", flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)

    passed = (ok == total and tests.returncode == 0 and not cpp.startswith("FAILED")
              and not colab.startswith("FAILED"))
    if args.record:
        record({"torch": version[0].split("+")[0], "python": version[1],
                "chapters run": f"{ok} of {total}", "tests": counts,
                "Colab copies outside a checkout": colab,
                "date": f"{dt.date.today():%Y-%m-%d}", "commit": commit})
    if not args.keep:
        shutil.rmtree(work / "repo", ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
