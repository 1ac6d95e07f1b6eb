"""ATen's convolution backend selection, written out as a rule table.

:func:`select` mirrors ``select_conv_backend`` / ``_select_conv_backend`` and the
``ConvParams`` predicates they call (``use_cudnn``, ``use_mkldnn``, ``use_nnpack``, ...) for
every device type, and returns the backend together with its *decision path*: every term
evaluated, in order, with the values that decided it. :func:`backend_memory_format` mirrors
``determine_backend_memory_format``.

Sources, named in each term's ``source``:

* ``Convolution.cpp`` is ``aten/src/ATen/native/Convolution.cpp``. The 2.13 tag's copy is
  not among the stored sources; the terms follow the nearest stored versions (pytorch/pytorch
  at 954cecd, and a mid-2026 main in the cyyever/pytorch fork at 021c4c1) and, on the CPU, the
  installed binary: ``tests/test_selection.py`` compares :func:`select` with
  ``torch._C._select_conv_backend`` over a grid of thousands of configurations.
* ``ConvUtils.h`` is ``aten/src/ATen/native/ConvUtils.h`` as shipped in the installed wheel
  (``torch/include``), i.e. exactly 2.13.

The CUDA, ROCm (MIOpen) and MPS terms are **from source, not run**: no GPU here.
``Selection.checked_here`` says which kind an answer is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from convlab.aten.conv_query import ConvQuery, Environment, Selection, Term
from convlab.scratch.params import ConvParams

CC = "Convolution.cpp"
CU = "ConvUtils.h"
INT_MAX = 2**31 - 1


@dataclass
class _Ctx:
    """A query after ATen's 1-d -> 2-d view, plus the environment and the recorded terms."""

    q: ConvQuery
    env: Environment
    shape: tuple[int, ...]
    wshape: tuple[int, ...]
    p: ConvParams
    input_format: str
    weight_format: str
    terms: list[Term] = field(default_factory=list)
    depth: int = 0

    def term(self, name: str, value: bool, detail: str, source: str = CC) -> bool:
        self.terms.append(Term(name, bool(value), detail, source, self.depth))
        return bool(value)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_cuda(self) -> bool:  # a ROCm build reports its GPUs as CUDA devices
        return self.q.device in ("cuda", "hip")

    @property
    def is_cpu(self) -> bool:
        return self.q.device == "cpu"

    def strided(self) -> bool:
        return any(s != 1 for s in self.p.stride)

    def dilated(self) -> bool:
        return any(d != 1 for d in self.p.dilation)

    def output_padding_big(self) -> bool:  # ConvParams::is_output_padding_big
        return any(o >= s for o, s in zip(self.p.output_padding, self.p.stride, strict=True))


def check_shape_forward(q: ConvQuery) -> None:
    """``check_shape_forward`` (Convolution.cpp), run before selection: ValueError where ATen
    raises (ranks, groups, channels, bias length, kernel larger than the padded input)."""
    p, shape, wshape = q.params, q.input_shape, q.weight_shape
    if len(shape) != len(wshape):
        raise ValueError(f"expected a {len(wshape)}-d input for a {len(wshape)}-d weight "
                         f"{list(wshape)}, got input of shape {list(shape)}")
    if wshape[0] < p.groups or wshape[0] % p.groups:
        raise ValueError(f"groups={p.groups}: weight.shape[0]={wshape[0]} must be a multiple")
    if p.transposed:
        if shape[1] != wshape[0]:
            raise ValueError(f"transposed: input has {shape[1]} channels, weight expects "
                             f"{wshape[0]}")
        return
    if shape[1] != wshape[1] * p.groups:
        raise ValueError(f"input has {shape[1]} channels, weight {list(wshape)} with groups="
                         f"{p.groups} expects {wshape[1] * p.groups}")
    for i, k, pad, d in zip(shape[2:], wshape[2:], p.padding, p.dilation, strict=True):
        if i + 2 * pad < d * (k - 1) + 1:
            raise ValueError(f"kernel extent {d * (k - 1) + 1} is larger than the padded "
                             f"input size {i + 2 * pad}")


def _view1d_as_2d(q: ConvQuery, env: Environment) -> _Ctx:
    """``select_conv_backend``: a 1-d conv (3-d weight) becomes 2-d with a unit height, the
    input made contiguous, unless the input is an mkldnn or XPU tensor."""
    shape, wshape, p = q.input_shape, q.weight_shape, q.params
    ifmt, wfmt = q.input_format, q.weight_format
    if len(wshape) == 3 and not q.is_mkldnn and q.device != "xpu":
        shape = (shape[0], shape[1], 1, shape[2])
        wshape = (wshape[0], wshape[1], 1, wshape[2])
        p = replace(p, stride=(1, *p.stride), padding=(0, *p.padding),
                    dilation=(1, *p.dilation), output_padding=(0, *p.output_padding))
        ifmt = wfmt = "contiguous"  # contiguous() then unsqueeze(2): NCHW strides
    return _Ctx(q, env, shape, wshape, p, ifmt, wfmt)


# --- the predicates (ConvParams members in Convolution.cpp) ---------------------------------


def is_depthwise(c: _Ctx) -> bool:
    """``ConvParams::is_depthwise``: CUDA, not transposed, 4-/5-d, C_in == groups > 1,
    C_out a multiple of C_in (a depthwise multiplier is allowed, despite the comment)."""
    n_in, g = c.shape[1], c.p.groups
    return c.term("is_depthwise",
                  c.is_cuda and not c.p.transposed and c.ndim in (4, 5) and n_in == g and g > 1
                  and c.wshape[0] % n_in == 0,
                  f"device={c.q.device}, transposed={c.p.transposed}, ndim={c.ndim}, "
                  f"C_in={n_in}, groups={g}, C_out={c.wshape[0]}")


def _cudnn_format(c: _Ctx) -> str:
    """``cudnn_conv_suggest_memory_format`` (ConvUtils.h): channels-last if either tensor
    is, for a cuDNN build and a dtype other than float64."""
    if not c.env.cudnn_compiled or c.q.dtype == torch.float64:
        return "contiguous"
    want = {4: "channels_last", 5: "channels_last_3d"}.get(len(c.wshape))
    return want if want in (c.input_format, c.weight_format) else "contiguous"


def _out_spatial(c: _Ctx) -> list[int]:
    p = c.p
    if p.transposed:
        return [(i - 1) * s - 2 * pd + d * (k - 1) + op + 1 for i, k, s, pd, d, op in zip(
            c.shape[2:], c.wshape[2:], p.stride, p.padding, p.dilation, p.output_padding,
            strict=True)]
    return [(i + 2 * pd - d * (k - 1) - 1) // s + 1 for i, k, s, pd, d in zip(
        c.shape[2:], c.wshape[2:], p.stride, p.padding, p.dilation, strict=True)]


def needs_64bit_indexing_no_split(c: _Ctx) -> bool:
    """``ConvParams::needs_64bit_indexing_no_split``: one sample of the input or the output
    has more than INT_MAX elements (splitting the batch cannot help)."""
    numel = math.prod(c.shape)
    if numel == 0:
        return False
    out_c = c.wshape[1] * c.p.groups if c.p.transposed else c.wshape[0]
    out = out_c * math.prod(_out_spatial(c))
    return c.term("needs_64bit_indexing_no_split", numel // c.shape[0] > INT_MAX or out > INT_MAX,
                  f"per-sample input {numel // c.shape[0]}, output {out}, INT_MAX {INT_MAX}")


def use_cudnn(c: _Ctx) -> bool:
    """``ConvParams::use_cudnn`` (from source, not run)."""
    c.depth += 1
    try:
        env = c.env
        if not c.term("compiledWithCuDNN && is_cuda && cudnn_enabled",
                      env.cudnn_compiled and c.is_cuda and env.cudnn_enabled,
                      f"cuDNN build={env.cudnn_compiled}, device={c.q.device}, "
                      f"torch.backends.cudnn.enabled={env.cudnn_enabled}"):
            return False
        if needs_64bit_indexing_no_split(c) and not c.term(
                "cudnn >= 9.3 && v8 API", env.cudnn_version >= 90300 and env.cudnn_v8_api,
                f"cuDNN {env.cudnn_version}, v8 API={env.cudnn_v8_api}"):
            return False
        if c.q.dtype == torch.bfloat16 and not c.term(
                "supportsBFloat16ConvolutionWithCuDNNv8", env.cuda_bf16_conv and env.cudnn_v8_api,
                "bf16 needs compute capability >= 8.0 and the v8 API"):
            return False
        if _cudnn_format(c) == "contiguous" and c.dilated():
            c.term("supportsDilatedConvolutionWithCuDNN", True, "NCHW dilated: cuDNN >= 6")
        return not c.term("is_output_padding_big", c.output_padding_big(),
                          f"output_padding={c.p.output_padding} >= stride={c.p.stride}")
    finally:
        c.depth -= 1


def use_cudnn_depthwise(c: _Ctx) -> bool:
    """``ConvParams::use_cudnn_depthwise`` (from source, not run; main adds the
    64-bit-index case of #153101 and the depthwise_kernel flag of #176500)."""
    c.depth += 1
    try:
        env = c.env
        if not c.term("cudnn_enabled && compiledWithCuDNN && is_cuda",
                      env.cudnn_enabled and env.cudnn_compiled and c.is_cuda,
                      f"cuDNN build={env.cudnn_compiled}, device={c.q.device}"):
            return False
        big = max(math.prod(c.shape), math.prod(c.wshape)) > INT_MAX
        if c.term("!canUse32BitIndexMath(input, weight)", big, "an operand over INT_MAX elements"):
            if _cudnn_format(c) != "contiguous" and (
                    env.cudnn_version < 0 or 91000 < env.cudnn_version < 91500):
                return c.term("cuDNN 9.10-9.14 channels-last 64-bit", False, "known broken")
            return c.term("cudnn >= 9.3 && v8 API", env.cudnn_version >= 90300
                          and env.cudnn_v8_api, f"cuDNN {env.cudnn_version}")
        if c.term("channels_last", _cudnn_format(c) != "contiguous",
                  f"cudnn_conv_suggest_memory_format = {_cudnn_format(c)}", CU):
            return True
        half = c.q.dtype == torch.float16
        square = c.p.stride[0] == c.p.stride[1] or c.shape[2] == 1
        cond = c.term("fp16 && 4-d && !dilated && square stride && C >= 32",
                      half and c.ndim == 4 and not c.dilated() and square and c.shape[1] >= 32,
                      f"dtype={c.q.dtype}, ndim={c.ndim}, stride={c.p.stride}, C={c.shape[1]}")
        if not cond or not use_cudnn(c):
            return False
        if env.depthwise_kernel != "auto":
            return c.term("cudnnDepthwiseKernel", env.depthwise_kernel == "cudnn",
                          f"torch.backends.cudnn depthwise_kernel={env.depthwise_kernel!r}")
        return c.term("check_cudnn_depthwise_workload_with_filter", _workload(c),
                      f"N={c.shape[0]}, C={c.shape[1]}, W={c.shape[3]}, kernel={c.wshape[2:]}")
    finally:
        c.depth -= 1


def _workload(c: _Ctx) -> bool:
    """``check_cudnn_depthwise_workload_with_filter`` (cuDNN >= 8.2 heuristic)."""
    n, ch, h, w = c.shape
    stride = c.p.stride[1]
    if h == 1 and stride == 1:
        return True
    if c.wshape[2] != c.wshape[3] or c.wshape[3] not in (1, 3, 5) or w < 7:
        return False
    f = c.wshape[3]
    if stride == 1:
        return True
    if stride != 2:
        return False
    if n == 1:
        return (f == 1 and w <= 28) or f in (3, 5)
    if f == 1 and n <= 16 and ch >= 128 and w <= 7:
        return True
    return f in (3, 5) and (ch >= 512 or (ch >= 256 and w >= 28))


def use_miopen(c: _Ctx) -> bool:
    """``ConvParams::use_miopen`` (from source, not run)."""
    env = c.env
    ok_dtype = c.q.dtype in (torch.float32, torch.float16, torch.bfloat16)
    return c.term("use_miopen",
                  ok_dtype and env.cudnn_enabled and c.is_cuda and env.miopen_compiled
                  and c.ndim <= 5 and not (c.p.groups > 1 and c.dilated()),
                  f"dtype={c.q.dtype}, MIOpen build={env.miopen_compiled}, "
                  f"device={c.q.device}, groups={c.p.groups}, dilated={c.dilated()}")


def use_mkldnn(c: _Ctx) -> bool:
    """``ConvParams::use_mkldnn``: oneDNN on CPU. bf16/fp16 go to oneDNN whenever the CPU
    passes ``mkldnn_{bf16,fp16}_device_check`` (so not "only on CPU Float Tensors", as the
    C++ comment says); float32 unless a small single-threaded 1x1 or a tiny single-sample
    ungrouped layer. The size term multiplies ``size(0..3)`` only: for a 3-d convolution
    the last spatial dim is not counted."""
    c.depth += 1
    try:
        env, q = c.env, c.q
        if not c.term("AT_MKLDNN_ENABLED && userEnabledMkldnn",
                      env.mkldnn_compiled and env.mkldnn_enabled,
                      f"torch.backends.mkldnn.enabled={env.mkldnn_enabled}"):
            return False
        if c.p.transposed and c.term("transposed && is_output_padding_big",
                                     c.output_padding_big(),
                                     f"output_padding={c.p.output_padding}, "
                                     f"stride={c.p.stride}"):
            return False
        if c.is_cpu and q.dtype in (torch.bfloat16, torch.float16):
            check = env.mkldnn_bf16 if q.dtype == torch.bfloat16 else env.mkldnn_fp16
            name = "bf16" if q.dtype == torch.bfloat16 else "fp16"
            if c.term(f"mkldnn_{name}_device_check", check,
                      f"dtype={q.dtype}; this CPU's ISA "
                      f"{'passes' if check else 'fails'} it"):
                return True
        if q.is_mkldnn:
            return c.term("input.is_mkldnn", True, "an mkldnn-layout input")
        if not c.term("cpu && float32", c.is_cpu and q.dtype == torch.float32,
                      f"device={q.device}, dtype={q.dtype}"):
            return False
        n, kw, kh = c.shape[0], c.wshape[-1], c.wshape[-2]
        first = c.term(
            "strided || dilated || N >= 16 || kernel != 1x1 || threads > 1",
            c.strided() or c.dilated() or n >= 16 or kw != 1 or kh != 1 or env.threads > 1,
            f"stride={c.p.stride}, dilation={c.p.dilation}, N={n}, kernel={kh}x{kw}, "
            f"threads={env.threads}")
        if not first:
            return False
        nchw = math.prod(c.shape[:4])  # N*C*size(2)*size(3), also for a 5-d input
        return c.term(
            "groups > 1 || kernel > 3x3 || N > 1 || N*C*H*W > 20480",
            c.p.groups > 1 or (kw > 3 and kh > 3) or n > 1 or nchw > 20480,
            f"groups={c.p.groups}, kernel={kh}x{kw}, N={n}, N*C*H*W={nchw}")
    finally:
        c.depth -= 1


def use_nnpack(c: _Ctx) -> bool:
    """``ConvParams::use_nnpack``: NNPACK forward (built, enabled, float32 CPU, 4-d, not
    dilated or transposed, kernel <= 16, padding < kernel, N >= 16 off mobile). The memory
    format is not checked, despite the "must be in NCHW format" comment: a channels_last
    input selects NNPACK too."""
    env, p = c.env, c.p
    ok = (env.nnpack_enabled and env.nnpack_available and c.is_cpu
          and c.q.dtype == torch.float32 and not c.dilated() and not p.transposed
          and c.ndim == 4 and c.wshape[2] < 17 and c.wshape[3] < 17
          and p.padding[0] < c.wshape[2] and p.padding[1] < c.wshape[3] and c.shape[0] >= 16)
    return c.term("use_nnpack", ok,
                  f"nnpack enabled={env.nnpack_enabled}, available={env.nnpack_available}, "
                  f"dtype={c.q.dtype}, kernel={c.wshape[2:]}, padding={p.padding}, "
                  f"N={c.shape[0]} (>= 16)")


def use_mps(c: _Ctx) -> bool:
    """``ConvParams::use_mps`` (from source, not run)."""
    if not (c.env.mps_built and c.q.device == "mps"):
        return c.term("use_mps", False, f"MPS build={c.env.mps_built}, device={c.q.device}")
    big = needs_64bit_indexing_no_split(c)
    return c.term("use_mps", not big or (c.ndim == 5 and not c.p.transposed),
                  "64-bit indexing only for 3-d forward")


# --- the rule table: first match wins (_select_conv_backend) --------------------------------


def _empty(c: _Ctx) -> bool:
    n, ch = c.shape[0], c.shape[1]
    if c.term("size(0) == 0 || size(1) == 0", n == 0 or ch == 0, f"N={n}, C={ch}"):
        return True
    if math.prod(c.shape) == 0:
        raise ValueError("only zero batch or zero channel inputs are supported, got input "
                         f"shape {list(c.q.input_shape)}")
    return False


def _depthwise_backend(c: _Ctx) -> str:
    c.depth += 1
    try:
        if use_cudnn_depthwise(c):
            return "Cudnn"
        if use_miopen(c):
            return "MiopenDepthwise"
        return "CudaDepthwise2d" if c.ndim == 4 else "CudaDepthwise3d"
    finally:
        c.depth -= 1


def _slow_backend(c: _Ctx) -> str:
    """The "backends without support for groups" block (ATen's own kernels, and NNPACK).
    Another rank than 4 or 5 (a 1-d mkldnn-layout input, not viewed as 2-d) reaches ATen's
    closing "unsupported ConvNd parameters"."""
    if c.ndim not in (4, 5):
        raise ValueError(f"unsupported ConvNd parameters: ATen's own kernels take a 4-d or 5-d"
                         f" input, got {c.ndim}-d (an mkldnn-layout 1-d input needs oneDNN on)")
    if c.p.transposed:
        return {4: "SlowTranspose2d", 5: "SlowTranspose3d"}[c.ndim]
    if c.ndim == 5:  # a CPU non-dilated one was taken by the Slow3d rule (dead branch in C++)
        return "SlowDilated3d" if c.is_cuda or c.dilated() else "Slow3d"
    c.depth += 1
    try:
        if c.term("is_dilated", c.dilated(), f"dilation={c.p.dilation}"):
            return "SlowDilated2d"
        return "NnpackSpatial" if use_nnpack(c) else "Slow2d"
    finally:
        c.depth -= 1


@dataclass(frozen=True)
class Rule:
    """One row of ``_select_conv_backend``: a named test, the backend(s) it leads to."""

    name: str
    source: str
    leads_to: str
    test: Callable[[_Ctx], bool]
    choose: Callable[[_Ctx], str]


def _rec(name: str, fn: Callable[[_Ctx], bool], source: str = CC) -> Callable[[_Ctx], bool]:
    """Record a predicate's value as a top-level term, before its sub-terms."""
    def test(c: _Ctx) -> bool:  # fn records its own sub-terms one level deeper
        start = len(c.terms)
        value = fn(c)
        c.terms.insert(start, Term(name, bool(value), "see the terms below", source, c.depth))
        return value
    return test


def _need_backward(c: _Ctx) -> bool:
    return c.env.grad_enabled and c.q.requires_grad


RULES: tuple[Rule, ...] = (
    Rule("empty input", "_select_conv_backend", "Empty / MkldnnEmpty", _empty,
         lambda c: "MkldnnEmpty" if c.q.is_mkldnn else "Empty"),
    Rule("is_depthwise", "ConvParams::is_depthwise",
         "Cudnn / MiopenDepthwise / CudaDepthwise2d / CudaDepthwise3d", is_depthwise,
         _depthwise_backend),
    Rule("use_cudnn", "ConvParams::use_cudnn", "Cudnn / CudnnTranspose",
         _rec("use_cudnn", use_cudnn), lambda c: "CudnnTranspose" if c.p.transposed else "Cudnn"),
    Rule("use_miopen", "ConvParams::use_miopen", "Miopen / MiopenTranspose", use_miopen,
         lambda c: "MiopenTranspose" if c.p.transposed else "Miopen"),
    Rule("use_mkldnn", "ConvParams::use_mkldnn", "Mkldnn / MkldnnTranspose",
         _rec("use_mkldnn", use_mkldnn),
         lambda c: "MkldnnTranspose" if c.p.transposed else "Mkldnn"),
    Rule("!need_backward && use_xnnpack", "ConvParams::use_xnnpack (false off mobile)",
         "Xnnpack2d",
         lambda c: c.term("!need_backward && use_xnnpack", False,
                          f"need_backward={_need_backward(c)}; use_xnnpack is false in "
                          "this build"), lambda c: "Xnnpack2d"),
    Rule("!need_backward && use_cpu_depthwise3x3_winograd",
         "ConvParams::use_cpu_depthwise3x3_winograd (ARM NEON / RISC-V V only)",
         "Winograd3x3Depthwise",
         lambda c: c.term("!need_backward && use_cpu_depthwise3x3_winograd", False,
                          f"need_backward={_need_backward(c)}; false on x86"),
         lambda c: "Winograd3x3Depthwise"),
    Rule("cpu && 5-d && !transposed && !dilated", "_select_conv_backend", "Slow3d",
         lambda c: c.term("cpu && 5-d && !transposed && !dilated",
                          c.is_cpu and c.ndim == 5 and not c.p.transposed and not c.dilated(),
                          f"device={c.q.device}, ndim={c.ndim}, transposed={c.p.transposed}, "
                          f"dilation={c.p.dilation}"), lambda c: "Slow3d"),
    Rule("cpu || cuda", "_select_conv_backend",
         "SlowTranspose2d/3d / SlowDilated2d / NnpackSpatial / Slow2d / SlowDilated3d",
         lambda c: c.term("cpu || cuda", c.is_cpu or c.is_cuda, f"device={c.q.device}"),
         _slow_backend),
    Rule("use_mps", "ConvParams::use_mps", "Mps / MpsTranspose", use_mps,
         lambda c: "MpsTranspose" if c.p.transposed else "Mps"),
    Rule("otherwise", "_select_conv_backend", "Overrideable",
         lambda c: c.term("otherwise", True, f"device={c.q.device}: XPU, meta, PrivateUse1..."),
         lambda c: "Overrideable"),
)


def select(query: ConvQuery, env: Environment | None = None) -> Selection:
    """The backend ATen's ``select_conv_backend`` picks for ``query`` and the decision path.

    ``env`` defaults to this process's state (for a device that is not here:
    ``Environment.typical()``). Raises ValueError where ATen raises (an input with zero
    elements that is not an empty batch or channel dim).

    >>> q = ConvQuery.create([1, 3, 8, 8], [4, 3, 3, 3], dtype=torch.float64)
    >>> select(q).backend
    'Slow2d'
    """
    if not isinstance(query, ConvQuery):
        raise TypeError(f"query must be a ConvQuery, got {type(query).__name__}")
    here = query.device == "cpu" or (query.device == "cuda" and torch.cuda.is_available())
    if env is None:
        env = Environment.current() if here else Environment.typical(query.device)
    check_shape_forward(query)
    c = _view1d_as_2d(query, env)
    for rule in RULES:
        if rule.test(c):
            backend = rule.choose(c)
            return Selection(backend, tuple(c.terms), backend_memory_format(query, backend),
                             query.device, here)
    raise AssertionError("the last rule always matches")  # pragma: no cover


def backend_memory_format(query: ConvQuery, backend: str) -> str:
    """``determine_backend_memory_format`` (Convolution.cpp) with ConvUtils.h's
    ``*_conv_use_channels_last`` / ``*_suggest_memory_format`` rules, for the tensors
    ``_convolution`` passes (a 1-d conv is already viewed as 2-d and contiguous)."""
    q = query
    k = len(q.weight_shape)
    if k == 3:  # viewed as 2-d and made contiguous before selection
        return "contiguous"
    cl = "channels_last" if k == 4 else "channels_last_3d"
    either_cl = cl in (q.input_format, q.weight_format)
    if backend in ("Mkldnn", "MkldnnTranspose"):  # mkldnn_conv_use_channels_last
        ok = q.dtype != torch.float64 and not q.is_mkldnn
        return cl if ok and either_cl else "contiguous"
    if backend in ("Slow2d", "SlowDilated2d", "SlowTranspose2d"):  # thnn_conv_use_channels_last
        return "channels_last" if q.device == "cpu" and "channels_last" in (
            q.input_format, q.weight_format) else "contiguous"
    if backend in ("Cudnn", "CudnnTranspose") and q.device == "cuda":
        return cl if q.dtype != torch.float64 and either_cl else "contiguous"
    if backend in ("Overrideable", "Mps", "MpsTranspose"):  # xpu / mps_conv_use_channels_last
        dev = "xpu" if backend == "Overrideable" else "mps"
        return cl if q.device == dev and either_cl else "contiguous"
    return "contiguous"  # Miopen*: only with PYTORCH_MIOPEN_SUGGEST_NHWC (not modelled here)


def flowchart_dot() -> str:
    """The rule table as a Graphviz ``dot`` graph: one test per row, first match wins."""
    lines = ["digraph select_conv_backend {", '  rankdir=TB; node [fontname="Helvetica"];',
             '  start [label="_select_conv_backend", shape=box, style=rounded];']
    prev = "start"
    for i, rule in enumerate(RULES):
        targets, edge = rule.leads_to.replace(" / ", chr(92) + "n"), ' [label="no"]'
        lines += [f'  r{i} [label="{rule.name}", shape=box];',
                  f'  b{i} [label="{targets}", shape=box, style=filled, fillcolor=lightgrey];',
                  f"  {prev} -> r{i}{edge if i else ''};", f'  r{i} -> b{i} [label="yes"];']
        prev = f"r{i}"
    lines.append("}")
    return "\n".join(lines)
