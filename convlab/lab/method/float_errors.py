"""How far a native conv backward is from the exact answer, in relative terms and in ULPs
(the measurement; chapter 10's record section is :mod:`convlab.lab.sections.numerics`).

* :func:`ulp`: the spacing of a floating-point dtype at given (float64) values;
* :func:`ulp_error`: element-wise error of a result in ULPs of its dtype;
* :func:`relative_error`: one normwise or max-norm relative error of a whole tensor;
* :func:`backward_error`: ``aten::convolution_backward`` in a chosen dtype (and backend)
  against :func:`convlab.scratch.reference.convolution_backward` in float64 on the same, rounded
  inputs;
* :func:`doctor_lines`: a few one-line summaries of :func:`backward_error` for
  ``convlab doctor``.

The oracle sees exactly the values the native kernel sees (the inputs rounded to the
dtype, then widened to float64), so every reported error is the kernel's own: its
accumulation order and precision, never the rounding of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from convlab.aten import backends, native
from convlab.scratch import reference
from convlab.scratch.params import IntOrSeq, check_output_mask, check_tensor

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32,
                                         torch.float64)
GRAD_NAMES: tuple[str, str, str] = ("grad_input", "grad_weight", "grad_bias")


def _check_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {type(dtype).__name__}")
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(str(d) for d in FLOAT_DTYPES)
        raise ValueError(f"{name} must be one of {names}, got {dtype}")
    return dtype


def _check_float(t: object, name: str) -> torch.Tensor:
    check_tensor(t, name)
    assert isinstance(t, torch.Tensor)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    return t


def _check_pair(actual: object, exact: object) -> tuple[torch.Tensor, torch.Tensor]:
    a = _check_float(actual, "actual")
    e = _check_float(exact, "exact")
    if a.shape != e.shape:
        raise ValueError(
            f"actual and exact must have the same shape, got {list(a.shape)} "
            f"and {list(e.shape)}"
        )
    if a.device != e.device:
        raise ValueError(f"actual is on {a.device} but exact is on {e.device}")
    return a, e


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at each of ``values``: the gap between the two ``dtype``
    numbers around ``|value|`` (at a power of two, the gap above it).

    Values below the smallest normal number get the subnormal spacing; NaN and inf give
    NaN and inf. Returns float64, the shape of ``values``.

    >>> ulp(torch.tensor([1.0, 1.5, 3.0]), torch.bfloat16).tolist()
    [0.0078125, 0.0078125, 0.015625]
    """
    values = _check_float(values, "values")
    dtype = _check_dtype(dtype)
    info = torch.finfo(dtype)
    mag = values.detach().to(torch.float64).abs().clamp_min(info.tiny)
    _, exponent = torch.frexp(mag)  # mag = m * 2**exponent with m in [0.5, 1)
    spacing = _times_pow2(torch.full_like(mag, info.eps), exponent - 1)
    return torch.where(torch.isfinite(mag), spacing, mag)


def ulp_error(
    actual: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Element-wise ``|actual - exact|`` in ULPs of ``dtype`` at ``exact``.

    ``dtype`` defaults to ``actual.dtype``; ``exact`` is usually a float64 oracle. A value
    that ``dtype`` represents exactly and ``actual`` returns exactly scores 0, its
    neighbour 1; the best a rounded result can score is 0.5. Non-finite entries score 0
    where both sides agree (both NaN, or the same infinity) and ``inf`` otherwise.
    Returns float64, the common shape.

    >>> x = torch.tensor([1.5], dtype=torch.bfloat16)
    >>> ulp_error(torch.nextafter(x, torch.tensor(2.0, dtype=x.dtype)), x.double())
    tensor([1.], dtype=torch.float64)
    """
    a, e = _check_pair(actual, exact)
    dtype = _check_dtype(a.dtype if dtype is None else dtype)
    a64, e64 = a.detach().to(torch.float64), e.detach().to(torch.float64)
    finite = torch.isfinite(a64) & torch.isfinite(e64)
    zero = torch.zeros((), dtype=torch.float64)
    a_f, e_f = torch.where(finite, a64, zero), torch.where(finite, e64, zero)
    # scaled by a power of two per entry: the subtraction cannot overflow near 1e308
    _, k = torch.frexp(torch.maximum(a_f.abs(), e_f.abs()))
    diff = (_times_pow2(a_f, -k) - _times_pow2(e_f, -k)).abs()
    ulp_k = torch.frexp(ulp(e_f, dtype))[1] - 1  # ulp() is a power of two: 2**ulp_k
    err = _times_pow2(diff, k - ulp_k)
    agree = (torch.isnan(a64) & torch.isnan(e64)) | (a64 == e64)
    nonfinite = torch.where(agree, 0.0, math.inf).to(torch.float64)
    return torch.where(finite, err, nonfinite)


def _times_pow2(x: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """``x * 2**k`` with one rounding, for any integer ``k``: applied as two factors that
    are normal numbers, so nothing overflows or underflows before the result does
    (``2.0**k`` alone is inf for ``k > 1023``)."""
    mant, e = torch.frexp(x)
    total = (torch.as_tensor(k) + e).clamp(-1200, 1200).to(torch.float64)
    half = torch.floor(total / 2)
    return mant * torch.exp2(half) * torch.exp2(total - half)


def _scaled_diff(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``((a - e) / 2**k, k)``: both scaled first by the power of two that brings the
    largest (finite) magnitude into ``[0.5, 1)``, so ``a - e`` cannot overflow near 1e308."""
    k = math.frexp(max(a.abs().max().item(), e.abs().max().item()))[1]
    return _times_pow2(a, -k) - _times_pow2(e, -k), k


def _norm(t: torch.Tensor) -> tuple[float, int]:
    """``(n, k)`` with ``||t||_2 = n * 2**k``; no square overflows or underflows."""
    k = math.frexp(t.abs().max().item())[1]
    return _times_pow2(t, -k).norm().item(), k


def _quotient(num: float, num_k: int, den: float, den_k: int) -> float:
    """``(num * 2**num_k) / (den * 2**den_k)``; ``inf`` past float64's range, 0/0 is 0."""
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    (m_num, e_num), (m_den, e_den) = math.frexp(num), math.frexp(den)
    try:
        return math.ldexp(m_num / m_den, e_num + num_k - e_den - den_k)
    except OverflowError:
        return math.inf


def _nonfinite_mismatch(a: torch.Tensor, e: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """Whether NaN/inf positions disagree, and the mask of entries that are finite in both."""
    finite = torch.isfinite(a) & torch.isfinite(e)
    agree = (torch.isnan(a) & torch.isnan(e)) | (a == e)
    return bool((~finite & ~agree).any()), finite


def relative_error(actual: torch.Tensor, exact: torch.Tensor, norm: str = "fro") -> float:
    """One relative error of ``actual`` against ``exact``, computed in float64.

    ``norm="fro"``: ``||actual - exact||_2 / ||exact||_2`` over all entries (normwise);
    ``norm="max"``: ``max|actual - exact| / max|exact|``. Entries where both are NaN or the
    same infinity are left out; any other NaN/inf mismatch gives ``inf``. An all-zero
    ``exact`` gives 0 if ``actual`` is all zero too, else ``inf``; empty tensors give 0.

    >>> relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    0.0
    """
    a, e = _check_pair(actual, exact)
    if norm not in ("fro", "max"):
        raise ValueError(f"norm must be 'fro' or 'max', got {norm!r}")
    a64, e64 = a.detach().to(torch.float64), e.detach().to(torch.float64)
    mismatch, finite = _nonfinite_mismatch(a64, e64)
    if mismatch:
        return math.inf
    if not finite.any():
        return 0.0
    diff, k = _scaled_diff(a64[finite], e64[finite])
    if norm == "fro":
        (num, num_k), (den, den_k) = _norm(diff), _norm(e64[finite])
        return _quotient(num, num_k + k, den, den_k)
    return _quotient(diff.abs().max().item(), k, e64[finite].abs().max().item(), 0)


@dataclass(frozen=True)
class GradError:
    """Error of one gradient against the float64 oracle.

    ``rel``: normwise relative error; ``max_rel``: ``max|a - e| / max|e|``; ``ulps``:
    ``max|a - e|`` in ULPs of the dtype at ``max|e|`` (the error measured in the last bits
    of the largest entry; 0.5 is what rounding the exact answer once costs);
    ``max_ulp``: the largest element-wise :func:`ulp_error` (large where cancellation
    leaves an entry far below the tensor's scale).
    """

    rel: float
    max_rel: float
    ulps: float
    max_ulp: float


def grad_error(actual: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> GradError:
    """:class:`GradError` of ``actual`` against ``exact``, ULPs counted in ``dtype``.

    NaN/inf handling is that of :func:`relative_error` and :func:`ulp_error`: agreeing
    non-finite entries are left out, any disagreement makes every field ``inf``.
    """
    a, e = _check_pair(actual, exact)
    dtype = _check_dtype(dtype)
    a64, e64 = a.detach().to(torch.float64), e.detach().to(torch.float64)
    mismatch, finite = _nonfinite_mismatch(a64, e64)
    if mismatch:
        return GradError(math.inf, math.inf, math.inf, math.inf)
    if not finite.any():
        return GradError(0.0, 0.0, 0.0, 0.0)
    ref = e64[finite]
    diff, k = _scaled_diff(a64[finite], ref)
    worst, top = diff.abs().max().item(), ref.abs().max().item()
    (num, num_k), (den, den_k) = _norm(diff), _norm(ref)
    spacing = ulp(torch.tensor([top], dtype=torch.float64), dtype).item()
    return GradError(
        rel=_quotient(num, num_k + k, den, den_k),
        max_rel=_quotient(worst, k, top, 0),
        ulps=_quotient(worst, k, spacing, 0),
        max_ulp=ulp_error(a64[finite], ref, dtype).max().item(),
    )


def backward_error(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    *,
    dtype: torch.dtype = torch.float32,
    backend: str | None = None,
    output_mask: Sequence[bool] = (True, True, True),
) -> dict[str, GradError]:
    """Error of ``aten::convolution_backward`` in ``dtype`` against the float64 oracle.

    Shapes: grad_output ``[N, C_out, *out]``, input ``[N, C_in, *in]``, weight
    ``[C_out, C_in/groups, *k]`` (any float dtype; they are rounded to ``dtype`` first).
    The native backward runs on the rounded tensors in ``dtype``, under ``backend`` (a
    :func:`convlab.aten.backends.use_backend` name, or None for the current flags); the oracle
    is :func:`convlab.scratch.reference.convolution_backward` in float64 on the same rounded
    values. The bias gradient is that of a conv with a bias of ``C_out`` entries.

    Returns:
        ``{"grad_input": GradError, "grad_weight": ..., "grad_bias": ...}`` for the
        entries of ``output_mask`` that are True.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> errs = backward_error(torch.randn(2, 4, 6, 6), x, w, dtype=torch.float64)
    >>> errs["grad_weight"].rel < 1e-12
    True
    """
    for t, name in ((grad_output, "grad_output"), (input, "input"), (weight, "weight")):
        _check_float(t, name)
    dtype = _check_dtype(dtype)
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
        if backend not in backends.BACKEND_CHOICES:
            names = ", ".join(backends.BACKEND_CHOICES)
            raise ValueError(f"backend must be one of {names}, got {backend!r}")
    mask = check_output_mask(output_mask)
    go, x, w = (t.detach().to(dtype) for t in (grad_output, input, weight))
    args = (stride, padding, dilation, False, 0, groups)
    bias_sizes = [w.shape[0]]
    got = native.convolution_backward(
        go, x, w, bias_sizes, *args, mask, backend=backend
    )
    exact = reference.convolution_backward(
        go.double(), x.double(), w.double(), bias_sizes, *args, mask
    )
    return {
        name: grad_error(a, e, dtype)
        for name, a, e, m in zip(GRAD_NAMES, got, exact, mask, strict=True)
        if m and a is not None and e is not None
    }


def doctor_lines(
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16, torch.float16),
    seed: int = 0,
) -> list[str]:
    """One line per dtype: the backend this machine picks for a small 3x3 conv and the
    worst :func:`backward_error` of its three gradients (relative and in ULPs).

    Meant for ``convlab doctor``; runs in well under a second on a CPU.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, 16, 16, generator=gen, dtype=torch.float64)
    w = torch.randn(16, 16, 3, 3, generator=gen, dtype=torch.float64)
    go = torch.randn(8, 16, 16, 16, generator=gen, dtype=torch.float64)
    lines = []
    for dtype in dtypes:
        dtype = _check_dtype(dtype, "dtypes")
        chosen = backends.select_backend(x.to(dtype), w.to(dtype), padding=1)
        try:
            errs = backward_error(go, x, w, padding=1, dtype=dtype)
        except (RuntimeError, NotImplementedError) as exc:
            lines.append(f"{dtype}: {chosen}: backward failed ({type(exc).__name__})")
            continue
        rel = max(e.rel for e in errs.values())
        ulps = max(e.ulps for e in errs.values())
        lines.append(
            f"{str(dtype).removeprefix('torch.')}: {chosen}, worst gradient "
            f"rel. error {rel:.1e}, {ulps:.1f} ulp of its largest entry"
        )
    return lines
