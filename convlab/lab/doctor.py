"""``convlab doctor``: the environment, the backends, and a quick check of every path.

It prints versions (torch, CUDA, cuDNN, oneDNN), thread counts, the backends
:func:`convlab.aten.backends.use_backend` can force here, which ATen backend each benchmark layer
(``convlab.lab.paths.SUITE``) selects, the accuracy of the default backend per dtype (when
:mod:`convlab.lab.sections.numerics` is present), and then checks every path of
``convlab.lab.paths.PATHS`` on the small layers ``convlab.lab.paths.CASES``, in float64
where the path has float64 kernels:

* convlab's own paths (reference, thnn, numpy_ref, the C++ extension) against ATen
  (``torch.ops.aten.convolution`` / ``convolution_backward``, default flags, CPU);
* ATen's paths (native and every forcible backend) against :mod:`convlab.scratch.reference`, an
  independent implementation, so that a forced ATen backend is never compared with itself.

The exit status is 1 when any path disagrees or fails, 2 for a bad argument.

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

from convlab.aten import backends
from convlab.lab import bench, paths
from convlab.lab.method import isa_settings, machine
from convlab.lab.paths import CASES, Layer, NotApplicable
from convlab.scratch import reference

# float64 paths must agree to rounding; the bound is relative to the largest expected value.
TOL64 = 1e-10
# oneDNN and NNPACK have no float64 kernels, so they are checked in float32 against the
# float64 truth: float32 rounding over these small sums stays far below this bound, while
# any real error (a wrong tap, a missing group) is of order 1.
TOL32 = 1e-4

Case = Layer  # a doctor case is a (small) benchmark layer
Grads = tuple[torch.Tensor | None, ...]
GRAD_NAMES = ("grad_input", "grad_weight", "grad_bias")
Runner = Callable[[Layer, torch.device], tuple[object | None, Sequence[object]]]
Oracle = Callable[[Layer], tuple[torch.Tensor, Grads]]


@dataclass
class PathCheck:
    """Outcome of checking one path over the cases."""

    path: str
    dtype: str
    checked: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    worst: float = 0.0
    against: str = "aten"

    @property
    def status(self) -> str:
        if self.failures:
            return "FAIL"
        return "ok" if self.checked else "skipped"


def _tensors(case: Layer, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return case.tensors(device, dtype, seed=len(case.name))


def aten_expected(case: Layer) -> tuple[torch.Tensor, Grads]:
    """ATen on CPU, float64, default flags: the truth convlab's paths are held to."""
    x, w, b, go = _tensors(case, torch.device("cpu"), torch.float64)
    args = case.args()
    y = torch.ops.aten.convolution.default(x, w, b, *args)
    grads = torch.ops.aten.convolution_backward.default(
        go, x, w, [b.shape[0]], *args, [True, True, True])
    return y, tuple(grads)


def reference_expected(case: Layer) -> tuple[torch.Tensor, Grads]:
    """`convlab.scratch.reference` in float64: the truth ATen's paths are held to."""
    x, w, b, go = _tensors(case, torch.device("cpu"), torch.float64)
    args = case.args()
    y = reference.convolution(x, w, b, *args)
    grads = reference.convolution_backward(go, x, w, [b.shape[0]], *args, [True, True, True])
    return y, tuple(grads)


def _rel_diff(actual: object, expected: torch.Tensor) -> float:
    got = torch.as_tensor(actual).detach().to(device="cpu", dtype=torch.float64)
    if got.shape != expected.shape:
        raise ValueError(f"shape {list(got.shape)} != expected {list(expected.shape)}")
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    return (got - expected).abs().max().item() / scale if expected.numel() else 0.0


def _compare(check: PathCheck, case: Layer, names: Sequence[str], outputs: Sequence[object],
             expected: Sequence[torch.Tensor], tol: float) -> None:
    for name, got, want in zip(names, outputs, expected, strict=True):
        diff = _rel_diff(got, want)
        check.worst = max(check.worst, diff)
        if not diff <= tol:
            check.failures.append(f"{case.name} {name}: relative diff {diff:.2e} > {tol:.0e}")


def path_runner(path: paths.Path, dtype: torch.dtype) -> Runner:
    """A doctor runner for a registry path: ``(output, grads)`` of a case, or NotApplicable."""

    def run(case: Layer, device: torch.device) -> tuple[object, Sequence[object]]:
        path.check(case, device, dtype)
        fns = path.runners(case, _tensors(case, device, dtype))
        return fns["forward"](), fns["backward"]()

    return run


def _extension_runner(ext: object) -> Runner:
    def run(case: Layer, device: torch.device) -> tuple[object, Sequence[object]]:
        x, w, b, go = _tensors(case, device, torch.float64)
        args = case.args()
        grads = ext.convolution_backward(go, x, w, [b.shape[0]], *args, [True, True, True])
        if case.thnn_ok:  # the explicit-buffer slow path too, compared on the same case
            p = case.params
            bufs = [torch.empty(0, dtype=x.dtype, device=device) for _ in range(3)]
            slow = ext.slow_conv2d_backward_out(*bufs, go, x, w, list(w.shape[2:]), p.stride,
                                                p.padding)
            _, expected = aten_expected(case)
            for got, want, name in zip(slow, expected, ("gi", "gw", "gb"), strict=True):
                if not _rel_diff(got, want) <= TOL64:
                    raise AssertionError(f"slow_conv2d_backward_out {name} differs")
        return None, grads

    return run


def check_path(path: str, runner: Runner, device: torch.device, dtype: str,
               tol: float, cases: Sequence[Layer] = CASES,
               oracle: Oracle = aten_expected) -> PathCheck:
    """Run ``runner`` on every case and compare with ``oracle`` (float64, CPU)."""
    result = PathCheck(path, dtype, against="reference" if oracle is reference_expected
                       else "aten")
    for case in cases:
        try:
            y, grads = runner(case, device)
        except NotApplicable as why:
            result.skipped[case.name] = str(why)
            continue
        except Exception as err:  # noqa: BLE001 - any failure of a path is reported, not raised
            result.failures.append(f"{case.name}: {type(err).__name__}: {err}")
            continue
        want_y, want_grads = oracle(case)
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
        from convlab.aten import extension
    except ImportError as err:
        return None, f"not built: convlab.aten.extension is not importable ({err})"
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


def checks(device: torch.device, build_extension: bool = False,
           only: Sequence[str] | None = None) -> tuple[list[PathCheck], str]:
    """Every registry path's check on ``device`` (or the paths named in ``only``), and the
    extension's status line."""
    out = []
    for path in paths.PATHS:
        if only is not None and path.name not in only:
            continue
        if path.cpu_only and device.type != "cpu":
            continue
        if path.force is not None and path.force not in backends.available_backends(device):
            continue
        dtype = torch.float64 if path.float64 else torch.float32
        oracle = reference_expected if path.is_aten else aten_expected
        name = f"forced {path.name}" if path.force else path.name
        out.append(check_path(name, path_runner(path, dtype), device,
                              str(dtype).replace("torch.", ""),
                              TOL64 if path.float64 else TOL32, oracle=oracle))
    if only is not None:
        return out, "not checked"
    try:
        ext, status = extension_status(build_extension)
    except Exception as err:  # noqa: BLE001 - a broken build is a failed check, not a crash
        failed = PathCheck("C++ extension", "float64", failures=[f"load: {err}"])
        out.append(failed)
        return out, f"load failed: {err}"
    if ext is not None:
        out.append(check_path("C++ extension", _extension_runner(ext), device, "float64", TOL64))
    return out, status


def accuracy_lines() -> list[str]:
    """Accuracy of the default backend per dtype
    (:func:`convlab.lab.method.float_errors.doctor_lines`)."""
    try:
        from convlab.lab.method import float_errors
    except ImportError:
        return ["convlab.lab.method.float_errors is not available"]
    return float_errors.doctor_lines()


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


def fingerprint_lines() -> list[str]:
    """:func:`convlab.lab.method.machine.fingerprint` as short lines: the summary, then details."""
    fp = machine.fingerprint()
    blas = fp["blas"]
    numpy_blas = blas.get("numpy_blas")
    if isinstance(numpy_blas, list):
        numpy_blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']}, "
                               f"{b['num_threads']} threads)" for b in numpy_blas) or "none"
    settings = ", ".join(s.label for s in isa_settings.available_settings()) or "none"
    return [
        machine.fingerprint_line(fp),
        f"CPU flags: {' '.join(fp['isa_flags']) or '(none read)'}",
        f"ISA settings `make records` measures here: {settings} (each where its cap "
        "is observed)",
        f"oneDNN implementations: {fp['onednn_implementations'] or 'none'}",
        f"oneDNN bf16/fp16 implementations: {fp.get('onednn_dtype_implementations') or 'none'}",
        f"MKL code path: {blas.get('mkl_path') or 'none'}",
        f"oneDNN bf16/fp16 supported: {fp['mkldnn_bf16_supported']}/"
        f"{fp['mkldnn_fp16_supported']}",
        f"NumPy BLAS: {numpy_blas}",
        f"ISA caps set: {fp['isa_env'] or 'none'}",
    ]


def selection_table(device: torch.device) -> list[tuple[str, str, str, str, str]]:
    """``(layer, shape, float32, float64, forced slow)`` backend names for the suite layers.

    Tensors require grad, as in training; only ATen's selection runs (no convolution).
    """
    rows = []
    for layer in paths.SUITE:
        native_path = paths.get_path("native")
        names = [native_path.check(layer, device, dtype)
                 for dtype in (torch.float32, torch.float64)]
        try:
            names.append(paths.get_path("slow").check(layer, device, torch.float32))
        except NotApplicable:
            names.append("-")
        rows.append((layer.name, layer.describe(), *names))
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convlab doctor",
        description="Environment, backends, the backend each benchmark layer selects, and a "
        "quick float64 check of every path (convlab's against ATen, ATen's against "
        "convlab.scratch.reference). Exit status 1 on a mismatch, 2 on a bad argument.",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--build-extension", action="store_true",
                        help="compile the C++ extension if it is not built yet (15-60 s)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every mismatch and skipped case")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab doctor``; 0 when every checked path agrees, 1 if not, 2 on a bad argument."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    start = time.perf_counter()
    try:
        device = bench.check_device(args.device)
    except ValueError as err:
        print(f"convlab doctor: error: {err}", file=sys.stderr)
        return 2

    print("== environment")
    for key, value in _versions(device):
        print(f"  {key:<12} {value}")
    print("\n== machine fingerprint (what stored measurements record)")
    for line in fingerprint_lines():
        print(f"  {line}")
    print(f"\n== backends use_backend() can force on {device.type}")
    print("  " + ", ".join(backends.available_backends(device)))
    print(f"\n== backend each `convlab bench` layer selects on {device.type} (requires_grad)")
    print(f"  {'layer':<11} {'shape':<44} {'float32':<16} {'float64':<16} forced slow")
    for name, shape, f32, f64, slow in selection_table(device):
        print(f"  {name:<11} {shape:<44} {f32:<16} {f64:<16} {slow}")
    print("\n== accuracy of the default backend against a float64 oracle (CPU)")
    for line in accuracy_lines():
        print(f"  {line}")

    print(f"\n== correctness on {len(CASES)} small cases (float64 where the path has it; "
          "convlab's paths against ATen, ATen's against convlab.scratch.reference)")
    results, ext_status = checks(device, args.build_extension)
    for r in results:
        worst = f"{r.worst:.1e}" if r.checked else "-"
        line = (f"  {r.status:<8} {r.path:<17} {r.dtype:<8} vs {r.against:<9} "
                f"{len(r.checked)} checked, {len(r.skipped)} n/a, max rel diff {worst}")
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
        print(f"\nFAILED: {', '.join(failed)} disagree ({elapsed:.1f} s)")
        return 1
    print(f"\nall checked paths agree ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
