"""``scripts/old_wheel_calls.py``, the evidence behind chapter 8's release column: it
counts the call sites of one ``at::native`` function and lists matching schemas. Tested on
a small shared library built here, in which the function calls two ``at::`` functions
(one of them twice), and on a made-up wheel."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "old_wheel_calls.py"
SOURCE = """
namespace at {
__attribute__((noinline)) int cat(int a) { return a + 1; }
__attribute__((noinline)) int _convolution(int a, int b) { return a * b; }
namespace native {
int _convolution_double_backward(int a, int b) {
  return cat(_convolution(a, b)) + _convolution(b, a);
}
}  // namespace native
}  // namespace at
"""
HEADER = '''
  {"schema": "aten::cudnn_convolution.deprecated(Tensor self) -> Tensor", "x": 1},
  {"schema": "aten::cudnn_convolution(Tensor self, bool allow_tf32) -> Tensor"},
  {"schema": "aten::cudnn_convolution_relu(Tensor self) -> Tensor"},
'''


def _module():
    spec = importlib.util.spec_from_file_location("old_wheel_calls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(tmp_path: Path) -> Path:
    """A wheel-shaped zip with a real ``libtorch_cpu.so`` and a schema header."""
    (tmp_path / "conv.cpp").write_text(SOURCE)
    library = tmp_path / "libtorch_cpu.so"
    subprocess.run(["c++", "-shared", "-fPIC", "-O1", str(tmp_path / "conv.cpp"),
                    "-o", str(library)], check=True)
    wheel = tmp_path / "torch-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(library, "torch/lib/libtorch_cpu.so")
        zf.writestr("torch/include/ATen/RegistrationDeclarations.h", HEADER)
    return wheel


def test_counts_call_sites_and_lists_schemas(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(_wheel(tmp_path)),
         "_convolution_double_backward", "--schema", r"cudnn_convolution[.(]"],
        capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert "  2  at::_convolution" in lines
    assert "  1  at::cat" in lines
    assert [ln for ln in lines if ln.startswith("schema:")] == [
        "schema: cudnn_convolution.deprecated(Tensor self) -> Tensor",
        "schema: cudnn_convolution(Tensor self, bool allow_tf32) -> Tensor"]


def test_call_lines_of_both_architectures_are_read() -> None:
    target = _module().TARGET
    x86 = "  254b21:  callq  0x2f0 <__ZN2at12_convolutionEv>"
    arm = "  21b0f4:  bl     0x8d0 <__ZN2at4_ops11convolution4callEv>"
    elf = "  1139:  call   1120 <_ZN2at3catEi>"
    assert [target.search(s).group(1) for s in (x86, arm, elf)] == [
        "_ZN2at12_convolutionEv", "_ZN2at4_ops11convolution4callEv", "_ZN2at3catEi"]
    assert target.search("  1139:  mov  %rax, 0x10(%rsp)") is None


def test_refuses_a_missing_wheel(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "none.whl"), "_convolution"],
        capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
