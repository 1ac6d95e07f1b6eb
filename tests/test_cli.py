"""The ``convlab`` dispatcher: one module per command, lazy imports, one argument behaviour.

Issue 34 E3: ``bench`` and ``doctor`` printed argparse's multi-line usage block for an
unknown option or a malformed value while ``trace``/``explain`` printed one line. Every
command, including one added later, now answers a usage error with one line on stderr
(``convlab CMD: error: ...``) and exit status 2, before any work. E4: ``bench --out ""``
wrote into the current folder and ``--rounds`` had no upper bound.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import types

import pytest

from convlab import cli
from convlab.cli import bench as bench_cli
from convlab.lab import bench


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``convlab *argv`` (usage errors: SystemExit)."""
    try:
        rc = cli.main(argv)
    except SystemExit as stop:
        rc = stop.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_line_usage_error(name: str, rc: int, out: str, err: str) -> None:
    assert rc == 2, (rc, err)
    assert out == "", out  # nothing ran, nothing printed
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"convlab {name}: error: "), err
    assert "usage:" not in err and "Traceback" not in err


def test_every_command_has_a_module_with_a_parser_and_main() -> None:
    for name in cli.COMMANDS:
        module = importlib.import_module(f"convlab.cli.{name}")
        assert callable(module.main)
        assert isinstance(module.build_parser(), argparse.ArgumentParser)


def test_unknown_command_is_one_line_exit_2(capsys) -> None:
    rc, out, err = run(["nonsense"], capsys)
    assert rc == 2 and out == ""
    assert err.strip() == ("convlab: error: unknown command 'nonsense' (choose from "
                           f"{', '.join(cli.COMMANDS)}; convlab --help)")


def test_help_lists_every_command(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_command_has_help(name, capsys) -> None:
    rc, out, _ = run([name, "--help"], capsys)
    assert rc == 0 and out.startswith(f"usage: convlab {name}")


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_unknown_option_is_one_line_exit_2(name, capsys) -> None:
    rc, out, err = run([name, "--no-such-option"], capsys)
    assert_one_line_usage_error(name, rc, out, err)
    assert "unrecognized arguments: --no-such-option" in err


def _malformed(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Every malformed use of every option of ``parser``: a missing value, a value given to
    a flag, and a value the option's own type or choices refuse."""
    cases = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        opt = action.option_strings[-1]
        if action.nargs == 0:  # a flag
            cases.append([f"{opt}=x"])
            continue
        cases.append([opt])  # the value is missing
        if action.choices is not None:
            cases.append([opt, "@@"])
        elif action.type is not None:
            try:
                action.type("@@")
            except argparse.ArgumentTypeError:
                cases.append([opt, "@@"])
    return cases


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_malformed_option_of_every_command_is_one_line_exit_2(name, capsys) -> None:
    # the class: whatever the command and the option, a usage error is one line and 2
    module = importlib.import_module(f"convlab.cli.{name}")
    cases = _malformed(module.build_parser())
    assert cases, name
    for argv in cases:
        rc, out, err = run([name, *argv], capsys)
        assert_one_line_usage_error(name, rc, out, err)


def test_a_command_added_later_gets_the_same_behaviour(monkeypatch, capsys) -> None:
    # a new command with a plain argparse parser: the dispatcher parses it the same way
    ran = []
    fake = types.ModuleType("convlab.cli.fake")
    fake.build_parser = lambda: _plain_parser()
    fake.main = lambda argv: ran.append(argv) or 0
    monkeypatch.setitem(sys.modules, "convlab.cli.fake", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", "a command registered with one line")
    for argv in (["--bogus"], ["--count", "x"], ["--count"]):
        rc, out, err = run(["fake", *argv], capsys)
        assert_one_line_usage_error("fake", rc, out, err)
    assert ran == []
    assert run(["fake", "--count", "3"], capsys)[0] == 0 and ran == [["--count", "3"]]


def _plain_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convlab fake")
    parser.add_argument("--count", type=int)
    return parser


@pytest.mark.parametrize("name, argv, message", [
    ("bench", ["--device", "gpu"], "device must be cpu or cuda, got 'gpu'"),
    ("bench", ["--layers", "nope"], "unknown layer name(s) 'nope'"),
    ("bench", ["--rounds", "0"], "rounds must be a positive int"),
    ("bench", ["--rounds", str(bench_cli.MAX_ROUNDS + 1)], "no larger than 100"),
    ("bench", ["--rounds", "1e9"], "expected an int, got '1e9'"),
    ("bench", ["--min-run-time", "inf"], "a finite number of seconds in (0, 60], got inf"),
    ("bench", ["--min-run-time", "1e300"], "a finite number of seconds in (0, 60]"),
    ("bench", ["--min-run-time", "nan"], "a finite number of seconds in (0, 60]"),
    ("bench", ["--min-run-time", "0"], "a finite number of seconds in (0, 60]"),
    ("bench", ["--min-run-time", "x"], "expected a number, got 'x'"),
    ("bench", ["--threads", "0"], "threads must be an int from 1 to"),
    ("bench", ["--out", ""], "expected a folder name, got ''"),
    ("bench", ["--out", "  "], "expected a folder name"),
    ("doctor", ["--device", "gpu"], "device must be cpu or cuda"),
    ("trace", ["--stride", "0"], "stride"),
    ("trace", ["--groups", "1.5"], "expected an int, got '1.5'"),
    ("explain", ["--threads", "0"], "--threads must be a positive int"),
    ("explain", ["--groups", "x"], "expected an int, got 'x'"),
    ("claims", ["--id", "ch3_nope"], "no claim 'ch3_nope' (convlab claims --list shows"),
    ("claims", ["--chapter", "14"], "chapter must be 1..13 or 'intro', got 14"),
])
def test_bad_values_are_one_line_exit_2_before_any_work(name, argv, message, monkeypatch,
                                                        tmp_path, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: pytest.fail("bench ran"))
    rc, out, err = run([name, *argv], capsys)
    assert_one_line_usage_error(name, rc, out, err)
    assert message in err
    assert list(tmp_path.iterdir()) == []  # nothing written (bench's --out default included)


def _fake_benchmark(seen: dict):
    def fake(layers, paths, passes, device, dtype, threads, rounds, min_run_time, memory,
             progress, report):
        seen.update(rounds=rounds, min_run_time=min_run_time)
        return report
    return fake


def test_bench_takes_the_largest_rounds_and_block_time(monkeypatch, tmp_path) -> None:
    seen: dict = {}
    monkeypatch.setattr(bench, "benchmark", _fake_benchmark(seen))
    argv = ["bench", "--layers", "conv1d", "--rounds", str(bench_cli.MAX_ROUNDS),
            "--min-run-time", "60", "--out", str(tmp_path / "res")]
    assert cli.main(argv) == 0
    assert seen == {"rounds": 100, "min_run_time": 60.0}
    assert (tmp_path / "res" / "bench.csv").exists()


def test_bench_out_dot_is_the_current_folder_when_asked(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "benchmark", _fake_benchmark({}))
    assert cli.main(["bench", "--layers", "conv1d", "--out", "."]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json"]


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


def test_the_console_script_exits_2_with_one_line() -> None:
    run_ = subprocess.run([sys.executable, "-m", "convlab", "doctor", "--no-such-option"],
                          capture_output=True, text=True, timeout=120)
    assert run_.returncode == 2 and run_.stdout == ""
    # torch itself may say on import that a CUDA wheel finds no CUDA: in its glog format
    # ("W1202 11:34:01.127000 ... No CUDA runtime is found", 2.11) or as a plain line
    # ("No CUDA runtime is found, using CUDA_HOME=...", 2.4); those lines are not ours.
    ours = [line for line in run_.stderr.splitlines()
            if not re.match(r"[IWE]\d{4} \d\d:\d\d:\d\d|No CUDA runtime is found", line)]
    assert ours == ["convlab doctor: error: unrecognized arguments: --no-such-option"]
