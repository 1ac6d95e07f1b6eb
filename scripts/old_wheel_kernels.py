"""Which native kernel each device ran for an operator in an old torch wheel.

The intro's answer about ``thnn_conv2d_backward_out`` (PyTorch 1.5) names the kernels
behind each overload from the release itself:

    pip download torch==1.5.0 --no-deps --python-version 38 \\
        --platform manylinux1_x86_64 --only-binary=:all: -d /tmp/wheel
    python scripts/old_wheel_kernels.py /tmp/wheel/torch-1.5.0-*.whl thnn_conv2d_backward

Up to about 1.7 the code generator wrote one wrapper per operator overload and device,
``at::CPUType::<op>_<overload>`` in ``libtorch_cpu.so`` and ``at::CUDAType::...`` in
``libtorch_cuda.so``; each calls the kernel that ``native_functions.yaml``'s ``dispatch:``
named for that device. This prints, per wrapper of the operator, the ``at::native``
functions it calls (from ``nm`` and ``objdump -d -C``). Needs ``unzip``, ``nm`` and
``objdump``; the CUDA library is about 1 GB unpacked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARIES = {"CPU": "torch/lib/libtorch_cpu.so", "CUDA": "torch/lib/libtorch_cuda.so"}
NATIVE_CALL = re.compile(r"(?:call|jmp)\s+[0-9a-f]+ <(at::native::[\w:]+)\(")


def wrappers(library: Path, device: str, op: str) -> list[tuple[int, int, str]]:
    """(address, size, wrapper name) of ``at::<device>Type::<op>...`` functions."""
    listing = subprocess.run(["nm", "-S", "-C", str(library)], capture_output=True,
                             text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[2] in "Tt":
            name = parts[3].split("(")[0]
            if re.fullmatch(rf"at::{device}Type::{op}(_\w+)?", name):
                found.append((int(parts[0], 16), int(parts[1], 16), name))
    return sorted(found, key=lambda row: row[2])


def native_callees(library: Path, start: int, size: int) -> list[str]:
    """The ``at::native`` functions called (or tail-called) by the code at ``start``."""
    listing = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", f"--start-address={start}",
         f"--stop-address={start + size}", str(library)],
        capture_output=True, text=True, check=True).stdout
    return sorted(set(NATIVE_CALL.findall(listing)))


def main(wheel: str, op: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for device, member in LIBRARIES.items():
            unzip = subprocess.run(["unzip", "-q", "-o", wheel, member, "-d", tmp],
                                   capture_output=True, text=True, check=False)
            library = Path(tmp) / member
            if unzip.returncode or not library.is_file():
                print(f"{device}: no {member} in this wheel")
                continue
            for start, size, name in wrappers(library, device, op):
                callees = native_callees(library, start, size)
                print(f"{name.split('::')[-1]} [{device}]: {', '.join(callees) or '-'}")
            library.unlink()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} path/to/torch-X.Y.Z-...whl OPERATOR")
    main(sys.argv[1], sys.argv[2])
