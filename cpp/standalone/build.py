"""Configure (once) and build the standalone libtorch program; print the executable's path.

Usage: ``python cpp/standalone/build.py`` (``--print-flags``: the compiler command that builds
it without CMake, with the installed wheel's paths). The build folder is
``.cache/cpp-standalone/<torch version>`` at the repository root, reused between runs (a
second build only relinks what changed). CMake finds libtorch through the installed wheel
(``torch.utils.cmake_prefix_path``). The CMake config of a CUDA build of torch looks for
the CUDA toolkit (nvcc, headers), which a pip install does not bring.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent
BUILD = SOURCE.parents[1] / ".cache" / "cpp-standalone" / torch.__version__


class CudaToolkitMissing(RuntimeError):
    """torch is a CUDA build, whose CMake config needs the CUDA toolkit, and none is found."""


def cxx_standard(version: str = torch.__version__) -> str:
    """The ``-std=`` value libtorch ``version`` needs: ``c++20`` from 2.12, else ``c++17``.

    Why: from 2.12 the wheel's ``TorchConfig.cmake`` sets ``CXX_STANDARD 20`` on its
    ``torch`` target and ``cpp_extension`` compiles with ``-std=c++20``: PyTorch's
    ``cmake/TorchConfig.cmake.in`` and top-level ``CMakeLists.txt`` moved from 17 to 20 in
    pytorch/pytorch#167929, merged to main after the 2.11 release branch was cut (and
    ``cpp_extension``'s default in #176659, also after it). 2.11 and older build as C++17.
    The wheel's own setting is checked against this in
    ``tests/test_standalone_cpp.py::test_installed_wheel_asks_for_the_standard_we_use``.

    >>> cxx_standard("2.11.0+cpu"), cxx_standard("2.12.0")
    ('c++17', 'c++20')
    """
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return "c++20" if (major, minor) >= (2, 12) else "c++17"


def compile_command(output: Path, source: Path = SOURCE / "main.cpp",
                    defines: tuple[str, ...] = ()) -> list[str]:
    """The one ``c++`` command that compiles and links ``source`` without CMake.

    ``defines`` are extra macros (``-D<name>``), e.g. ``("C10_NODEPRECATED",)`` to check
    that no deprecated c10 alias is used. The C++ standard is :func:`cxx_standard`'s.
    Include and library folders come from the installed wheel
    (``torch.utils.cpp_extension``), the ABI macro from the value torch was built with
    (wheels before 2.7 use the old ABI, ``_GLIBCXX_USE_CXX11_ABI=0``), and ``-rpath`` lets
    the program find libtorch next to the wheel at run time. CPU libraries only: a CUDA
    program also links ``torch_cuda`` and the CUDA runtime.
    """
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    (libdir,) = cpp_extension.library_paths()
    macros = [f"-D{name}" for name in defines]
    return ["c++", f"-std={cxx_standard()}", "-O1", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *macros, *includes, str(source), "-o", str(output), f"-L{libdir}",
            f"-Wl,-rpath,{libdir}", "-ltorch", "-ltorch_cpu", "-lc10"]


def build(source: Path = SOURCE, build_dir: Path = BUILD) -> Path:
    """Configure when no CMake cache exists, build, and return the executable's path.

    Raises:
        CudaToolkitMissing: torch is a CUDA build and the CUDA toolkit is not installed.
        RuntimeError: cmake is not installed, or configuring or building failed (the
            message carries CMake's output).
    """
    if shutil.which("cmake") is None:
        raise RuntimeError("building the standalone program needs cmake: apt-get install cmake")
    steps = []
    if not (build_dir / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        steps.append(["cmake", "-S", str(source), "-B", str(build_dir), *generator,
                      "-DCMAKE_BUILD_TYPE=Release",
                      f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"])
    steps.append(["cmake", "--build", str(build_dir)])
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 and cmd[1] == "-S":  # a failed configure leaves no cache
            (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        if done.returncode != 0 and torch.version.cuda and "uses CUDA but I cannot find" in (
                done.stdout + done.stderr):
            raise CudaToolkitMissing(
                f"torch {torch.__version__} is a CUDA build; its CMake config needs the "
                "CUDA toolkit (headers and libcudart), which CMake did not find")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{done.stdout[-3000:]}"
                               f"{done.stderr[-3000:]}")
    return build_dir / "conv_backward"


if __name__ == "__main__":
    if sys.argv[1:] == ["--print-flags"]:
        print(" ".join(compile_command(Path("conv_backward"))))
        sys.exit(0)
    try:
        print(build())
    except RuntimeError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
