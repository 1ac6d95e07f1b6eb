"""``scripts/old_wheel_kernels.py`` on a small library built here: per-device wrappers
``at::CPUType::<op>_<overload>`` and the ``at::native`` kernels they call, as in 1.5.0."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import old_wheel_kernels  # noqa: E402

SOURCE = """
namespace at { namespace native {
__attribute__((noinline)) int slow_backward_cpu(int x) { return x + 1; }
__attribute__((noinline)) int slow_backward_out_cpu(int x) { return x * 2; }
__attribute__((noinline)) int unrelated_cpu(int x) { return x - 3; }
}
namespace CPUType {
int conv_backward_output_mask(int x) { return native::slow_backward_cpu(x) + 5; }
int conv_backward_out_grad_input(int x) { return native::slow_backward_out_cpu(x) + 7; }
int conv_backward_other_op_thing(int x) { return x; }
int conv_forward(int x) { return native::unrelated_cpu(x) + 9; }
}}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not all(shutil.which(t) for t in ("g++", "nm", "objdump")):
        pytest.skip("needs g++, nm and objdump")
    folder = tmp_path_factory.mktemp("lib")
    (folder / "wrappers.cpp").write_text(SOURCE)
    out = folder / "libwrappers.so"
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", str(folder / "wrappers.cpp"), "-o",
                    str(out)], check=True)
    return out


def test_finds_each_overloads_wrapper_and_its_kernel(library: Path) -> None:
    found = {name: old_wheel_kernels.native_callees(library, start, size)
             for start, size, name in old_wheel_kernels.wrappers(library, "CPU",
                                                                 "conv_backward")}
    assert found == {
        "at::CPUType::conv_backward_other_op_thing": [],
        "at::CPUType::conv_backward_out_grad_input": ["at::native::slow_backward_out_cpu"],
        "at::CPUType::conv_backward_output_mask": ["at::native::slow_backward_cpu"],
    }
    assert old_wheel_kernels.wrappers(library, "CUDA", "conv_backward") == []
