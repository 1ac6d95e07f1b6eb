"""Which backend and C++ kernel compute *your* layer's backward, why, and what would change it.

:func:`explain` answers for one layer (shapes, parameters, dtype, memory format, device,
flags, threads) with a frozen :class:`Explanation`: the backend the forward and the backward
select (:mod:`convlab.aten.selection`, cross-checked against ATen's own
``torch._C._select_conv_backend`` when the device is here, without owning the layer's
memory: :func:`aten_check`), the decisive terms, the smallest single change that flips the
choice, the backward kernel (:func:`convlab.aten.kernels.backward_kernel`), the buffers it
allocates (from the shapes) and the autograd node recorded. :func:`format_explanation`
prints it; the command is ``convlab explain`` (:mod:`convlab.cli.explain`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from convlab.aten import selection
from convlab.aten.conv_query import ConvQuery, Environment, Selection
from convlab.aten.kernels import backward_kernel

_GROUP_LOOP = frozenset({"Slow2d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d",
                         "SlowTranspose3d", "NnpackSpatial"})


@dataclass(frozen=True)
class Flip:
    """One change to the layer or the process that makes ATen pick another backend."""

    change: str
    backend: str
    cost: int  # 0 a flag, 1 threads, 2 dtype or layout, 3 batch size, 4 a hyper-parameter

    def line(self) -> str:
        return f"{self.change} -> {self.backend}"


@dataclass(frozen=True)
class Buffer:
    """A work buffer the backward allocates: name, shape, dtype, size in MB (10**6 bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    note: str

    @property
    def megabytes(self) -> float:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size() / 1e6


# Up to this many bytes (input, weight and bias together) the cross-check allocates empty
# tensors of the layer's shapes: the exact tensors a caller passes, at no real cost (never
# filled). Above it, owning the memory could fail on a valid layer (the 64-bit-indexing
# layers the selection has a rule for), so it asks ATen with stand-ins instead.
REAL_TENSOR_BYTES = 2**28

_FORMATS = {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d}


@dataclass(frozen=True)
class AtenCheck:
    """ATen's own ``_select_conv_backend`` on the layer: its answer (``None`` when not
    asked) and how it was asked, or why not."""

    backend: str | None
    how: str


@dataclass(frozen=True)
class Explanation:
    """Everything :func:`explain` found for one layer."""

    query: ConvQuery
    env: Environment
    forward: Selection
    backward: Selection
    aten: AtenCheck  # ATen's own answer for the forward, and how it was asked
    flips: tuple[Flip, ...]
    kernel: str
    kernel_checked: bool
    buffers: tuple[Buffer, ...]
    autograd_node: str
    kernel_trace: str | None = None


def _backward_query(q: ConvQuery) -> ConvQuery:
    return replace(q, requires_grad=True)  # convolution_backward selects with need_backward


def _layer_bytes(q: ConvQuery) -> int:
    p, size = q.params, torch.empty((), dtype=q.dtype).element_size()
    out = q.weight_shape[1] * p.groups if p.transposed else q.weight_shape[0]
    return size * (math.prod(q.input_shape) + math.prod(q.weight_shape) + out * q.bias)


def _aten_tensors(q: ConvQuery, stand_in: bool) -> tuple[torch.Tensor, ...]:
    """Input, weight (and bias) of the layer: empty tensors in its memory formats, or
    stand-ins: one element expanded to each shape (zero strides, no memory)."""
    p, kw = q.params, dict(dtype=q.dtype, device=q.device)
    out = q.weight_shape[1] * p.groups if p.transposed else q.weight_shape[0]
    shapes = [q.input_shape, q.weight_shape] + ([(out,)] if q.bias else [])
    fmts = [q.input_format, q.weight_format, "contiguous"]
    made = [torch.empty((), **kw).expand(shape) if stand_in else
            torch.empty(shape, memory_format=_FORMATS.get(fmt, torch.contiguous_format), **kw)
            for shape, fmt in zip(shapes, fmts, strict=False)]
    made[0].requires_grad_(q.requires_grad)
    return tuple(made)


def aten_check(q: ConvQuery, env: Environment) -> AtenCheck:
    """Ask ATen's ``_select_conv_backend`` for the forward's backend, without owning the
    layer's memory.

    A layer over ``REAL_TENSOR_BYTES`` is asked with zero-stride stand-ins: the CPU
    selection reads sizes, dtype, device, layout and flags, and a stand-in suggests the
    contiguous format, as the real tensor does. Not for a channels_last layer (no
    stand-in suggests it), a 1-d one (ATen copies it with ``contiguous()`` first) or a GPU
    (``canUse32BitIndexMath`` reads strides): those are skipped, saying why.
    """
    from convlab.aten.backends import backend_name

    if q.device != "cpu" and not (q.device == "cuda" and torch.cuda.is_available()):
        return AtenCheck(None, f"from the rule, from source, not run: no {q.device} device "
                         "here")
    if env != Environment.current():  # a hypothetical environment: only the rule answers
        return AtenCheck(None, "this machine's rules, with the flags given")
    size = _layer_bytes(q)
    stand_in = size > REAL_TENSOR_BYTES
    if stand_in:
        why = ("GPU" if q.device != "cpu" else "1-d" if q.params.dim == 1
               else "channels_last" if {q.input_format, q.weight_format} != {"contiguous"}
               else None)
        if why is not None:
            return AtenCheck(None, f"this machine's rules; ATen not asked: a {size / 2**30:.1f}"
                             f" GiB {why} layer needs its memory")
    try:
        x, w, *b = _aten_tensors(q, stand_in)
        backend = backend_name(torch._C._select_conv_backend(x, w, b[0] if b else None,
                                                             *q.params.aten_args()))
    except RuntimeError as err:  # shown next to the rule's answer, not raised
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return AtenCheck(None, f"this machine's rules; ATen raised: {first}")
    return AtenCheck(backend, "on zero-stride stand-ins" if stand_in else "on empty tensors")


def _with_shape(q: ConvQuery, n: int | None = None, groups: int | None = None,
                **params: object) -> ConvQuery | None:
    shape, wshape, p = list(q.input_shape), list(q.weight_shape), q.params
    if n is not None:
        shape[0] = n
    if groups is not None:  # a normal conv's weight [C_out, C_in / groups, *k]
        wshape[1] *= p.groups // groups
        params["groups"] = groups
    try:
        new_p = replace(p, **params)
        new_p._check_values()
        new_p.check_shapes(shape, wshape)
    except ValueError:
        return None
    return replace(q, input_shape=tuple(shape), weight_shape=tuple(wshape), params=new_p)


def _candidates(q: ConvQuery, env: Environment) -> list[tuple[str, int, ConvQuery, Environment]]:
    """Single changes, cheapest first: flags, threads, dtype, layout, batch, parameters."""
    out: list[tuple[str, int, ConvQuery, Environment]] = []
    on_off = {True: "off", False: "on"}
    out.append((f"torch.backends.mkldnn.enabled {on_off[env.mkldnn_enabled]}", 0, q,
                replace(env, mkldnn_enabled=not env.mkldnn_enabled)))
    out.append((f"torch.backends.nnpack {on_off[env.nnpack_enabled]}", 0, q,
                replace(env, nnpack_enabled=not env.nnpack_enabled)))
    if q.device in ("cuda", "hip"):
        out.append((f"torch.backends.cudnn.enabled {on_off[env.cudnn_enabled]}", 0, q,
                    replace(env, cudnn_enabled=not env.cudnn_enabled)))
    threads = 2 if env.threads == 1 else 1
    out.append((f"torch.set_num_threads({threads}) instead of {env.threads}", 1, q,
                replace(env, threads=threads)))
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        if dt != q.dtype:
            name = str(dt).removeprefix("torch.")
            was = str(q.dtype).removeprefix("torch.")
            out.append((f"{name} instead of {was}", 2, replace(q, dtype=dt), env))
    if len(q.input_shape) in (4, 5):
        cl = "channels_last" if len(q.input_shape) == 4 else "channels_last_3d"
        fmt = "contiguous" if q.input_format == cl else cl
        out.append((f"{fmt} input and weight", 2,
                    replace(q, input_format=fmt, weight_format=fmt), env))
    n = q.input_shape[0]
    for new_n in sorted({1, 2, 15, 16, 17, n - 1, n + 1} - {n}, key=lambda m: (abs(m - n), m)):
        changed = _with_shape(q, n=new_n) if new_n >= 1 else None
        if changed is not None:
            out.append((f"batch {new_n} instead of {n}", 3, changed, env))
    p = q.params
    for label, kw in (("stride 1", {"stride": (1,) * p.dim}),
                      ("dilation 1", {"dilation": (1,) * p.dim}),
                      ("no output_padding", {"output_padding": (0,) * p.dim})):
        if tuple(kw.values())[0] != getattr(p, next(iter(kw))):
            changed = _with_shape(q, **kw)
            if changed is not None:
                out.append((label + " instead of " + str(getattr(p, next(iter(kw)))), 4,
                            changed, env))
    if p.groups > 1 and not p.transposed:
        changed = _with_shape(q, groups=1)
        if changed is not None:
            out.append((f"groups 1 instead of {p.groups}", 4, changed, env))
    return out


def flips(q: ConvQuery, env: Environment, backend: str) -> tuple[Flip, ...]:
    """Every single change of ``_candidates`` that selects another backend."""
    found = []
    for label, cost, q2, env2 in _candidates(q, env):
        try:
            other = selection.select(q2, env2).backend
        except ValueError:
            continue
        if other != backend:
            found.append(Flip(label, other, cost))
    return tuple(found)


def buffers(q: ConvQuery, backend: str) -> tuple[Buffer, ...]:
    """Work buffers the backward allocates for ``backend`` (from the shapes).

    Slow2d/Slow3d: grad_weight's im2col/vol2col columns for the whole batch
    ``[N, C_in/g * prod(kernel), prod(out)]`` (Slow2d measured with the profiler in
    ``tests/test_explain.py``; Slow3d from ConvolutionMM3d.cpp). Backends without groups
    support copy each group's slices (``narrow(...).contiguous()``).
    """
    p = q.params
    shape, wshape = q.input_shape, q.weight_shape
    if backend in ("Empty", "MkldnnEmpty"):
        return ()
    out_spatial = tuple(p.output_shape(shape, wshape)[2:])
    c_in_g = shape[1] // p.groups
    found: list[Buffer] = []
    if backend in ("Slow2d", "Slow3d"):
        rows = c_in_g * math.prod(wshape[2:])
        found.append(Buffer("columns", (shape[0], rows, math.prod(out_spatial)), q.dtype,
                            "grad_weight's im2col of the whole batch"))
    if backend in _GROUP_LOOP and p.groups > 1:
        found.append(Buffer("per-group input copies", tuple(shape), q.dtype,
                            "narrow(...).contiguous() of each group, then cat"))
    return tuple(found)


def autograd_node(q: ConvQuery) -> str:
    """The node ``F.conv*`` records (through ``aten::convolution``), read live from a
    one-element convolution of the same rank and kind: the node does not depend on sizes,
    and a tiny CPU call is faster than loading the meta kernels."""
    if not q.dtype.is_floating_point:
        return "none (integer tensors cannot require grad)"
    return _node_name(q.params.dim, q.params.transposed)


@functools.cache
def _node_name(dim: int, transposed: bool) -> str:
    x = torch.zeros((1, 1) + (1,) * dim, requires_grad=True)
    w = torch.zeros((1, 1) + (1,) * dim)
    y = torch.ops.aten.convolution(x, w, None, [1] * dim, [0] * dim, [1] * dim, transposed,
                                   [0] * dim, 1)
    return y.grad_fn.name()


def explain(query: ConvQuery, env: Environment | None = None,
            kernels: bool = False) -> Explanation:
    """Explain the backend choice for ``query`` (see the module docstring).

    ``env`` defaults to this process's state (for a device not here,
    ``Environment.typical()``). With ``kernels``, the backward is traced under gdb
    (:func:`convlab.aten.kernels.trace_kernels`; CPU only, a few seconds).

    >>> q = ConvQuery.create([1, 3, 8, 8], [4, 3, 3, 3], dtype=torch.float64)
    >>> explain(q).backward.backend
    'Slow2d'
    """
    if not isinstance(query, ConvQuery):
        raise TypeError(f"query must be a ConvQuery, got {type(query).__name__}")
    here = query.device == "cpu" or (query.device == "cuda" and torch.cuda.is_available())
    if env is None:
        env = Environment.current() if here else Environment.typical(query.device)
    forward = selection.select(query, env)
    backward = selection.select(_backward_query(query), env)
    kernel, checked = backward_kernel(backward.backend, query.device)
    trace = _trace(query, env) if kernels else None
    return Explanation(query, env, forward, backward, aten_check(query, env),
                       flips(query, env, forward.backend), kernel, checked,
                       buffers(query, backward.backend), autograd_node(query), trace)


def _trace(q: ConvQuery, env: Environment) -> str:
    from convlab.aten.kernels import ConvCase, trace_kernels

    p = q.params
    if q.device != "cpu":
        raise ValueError("kernels=True traces CPU layers only")
    if len(q.input_shape) not in (4, 5):
        raise ValueError("kernels=True traces 2-d and 3-d convolutions only")
    if env != Environment.current():
        raise ValueError("kernels=True traces this process's flags only")
    for name in ("stride", "padding", "dilation", "output_padding"):
        if len(set(getattr(p, name))) != 1:
            raise ValueError(f"kernels=True takes one value for {name}, got {getattr(p, name)}")
    disable = tuple(f for f, on in (("mkldnn", env.mkldnn_enabled),
                                    ("nnpack", env.nnpack_enabled)) if not on)
    case = ConvCase("explain", q.input_shape, q.weight_shape,
                    str(q.dtype).removeprefix("torch."), p.stride[0], p.padding[0],
                    p.dilation[0], p.transposed, p.groups, q.bias, disable,
                    p.output_padding[0], q.input_format != "contiguous")
    (traced,) = trace_kernels([case])
    return traced.path


def format_explanation(e: Explanation) -> str:
    """The explanation as the text ``convlab explain`` prints."""
    q, p = e.query, e.query.params
    kind = "conv_transpose" if p.transposed else "conv"
    lines = [f"{kind}{p.dim}d  input {list(q.input_shape)}  weight {list(q.weight_shape)}  "
             f"{str(q.dtype).removeprefix('torch.')}  {q.device}  {q.input_format}",
             f"  stride {p.stride}  padding {p.padding}  dilation {p.dilation}  groups "
             f"{p.groups}" + (f"  output_padding {p.output_padding}" if p.transposed else ""),
             f"  threads {e.env.threads}  mkldnn {e.env.mkldnn_enabled}  nnpack "
             f"{e.env.nnpack_enabled}"]
    where = e.aten.how
    if e.aten.backend is not None:
        agree = "agrees" if e.aten.backend == e.forward.backend else f"says {e.aten.backend}"
        where = f"this machine; ATen's own _select_conv_backend {agree} {e.aten.how}"
    lines += [f"forward backend:  {e.forward.backend}  ({where})",
              f"backward backend: {e.backward.backend}  (convolution_backward selects again, "
              "need_backward=true)",
              f"memory format:    {e.backward.memory_format}", "why (decision path):"]
    lines += ["  " + t.line() for t in e.backward.path]
    lines.append("smallest change that flips it:")
    ranked = sorted(e.flips, key=lambda f: f.cost)
    lines += [f"  {f.line()}" for f in ranked[:5]] or ["  none of the single changes tried"]
    source = "traced on this build (tests/test_kernels.py)" if e.kernel_checked else \
        "from source, not run"
    lines.append(f"backward kernel:  {e.kernel}  ({source})")
    if e.kernel_trace is not None:
        lines.append(f"  traced now: {e.kernel_trace}")
    lines.append("buffers:" if e.buffers else "buffers:  no work buffer of its own "
                 "(oneDNN: implicit GEMM, no columns; its reorders are not counted)")
    for b in e.buffers:
        lines.append(f"  {b.name} {list(b.shape)} {str(b.dtype).removeprefix('torch.')}: "
                     f"{b.megabytes:.1f} MB ({b.note})")
    lines.append(f"autograd node:    {e.autograd_node}")
    return "\n".join(lines)
