"""Which C++ function computed a convolution's backward, traced from the binary.

The profiler and ``TorchDispatchMode`` see ATen *ops*; the backends' backward kernels are
plain C++ functions below ``aten::convolution_backward`` (reached through ``DispatchStub``
function-pointer tables), so neither sees them. ``libtorch_cpu.so`` keeps its function
symbols, so a debugger can: :func:`trace_kernels` runs a small Python program under ``gdb``
in batch mode, puts a breakpoint on each backward kernel of ``CPU_KERNELS`` (and
``CUDA_KERNELS`` when ``libtorch_cuda.so`` is present), and records, for each
:class:`ConvCase`, the ordered functions its ``.backward()`` entered, e.g. for a float64
dilated convolution::

    convolution_backward -> _convolution_backward_nogroup_backend
        -> slow_conv_dilated2d_backward_cpu

All cases share one debugger session (the program calls ``os.getsid`` before and after
each backward; a breakpoint there splits the log), and breakpoints are set only once torch
is imported. They are set by address (offsets read with binutils' ``nm``, through gdb's
Python API), so gdb never loads libtorch's huge symbol table; without ``nm`` they are set
by name, which costs a few more seconds.

``convlab trace --kernels`` (:mod:`convlab.cli.trace`) runs it for one layer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from convlab.scratch.params import ConvParams

# Functions a breakpoint is put on: (name for gdb, short name in the trace). Anonymous
# namespaces are spelled as gdb demangles them.
_NATIVE = "at::native::"
_ANON = "at::native::(anonymous namespace)::"
CPU_KERNELS: tuple[tuple[str, str], ...] = tuple(
    (prefix + name, name)
    for prefix, name in [
        (_NATIVE, "convolution_backward"),
        (_NATIVE, "_convolution_backward_nogroup_backend"),
        (_NATIVE, "convolution_backward_overrideable"),
        (_NATIVE, "_convolution_double_backward"),
        (_NATIVE, "slow_conv2d_backward_cpu"),
        (_NATIVE, "slow_conv2d_backward_out_cpu"),
        (_NATIVE, "slow_conv3d_backward_cpu"),
        (_NATIVE, "slow_conv_dilated2d_backward_cpu"),
        (_NATIVE, "slow_conv_dilated3d_backward_cpu"),
        (_NATIVE, "slow_conv_transpose2d_backward_cpu"),
        (_NATIVE, "slow_conv_transpose3d_backward_cpu"),
        (_ANON, "mkldnn_convolution_backward"),
        (_ANON, "mkldnn_convolution_transpose_backward"),
    ]
)
# The CUDA kernels (aten/src/ATen/native/cuda and cudnn/); used only when libtorch_cuda.so
# exists.
CUDA_KERNELS: tuple[tuple[str, str], ...] = tuple(
    (_NATIVE + name, name)
    for name in [
        "slow_conv2d_backward_cuda",
        "slow_conv_dilated2d_backward_cuda",
        "slow_conv_dilated3d_backward_cuda",
        "slow_conv_transpose2d_backward_cuda",
        "slow_conv_transpose3d_backward_cuda",
        "conv_depthwise2d_backward_cuda",
        "conv_depthwise3d_backward_cuda",
        "cudnn_convolution_backward",
        "cudnn_convolution_transpose_backward",
    ]
)

# Functions that only choose where to go (Convolution.cpp), not kernels.
ROUTERS = frozenset({"convolution_backward", "_convolution_backward_nogroup_backend"})

_MARK = "@@MARK"
_HIT = "@@K "


@dataclass(frozen=True)
class ConvCase:
    """One convolution whose backward is traced: shapes, dtype, arguments, flags.

    ``disable`` names ``torch.backends`` switches turned off for the forward and the
    backward (``"mkldnn"``, ``"nnpack"``), which is how a backend is forced.
    """

    label: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    dtype: str = "float64"
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    transposed: bool = False
    groups: int = 1
    bias: bool = True
    disable: tuple[str, ...] = ()
    output_padding: int = 0
    channels_last: bool = False

    def __post_init__(self) -> None:
        """Validate everything before a debugger starts (ConvParams: the shared rules)."""
        if len(self.input_shape) not in (4, 5) or len(self.weight_shape) != len(
            self.input_shape
        ):
            raise ValueError(
                f"input_shape and weight_shape must both have 4 or 5 entries, got "
                f"{self.input_shape} and {self.weight_shape}"
            )
        dtype = getattr(torch, str(self.dtype), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must name a floating torch dtype, got {self.dtype!r}")
        unknown = set(self.disable) - {"mkldnn", "nnpack"}
        if unknown:
            raise ValueError(f"disable accepts 'mkldnn' and 'nnpack', got {sorted(unknown)}")
        p = ConvParams.create(len(self.weight_shape) - 2, self.stride, self.padding,
                              self.dilation, self.transposed, self.output_padding, self.groups)
        out = self.weight_shape[1] * p.groups if p.transposed else self.weight_shape[0]
        p.check_shapes(self.input_shape, self.weight_shape, (out,) if self.bias else None)


@dataclass
class KernelTrace:
    """What one case's backward ran: the backend ATen selected and the functions entered."""

    case: ConvCase
    backend: str
    calls: list[str] = field(default_factory=list)

    @property
    def kernel(self) -> str:
        """The function that computed the gradients.

        That is the first one below the routing functions (``ROUTERS``), else the last
        one entered.
        """
        for name in self.calls:
            if name not in ROUTERS:
                return name
        return self.calls[-1] if self.calls else ""

    @property
    def path(self) -> str:
        """The calls joined by arrows, outermost first."""
        return " -> ".join(self.calls)


# One case per CPU backend this build can select (float64 keeps oneDNN out of the slow ones;
# N >= 16 with oneDNN off is NNPACK's condition; the oneDNN cases exceed its size bound).
CPU_CASES: dict[str, ConvCase] = {
    c.label: c
    for c in [
        ConvCase("Slow2d", (2, 3, 8, 8), (4, 3, 3, 3)),
        ConvCase("SlowDilated2d", (2, 3, 8, 8), (4, 3, 3, 3), dilation=2),
        ConvCase("Slow3d", (1, 2, 5, 5, 5), (3, 2, 3, 3, 3)),
        ConvCase("SlowDilated3d", (1, 2, 6, 6, 6), (3, 2, 2, 2, 2), dilation=2),
        ConvCase("SlowTranspose2d", (2, 3, 6, 6), (3, 4, 3, 3), stride=2, transposed=True),
        ConvCase("SlowTranspose3d", (1, 2, 4, 4, 4), (2, 3, 2, 2, 2), transposed=True),
        ConvCase("Mkldnn", (2, 16, 32, 32), (8, 16, 3, 3), dtype="float32"),
        ConvCase("MkldnnTranspose", (2, 16, 32, 32), (16, 8, 3, 3), dtype="float32",
                 transposed=True),
        ConvCase("NnpackSpatial", (16, 3, 8, 8), (4, 3, 3, 3), dtype="float32",
                 disable=("mkldnn",)),
        ConvCase("Empty", (0, 3, 8, 8), (4, 3, 3, 3)),
    ]
}
# The function each backend's backward is expected to end in (aten/src/ATen/native/
# Convolution.cpp, convolution_backward and _convolution_backward_nogroup_backend).
EXPECTED_CPU_KERNEL: dict[str, str] = {
    "Slow2d": "slow_conv2d_backward_cpu",
    "SlowDilated2d": "slow_conv_dilated2d_backward_cpu",
    "Slow3d": "slow_conv3d_backward_cpu",
    "SlowDilated3d": "slow_conv_dilated3d_backward_cpu",
    "SlowTranspose2d": "slow_conv_transpose2d_backward_cpu",
    "SlowTranspose3d": "slow_conv_transpose3d_backward_cpu",
    "Mkldnn": "mkldnn_convolution_backward",
    "MkldnnTranspose": "mkldnn_convolution_transpose_backward",
    "NnpackSpatial": "slow_conv_dilated2d_backward_cpu",
    "Empty": "convolution_backward",  # fills zeros itself, no kernel below
}

# Other devices' backward kernels, as convolution_backward's switch calls them (from source,
# not run: Convolution.cpp, cuda/, cudnn/, miopen/, mps/). Key: (backend, device type).
OTHER_KERNEL: dict[tuple[str, str], str] = {
    **{(b, "cuda"): k.replace("_cpu", "_cuda") for b, k in EXPECTED_CPU_KERNEL.items()
       if b.startswith("Slow")},
    ("CudaDepthwise2d", "cuda"): "conv_depthwise2d_backward_cuda",
    ("CudaDepthwise3d", "cuda"): "conv_depthwise3d_backward_cuda",
    ("Cudnn", "cuda"): "cudnn_convolution_backward",
    ("CudnnTranspose", "cuda"): "cudnn_convolution_transpose_backward",
    ("Miopen", "hip"): "miopen_convolution_backward",
    ("MiopenDepthwise", "hip"): "miopen_depthwise_convolution_backward",
    ("MiopenTranspose", "hip"): "miopen_convolution_transpose_backward",
    ("Mps", "mps"): "mps_convolution_backward",
    ("MpsTranspose", "mps"): "mps_convolution_transpose_backward",
}


def backward_kernel(backend: str, device: str = "cpu") -> tuple[str, bool]:
    """The function ``convolution_backward`` ends in for ``backend`` on ``device``, and
    whether that entry was traced on this CPU build (``True``) or is from source."""
    if backend in ("Xnnpack2d", "Winograd3x3Depthwise"):
        return "none: inference only, convolution_backward raises", False
    if backend == "Overrideable":
        return "convolution_backward_overrideable (the device's own kernel)", False
    if device == "cpu" and backend in EXPECTED_CPU_KERNEL:
        return EXPECTED_CPU_KERNEL[backend], True
    if backend in ("Empty", "MkldnnEmpty"):
        return "convolution_backward (zeros, no kernel)", False
    return OTHER_KERNEL.get((backend, "cuda" if device == "hip" and backend.startswith(
        ("Slow", "Cudnn")) else device), f"unknown for {backend} on {device}"), False


# The program run under the debugger: cases come as JSON (argv[1]), the selected backends go
# to argv[2]. os.kill(SIGTRAP) hands control to the debugger once torch is imported.
_SNIPPET = """\
import json, os, signal, sys
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
cases = json.load(open(sys.argv[1]))
os.kill(os.getpid(), signal.SIGTRAP)
FWD = {(4, False): F.conv2d, (5, False): F.conv3d,
       (4, True): F.conv_transpose2d, (5, True): F.conv_transpose3d}
chosen = []
for c in cases:
    dtype = getattr(torch, c["dtype"])
    x = torch.randn(c["input_shape"], dtype=dtype)
    w = torch.randn(c["weight_shape"], dtype=dtype)
    if c["channels_last"]:
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    x.requires_grad_(True)
    w.requires_grad_(True)
    out_ch = w.shape[1] * c["groups"] if c["transposed"] else w.shape[0]
    b = torch.randn(out_ch, dtype=dtype, requires_grad=True) if c["bias"] else None
    nd = x.dim() - 2
    args = ([c["stride"]] * nd, [c["padding"]] * nd, [c["dilation"]] * nd)
    with torch.backends.mkldnn.flags(enabled="mkldnn" not in c["disable"]), \\
            torch.backends.nnpack.flags(enabled="nnpack" not in c["disable"]):
        chosen.append(int(torch._C._select_conv_backend(
            x, w, b, *args, c["transposed"], [c["output_padding"]] * nd, c["groups"])))
        kw = dict(stride=args[0], padding=args[1], dilation=args[2],
                  groups=c["groups"])
        if c["transposed"]:
            kw["output_padding"] = [c["output_padding"]] * nd
        y = FWD[x.dim(), c["transposed"]](x, w, b, **kw)
        g = torch.ones_like(y)
        os.getsid(0)
        y.backward(g)
        os.getsid(0)
json.dump(chosen, open(sys.argv[2], "w"))
"""


def find_debugger() -> str:
    """The path of ``gdb`` (or ``cuda-gdb``), or a RuntimeError saying how to get one."""
    for name in ("gdb", "cuda-gdb"):
        path = shutil.which(name)
        if path:
            return path
    hint = "`apt-get install gdb` (Debian/Ubuntu; `make test` does it)"
    if "google.colab" in sys.modules:
        hint = "`!apt-get install -y gdb` in a cell"
    raise RuntimeError(f"kernel tracing needs gdb, which is not installed: run {hint}")


def ptrace_refusal() -> str | None:
    """Why this system forbids a debugger to trace a child process, or None when it allows.

    Yama's ``ptrace_scope`` 3 forbids every ptrace; lower values allow tracing one's child.
    """
    scope_file = Path("/proc/sys/kernel/yama/ptrace_scope")
    try:
        scope = scope_file.read_text().strip()
    except OSError:
        return None
    if scope == "3":
        return "kernel.yama.ptrace_scope is 3 (no process may be traced); it resets on reboot"
    return None


def _torch_libs() -> dict[str, Path]:
    lib = Path(torch.__file__).parent / "lib"
    return {name: lib / f"{name}.so" for name in ("libtorch_cpu", "libtorch_cuda")
            if (lib / f"{name}.so").exists()}


def _gdb_header(libs: Sequence[str]) -> list[str]:
    return [
        "set pagination off",
        "set confirm off",
        "set print thread-events off",
        "set disable-randomization off",
        "set breakpoint pending on",
        "set auto-solib-add off",
        "run",
        "sharedlibrary libc.so",
        *[f"sharedlibrary {name}" for name in libs],
    ]


def _gdb_script(libs: Sequence[str], kernels: Sequence[tuple[str, str]]) -> str:
    """Breakpoints by demangled name: gdb reads the libraries' symbol tables (slow)."""
    lines = _gdb_header(libs)
    lines += ["break getsid", "commands", "silent", f'printf "{_MARK}\\n"', "continue", "end"]
    for gdb_name, short in kernels:
        spec = f"'{gdb_name}'" if "(" in gdb_name else gdb_name
        lines += [f"break {spec}", "commands", "silent", f'printf "{_HIT}{short}\\n"',
                  "continue", "end"]
    lines.append("continue")
    return "\n".join(lines) + "\n"


def _mangled_prefix(gdb_name: str) -> re.Pattern[str]:
    """Itanium-mangled prefix of ``at::native::[(anonymous namespace)::]name`` (any
    linkage), without the ``.cold`` parts the compiler splits off."""
    short = gdb_name.rsplit("::", 1)[1]
    anon = "12_GLOBAL__N_1" if "(anonymous namespace)" in gdb_name else ""
    return re.compile(rf"_ZN2at6native{anon}L?{len(short)}{short}E[^.]*$")


def symbol_offsets(
    library: Path, kernels: Sequence[tuple[str, str]]
) -> list[tuple[int, str]]:
    """(offset in ``library``, short name) of each kernel, read with binutils' ``nm``.

    Raises RuntimeError when ``nm`` is missing or fails.
    """
    nm = shutil.which("nm")
    if nm is None:
        raise RuntimeError("nm (binutils) is not installed")
    done = subprocess.run([nm, "--defined-only", str(library)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nm failed on {library}: {done.stderr[-500:]}")
    patterns = [(_mangled_prefix(name), short) for name, short in kernels]
    found: list[tuple[int, str]] = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[1] not in "tTwW":
            continue
        for pattern, short in patterns:
            if pattern.match(parts[2]):
                found.append((int(parts[0], 16), short))
    return found


# gdb's Python API: one internal breakpoint per address that prints and never stops.
_GDB_PYTHON = """python
import json
import gdb
class _Hit(gdb.Breakpoint):
    def __init__(self, where, line):
        super().__init__(where, internal=True)
        self.line = line
    def stop(self):
        gdb.write(self.line)
        gdb.flush()
        return False
_spec = json.load(open(SPEC_FILE))
_maps = open(f"/proc/{gdb.selected_inferior().pid}/maps").read().splitlines()
for _lib, _entries in _spec["libs"].items():
    _base = min(int(m.split("-")[0], 16) for m in _maps
                if m.endswith("/" + _lib) and m.split()[2] == "00000000")
    for _offset, _short in _entries:
        _Hit(f"*{_base + _offset:#x}", _spec["hit"] + _short + "\\n")
_Hit("getsid", _spec["mark"] + "\\n")
end
"""


def _gdb_python_script(spec_file: Path) -> str:
    """Breakpoints by address (offsets from ``nm``): gdb loads no big symbol table."""
    lines = _gdb_header([])
    lines.append(_GDB_PYTHON.replace("SPEC_FILE", repr(str(spec_file))).rstrip("\n"))
    lines.append("continue")
    return "\n".join(lines) + "\n"


def _split_log(log: str, n_cases: int) -> list[list[str]]:
    """Per case, the functions hit between its two marks (a repeat in a row shown once:
    the compiler splits some functions into a hot and a cold part)."""
    cases: list[list[str]] = []
    inside = False
    for line in log.splitlines():
        if line.startswith(_MARK):
            inside = not inside
            if inside:
                cases.append([])
        elif line.startswith(_HIT) and inside:
            name = line[len(_HIT):].strip()
            if not cases[-1] or cases[-1][-1] != name:
                cases[-1].append(name)
    if len(cases) != n_cases or inside:
        raise RuntimeError(
            f"the debugger log has {len(cases)} traced backward calls, expected {n_cases}; "
            f"its last lines:\n" + "\n".join(log.splitlines()[-15:])
        )
    return cases


def _refused(log: str) -> bool:
    return "ptrace: Operation not permitted" in log or "Could not trace the inferior" in log


def _trace_script(work: Path, libs: dict[str, Path],
                  kernels: Sequence[tuple[str, str]]) -> str:
    """The gdb script: by address when ``nm`` can list the kernels, else by name."""
    try:
        offsets = {path.name: symbol_offsets(path, [k for k in kernels
                                                     if _lib_of(k, name) ])
                   for name, path in libs.items()}
    except RuntimeError:
        return _gdb_script(list(libs), kernels)
    spec = {"libs": offsets, "hit": _HIT, "mark": _MARK}
    (work / "spec.json").write_text(json.dumps(spec))
    return _gdb_python_script(work / "spec.json")


def _lib_of(kernel: tuple[str, str], lib: str) -> bool:
    return (kernel in CUDA_KERNELS) == (lib == "libtorch_cuda")


def trace_kernels(
    cases: Sequence[ConvCase], timeout: float = 180.0, debugger: str | None = None
) -> list[KernelTrace]:
    """Run each case's forward and ``.backward()`` under gdb; return what each backward ran.

    Returns one :class:`KernelTrace` per case, in order, with the backend ATen selected and
    the traced functions (``CPU_KERNELS``, plus ``CUDA_KERNELS`` when present) that
    the backward entered, outermost first.

    Raises:
        TypeError: a case is not a :class:`ConvCase`.
        ValueError: no cases.
        RuntimeError: gdb is missing, ptrace is refused, or the traced program failed.
    """
    cases = list(cases)
    if not cases:
        raise ValueError("cases must name at least one ConvCase")
    for c in cases:
        if not isinstance(c, ConvCase):
            raise TypeError(f"cases must be ConvCase objects, got {type(c).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if debugger is not None and not (os.path.isfile(debugger)
                                     and os.access(debugger, os.X_OK)):
        raise ValueError(f"debugger: {debugger!r} is not an executable file")
    gdb = debugger or find_debugger()
    refusal = ptrace_refusal()
    if refusal:
        raise RuntimeError(f"kernel tracing needs ptrace, which is refused: {refusal}")
    from convlab.aten.backends import backend_name

    libs = _torch_libs()
    kernels = list(CPU_KERNELS) + (list(CUDA_KERNELS) if "libtorch_cuda" in libs else [])
    with tempfile.TemporaryDirectory(prefix="convlab-kernels-") as tmp:
        work = Path(tmp)
        (work / "snippet.py").write_text(_SNIPPET)
        (work / "cases.json").write_text(json.dumps([asdict(c) for c in cases]))
        (work / "trace.gdb").write_text(_trace_script(work, libs, kernels))
        cmd = [gdb, "-q", "-nx", "-batch", "-x", str(work / "trace.gdb"), "--args",
               sys.executable, str(work / "snippet.py"), str(work / "cases.json"),
               str(work / "chosen.json")]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=env, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the debugger did not finish within {timeout:g} s") from None
        log = proc.stdout + proc.stderr
        if _refused(log):
            raise RuntimeError(
                "kernel tracing needs ptrace, which this system refuses (in a container, "
                "run it with --cap-add=SYS_PTRACE):\n" + log[-2000:]
            )
        chosen_file = work / "chosen.json"
        if not chosen_file.exists():
            raise RuntimeError("the traced program did not finish; gdb said:\n" + log[-3000:])
        chosen = json.loads(chosen_file.read_text())
    calls = _split_log(proc.stdout, len(cases))
    return [KernelTrace(c, backend_name(b), k) for c, b, k in zip(cases, chosen, calls,
                                                                    strict=True)]


def trace_table(traces: Sequence[KernelTrace]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows (case, selected backend, innermost kernel) for ``Table``."""
    headers = ["case", "backend", "kernel its backward ran"]
    return headers, [[t.case.label, t.backend, t.kernel] for t in traces]
