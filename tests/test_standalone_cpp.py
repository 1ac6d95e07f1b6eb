"""The standalone libtorch program (cpp/standalone): builds with CMake, runs without Python,
and its three routes to convolution backward agree with each other and with torch here."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("standalone_build",
                                               ROOT / "cpp" / "standalone" / "build.py")
standalone = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standalone)
_compat_spec = importlib.util.spec_from_file_location("compat", ROOT / "scripts" / "compat.py")
compat = importlib.util.module_from_spec(_compat_spec)
_compat_spec.loader.exec_module(compat)

pytestmark = pytest.mark.skipif(
    shutil.which("cmake") is None, reason="cmake is not installed (make test installs it)"
)


@dataclass
class DirectBuild:
    """A ``c++`` command of :func:`standalone.compile_command`, compiling in the background."""

    command: list[str]
    exe: Path
    process: subprocess.Popen

    def wait(self) -> subprocess.CompletedProcess:
        stdout, stderr = self.process.communicate(timeout=900)
        return subprocess.CompletedProcess(self.command, self.process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def direct_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DirectBuild]]:
    """The two one-command builds of the tests below (plain, and with ``C10_NODEPRECATED``),
    started together and before CMake's: each compiles main.cpp against libtorch's headers
    on one core, so on two cores they run beside each other and beside CMake's build."""
    if shutil.which("c++") is None:
        yield {}
        return
    builds = {}
    for name, defines in (("plain", ()), ("nodeprecated", ("C10_NODEPRECATED",))):
        exe = tmp_path_factory.mktemp(name) / "conv_backward"
        command = standalone.compile_command(exe, defines=defines)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        builds[name] = DirectBuild(command, exe, process)
    yield builds
    for build in builds.values():
        if build.process.poll() is None:
            build.process.kill()
        build.process.communicate()


@pytest.fixture(scope="module")
def program(direct_builds: dict[str, DirectBuild]) -> Path:
    start = time.perf_counter()
    try:
        path = standalone.build()
    except standalone.CudaToolkitMissing as err:  # a CUDA wheel without the toolkit
        pytest.skip(str(err))
    # Reported, not asserted: a fresh clone configures and compiles, later runs relink.
    print(f"\nstandalone build: {time.perf_counter() - start:.1f} s")
    return path


def test_three_routes_agree(program: Path) -> None:
    out = subprocess.run([str(program)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "convolution_backward_out vs convolution_backward: match" in out.stdout
    assert "_slow_conv2d_backward_out vs convolution_backward: match" in out.stdout
    assert "kept the caller's storage: yes" in out.stdout
    assert "aten::convolution_backward, then aten::copy_: yes" in out.stdout


def test_sums_match_python(program: Path) -> None:
    """Same seed, same CPU generator: the C++ gradients equal torch's from Python."""
    out = subprocess.run([str(program)], capture_output=True, text=True, timeout=120)
    sums = {k: float(v) for k, v in re.findall(r"sum grad_(\w+)\s+(-?[\d.]+)", out.stdout)}
    torch.manual_seed(0)
    f64 = torch.float64
    x, w = torch.randn(2, 3, 8, 8, dtype=f64), torch.randn(4, 3, 3, 3, dtype=f64)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    go = torch.randn(y.shape, dtype=f64)
    grads = torch.ops.aten.convolution_backward(
        go, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True] * 3
    )
    assert set(sums) == {"input", "weight", "bias"}
    for name, g in zip(("input", "weight", "bias"), grads, strict=True):
        # the program prints 6 decimals
        assert abs(sums[name] - g.sum().item()) < 1e-5, name


def test_empty_batch_without_bias_sizes_aborts(program: Path) -> None:
    """The abort passes by the program's try/catch: std::terminate, not an exception."""
    out = subprocess.run([str(program), "abort-demo"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == -signal.SIGABRT, (out.returncode, out.stderr)
    assert "returned normally" not in out.stdout
    assert "caught" not in out.stdout
    assert "bad_optional_access" in out.stderr


def test_out_limits_are_caught_errors(program: Path) -> None:
    """Each unsupported out= use throws a c10::Error (caught, first line printed)."""
    out = subprocess.run([str(program), "out-limits"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert len(lines) == 3, out.stdout
    assert "no error" not in lines.values(), out.stdout
    assert "dtype nullptr" in lines["convolution_backward_out, mask {1, 0, 0}"]
    assert "bump_version" in lines["_slow_conv2d_backward_out, undefined grad_weight"]


def test_force_slow_guard_switches_and_restores(program: Path) -> None:
    """``force-slow``: with oneDNN off the float32 backward runs the slow kernel, agrees
    with the default route, and the guard puts the process-wide flag back (also when an
    exception leaves its scope): a guard that did not restore would print "off" below."""
    out = subprocess.run([str(program), "force-slow"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines == [
        "oneDNN flag before: on",
        "default backward ran aten::_slow_conv2d_backward: "
        + ("no" if torch.backends.mkldnn.is_available() else "yes"),
        "inside the guard, oneDNN flag: off",
        "forced backward ran aten::_slow_conv2d_backward: yes",
        "forced vs default, largest difference < 1e-4: match",
        "oneDNN flag after the guard: on",
        'caught "thrown inside the guard"; oneDNN flag after the guard: on',
    ], out.stdout


def test_builds_without_cmake(program: Path, direct_builds: dict[str, DirectBuild]) -> None:
    """The one compiler command the book prints builds a program that agrees too."""
    if shutil.which("c++") is None:
        pytest.skip("no c++ compiler on PATH")
    build = direct_builds["plain"]
    assert build.command == standalone.compile_command(build.exe)
    done = build.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    out = subprocess.run([str(build.exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("vs convolution_backward: match") == 2


def test_builds_without_deprecated_c10_aliases(
    program: Path, direct_builds: dict[str, DirectBuild]
) -> None:
    """With ``C10_NODEPRECATED`` c10's deprecated aliases (``c10::nullopt``, ...) are gone:
    the program must not need them."""
    if shutil.which("c++") is None:
        pytest.skip("no c++ compiler on PATH")
    build = direct_builds["nodeprecated"]
    assert build.command == standalone.compile_command(build.exe, defines=("C10_NODEPRECATED",))
    assert "-DC10_NODEPRECATED" in build.command
    done = build.wait()
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(("version", "std"), [("2.4.1", "c++17"), ("2.11.0+cpu", "c++17"),
                                              ("2.12.0", "c++20"), ("2.13.0", "c++20"),
                                              ("2.15.0.dev20260101", "c++20"), ("3.0.0", "c++20")])
def test_cxx_standard_follows_the_torch_version(version: str, std: str) -> None:
    assert standalone.cxx_standard(version) == std


def test_installed_wheel_asks_for_the_standard_we_use() -> None:
    """What the wheel's own CMake config sets on its torch target is what we compile with."""
    config = Path(torch.utils.cmake_prefix_path) / "Torch" / "TorchConfig.cmake"
    # "CXX_STANDARD 20" (from 2.12) or "target_compile_features(torch INTERFACE cxx_std_20)"
    found = re.search(r"CXX_STANDARD (\d+)|cxx_std_(\d+)", config.read_text())
    wanted = int(standalone.cxx_standard().removeprefix("c++"))
    if found is None:  # older wheels set no standard on the target
        assert wanted == 17
    else:
        assert int(found.group(1) or found.group(2)) == wanted
    assert f"-std={standalone.cxx_standard()}" in standalone.compile_command(Path("x"))


def test_compat_step_on_the_installed_torch(program: Path, tmp_path: Path) -> None:
    """scripts/compat.py's C++ step, run with this interpreter on this checkout."""
    log = tmp_path / "log.txt"
    log.write_text("")
    status = compat.standalone_program(Path(sys.executable), ROOT, dict(os.environ), log)
    assert status == "ok", log.read_text()[-3000:]
    assert "vs convolution_backward: match" in log.read_text()


@pytest.mark.parametrize(
    ("build_output", "expected"),
    [("print(PROGRAM)", "FAILED"),
     ("sys.exit('torch 2.0.1 is a CUDA build; its CMake config needs ...')",
      "skipped (CUDA wheel, no CUDA toolkit)"),
     ("sys.exit('cmake failed')", "FAILED (build)")],
)
def test_compat_step_reports_failures(tmp_path: Path, build_output: str, expected: str) -> None:
    """A program that disagrees, a CUDA wheel without toolkit, a failed build: never "ok"."""
    fake = tmp_path / "fake_program"
    fake.write_text("#!/bin/sh\necho 'convolution_backward_out vs convolution_backward: "
                    "MISMATCH'\nexit 1\n")
    fake.chmod(0o755)
    builder = tmp_path / "cpp" / "standalone" / "build.py"
    builder.parent.mkdir(parents=True)
    builder.write_text(f"import sys\nPROGRAM = {str(fake)!r}\n{build_output}\n")
    log = tmp_path / "log.txt"
    log.write_text("")
    assert compat.standalone_program(Path(sys.executable), tmp_path, dict(os.environ),
                                     log) == expected
