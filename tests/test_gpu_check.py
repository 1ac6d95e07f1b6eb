"""CPU-side tests of scripts/gpu_check.py: notebook-to-script conversion and the runner."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up by name
_spec.loader.exec_module(gpu_check)

COLAB = (
    "import sys\n"
    'if "google.colab" in sys.modules:  # on Colab only: install convlab from the repository\n'
    '    %pip install -q "convlab @ git+https://github.com/conv-backward/conv-backward-book"\n'
)


def notebook(*sources: str, markdown: str = "# title") -> dict:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": markdown}]
    for i, src in enumerate(sources, start=1):
        cells.append({"cell_type": "code", "metadata": {}, "execution_count": i, "outputs": [],
                      "source": src.splitlines(keepends=True)})
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_magics_become_pass_at_their_indent() -> None:
    code = gpu_check.cell_to_python(COLAB)
    assert "%pip" not in code.replace("# was: %pip", "")
    assert '    pass  # was: %pip install -q "convlab @' in code
    compile(code, "cell", "exec")
    assert gpu_check.cell_to_python("!nvidia-smi\nx = 1") == "pass  # was: !nvidia-smi\nx = 1"


def test_cell_magics() -> None:
    assert gpu_check.cell_to_python("%%time\nx = 1\ny = 2") == "x = 1\ny = 2"
    assert gpu_check.cell_to_python("%%bash\necho hi") == ""
    assert gpu_check.cell_to_python("%%writefile f.py\nprint(1)") == ""


def test_notebook_to_script_keeps_code_cells_in_order_with_markers() -> None:
    script = gpu_check.notebook_to_script(notebook(COLAB, "a = 1", "%%bash\nls", "b = a + 1"))
    assert "# title" not in script
    assert script.index("a = 1") < script.index("b = a + 1")
    assert [n for n in range(1, 5) if f"# --- cell {n} ---" in script] == [1, 2, 3, 4]
    namespace: dict = {}
    exec(compile(script, "nb", "exec"), namespace)
    assert namespace["b"] == 2
    line = script.splitlines().index("b = a + 1") + 1
    assert gpu_check.cell_of_line(script, line) == 4
    assert gpu_check.cell_of_line(script, 1) is None  # the prelude belongs to no cell


def test_notebook_to_script_reports_a_syntax_error() -> None:
    with pytest.raises(SyntaxError):
        gpu_check.notebook_to_script(notebook("def f(:\n    pass"))


def test_toc_notebooks_match_the_book_helper() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from toc_notebooks import toc_notebooks

    assert gpu_check.toc_notebooks() == toc_notebooks()


def test_toc_notebooks_without_yaml(tmp_path, monkeypatch) -> None:
    (tmp_path / "book").mkdir()
    for name in ("a", "b"):
        (tmp_path / "book" / f"{name}.ipynb").write_text("{}")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n  - caption: C\n    chapters:\n"
        "      - file: book/b\n      - file: book/missing\n      - file: book/a\n"
    )
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now raises ImportError
    assert gpu_check.toc_notebooks(tmp_path) == [tmp_path / "book/b.ipynb",
                                                 tmp_path / "book/a.ipynb"]


def test_missing_imports_lists_absent_modules(tmp_path) -> None:
    (tmp_path / "mypkg").mkdir()  # a package of the checkout: found without being installed
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "helper.py").write_text("import no_such_module_abc\n")
    (tests / "conftest.py").write_text("import os\n")
    path = tests / "test_x.py"
    path.write_text("import os\nimport torch\nimport mypkg\nfrom conftest import x\n"
                    "from no_such_module_xyz import y\n")
    assert gpu_check._missing_imports(path, tmp_path) == ["no_such_module_xyz"]
    # a sibling test module that cannot be imported makes its importers unimportable too
    path.write_text("from helper import z\n")
    assert gpu_check._missing_imports(path, tmp_path) == ["no_such_module_abc"]
    # a script loaded by its file name counts as imported (tests/test_version_runs.py)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "tool.py").write_text("import no_such_module_def\n")
    path.write_text("import importlib.util\nspec = importlib.util.spec_from_file_location("
                    "'tool', ROOT / 'scripts' / 'tool.py')\n")
    assert gpu_check._missing_imports(path, tmp_path) == ["no_such_module_def"]


def test_prelude_stands_in_for_ipython_where_it_is_missing(tmp_path) -> None:
    # A notebook's `from IPython.display import display` runs on a machine without the
    # Jupyter stack: a fake IPython package shadows nothing where the real one exists.
    (tmp_path / "IPython").mkdir()
    (tmp_path / "IPython" / "__init__.py").write_text("raise ImportError('not installed')\n")
    code = (gpu_check.PRELUDE + "from IPython.display import display\n"
            "from IPython import get_ipython\ndisplay('shown', get_ipython())\n"
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.figure()\nplt.close('all')\n")  # matplotlib looks for a running IPython
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["shown", "None"]


# Optional test dependencies: the browser tests need playwright, which CPU and GPU
# machines may lack; gpu-check leaves such files out (and lists them).
OPTIONAL = {"playwright"}


def test_missing_imports_of_this_checkout_are_only_optional_ones() -> None:
    # Every other test file here must be runnable by gpu-check where torch exists.
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        assert set(gpu_check._missing_imports(path)) <= OPTIONAL, path.name


def test_backend_report_covers_the_registry() -> None:
    from convlab.lab import paths

    lines = gpu_check.backend_report("cpu")
    for layer in paths.SUITE:
        assert any(line.startswith(f"{layer.name} float32 ") for line in lines), layer.name
    resnet = next(line for line in lines if line.startswith("resnet56 float32"))
    assert "Mkldnn" in resnet and "slow=Slow2d" in resnet


def test_run_notebook_passes_and_fails_with_the_cell(tmp_path) -> None:
    good = tmp_path / "good.ipynb"
    # The checkout must be importable and matplotlib headless in the child process.
    good.write_text(json.dumps(notebook(
        COLAB, "import convlab, matplotlib\nassert matplotlib.get_backend().lower() == 'agg'",
        "display(convlab.__version__)\nopen('ran.txt', 'w').write('yes')",
    )))
    result = gpu_check.run_notebook(good, timeout=120, root=ROOT)
    assert result.ok, result.log
    assert (tmp_path / "ran.txt").read_text() == "yes"  # ran in the notebook's folder

    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps(notebook(COLAB, "x = 1", "raise ValueError('boom')")))
    result = gpu_check.run_notebook(bad, timeout=120, root=ROOT)
    assert not result.ok
    assert result.detail == "code cell 3: ValueError: boom"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_main_without_cuda_exits_with_a_message(capsys) -> None:
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_store_writes_the_cuda_claims_with_the_steps(tmp_path, monkeypatch, capsys) -> None:
    # --store on a GPU: the claims (a stand-in run here) are stored with each step's end.
    from convlab.lab.claims import gpu_runs

    nb = tmp_path / "tiny.ipynb"
    nb.write_text(json.dumps(notebook(COLAB, "x = 1")))
    seen = {}

    def fake_run(checks):
        seen.update(checks)
        return {"schema": 1, "date": "2026-12-04 14:09 UTC", "gpu": "GPU X", "torch": "2",
                "cuda": "13.0", "cudnn": None, "cpu_model": "CPU", "cores": 1,
                "outcomes": {"ch10_cuda_tf32_deterministic": {"status": "holds",
                                                              "evidence": "same bits"}},
                "checks": checks}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "backend_report", lambda device: [])
    monkeypatch.setattr(gpu_runs, "run_here", fake_run)
    assert gpu_check.main(["--skip-tests", "--store", str(tmp_path / "gpu"), str(nb)]) == 0
    assert [(Path(k).name, v) for k, v in seen.items()] == [("tiny.ipynb", "PASS")]
    [run] = gpu_runs.load_runs(tmp_path / "gpu")
    assert run["gpu"] == "GPU X" and run["checks"] == seen
    assert re.search(r"^PASS .* CUDA claims stored", capsys.readouterr().out, re.M)
