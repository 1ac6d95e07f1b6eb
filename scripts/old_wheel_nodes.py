"""Which backward operator each convolution autograd node of an old torch wheel called.

The intro's 2020 table (PyTorch 1.5) is read from the release itself, not from memory:

    pip download torch==1.5.0 --no-deps --python-version 38 \
        --platform manylinux1_x86_64 --only-binary=:all: -d /tmp/wheel
    python scripts/old_wheel_nodes.py /tmp/wheel/torch-1.5.0-*.whl

For each generated node class whose name contains ``Conv`` it prints the tensors the node
saves (from ``torch/include/torch/csrc/autograd/generated/Functions.h``) and the operator
names its ``apply`` looks up in the dispatcher (``findSchemaOrThrow("aten::...")`` takes
the name as a string literal; the literal is found through the ``lea`` before the call in
``objdump`` output of ``libtorch_cpu.so``). It also prints the operators that
``at::native::_convolution`` and ``_convolution_nogroup`` look up: the forward backends.
Needs ``unzip``, ``nm`` and ``objdump``; takes about a minute. The operator look-ups are
found in the code generated up to about 1.9 (a ``findSchemaOrThrow`` per call site); in
later wheels (1.10 and on) the calls go through ``at::_ops`` and show as ``-``, while the
saved tensors are still printed (e.g. ``ThnnConv2DBackward0: saves self, weight, finput,
fgrad_input`` in 1.10.1).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = "torch/include/torch/csrc/autograd/generated/Functions.h"
LIBRARY = "torch/lib/libtorch_cpu.so"
NODE = re.compile(r"struct TORCH_API (\w*Conv\w*Backward\w*) : public")
SAVED = re.compile(r"SavedVariable (\w+)_;")
CALL_TARGET = re.compile(r"#\s*([0-9a-f]+)")
FORWARD = ("_ZN2at6native12_convolutionE", "_ZN2at6native20_convolution_nogroupE")


def saved_tensors(header: str) -> dict[str, list[str]]:
    """Node class name -> names of its SavedVariable members."""
    nodes: dict[str, list[str]] = {}
    for block in header.split("\n};"):
        match = NODE.search(block)
        if match:
            nodes[match.group(1)] = SAVED.findall(block)
    return nodes


def looked_up_ops(library: Path, start: int, size: int, blob: bytes) -> list[str]:
    """The ``aten::`` strings loaded just before each dispatcher schema lookup."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}",
         f"--stop-address={start + size}", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    found = set()
    for i, line in enumerate(listing):
        if "findSchemaOrThrow" not in line:
            continue
        for previous in listing[max(0, i - 12):i]:
            target = CALL_TARGET.search(previous) if "lea" in previous else None
            if target:
                address = int(target.group(1), 16)
                text = blob[address:blob.index(b"\0", address)].decode("latin1")
                if text.startswith("aten::"):
                    found.add(text)
    return sorted(found)


def called_functions(library: Path, start: int, size: int) -> list[str]:
    """Names of the ``at::`` operator functions called directly (not through a lookup)."""
    listing = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", f"--start-address={start}",
         f"--stop-address={start + size}", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout
    return sorted({f"at::{name}" for name in re.findall(r"call.*<at::([a-z_0-9]+)\(", listing)})


def symbols(library: Path) -> list[tuple[int, int, str]]:
    """(address, size, mangled name) of every defined text symbol."""
    listing = subprocess.run(["nm", "-S", str(library)], capture_output=True, text=True,
                             check=True).stdout
    rows = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "Tt":
            rows.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return rows


def main(wheel: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["unzip", "-q", "-o", wheel, HEADER, LIBRARY, "-d", tmp], check=True)
        header = (Path(tmp) / HEADER).read_text()
        library = Path(tmp) / LIBRARY
        blob = library.read_bytes()  # for a shared library, file offset == address here
        nodes = saved_tensors(header)
        table = symbols(library)
        for name, saved in sorted(nodes.items()):
            mangled = f"generated{len(name)}{name}5applyE"
            hits = [(a, s) for a, s, sym in table if mangled in sym]
            ops = looked_up_ops(library, *hits[0], blob) if hits else []
            print(f"{name}: saves {', '.join(saved) or '-'}; calls {', '.join(ops) or '-'}")
        for prefix in FORWARD:
            for address, size, sym in table:
                if sym.startswith(prefix):
                    ops = looked_up_ops(library, address, size, blob)
                    direct = called_functions(library, address, size)
                    print(f"{prefix}: dispatches {', '.join(ops)}; calls {', '.join(direct)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} path/to/torch-X.Y.Z-...whl")
    main(sys.argv[1])
