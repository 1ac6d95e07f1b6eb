"""Which ATen ops (and which convolution backend) a forward + backward runs.

Two views of the same call:

* :class:`OpRecorder`, a ``TorchDispatchMode``: every ATen op that reaches the Python
  dispatcher, with its tensor shapes and, for convolution ops, the backend
  :func:`convlab.aten.backends.select_backend` names. It sees ``aten::convolution`` and
  ``aten::convolution_backward`` but not what runs below them (``_convolution``,
  ``mkldnn_convolution``, ...), because those calls happen inside C++ kernels.
* :func:`profile_op_tree`, built on ``torch.profiler``: the nested op names, down to the
  backend's kernel op (``aten::_convolution -> aten::mkldnn_convolution``).

:func:`trace_conv` / :func:`profile_conv` build one convolution and run both passes; the
``convlab trace`` command is :mod:`convlab.cli.trace`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from convlab.aten.backends import select_backend, use_backend
from convlab.aten.capture import PROFILER_LOCK, redirect_fd
from convlab.scratch.params import ConvParams, IntOrSeq

# Ops whose arguments start like aten::convolution's: (input, weight, bias, stride, padding,
# dilation, transposed, output_padding, groups, ...).
_FORWARD_CONV_OPS = {"aten::convolution", "aten::_convolution"}
_BACKWARD_CONV_OPS = {"aten::convolution_backward"}


@dataclass
class OpRecord:
    """One ATen op call: its name, pass, tensor argument shapes and conv backend (or None)."""

    op: str
    phase: str
    shapes: list[tuple[int, ...]]
    backend: str | None = None


def _op_name(func: torch._ops.OpOverload) -> str:
    overload = func._overloadname
    return func.name() if overload == "default" else f"{func.name()}.{overload}"


def _tensor_shapes(args: Sequence[Any]) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            shapes.append(tuple(arg.shape))
        elif isinstance(arg, list | tuple):
            shapes += [tuple(a.shape) for a in arg if isinstance(a, torch.Tensor)]
    return shapes


def conv_op_backend(op: str, args: Sequence[Any]) -> str | None:
    """The backend ATen selects for a recorded convolution op's arguments (else ``None``).

    ``aten::convolution``/``_convolution`` take ``(input, weight, bias, stride, padding,
    dilation, transposed, output_padding, groups)``; ``aten::convolution_backward`` takes
    ``(grad_output, input, weight, bias_sizes, stride, ...)``.
    """
    base = op.split(".")[0]
    if base in _FORWARD_CONV_OPS:
        conv_args = list(args[:9])
    elif base in _BACKWARD_CONV_OPS:
        conv_args = [args[1], args[2], None, *args[4:10]]
    else:
        return None
    try:
        return select_backend(*conv_args)
    except (TypeError, ValueError, RuntimeError) as exc:  # unusual arguments: say so, go on
        return f"? ({type(exc).__name__})"


class OpRecorder(TorchDispatchMode):
    """Record the ATen ops run inside ``with OpRecorder() as rec:`` into ``rec.records``.

    Set ``rec.phase`` (``"forward"``, ``"backward"``, ...) to label the records that follow.

    >>> x, w = torch.randn(1, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3)
    >>> with OpRecorder() as rec:
    ...     y = torch.nn.functional.conv2d(x, w)
    >>> [r.op for r in rec.records]
    ['aten::convolution']
    """

    def __init__(self, phase: str = "forward") -> None:
        super().__init__()
        self.phase = phase
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        op = _op_name(func)
        record = OpRecord(op, self.phase, _tensor_shapes(list(args) + list(kwargs.values())))
        record.backend = conv_op_backend(op, args)
        self.records.append(record)
        return func(*args, **kwargs)

    def table(self, skip: Sequence[str] = ("aten::detach",)) -> str:
        """The records as a plain-text table (ops in ``skip`` left out)."""
        return format_records([r for r in self.records if r.op not in skip])


def _fmt_shapes(shapes: list[tuple[int, ...]]) -> str:
    return " ".join("[" + ",".join(map(str, s)) + "]" for s in shapes)


def format_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A left-aligned plain-text table with a rule under the header."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
             for row in [header, ["-" * w for w in widths], *rows]]
    return "\n".join(lines)


def format_records(records: Sequence[OpRecord]) -> str:
    """Records as a table: index, pass, op, backend, tensor argument shapes."""
    rows = [
        [str(i), r.phase, r.op, r.backend or "", _fmt_shapes(r.shapes)]
        for i, r in enumerate(records)
    ]
    return format_rows(["#", "pass", "aten op", "backend", "tensor shapes"], rows)


# --- building one convolution ---------------------------------------------------------------


@dataclass
class ConvSetup:
    """Tensors and arguments of one ``aten::convolution`` call, ready to run."""

    input: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    params: ConvParams

    def args(self) -> tuple[Any, ...]:
        """``(input, weight, bias, stride, padding, dilation, transposed, output_padding,
        groups)`` as ``aten::convolution`` takes them."""
        return (self.input, self.weight, self.bias, *self.params.aten_args())

    def forward(self) -> torch.Tensor:
        """Run the forward through the public functional API (``F.conv*`` / ``conv_transpose*``)."""
        f = torch.nn.functional
        p = self.params
        if p.transposed:
            fn = {1: f.conv_transpose1d, 2: f.conv_transpose2d, 3: f.conv_transpose3d}[p.dim]
            return fn(self.input, self.weight, self.bias, p.stride, p.padding, p.output_padding,
                      p.groups, p.dilation)
        fn = {1: f.conv1d, 2: f.conv2d, 3: f.conv3d}[p.dim]
        return fn(self.input, self.weight, self.bias, p.stride, p.padding, p.dilation, p.groups)


def make_conv(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    bias: bool = True,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    channels_last: bool = False,
) -> ConvSetup:
    """Random leaf tensors (``requires_grad``) for one convolution, validated by ConvParams.

    >>> c = make_conv([2, 4, 8, 8], [6, 2, 3, 3], groups=2)
    >>> list(c.forward().shape)
    [2, 6, 6, 6]
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if len(weight_shape) not in (3, 4, 5):
        raise ValueError(
            f"weight shape must have 3, 4 or 5 dims (a 1-, 2- or 3-d convolution; torch has "
            f"no 4-d one), got {list(weight_shape)}")
    p = ConvParams.create(len(weight_shape) - 2, stride, padding, dilation, transposed,
                          output_padding, groups)
    out_channels = weight_shape[1] * groups if transposed else weight_shape[0]
    p.check_shapes(input_shape, weight_shape, (out_channels,) if bias else None)
    x = torch.randn(*input_shape, dtype=dtype, device=device)
    w = torch.randn(*weight_shape, dtype=dtype, device=device)
    if channels_last:
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(input_shape))
        if fmt is None:
            raise ValueError("channels_last needs a 4-d or 5-d input")
        x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    b = torch.randn(out_channels, dtype=dtype, device=device) if bias else None
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_(True)
    return ConvSetup(x, w, b, p)


def trace_conv(conv: ConvSetup, backend: str | None = None) -> OpRecorder:
    """Record forward then backward (``y.backward(grad)``) of ``conv``, optionally forced.

    Returns the recorder; ``print(rec.table())`` shows the trace.
    """
    with _maybe_backend(backend, conv):
        y = conv.forward()
        grad = torch.randn_like(y)
        with OpRecorder("forward") as rec:
            y = conv.forward()
            rec.phase = "backward"
            y.backward(grad)
    return rec


@contextmanager
def _maybe_backend(backend: str | None, conv: ConvSetup) -> Iterator[None]:
    if backend is None:
        yield
        return
    with use_backend(backend, *conv.args()):
        yield


# --- the profiler view ----------------------------------------------------------------------

# Bookkeeping ops (allocation, views) whose subtrees say nothing about the algorithm.
HIDDEN_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::as_strided",
    "aten::as_strided_", "aten::resize_", "aten::resize_as_", "aten::view", "aten::detach",
    "detach",
    "aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like", "aten::ones_like",
    "aten::randn_like", "aten::normal_", "aten::expand", "aten::slice", "aten::select",
    "aten::t", "aten::transpose", "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze",
    "aten::squeeze", "aten::contiguous", "aten::copy_", "aten::clone", "aten::alias",
    "aten::_unsafe_view", "aten::lift_fresh",
})


def _keep(name: str) -> bool:
    if name in HIDDEN_OPS or "AccumulateGrad" in name:
        return False
    if name.startswith("autograd::engine"):
        return False
    return name.startswith("aten::") or name.endswith(("Backward0", "Backward1"))


def profile_op_tree(fn: Callable[[], object], hide: bool = True) -> list[tuple[int, str]]:
    """Run ``fn`` under ``torch.profiler`` and return its op tree as ``(depth, name)`` rows.

    Kept: ``aten::*`` ops and autograd nodes (``ConvolutionBackward0``); with ``hide``,
    allocation and view ops in ``HIDDEN_OPS`` (and their subtrees) are dropped.
    Depth counts kept ancestors, so ``aten::_convolution`` under ``aten::convolution`` is 1
    deeper.

    >>> x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    >>> rows = profile_op_tree(lambda: torch.nn.functional.conv2d(x, w))
    >>> rows[:3]
    [(0, 'aten::conv2d'), (1, 'aten::convolution'), (2, 'aten::_convolution')]
    """
    from torch.profiler import ProfilerActivity, profile

    with PROFILER_LOCK:  # torch's profiler is not re-entrant: one profile at a time
        prof = profile(activities=[ProfilerActivity.CPU])
        with redirect_fd(2):  # kineto logs profiler start/stop lines to C++ stderr
            prof.__enter__()
        try:
            fn()
        finally:
            with redirect_fd(2):
                prof.__exit__(None, None, None)
    events = sorted(prof.events(), key=lambda e: (e.time_range.start, -e.time_range.end))
    rows: list[tuple[int, str]] = []

    def visit(event: Any, depth: int) -> None:
        name = event.name
        if hide and not _keep(name):
            if name in HIDDEN_OPS or "AccumulateGrad" in name:
                return
            for child in event.cpu_children:  # e.g. autograd::engine::evaluate_function
                visit(child, depth)
            return
        rows.append((depth, name))
        for child in sorted(event.cpu_children, key=lambda e: e.time_range.start):
            visit(child, depth + 1)

    for event in events:
        if event.cpu_parent is None:
            visit(event, 0)
    return rows


def profile_conv(conv: ConvSetup, backend: str | None = None) -> dict[str, list[tuple[int, str]]]:
    """Profiler op trees of ``conv``'s forward and backward: ``{"forward": rows, "backward":
    rows}`` as :func:`profile_op_tree` returns them."""
    with _maybe_backend(backend, conv):
        forward = profile_op_tree(conv.forward)
        y = conv.forward()
        grad = torch.randn_like(y)
        backward = profile_op_tree(lambda: y.backward(grad))
    return {"forward": forward, "backward": backward}


def format_tree(rows: Sequence[tuple[int, str]], indent: str = "  ") -> str:
    """Indented op names, one per line."""
    return "\n".join(f"{indent * depth}{name}" for depth, name in rows)
