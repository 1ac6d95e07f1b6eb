"""PyTorch's own convolution paths, called from Python.

* :func:`select_backend`: the name of the backend ATen's ``select_conv_backend`` picks;
* :func:`use_backend`: a context manager that forces one (``"mkldnn"``, ``"slow"``,
  ``"nnpack"``, ``"cudnn"``, ...) through the global ``torch.backends`` flags and checks that
  the choice took effect;
* :func:`convolution_backward`: ``aten::convolution_backward`` under a chosen backend;
* :func:`slow_conv2d_backward`: the slow (im2col + GEMM) 2-d backward into caller buffers;
* :func:`conv1d_input` ... :func:`conv3d_weight`: the ``torch.nn.grad`` functions.

The backend flags are process-global (ATen's ``globalContext()``), so :func:`use_backend`
is not thread-safe: do not force different backends from two threads at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from convlab.params import (
    ConvParams,
    IntOrSeq,
    check_output_mask,
    check_same,
    check_tensor,
    normalize,
)

# ATen's ``enum class ConvBackend`` (aten/src/ATen/native/ConvUtils.h), in declaration order,
# so that index == enum value. The Python binding ``torch._C._ConvBackend`` cannot be trusted
# for names: it has no entry for value 9 (prints as ``_ConvBackend.???``) and spells value 22
# "MpsTranspose,". tests/test_native.py checks this tuple against the installed header.
CONV_BACKENDS: tuple[str, ...] = (
    "CudaDepthwise2d",
    "CudaDepthwise3d",
    "Cudnn",
    "CudnnTranspose",
    "Empty",
    "Miopen",
    "MiopenDepthwise",
    "MiopenTranspose",
    "Mkldnn",
    "MkldnnTranspose",
    "MkldnnEmpty",
    "NnpackSpatial",
    "Overrideable",
    "Slow2d",
    "Slow3d",
    "SlowDilated2d",
    "SlowDilated3d",
    "SlowTranspose2d",
    "SlowTranspose3d",
    "Winograd3x3Depthwise",
    "Xnnpack2d",
    "Mps",
    "MpsTranspose",
)

SLOW_BACKENDS = frozenset(
    {"Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d", "SlowTranspose3d"}
)


def backend_name(backend: torch._C._ConvBackend | int) -> str:
    """Name of a ``torch._C._ConvBackend`` value (or its int), robust to the binding's quirks.

    >>> backend_name(9)
    'MkldnnTranspose'
    """
    value = int(backend)
    if not 0 <= value < len(CONV_BACKENDS):
        raise ValueError(
            f"unknown ConvBackend value {value} (this torch may be newer than convlab)"
        )
    return CONV_BACKENDS[value]


def select_backend(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> str:
    """The backend ``aten::_convolution`` would run for these arguments, under the current flags.

    Arguments are those of ``aten::convolution`` (input ``[N, C, *spatial]``); ints are
    broadcast to every spatial dimension. Runs only ATen's selection (no convolution).
    As in the forward, ``need_backward`` follows grad mode and ``requires_grad``, which only
    matters for the inference-only Xnnpack2d / Winograd3x3Depthwise branches.

    Returns:
        A name from ``CONV_BACKENDS``, e.g. ``"Mkldnn"`` or ``"Slow2d"``.

    >>> x, w = torch.randn(1, 3, 8, 8, dtype=torch.float64), torch.randn(4, 3, 3, 3).double()
    >>> select_backend(x, w, dilation=2)
    'SlowDilated2d'
    """
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    chosen = torch._C._select_conv_backend(input, weight, bias, *p.aten_args())
    return backend_name(chosen)


def backend_memory_format(
    input: torch.Tensor, weight: torch.Tensor, backend: str
) -> torch.memory_format:
    """The memory format ATen runs ``backend`` in for these tensors.

    Wraps ``torch._C._conv_determine_backend_memory_format`` (what ``_convolution`` calls
    right after selection); ``backend`` is a name from ``CONV_BACKENDS``.

    >>> x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    >>> backend_memory_format(x, torch.randn(4, 3, 3, 3), "Slow2d")
    torch.channels_last
    """
    check_tensor(input, "input")
    check_tensor(weight, "weight")
    if backend not in CONV_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; ATen's names: {', '.join(CONV_BACKENDS)}")
    enum = torch._C._ConvBackend(CONV_BACKENDS.index(backend))
    return torch._C._conv_determine_backend_memory_format(input, weight, enum)


@dataclass(frozen=True)
class _Forcing:
    """How one forcible backend is reached: flag values to set and the ATen names it yields."""

    flags: dict[str, bool]
    expect: frozenset[str]
    device: str
    doc: str


# "Empty" is accepted everywhere: a zero-size batch or channel dim is served without a kernel.
_FORCE: dict[str, _Forcing] = {
    "mkldnn": _Forcing(
        {"mkldnn": True},
        frozenset({"Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "Empty"}),
        "cpu",
        "oneDNN (MKL-DNN) on CPU",
    ),
    "slow": _Forcing(
        {"mkldnn": False, "nnpack": False, "cudnn": False},
        SLOW_BACKENDS | {"CudaDepthwise2d", "CudaDepthwise3d", "Empty"},
        "any",
        "ATen's own kernels: no oneDNN, NNPACK, cuDNN or MIOpen",
    ),
    "nnpack": _Forcing(
        {"mkldnn": False, "nnpack": True},
        frozenset({"NnpackSpatial", "Empty"}),
        "cpu",
        "NNPACK forward (its backward is the SlowDilated2d kernel)",
    ),
    "cudnn": _Forcing(
        {"cudnn": True, "cudnn_deterministic": False},
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN",
    ),
    "cudnn-deterministic": _Forcing(
        {"cudnn": True, "cudnn_deterministic": True, "cudnn_benchmark": False},
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN with deterministic algorithms only",
    ),
    "cudnn-benchmark": _Forcing(
        {"cudnn": True, "cudnn_benchmark": True},
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN, algorithm chosen by timing (benchmark mode)",
    ),
}
BACKEND_CHOICES: tuple[str, ...] = tuple(_FORCE)


def _get_flags() -> dict[str, bool]:
    return {
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "nnpack": bool(torch._C._get_nnpack_enabled()),
        "cudnn": bool(torch.backends.cudnn.enabled),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def _set_flags(flags: dict[str, bool]) -> None:
    # Plain attribute assignment: `torch.backends.mkldnn.flags()` also resets TF32 settings and
    # warns (with a local path) on CPU-only builds.
    for key, value in flags.items():
        if key == "mkldnn":
            torch.backends.mkldnn.enabled = value
        elif key == "nnpack":
            torch.backends.nnpack.set_flags(value)
        elif key == "cudnn":
            torch.backends.cudnn.enabled = value
        elif key == "cudnn_deterministic":
            torch.backends.cudnn.deterministic = value
        elif key == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = value
        else:  # pragma: no cover - _FORCE and this function are kept in step
            raise KeyError(key)


def _unavailable_reason(name: str, device: torch.device | None) -> str | None:
    """Why backend ``name`` cannot serve tensors on ``device`` (any device when None)."""
    spec = _FORCE[name]
    if spec.device == "cpu":
        if name == "mkldnn" and not torch.backends.mkldnn.is_available():
            return "this torch was built without oneDNN (torch.backends.mkldnn.is_available())"
        if name == "nnpack" and not torch.backends.nnpack.is_available():
            return "this torch was built without NNPACK (torch.backends.nnpack.is_available())"
        if device is not None and device.type != "cpu":
            return f"it serves CPU tensors only, got tensors on {device}"
    if spec.device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device is available"
        if not torch.backends.cudnn.is_available() or torch.version.hip is not None:
            return "this torch was built without cuDNN (torch.backends.cudnn.is_available())"
        if device is not None and device.type != "cuda":
            return f"it serves CUDA tensors only, got tensors on {device}"
    return None


def available_backends(device: str | torch.device = "cpu") -> list[str]:
    """Names :func:`use_backend` accepts for tensors on ``device`` in this build.

    >>> "slow" in available_backends("cpu")
    True
    """
    dev = torch.device(device)
    if dev.type not in {"cpu", "cuda"}:
        return []
    return [name for name in _FORCE if _unavailable_reason(name, dev) is None]


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    if name not in _FORCE:
        raise ValueError(f"unknown backend {name!r}; valid names: {', '.join(_FORCE)}")
    return name


@contextmanager
def use_backend(
    name: str,
    input: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> Iterator[str | None]:
    """Force convolution backend ``name`` inside the block by setting ``torch.backends`` flags.

    ``name`` is one of ``BACKEND_CHOICES``: ``"mkldnn"``, ``"slow"`` (oneDNN, NNPACK and
    cuDNN off), ``"nnpack"``, ``"cudnn"``, ``"cudnn-deterministic"``, ``"cudnn-benchmark"``.
    With ``input`` and ``weight`` (and the other ``aten::convolution`` arguments) the block
    is entered only if :func:`select_backend` confirms the choice for them; it yields that
    ATen backend name (``None`` without tensors). The previous flags are restored on exit,
    also when the block raises. Flags are global: this is not thread-safe.

    Raises:
        ValueError: unknown name, the backend is not available here, or ATen picks another
            backend for the given tensors (e.g. ``"mkldnn"`` with float64).

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> with use_backend("slow", x, w) as chosen:
    ...     y = torch.nn.functional.conv2d(x, w)
    >>> chosen
    'Slow2d'
    """
    name = _check_name(name)
    if (input is None) != (weight is None):
        raise ValueError("use_backend needs both input and weight, or neither")
    reason = _unavailable_reason(name, None if input is None else input.device)
    if reason is not None:
        raise ValueError(f"backend {name!r} is not available: {reason}")
    saved = _get_flags()
    try:
        _set_flags(_FORCE[name].flags)
        chosen = None
        if input is not None and weight is not None:
            chosen = select_backend(
                input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
            )
            expected = _FORCE[name].expect
            if chosen not in expected:
                raise ValueError(
                    f"backend {name!r} cannot serve these inputs: with its flags set ATen "
                    f"selects {chosen} (expected one of {', '.join(sorted(expected))}); "
                    f"input {list(input.shape)} {input.dtype} on {input.device}, "
                    f"weight {list(weight.shape)}"
                )
        yield chosen
    finally:
        _set_flags(saved)


def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Sequence[int] | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
    output_mask: Sequence[bool],
    backend: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``torch.ops.aten.convolution_backward``, optionally under a forced backend.

    Shapes: ``grad_output`` is the forward output's shape ``[N, C_out, *out]``; returns
    ``(grad_input [N, C_in, *in], grad_weight like weight, grad_bias [C_out])`` with ``None``
    where ``output_mask`` is False. ``backend`` is a :func:`use_backend` name (checked against
    :func:`select_backend`) or ``None`` for the current flags.

    One guard differs from ATen: ``bias_sizes=None`` with ``output_mask[2]`` set is passed as
    ``[C_out]``, because ATen aborts the process on that combination with an empty batch.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> go = torch.ones(2, 4, 6, 6)
    >>> gi, gw, gb = convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 1,
    ...                                   [True, True, True], backend="slow")
    >>> gb
    tensor([72., 72., 72., 72.])
    """
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    p.check_grad_output(grad_output, input, weight)
    mask = check_output_mask(output_mask)
    out_channels = p.output_shape(tuple(input.shape), tuple(weight.shape))[1]
    if bias_sizes is not None:
        sizes = list(normalize(bias_sizes, 1, "bias_sizes")) if bias_sizes else []
        if mask[2] and sizes != [out_channels]:
            raise ValueError(
                f"bias_sizes must be [{out_channels}] (out_channels) when output_mask[2] is "
                f"True, got {list(bias_sizes)}"
            )
    elif mask[2]:
        sizes = [out_channels]
    args = (
        grad_output,
        input,
        weight,
        None if bias_sizes is None and not mask[2] else sizes,
        *p.aten_args(),
        list(mask),
    )
    if backend is None:
        grads = torch.ops.aten.convolution_backward.default(*args)
    else:
        with use_backend(
            backend, input, weight, None, p.stride, p.padding, p.dilation, p.transposed,
            p.output_padding, p.groups,
        ):
            grads = torch.ops.aten.convolution_backward.default(*args)
    return tuple(g if m else None for g, m in zip(grads, mask, strict=True))  # type: ignore[return-value]


def _check_slow2d(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: IntOrSeq,
    stride: IntOrSeq,
    padding: IntOrSeq,
) -> tuple[list[int], ConvParams]:
    check_tensor(weight, "weight")
    if weight.dim() != 4:
        raise ValueError(
            f"slow_conv2d_backward needs a 4-d weight [C_out, C_in, kH, kW], "
            f"got shape {list(weight.shape)}"
        )
    p = ConvParams.for_tensors(input, weight, None, stride, padding)
    p.check_grad_output(grad_output, input, weight)
    ks = list(normalize(kernel_size, 2, "kernel_size"))
    if ks != list(weight.shape[2:]):
        raise ValueError(
            f"kernel_size={ks} must equal the weight's spatial shape {list(weight.shape[2:])}"
        )
    if input.device.type not in {"cpu", "cuda"}:
        raise ValueError(
            f"_slow_conv2d_backward has CPU and CUDA kernels only, got input on {input.device}"
        )
    return ks, p


def slow_conv2d_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: IntOrSeq,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    output_mask: Sequence[bool] = (True, True, True),
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """ATen's slow (im2col + GEMM) 2-d conv backward: ``aten::_slow_conv2d_backward``, CPU or CUDA.

    No dilation or groups (the kernel has neither). Shapes: input ``[N, C_in, H, W]``, weight
    ``[C_out, C_in, kH, kW]``, grad_output ``[N, C_out, oH, oW]``. With ``out=(grad_input,
    grad_weight, grad_bias)`` the ``.grad_input`` overload writes into those buffers (resized
    in place; a buffer that is large enough keeps its storage, ``torch.empty(0)`` is fine)
    and returns them, ignoring ``output_mask``; otherwise the ``.output_mask`` overload
    allocates and masked slots are ``None``. Inputs are made contiguous: the kernel refuses
    a channels-last input with a contiguous weight, and with a contiguous input and a
    channels-last weight it returns a wrong ``grad_weight`` (torch 2.13).

    >>> x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    >>> bufs = (torch.empty(0), torch.empty(0), torch.empty(0))
    >>> gi, gw, gb = slow_conv2d_backward(torch.ones(1, 3, 3, 3), x, w, 3, out=bufs)
    >>> gi is bufs[0], list(gw.shape)
    (True, [3, 2, 3, 3])
    """
    ks, p = _check_slow2d(grad_output, input, weight, kernel_size, stride, padding)
    go, x, w = grad_output.contiguous(), input.contiguous(), weight.contiguous()
    stride_, padding_ = list(p.stride), list(p.padding)
    if out is None:
        mask = check_output_mask(output_mask)
        grads = torch.ops.aten._slow_conv2d_backward.output_mask(
            go, x, w, ks, stride_, padding_, list(mask)
        )
        return tuple(g if m else None for g, m in zip(grads, mask, strict=True))  # type: ignore[return-value]
    if not isinstance(out, tuple | list) or len(out) != 3:
        raise TypeError("out must be a tuple of 3 tensors (grad_input, grad_weight, grad_bias)")
    for buf, buf_name in zip(out, ("grad_input", "grad_weight", "grad_bias"), strict=True):
        check_tensor(buf, f"out {buf_name}")
        check_same(input, buf, "input", f"out {buf_name}")
    gi, gw, gb = out
    return torch.ops.aten._slow_conv2d_backward.grad_input(
        go, x, w, ks, stride_, padding_, grad_input=gi, grad_weight=gw, grad_bias=gb
    )


# --- torch.nn.grad equivalents -------------------------------------------------------------


def _dense_placeholder(size: Sequence[int], like: torch.Tensor, name: str) -> torch.Tensor:
    """An uninitialised tensor of ``size`` (never read: its gradient slot is masked off)."""
    if isinstance(size, torch.Size):
        size = tuple(size)
    if isinstance(size, str | bytes) or not isinstance(size, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(size).__name__}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise TypeError(f"{name} must contain ints, got {list(size)}")
    if len(size) != like.dim():
        raise ValueError(
            f"{name} must have {like.dim()} entries to match a {like.dim()}-d tensor, "
            f"got {list(size)}"
        )
    if any(s < 0 for s in size):
        raise ValueError(f"{name} must be non-negative, got {list(size)}")
    fmt = torch.preserve_format
    if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last):
        fmt = torch.channels_last
    elif like.dim() == 5 and like.is_contiguous(memory_format=torch.channels_last_3d):
        fmt = torch.channels_last_3d
    if fmt is torch.preserve_format:
        return like.new_empty(tuple(size))
    return torch.empty(tuple(size), dtype=like.dtype, device=like.device, memory_format=fmt)


def _conv_input(
    dim: int,
    input_size: Sequence[int],
    weight: torch.Tensor,
    grad_output: torch.Tensor,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    groups: int,
) -> torch.Tensor:
    check_tensor(weight, "weight")
    check_tensor(grad_output, "grad_output")
    if weight.dim() != dim + 2:
        raise ValueError(
            f"weight must have {dim + 2} dimensions for conv{dim}d, got {list(weight.shape)}"
        )
    placeholder = _dense_placeholder(input_size, grad_output, "input_size")
    grad_input, _, _ = convolution_backward(
        grad_output, placeholder, weight, None, stride, padding, dilation, False, 0, groups,
        [True, False, False],
    )
    assert grad_input is not None
    return grad_input


def _conv_weight(
    dim: int,
    input: torch.Tensor,
    weight_size: Sequence[int],
    grad_output: torch.Tensor,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    groups: int,
) -> torch.Tensor:
    check_tensor(input, "input")
    check_tensor(grad_output, "grad_output")
    if input.dim() != dim + 2:
        raise ValueError(
            f"input must have {dim + 2} dimensions for conv{dim}d, got {list(input.shape)}"
        )
    placeholder = _dense_placeholder(weight_size, input, "weight_size")
    _, grad_weight, _ = convolution_backward(
        grad_output, input, placeholder, None, stride, padding, dilation, False, 0, groups,
        [False, True, False],
    )
    assert grad_weight is not None
    return grad_weight


def conv1d_input(
    input_size: Sequence[int], weight: torch.Tensor, grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv1d w.r.t. its input, like ``torch.nn.grad.conv1d_input``.

    Calls ``aten::convolution_backward`` with output_mask ``[True, False, False]``; see
    :func:`conv2d_input` for shapes and the placeholder.
    """
    return _conv_input(1, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv2d_input(
    input_size: Sequence[int], weight: torch.Tensor, grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv2d w.r.t. its input, like ``torch.nn.grad.conv2d_input``.

    Shapes: ``input_size`` ``[N, C_in, H, W]`` (it fixes the sizes a strided conv leaves
    ambiguous), weight ``[C_out, C_in/groups, kH, kW]``, grad_output ``[N, C_out, oH, oW]``.
    Calls ``aten::convolution_backward`` with output_mask ``[True, False, False]`` and an
    uninitialised input of ``input_size`` that is never read.

    Why a dense placeholder: torch.nn.grad passes a zero-memory ``new_empty(1).expand(size)``
    for the operand whose gradient is not wanted. Backends choose memory formats (and
    oneDNN/cuDNN their layouts) from that operand's strides, and a stride-0 view looks
    non-contiguous to those heuristics. An uninitialised dense tensor (channels_last when the
    other operand is) makes exactly the call autograd makes, for one unfilled allocation.

    >>> w, go = torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)
    >>> list(conv2d_input([2, 3, 8, 8], w, go).shape)
    [2, 3, 8, 8]
    """
    return _conv_input(2, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv3d_input(
    input_size: Sequence[int], weight: torch.Tensor, grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv3d w.r.t. its input, like ``torch.nn.grad.conv3d_input``.

    Calls ``aten::convolution_backward`` with output_mask ``[True, False, False]``; see
    :func:`conv2d_input` for shapes and the placeholder.
    """
    return _conv_input(3, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv1d_weight(
    input: torch.Tensor, weight_size: Sequence[int], grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv1d w.r.t. its weight, like ``torch.nn.grad.conv1d_weight``.

    Calls ``aten::convolution_backward`` with output_mask ``[False, True, False]``; see
    :func:`conv2d_weight` for shapes and the placeholder.
    """
    return _conv_weight(1, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv2d_weight(
    input: torch.Tensor, weight_size: Sequence[int], grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv2d w.r.t. its weight, like ``torch.nn.grad.conv2d_weight``.

    Shapes: input ``[N, C_in, H, W]``, ``weight_size`` ``[C_out, C_in/groups, kH, kW]``,
    grad_output ``[N, C_out, oH, oW]``. Calls ``aten::convolution_backward`` with output_mask
    ``[False, True, False]`` and an uninitialised weight of ``weight_size`` that is never read.

    Why a dense placeholder: torch.nn.grad passes a zero-memory ``new_empty(1).expand(size)``
    for the operand whose gradient is not wanted. Backends choose memory formats (and
    oneDNN/cuDNN their layouts) from that operand's strides, and a stride-0 view looks
    non-contiguous to those heuristics. An uninitialised dense tensor (channels_last when the
    other operand is) makes exactly the call autograd makes, for one unfilled allocation.

    >>> x, go = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 6, 6)
    >>> list(conv2d_weight(x, [4, 3, 3, 3], go).shape)
    [4, 3, 3, 3]
    """
    return _conv_weight(2, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv3d_weight(
    input: torch.Tensor, weight_size: Sequence[int], grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """Gradient of conv3d w.r.t. its weight, like ``torch.nn.grad.conv3d_weight``.

    Calls ``aten::convolution_backward`` with output_mask ``[False, True, False]``; see
    :func:`conv2d_weight` for shapes and the placeholder.
    """
    return _conv_weight(3, input, weight_size, grad_output, stride, padding, dilation, groups)
