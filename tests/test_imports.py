"""Importing convlab builds nothing and imports no ``torch.utils.cpp_extension``.

``cpp_extension`` prints a warning when it is imported from a CUDA wheel on a machine
without a CUDA runtime (``No CUDA runtime is found, using CUDA_HOME=...``, Colab's CPU
runtime and ``make compat``), so a module that imports it, directly or through
``torch.utils.benchmark``, puts that line on the stderr of every script and chapter that
imports convlab. The C++ extension and the timer import it where they are used. The check
runs in a fresh interpreter: this process has imported both long before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch.utils.cpp_extension", "torch.utils.benchmark")
IMPORT_ALL = """
import importlib, json, os, pkgutil, sys
import convlab
names = sorted(m.name for m in pkgutil.walk_packages(convlab.__path__, "convlab.")
               if not m.name.endswith("__main__"))   # __main__ runs the command
first = {}
for name in names:
    importlib.import_module(name)
    for heavy in HEAVY:
        if heavy in sys.modules and heavy not in first:
            first[heavy] = name
built = sorted(os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]))
print(json.dumps({"modules": names, "first": first, "built": built}))
"""


def test_importing_every_module_imports_no_cpp_extension(tmp_path: Path) -> None:
    """Every module of the package (as installed: the checkout's or the wheel's), in one
    fresh interpreter; ``first`` names the module after whose import a heavy one appeared."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{IMPORT_ALL}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "convlab.aten.extension" in found["modules"]
    assert "convlab.lab.method.timing" in found["modules"]
    assert found["first"] == {}, f"imported at import time: {found['first']}"
    assert found["built"] == [], f"built at import time: {found['built']}"
    assert done.stderr == ""


def test_old_torch_runs_imports_no_torch() -> None:
    """scripts/old_torch_runs.py runs another interpreter's torch: its own imports load none
    (convlab only for ``--record``), so its messages are the only lines on its stderr."""
    script = str(ROOT / "scripts" / "old_torch_runs.py")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('s', {script!r})\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            f"print(sorted(m for m in ('torch', *{HEAVY!r}) if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
