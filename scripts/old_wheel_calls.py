"""What an old torch wheel says about one ``at::native`` function and a few schemas.

Chapter 8 names the release of several pull requests from the wheels themselves, not from
dates. For a wheel it prints, for the native function named on the command line, how many
call sites its machine code has for each ``at::`` function it calls (demangled), and every
operator schema in ``ATen/RegistrationDeclarations.h`` that matches ``--schema``:

    pip download torch==1.9.0 --no-deps --platform macosx_10_9_x86_64 \
        --python-version 39 --only-binary=:all: -d /tmp/w
    python scripts/old_wheel_calls.py /tmp/w/torch-1.9.0-*.whl \
        _convolution_double_backward --schema 'cudnn_convolution(_transpose)?[.(]'

The macOS wheels are small (40-120 MB) and hold the same generated headers as the Linux
ones; ``llvm-objdump`` reads their Mach-O ``libtorch_cpu.dylib`` (x86-64 or arm64; compare
call counts only between wheels of one architecture). Reading ``torch/nn/grad.py`` needs
no script: ``unzip -p WHEEL torch/nn/grad.py``.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIBRARIES = ("torch/lib/libtorch_cpu.so", "torch/lib/libtorch_cpu.dylib")
SCHEMAS = "torch/include/ATen/RegistrationDeclarations.h"
TARGET = re.compile(r"\b(?:callq?|bl|jmpq?)\b.*<_?(_Z[^>+]+)>")


def native_symbol(library: Path, name: str) -> str:
    """The mangled ``at::native::NAME`` symbol defined in ``library``."""
    mangled = re.compile(rf"_?_ZN2at6native{len(name)}{name}E")
    listing = subprocess.run(["llvm-nm", "--defined-only", str(library)],
                             capture_output=True, text=True, check=True).stdout
    found = [line.split()[-1] for line in listing.splitlines()
             if line.split()[-2:-1] == ["T"] and mangled.match(line.split()[-1])]
    if len(found) != 1:
        raise ValueError(f"name: {len(found)} symbols for at::native::{name}")
    return found[0]


def call_counts(library: Path, symbol: str) -> collections.Counter[str]:
    """Demangled callee name (without arguments) -> number of call sites."""
    listing = subprocess.run(
        ["llvm-objdump", "-d", "--no-show-raw-insn",
         f"--disassemble-symbols={symbol}", str(library)],
        capture_output=True, text=True, check=True).stdout
    mangled = [m.group(1) for m in map(TARGET.search, listing.splitlines()) if m]
    names = subprocess.run(["c++filt"], input="\n".join(mangled),
                           capture_output=True, text=True, check=True).stdout
    return collections.Counter(n.split("(")[0] for n in names.splitlines()
                               if n.startswith("at::") and "native::" not in n)


def schemas(header: str, pattern: str) -> list[str]:
    """Every ``aten::`` schema string in the header whose name part matches."""
    found = re.findall(r'"schema": "aten::([^"]+)"', header)
    return [s for s in found if re.match(pattern, s)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("function", help="an at::native function, e.g. _convolution")
    parser.add_argument("--schema", default=None, help="regex on operator schemas")
    args = parser.parse_args(argv)
    missing = [t for t in ("llvm-nm", "llvm-objdump", "c++filt") if not shutil.which(t)]
    if missing or not args.wheel.is_file():
        what = f"tools not found: {missing}" if missing else f"no wheel at {args.wheel}"
        print(f"old_wheel_calls: error: {what}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(args.wheel) as wheel:
        names = set(wheel.namelist())
        member = next(m for m in LIBRARIES if m in names)
        library = Path(wheel.extract(member, tmp))
        symbol = native_symbol(library, args.function)
        for callee, count in sorted(call_counts(library, symbol).items()):
            print(f"{count:3d}  {callee}")
        if args.schema:
            header = wheel.read(SCHEMAS).decode()
            for schema in schemas(header, args.schema):
                print(f"schema: {schema}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
