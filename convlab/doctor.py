"""``convlab doctor``: the environment, the backends, and a quick check of every path.

It prints versions (torch, CUDA, cuDNN, oneDNN), thread counts, the backends
:func:`convlab.native.use_backend` can force here, which ATen backend each benchmark layer
(``convlab.bench.SUITE``) selects, and then compares every path with native ATen
(``torch.ops.aten.convolution`` / ``convolution_backward``, default flags, float64, CPU)
on small shapes: :mod:`convlab.reference`, :mod:`convlab.thnn`, :mod:`convlab.numpy_ref`,
the forced backends and, when it is already built (or ``--build-extension``), the C++
extension :mod:`convlab.extension`. The exit status is 1 when any path disagrees or fails.

>>> main([])                                          # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from convlab import bench, native, numpy_ref, reference, thnn

# float64 paths must agree to rounding; the bound is relative to the largest expected value.
TOL64 = 1e-10
# oneDNN and NNPACK have no float64 kernels, so they are checked in float32 against the
# float64 truth: float32 rounding over these small sums stays far below this bound, while
# any real error (a wrong tap, a missing group) is of order 1.
TOL32 = 1e-4


@dataclass(frozen=True)
class Case(bench.Layer):
    """A small convolution to check: ``aten::convolution`` arguments, as a benchmark
    :class:`~convlab.bench.Layer` has them (``params``, ``args()``, ``thnn_ok``)."""


CASES: tuple[Case, ...] = (
    Case("plain2d", (2, 3, 7, 6), (4, 3, 3, 2), padding=1),
    Case("strided2d", (2, 4, 9, 8), (6, 4, 3, 3), stride=2, padding=(1, 0)),
    Case("grouped2d", (2, 4, 6, 6), (6, 2, 3, 3), padding=1, groups=2),
    Case("depthwise2d", (2, 4, 6, 6), (8, 1, 3, 3), groups=4),
    Case("dilated2d", (2, 3, 9, 9), (4, 3, 3, 3), padding=1, dilation=2),
    Case("transposed2d", (2, 4, 5, 5), (4, 3, 3, 3), stride=2, padding=1, transposed=True,
         output_padding=1),
    Case("conv1d", (2, 3, 10), (4, 3, 3), stride=2, padding=1),
    Case("conv3d", (2, 2, 5, 5, 4), (3, 2, 3, 3, 2), padding=1),
    Case("batch16", (16, 3, 8, 8), (4, 3, 3, 3), padding=1),  # NNPACK needs a batch >= 16
)

Grads = tuple[torch.Tensor | None, ...]
GRAD_NAMES = ("grad_input", "grad_weight", "grad_bias")


@dataclass
class PathCheck:
    """Outcome of checking one path over the cases."""

    path: str
    dtype: str
    checked: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    worst: float = 0.0
    note: str = ""

    @property
    def status(self) -> str:
        if self.failures:
            return "FAIL"
        return "ok" if self.checked else "skipped"


def _tensors(case: Case, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return case.tensors(device, dtype, seed=len(case.name))


def _expected(case: Case) -> tuple[torch.Tensor, Grads]:
    """Native ATen on CPU, float64, default flags: the truth every path is held to."""
    x, w, b, go = _tensors(case, torch.device("cpu"), torch.float64)
    args = case.args()
    y = torch.ops.aten.convolution.default(x, w, b, *args)
    grads = torch.ops.aten.convolution_backward.default(
        go, x, w, [b.shape[0]], *args, [True, True, True]
    )
    return y, tuple(grads)


def _rel_diff(actual: object, expected: torch.Tensor) -> float:
    got = torch.as_tensor(actual).detach().to(device="cpu", dtype=torch.float64)
    if got.shape != expected.shape:
        raise ValueError(f"shape {list(got.shape)} != expected {list(expected.shape)}")
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    return (got - expected).abs().max().item() / scale if expected.numel() else 0.0


def _compare(check: PathCheck, case: Case, names: Sequence[str], outputs: Sequence[object],
             expected: Sequence[torch.Tensor], tol: float) -> None:
    for name, got, want in zip(names, outputs, expected, strict=True):
        diff = _rel_diff(got, want)
        check.worst = max(check.worst, diff)
        if not diff <= tol:
            check.failures.append(f"{case.name} {name}: relative diff {diff:.2e} > {tol:.0e}")


# Each runner returns (forward output or None, (grad_input, grad_weight, grad_bias)) for a case,
# or raises _NotApplicable.
class _NotApplicable(Exception):
    pass


Runner = Callable[[Case, torch.device], tuple[object | None, Sequence[object]]]


def _run_reference(case: Case, device: torch.device) -> tuple[object, Sequence[object]]:
    x, w, b, go = _tensors(case, device, torch.float64)
    args = case.args()
    y = reference.convolution(x, w, b, *args)
    grads = reference.convolution_backward(go, x, w, [b.shape[0]], *args, [True, True, True])
    return y, grads


def _run_thnn(case: Case, device: torch.device) -> tuple[object, Sequence[object]]:
    if not case.thnn_ok:
        raise _NotApplicable("2-d without groups, dilation or transposition only")
    x, w, b, go = _tensors(case, device, torch.float64)
    p = case.params
    kernel = list(w.shape[2:])
    y, finput = thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding)
    grads = thnn.conv2d_backward(
        go, x, w, kernel, p.stride, p.padding, finput, torch.empty(0, dtype=x.dtype,
                                                                   device=device)
    )
    return y, grads


def _run_numpy(case: Case, device: torch.device) -> tuple[object, Sequence[object]]:
    if case.transposed:
        raise _NotApplicable("no transposed convolution in numpy_ref")
    x, w, b, go = (t.numpy() for t in _tensors(case, torch.device("cpu"), torch.float64))
    p = case.params
    y = numpy_ref.convolution(x, w, b, p.stride, p.padding, p.dilation, p.groups)
    grads = numpy_ref.convolution_backward(
        go, x, w, [b.shape[0]], p.stride, p.padding, p.dilation, p.groups, (True, True, True)
    )
    return y, grads


def _forced_runner(backend: str, dtype: torch.dtype) -> Runner:
    def run(case: Case, device: torch.device) -> tuple[object, Sequence[object]]:
        x, w, b, go = _tensors(case, device, dtype)
        args = case.args()
        try:
            with native.use_backend(backend, x, w, b, *args):
                y = torch.ops.aten.convolution.default(x, w, b, *args)
        except ValueError as err:  # ATen picks another backend for this case
            message = str(err)
            raise _NotApplicable(message.split("inputs: ")[-1].split(";")[0]) from None
        grads = native.convolution_backward(
            go, x, w, [b.shape[0]], *args, [True, True, True], backend=backend
        )
        return y, grads

    return run


def _extension_runner(ext: object) -> Runner:
    def run(case: Case, device: torch.device) -> tuple[object, Sequence[object]]:
        x, w, b, go = _tensors(case, device, torch.float64)
        args = case.args()
        grads = ext.convolution_backward(go, x, w, [b.shape[0]], *args, [True, True, True])
        if case.thnn_ok:  # the explicit-buffer slow path too, compared on the same case
            p = case.params
            bufs = [torch.empty(0, dtype=x.dtype, device=device) for _ in range(3)]
            slow = ext.slow_conv2d_backward_out(*bufs, go, x, w, list(w.shape[2:]), p.stride,
                                                p.padding)
            _, expected = _expected(case)
            for got, want, name in zip(slow, expected, ("gi", "gw", "gb"), strict=True):
                if not _rel_diff(got, want) <= TOL64:
                    raise AssertionError(f"slow_conv2d_backward_out {name} differs")
        return None, grads

    return run


def check_path(path: str, runner: Runner, device: torch.device, dtype: str,
               tol: float, cases: Sequence[Case] = CASES) -> PathCheck:
    """Run ``runner`` on every case and compare with native float64 ATen on CPU."""
    result = PathCheck(path, dtype)
    for case in cases:
        try:
            y, grads = runner(case, device)
        except _NotApplicable as why:
            result.skipped[case.name] = str(why)
            continue
        except Exception as err:  # noqa: BLE001 - any failure of a path is reported, not raised
            result.failures.append(f"{case.name}: {type(err).__name__}: {err}")
            continue
        want_y, want_grads = _expected(case)
        try:
            if y is not None:
                _compare(result, case, ["output"], [y], [want_y], tol)
            _compare(result, case, GRAD_NAMES, list(grads), list(want_grads), tol)
        except ValueError as err:
            result.failures.append(f"{case.name}: {err}")
        result.checked.append(case.name)
    return result


def extension_status(build: bool) -> tuple[object | None, str]:
    """The loaded extension (or None) and a one-line status.

    Loads it only when a build is already cached, unless ``build`` (a cold compile takes
    15-60 s).
    """
    try:
        from convlab import extension
    except ImportError as err:
        return None, f"not built: convlab.extension is not importable ({err})"
    try:
        built = (extension.build_directory() / f"{extension.NAME}.so").exists()
        if not built and not build:
            return None, "not built (run `convlab doctor --build-extension` to compile it)"
        extension.check_compiler()
        extension.ensure_ninja()
    except RuntimeError as err:
        return None, f"not built: {err}"
    start = time.perf_counter()
    ext = extension.load()
    return ext, f"loaded in {time.perf_counter() - start:.1f} s"


def checks(device: torch.device, build_extension: bool = False) -> tuple[list[PathCheck], str]:
    """Every path's check on ``device``, and the extension's status line."""
    out = [
        check_path("reference", _run_reference, device, "float64", TOL64),
        check_path("thnn", _run_thnn, device, "float64", TOL64),
    ]
    if device.type == "cpu":
        out.append(check_path("numpy_ref", _run_numpy, device, "float64", TOL64))
    for backend in native.available_backends(device):
        # oneDNN and NNPACK serve float32 only; the others are checked in float64.
        dtype = torch.float32 if backend in ("mkldnn", "nnpack") else torch.float64
        tol = TOL32 if dtype == torch.float32 else TOL64
        out.append(check_path(f"forced {backend}", _forced_runner(backend, dtype), device,
                              str(dtype).replace("torch.", ""), tol))
    try:
        ext, status = extension_status(build_extension)
    except Exception as err:  # noqa: BLE001 - a broken build is a failed check, not a crash
        failed = PathCheck("C++ extension", "float64", failures=[f"load: {err}"])
        out.append(failed)
        return out, f"load failed: {err}"
    if ext is not None:
        out.append(check_path("C++ extension", _extension_runner(ext), device, "float64", TOL64))
    return out, status


def _versions(device: torch.device) -> list[tuple[str, str]]:
    env = bench.environment(device)
    rows = [
        ("python", env["python"]),
        ("torch", f"{torch.__version__} (git {torch.version.git_version[:8]})"),
        ("numpy", np.__version__),
        ("platform", f"{platform.system()} {platform.machine()}, CPU capability "
                     f"{env['cpu_capability']}"),
        ("oneDNN", f"{env['onednn']} (available: {torch.backends.mkldnn.is_available()}, "
                   f"enabled: {torch.backends.mkldnn.enabled})"),
        ("NNPACK", f"available: {torch.backends.nnpack.is_available()}"),
        ("threads", f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} "
                    "inter-op"),
        ("CUDA", f"{torch.version.cuda or 'not built'}; device available: "
                 f"{torch.cuda.is_available()}"),
    ]
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    rows.append(("cuDNN", str(cudnn) if cudnn else "not available"))
    if torch.cuda.is_available():
        rows.append(("GPU", torch.cuda.get_device_name()))
        rows.append(("cuDNN flags", f"benchmark={torch.backends.cudnn.benchmark}, "
                     f"deterministic={torch.backends.cudnn.deterministic}, "
                     f"allow_tf32={torch.backends.cudnn.allow_tf32}"))
    return rows


def selection_table(device: torch.device) -> list[tuple[str, str, str, str, str]]:
    """``(layer, shape, float32, float64, forced slow)`` backend names for the suite layers.

    Tensors require grad, as in training; only ATen's selection runs (no convolution).
    """
    rows = []
    for layer in bench.SUITE:
        names = []
        for dtype in (torch.float32, torch.float64):
            x = torch.empty(layer.input_shape, dtype=dtype, device=device, requires_grad=True)
            w = torch.empty(layer.weight_shape, dtype=dtype, device=device, requires_grad=True)
            names.append(native.select_backend(x, w, None, *layer.args()))
        x = torch.empty(layer.input_shape, device=device, requires_grad=True)
        w = torch.empty(layer.weight_shape, device=device, requires_grad=True)
        try:
            with native.use_backend("slow", x, w, None, *layer.args()) as chosen:
                names.append(str(chosen))
        except ValueError:
            names.append("-")
        rows.append((layer.name, layer.describe(), *names))
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convlab doctor",
        description="Environment, backends, the backend each benchmark layer selects, and a "
        "quick float64 check of every path against native ATen. Exit status 1 on a mismatch.",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--build-extension", action="store_true",
                        help="compile the C++ extension if it is not built yet (15-60 s)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every mismatch and skipped case")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab doctor``; returns 0 when every checked path agrees with native ATen."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("convlab doctor: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2

    print("== environment")
    for key, value in _versions(device):
        print(f"  {key:<12} {value}")
    print(f"\n== backends use_backend() can force on {device.type}")
    print("  " + ", ".join(native.available_backends(device)))
    print(f"\n== backend each `convlab bench` layer selects on {device.type} (requires_grad)")
    print(f"  {'layer':<11} {'shape':<44} {'float32':<16} {'float64':<16} forced slow")
    for name, shape, f32, f64, slow in selection_table(device):
        print(f"  {name:<11} {shape:<44} {f32:<16} {f64:<16} {slow}")

    print(f"\n== correctness against native ATen (float64, CPU) on {len(CASES)} small cases")
    results, ext_status = checks(device, args.build_extension)
    for r in results:
        worst = f"{r.worst:.1e}" if r.checked else "-"
        line = (f"  {r.status:<8} {r.path:<22} {r.dtype:<8} {len(r.checked)} checked, "
                f"{len(r.skipped)} n/a, max rel diff {worst}")
        print(line)
        shown = r.failures if args.verbose else r.failures[:3]
        for failure in shown:
            print(f"             {failure}")
        if len(r.failures) > len(shown):
            print(f"             ... {len(r.failures) - len(shown)} more (-v)")
        if args.verbose:
            for case, why in r.skipped.items():
                print(f"             n/a {case}: {why}")
    print(f"  C++ extension: {ext_status}")
    failed = [r.path for r in results if r.failures]
    elapsed = time.perf_counter() - start
    if failed:
        print(f"\nFAILED: {', '.join(failed)} disagree with native ATen ({elapsed:.1f} s)")
        return 1
    print(f"\nall checked paths agree with native ATen ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
