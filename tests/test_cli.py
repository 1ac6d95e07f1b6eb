"""The ``convlab`` dispatcher: one module per command, lazy imports, no cycle."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from convlab import cli


def test_every_command_has_a_module_with_main() -> None:
    for name in cli.COMMANDS:
        module = importlib.import_module(f"convlab.cli.{name}")
        assert callable(module.main)


def test_unknown_command_is_exit_2(capsys) -> None:
    assert cli.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err


def test_help_lists_every_command(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_bench_main_stays_importable() -> None:
    from convlab.cli import bench_main

    assert callable(bench_main)


def test_importing_the_dispatcher_loads_no_command() -> None:
    code = ("import sys, convlab.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('convlab.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "convlab.lab" not in out and "convlab.cli.bench" not in out


@pytest.mark.parametrize("module", ["convlab.aten.dispatch", "convlab.aten.kernels",
                                    "convlab.aten.selection", "convlab.aten.explain"])
def test_aten_modules_import_nothing_from_the_lab_or_the_cli(module) -> None:
    code = (f"import sys, {module}; "
            "print([m for m in sys.modules if m.startswith(('convlab.lab', 'convlab.cli'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
