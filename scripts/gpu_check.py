"""`make gpu-check`: the CUDA tests and every chapter of the book, on a CUDA machine.

Usage: python3 scripts/gpu_check.py [--allow-cpu] [--skip-tests] [--store DIR] [--timeout S]
[book/x.ipynb ...]

1. ``pytest -m cuda tests/`` (test files whose imports are missing here are left out, and
   listed);
2. every notebook of ``_toc.yml`` (or the ones given), run as a plain Python script on the
   GPU: errors fail, outputs are not compared;
3. with ``--store DIR`` (``make gpu-check`` passes ``book/data/gpu``), the CUDA claims of
   :mod:`convlab.lab.claims.cuda`, run and written to ``DIR/<device>.json``, which the
   book shows on machines without a GPU;
4. a summary: each step's pass/fail and time, and which backend ATen selects on CUDA for a
   few common convolutions (cuDNN or not).

Needs only torch, numpy, matplotlib and pytest: no Jupyter stack, no network. Notebooks are
read with :mod:`json`; IPython magics (``%pip``, ``!ls``) become ``pass``, so the Colab
install cell is a no-op. Without CUDA it stops with exit status 2 unless ``--allow-cpu``
(used by tests/test_gpu_check.py to exercise the notebook runner on CPU).
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Cell magics whose body is still Python (time it, capture its output); others are skipped.
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}
# Jupyter builtins that plain Python lacks: a notebook may call display() freely, and
# import IPython's display() and get_ipython() where IPython itself is not installed.
PRELUDE = '''\
import builtins as _builtins
if not hasattr(_builtins, "display"):
    def _display(*objs, **kwargs):
        for obj in objs:
            print(obj)
    _builtins.display = _display
try:
    import IPython.display
except ImportError:
    import sys as _sys
    import types as _types
    _ipython = _types.ModuleType("IPython")
    _ipython.display = _types.ModuleType("IPython.display")
    _ipython.display.display = _builtins.display
    _ipython.get_ipython = lambda: None
    _ipython.version_info = (8, 24, 0)  # matplotlib reads it; from 8.24 on it asks no more
    _sys.modules.update({"IPython": _ipython, "IPython.display": _ipython.display})
    del _sys, _types, _ipython
del _builtins
'''


@dataclass
class Result:
    """Outcome of one step of the check."""

    name: str
    ok: bool
    seconds: float
    detail: str = ""
    log: str = ""


# --- notebooks to scripts -------------------------------------------------------------------


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _convert_line(line: str) -> str:
    """A line magic (``%pip ...``) or shell escape (``!ls``) becomes ``pass`` at its indent."""
    stripped = line.lstrip()
    if stripped.startswith(("%", "!")):
        indent = line[: len(line) - len(stripped)]
        return f"{indent}pass  # was: {stripped.strip()}"
    return line


def cell_to_python(source: str) -> str:
    """The Python code of one code cell, magics neutralised; ``""`` for a non-Python cell.

    >>> cell_to_python("x = 1\\n%time y = 2")
    'x = 1\\npass  # was: %time y = 2'
    """
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split()[0] if lines[0].strip() != "%%" else ""
        if magic not in PYTHON_CELL_MAGICS:
            return ""  # %%bash, %%writefile, ...: not Python
        lines = lines[1:]
    return "\n".join(_convert_line(line) for line in lines)


def notebook_to_script(nb: dict) -> str:
    """Join the code cells of a notebook (parsed ``.ipynb`` JSON) into one Python script.

    Each cell starts with a ``# --- cell N ---`` marker (N counts code cells from 1) so an
    error's line number can be traced back to its cell; raw and markdown cells are dropped.
    """
    parts = [PRELUDE]
    number = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        code = cell_to_python(_source(cell))
        parts.append(f"# --- cell {number} ---\n{code}\n")
    script = "\n".join(parts)
    ast.parse(script)  # a syntax error is reported here, before any run
    return script


def cell_of_line(script: str, lineno: int) -> int | None:
    """Which code cell (1-based) line ``lineno`` of a :func:`notebook_to_script` script is in."""
    cell = None
    for i, line in enumerate(script.splitlines(), start=1):
        if i > lineno:
            break
        match = re.match(r"# --- cell (\d+) ---$", line)
        if match:
            cell = int(match.group(1))
    return cell


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """Notebooks listed in ``_toc.yml``, in order (PyYAML if present, else a line scan)."""
    text = (root / "_toc.yml").read_text()
    try:
        import yaml
    except ImportError:
        entries = re.findall(r"^\s*-?\s*(?:file|root):\s*['\"]?([^'\"\s#]+)", text, re.M)
    else:
        entries = []

        def walk(node: object) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key in ("file", "root") and isinstance(value, str):
                        entries.append(value)
                    else:
                        walk(value)
            elif isinstance(node, list):
                for item in node:
                    walk(item)

        walk(yaml.safe_load(text))
    paths = [root / f"{entry}.ipynb" for entry in entries]
    return [p for p in paths if p.exists()]


def child_env(root: Path = ROOT) -> dict[str, str]:
    """Environment for the child processes: the checkout importable, a headless matplotlib."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["MPLBACKEND"] = "Agg"
    env.setdefault("PYTHONHASHSEED", "0")
    bindir = os.path.dirname(sys.executable)  # the extension needs ninja on PATH
    env["PATH"] = os.pathsep.join(filter(None, [env.get("PATH"), bindir]))
    return env


def run_notebook(path: Path, timeout: float, root: Path = ROOT) -> Result:
    """Run one notebook as a script in its own folder (as Jupyter does); fail on any error."""
    name = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    start = time.perf_counter()
    try:
        script = notebook_to_script(json.loads(path.read_text()))
    except (ValueError, SyntaxError) as exc:
        return Result(name, False, 0.0, f"cannot convert: {exc}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix=f"{path.stem}_", delete=False) as f:
        f.write(script)
        script_path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, script_path], cwd=path.parent, env=child_env(root),
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Result(name, False, time.perf_counter() - start, f"timed out after {timeout:.0f} s")
    finally:
        os.unlink(script_path)
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return Result(name, True, seconds)
    lines = [int(n) for n in re.findall(rf'File "{re.escape(script_path)}", line (\d+)',
                                        proc.stderr)]
    where = f"code cell {cell_of_line(script, lines[-1])}: " if lines else ""
    last = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return Result(name, False, seconds, where + last[0], proc.stderr)


# --- CUDA tests -----------------------------------------------------------------------------


def _missing_imports(path: Path, root: Path = ROOT, _seen: set[Path] | None = None) -> list[str]:
    """Top-level modules a test file imports (directly or through a sibling module) that
    cannot be found here. The checkout and the file's folder are searched as pytest does."""
    local = [str(root), str(path.parent)]
    seen = {path} if _seen is None else _seen
    missing: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in missing:
                continue
            spec = importlib.machinery.PathFinder.find_spec(top, local)
            if spec is None:
                if importlib.util.find_spec(top) is None:
                    missing.append(top)
                continue
            sibling = Path(spec.origin or "")
            if sibling.parent == path.parent and sibling.suffix == ".py" and sibling not in seen:
                seen.add(sibling)  # e.g. `from test_reference import CASES`
                missing += [m for m in _missing_imports(sibling, root, seen) if m not in missing]
    for script in _loaded_by_path(path, root):  # e.g. scripts/old_torch_runs.py
        if script not in seen:
            seen.add(script)
            missing += [m for m in _missing_imports(script, root, seen) if m not in missing]
    return missing


def _loaded_by_path(path: Path, root: Path = ROOT) -> list[Path]:
    """The checkout's Python files that ``path`` loads by file name through
    ``importlib.util.spec_from_file_location`` (looked up in ``scripts/`` and next to it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        func = node.func if isinstance(node, ast.Call) else None
        if getattr(func, "attr", getattr(func, "id", None)) != "spec_from_file_location":
            continue
        for const in ast.walk(node):
            if isinstance(const, ast.Constant) and str(const.value).endswith(".py"):
                found += [p for p in (root / "scripts" / str(const.value),
                                      path.parent / str(const.value))
                          if p.is_file() and p not in found]
    return found


def run_cuda_tests(timeout: float, root: Path = ROOT) -> tuple[Result, list[str]]:
    """``pytest -m cuda tests/``, leaving out test files that cannot be imported here."""
    tests = root / "tests"
    notes = []
    conftest = tests / "conftest.py"
    missing = _missing_imports(conftest, root) if conftest.exists() else []
    if missing:
        return Result("pytest -m cuda tests/", False, 0.0,
                      f"tests/conftest.py needs {', '.join(missing)}: pip install it"), notes
    ignore = []
    for path in sorted(tests.glob("test_*.py")):
        missing = _missing_imports(path, root)
        if missing:
            ignore.append(f"--ignore={path}")
            notes.append(f"left out {path.relative_to(root)} (needs {', '.join(missing)})")
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
           str(tests), *ignore]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, env=child_env(root), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result("pytest -m cuda tests/", False, time.perf_counter() - start,
                      f"timed out after {timeout:.0f} s"), notes
    seconds = time.perf_counter() - start
    tail = [line for line in proc.stdout.strip().splitlines() if line.strip()][-1:] or [""]
    ok = proc.returncode == 0
    if proc.returncode == 5:
        tail = ["no CUDA tests were collected"]
    if not ok:
        notes.append(proc.stdout[-4000:] + proc.stderr[-2000:])
    return Result("pytest -m cuda tests/", ok, seconds, tail[0].strip("= ")), notes


# --- what ATen selects on CUDA --------------------------------------------------------------


def backend_report(device: str) -> list[str]:
    """Which backend ATen selects on ``device`` for every benchmark layer of
    :data:`convlab.lab.paths.SUITE` (float32, plus float16 and float64 for the first), and
    what each forced path of the registry gets."""
    import torch

    from convlab.lab import paths

    dev = torch.device(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}"]
    if device == "cuda":
        lines.append(f"device: {torch.cuda.get_device_name(0)}")
    forced = [p for p in paths.PATHS if p.force is not None]
    cases = [(layer, torch.float32) for layer in paths.SUITE]
    cases += [(paths.SUITE[0], torch.float16), (paths.SUITE[0], torch.float64)]
    for layer, dtype in cases:
        label = f"{layer.name} {str(dtype).replace('torch.', '')}"
        try:
            chosen = paths.get_path("native").check(layer, dev, dtype)
        except Exception as exc:  # noqa: BLE001 - report, do not stop the summary
            chosen = f"error: {exc}"
        got = []
        for path in forced:
            try:
                got.append(f"{path.name}={path.check(layer, dev, dtype)}")
            except paths.NotApplicable:
                continue
        lines.append(f"{label:<20} {chosen:<16} (forced: {', '.join(got) or 'none'})")
    return lines


def preflight() -> list[str]:
    """Warnings about tools the checks need and this machine lacks (nothing is installed)."""
    warnings = []
    bindir = os.path.dirname(sys.executable)
    if not (shutil.which("ninja") or shutil.which("ninja", path=bindir)):
        warnings.append("ninja not found: the C++ extension (its tests, chapter 5) cannot "
                        "build; `pip install ninja`")
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        warnings.append(f"no C++ compiler ({compiler}): the C++ extension cannot build")
    return warnings


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every notebook in _toc.yml)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run even without CUDA (to test this script on CPU)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m cuda")
    parser.add_argument("--store", type=Path, default=None, metavar="DIR",
                        help="also run the CUDA claims and store them in DIR as "
                        "<device>.json (book/data/gpu; convlab.lab.claims.gpu_runs)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds allowed per notebook and for the test run (default 600)")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu-check: torch is not installed for this Python "
              f"({sys.executable})", file=sys.stderr)
        return 2
    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.allow_cpu:
        print("gpu-check: no CUDA device is visible to torch "
              f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); run it on a "
              "CUDA machine, or pass --allow-cpu to exercise the script on CPU", file=sys.stderr)
        return 2
    device = "cuda" if has_cuda else "cpu"

    results: list[Result] = []
    notes: list[str] = preflight()
    for warning in notes:
        print(f"warning: {warning}", flush=True)
    if not args.skip_tests:
        print("running pytest -m cuda tests/ ...", flush=True)
        result, test_notes = run_cuda_tests(args.timeout)
        results.append(result)
        notes += test_notes
    paths = [p.resolve() for p in args.notebooks] or toc_notebooks()
    for path in paths:
        print(f"running {path.name} on {device} ...", flush=True)
        result = run_notebook(path, args.timeout)
        results.append(result)
        if not result.ok and result.log:
            notes.append(f"{result.name}, end of stderr:\n{result.log[-3000:]}")

    if args.store is not None and has_cuda:
        start = time.perf_counter()
        try:
            sys.path.insert(0, str(ROOT))
            from convlab.lab.claims import gpu_runs
            steps = {r.name: ("PASS" if r.ok else "FAIL") + (f": {r.detail}" if r.detail
                                                             else "") for r in results}
            where = gpu_runs.store(gpu_runs.run_here(steps), args.store)
            results.append(Result("CUDA claims stored", True, time.perf_counter() - start,
                                  str(where)))
        except Exception as exc:  # the summary must still print
            results.append(Result("CUDA claims stored", False,
                                  time.perf_counter() - start, str(exc)[:200]))

    print("\n== gpu-check summary ==")
    for r in results:
        status = "PASS" if r.ok else "FAIL"
        print(f"{status}  {r.seconds:7.1f} s  {r.name}" + (f"  [{r.detail}]" if r.detail else ""))
    try:
        report = backend_report(device)
    except Exception as exc:  # the summary must still print
        report = [f"backend report failed: {exc}"]
    print(f"\n== backends ATen selects on {device} ==")
    print("\n".join(report))
    if notes:
        print("\n== notes ==")
        print("\n".join(notes))
    failed = [r.name for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
