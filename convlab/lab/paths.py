"""One registry of convolution layers and paths, for ``bench``, ``doctor`` and the GPU check.

* :class:`Layer`: the arguments of one ``aten::convolution`` (shapes, stride, groups, ...);
  ``SUITE`` holds the benchmark layers, ``CASES`` the small layers ``doctor``
  checks.
* :class:`Path`: one way to compute a convolution and its gradients (ATen with its own
  backend choice, ATen with a forced backend, or one of convlab's implementations). Its
  :meth:`Path.runners` gives one zero-argument callable per *pass*:

  - ``forward``: the output;
  - ``backward_input``: ``grad_input`` only;
  - ``backward_weight``: ``grad_weight`` only;
  - ``backward``: all three gradients (the bias gradient too);
  - ``forward_backward``: a forward followed by the full backward, as a training step
    runs them (this is where THNN's saved columns pay off).

  ``PATHS`` lists them by name. Adding a path or a layer is one entry here.

FLOPs (:func:`flops`) are ``2 * MACs`` for forward, backward_input and backward_weight,
``4 * MACs`` for the full backward and ``6 * MACs`` for forward_backward (bias terms
ignored). :func:`min_bytes` is the traffic no implementation can avoid: every operand read
once and every result written once; for a thin layer (depthwise) that, not FLOPs, bounds
the time.

>>> [p.name for p in PATHS]
['native', 'mkldnn', 'slow', 'nnpack', 'cudnn', 'thnn', 'reference', 'numpy_ref']
>>> suite_layers(["cifar5"])[0].describe()
'x[32,3,32,32] w[16,3,5,5] p2'
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from convlab.aten import backends
from convlab.scratch import numpy_ref, reference, thnn
from convlab.scratch.params import ConvParams

PASSES: tuple[str, ...] = (
    "forward", "backward_input", "backward_weight", "backward", "forward_backward",
)
MASKS: dict[str, tuple[bool, bool, bool]] = {
    "backward_input": (True, False, False),
    "backward_weight": (False, True, False),
    "backward": (True, True, True),
}
FLOP_FORMULA = (
    "flops = 2 * MACs for forward, backward_input and backward_weight; 4 * MACs for the "
    "full backward; 6 * MACs for forward_backward (bias terms ignored); "
    "MACs = ConvParams.macs(input_shape, weight_shape)"
)


class NotApplicable(Exception):
    """A path cannot serve a layer here (the message says why)."""


# ------------------------------------------------------------------------------------ layers


@dataclass(frozen=True)
class Layer:
    """One convolution: ``aten::convolution`` shapes and arguments.

    ``input_shape`` is ``[N, C_in, *S]``; ``weight_shape`` ``[C_out, C_in/groups, *k]``
    (``[C_in, C_out/groups, *k]`` when ``transposed``).

    >>> Layer("tiny", (2, 3, 8, 8), (4, 3, 3, 3), padding=1).output_shape
    (2, 4, 8, 8)
    """

    name: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] = 0
    dilation: int | tuple[int, ...] = 1
    transposed: bool = False
    output_padding: int | tuple[int, ...] = 0
    groups: int = 1
    note: str = ""

    @property
    def params(self) -> ConvParams:
        """The validated :class:`~convlab.scratch.params.ConvParams` (``ValueError`` if invalid)."""
        p = ConvParams.create(
            len(self.weight_shape) - 2, self.stride, self.padding, self.dilation,
            self.transposed, self.output_padding, self.groups,
        )
        p.check_shapes(self.input_shape, self.weight_shape)
        return p

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.params.output_shape(self.input_shape, self.weight_shape)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the forward (each backward GEMM costs as many)."""
        return self.params.macs(self.input_shape, self.weight_shape)

    @property
    def dim(self) -> int:
        return len(self.weight_shape) - 2

    @property
    def thnn_ok(self) -> bool:
        """True when THNN's conv2d serves this layer (2-d, no groups, dilation or transposition)."""
        p = self.params
        return p.dim == 2 and p.groups == 1 and not p.transposed and set(p.dilation) == {1}

    def args(self) -> tuple[list[int], list[int], list[int], bool, list[int], int]:
        """``(stride, padding, dilation, transposed, output_padding, groups)`` as ATen wants."""
        return self.params.aten_args()

    def describe(self) -> str:
        """Short description, e.g. ``x[8,64,56,56] w[64,64,3,3] p1``."""
        parts = [f"x{list(self.input_shape)}", f"w{list(self.weight_shape)}"]
        for key, short, default in (("stride", "s", 1), ("padding", "p", 0),
                                    ("dilation", "d", 1), ("groups", "g", 1)):
            value = getattr(self, key)
            if value != default:
                parts.append(f"{short}{value}")
        if self.transposed:
            parts.append("T" + (f" op{self.output_padding}" if self.output_padding else ""))
        return " ".join(p.replace(" ", "") for p in parts)

    def tensors(
        self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random ``(input, weight, bias, grad_output)`` for this layer (same for any dtype)."""
        gen = torch.Generator().manual_seed(seed)
        out = self.output_shape
        return tuple(  # type: ignore[return-value]
            torch.randn(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            for shape in (self.input_shape, self.weight_shape, (out[1],), out)
        )


SUITE: tuple[Layer, ...] = (
    Layer("resnet56", (8, 64, 56, 56), (64, 64, 3, 3), padding=1, note="ResNet conv2_x"),
    Layer("resnet28", (8, 128, 28, 28), (128, 128, 3, 3), padding=1, note="ResNet conv3_x"),
    Layer("resnet14", (8, 256, 14, 14), (256, 256, 3, 3), padding=1, note="ResNet conv4_x"),
    Layer("cifar5", (32, 3, 32, 32), (16, 3, 5, 5), padding=2, note="5x5 stem, 'same'"),
    Layer("strided", (8, 64, 56, 56), (128, 64, 3, 3), stride=2, padding=1, note="downsample"),
    Layer("grouped", (8, 128, 28, 28), (128, 32, 3, 3), padding=1, groups=4, note="ResNeXt"),
    Layer("depthwise", (8, 128, 28, 28), (128, 1, 3, 3), padding=1, groups=128,
          note="MobileNet"),
    Layer("dilated", (8, 64, 28, 28), (64, 64, 3, 3), padding=2, dilation=2, note="atrous"),
    Layer("transposed", (8, 64, 14, 14), (64, 32, 4, 4), stride=2, padding=1, transposed=True,
          note="2x upsampling"),
    Layer("conv1d", (8, 64, 512), (64, 64, 5), padding=2, note="1-d, audio/text"),
    Layer("conv3d", (4, 16, 16, 16, 16), (32, 16, 3, 3, 3), padding=1, note="3-d, video"),
)
RESNET_LAYERS: tuple[str, ...] = ("resnet56", "resnet28", "resnet14", "cifar5")
QUICK_LAYERS: tuple[str, ...] = ("resnet14", "cifar5", "depthwise", "conv1d")

CASES: tuple[Layer, ...] = (
    Layer("plain2d", (2, 3, 7, 6), (4, 3, 3, 2), padding=1),
    Layer("strided2d", (2, 4, 9, 8), (6, 4, 3, 3), stride=2, padding=(1, 0)),
    Layer("grouped2d", (2, 4, 6, 6), (6, 2, 3, 3), padding=1, groups=2),
    Layer("depthwise2d", (2, 4, 6, 6), (8, 1, 3, 3), groups=4),
    Layer("dilated2d", (2, 3, 9, 9), (4, 3, 3, 3), padding=1, dilation=2),
    Layer("transposed2d", (2, 4, 5, 5), (4, 3, 3, 3), stride=2, padding=1, transposed=True,
          output_padding=1),
    Layer("conv1d", (2, 3, 10), (4, 3, 3), stride=2, padding=1),
    Layer("conv3d", (2, 2, 5, 5, 4), (3, 2, 3, 3, 2), padding=1),
    Layer("batch16", (16, 3, 8, 8), (4, 3, 3, 3), padding=1),  # NNPACK needs a batch >= 16
)


def suite_layers(names: Sequence[str] | None = None) -> list[Layer]:
    """Suite layers by name (all when ``names`` is None); ``ValueError`` for an unknown name.

    >>> [layer.name for layer in suite_layers(["conv1d"])]
    ['conv1d']
    """
    by_name = {layer.name: layer for layer in SUITE}
    if names is None:
        return list(SUITE)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"layers: unknown layer name(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(by_name)}"
        )
    return [by_name[n] for n in names]


def flops(layer: Layer, pass_: str) -> int:
    """FLOPs of one pass (see the module docstring)."""
    factor = {"backward": 4, "forward_backward": 6}.get(pass_, 2)
    if pass_ not in PASSES:
        raise ValueError(f"pass_: unknown pass {pass_!r}; choose from {', '.join(PASSES)}")
    return factor * layer.macs


def min_bytes(layer: Layer, pass_: str, itemsize: int = 4) -> int:
    """Bytes a pass must move at least: each operand read once, each result written once.

    forward reads x, w, b and writes y; a backward reads grad_output and the operands its
    gradients need and writes those gradients; forward_backward is the sum of both.
    """
    x = math.prod(layer.input_shape)
    w = math.prod(layer.weight_shape)
    y = math.prod(layer.output_shape)
    b = layer.output_shape[1]
    if pass_ == "forward":
        elems = x + w + b + y
    elif pass_ == "backward_input":
        elems = y + w + x
    elif pass_ == "backward_weight":
        elems = y + x + w
    elif pass_ == "backward":
        elems = y + x + w + x + w + b
    elif pass_ == "forward_backward":
        elems = (x + w + b + y) + (y + x + w + x + w + b)
    else:
        raise ValueError(f"pass_: unknown pass {pass_!r}; choose from {', '.join(PASSES)}")
    return elems * itemsize


# ------------------------------------------------------------------------------------- paths

Runners = dict[str, Callable[[], object]]
Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Path:
    """One way to run a convolution and its backward.

    ``force`` names the :func:`convlab.aten.backends.use_backend` backend held while the path runs
    (None: the current flags). ``float64`` says whether it serves float64.
    """

    name: str
    description: str
    build: Callable[[Layer, Tensors], Runners]
    force: str | None = None
    float64: bool = True
    cpu_only: bool = False
    supports: Callable[[Layer], str | None] = lambda layer: None

    @property
    def is_aten(self) -> bool:
        """Whether the path runs ATen's own kernels (native or forced)."""
        return self.build is _aten_runners

    def check(self, layer: Layer, device: torch.device, dtype: torch.dtype) -> str:
        """The ATen backend it will use (``"-"`` for convlab's paths), or ``NotApplicable``."""
        if self.cpu_only and device.type != "cpu":
            raise NotApplicable("runs on the CPU only")
        if dtype == torch.float64 and not self.float64:
            raise NotApplicable("no float64 kernels")
        why = self.supports(layer)
        if why:
            raise NotApplicable(why)
        if not self.is_aten:
            return "-"
        x = torch.empty(layer.input_shape, device=device, dtype=dtype, requires_grad=True)
        w = torch.empty(layer.weight_shape, device=device, dtype=dtype, requires_grad=True)
        if self.force is None:  # select as a training step does: inputs require grad
            return backends.select_backend(x, w, None, *layer.args())
        if self.force not in backends.available_backends(device):
            raise NotApplicable(f"not available on {device.type} in this build")
        try:
            with backends.use_backend(self.force, x, w, None, *layer.args()) as chosen:
                return str(chosen)
        except backends.BackendMismatch as err:  # ATen picks another backend for these inputs
            raise NotApplicable(f"ATen selects {err.chosen} here") from None

    def runners(self, layer: Layer, tensors: Tensors, hold: bool = True) -> Runners:
        """pass name -> zero-argument callable.

        With ``hold`` a forced path sets its backend around every call; without it the
        caller holds :meth:`Path.held` around the calls (a timer does, so that setting the
        flags is not timed).
        """
        fns = self.build(layer, tensors)
        if self.force is None or not hold:
            return fns
        return {name: _held(self.force, fn) for name, fn in fns.items()}

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold this path's forced backend (nothing for unforced paths)."""
        if self.force is None:
            yield
        else:
            with backends.use_backend(self.force):
                yield


def _held(force: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with backends.use_backend(force):
            return fn()

    return run


def _aten_runners(layer: Layer, tensors: Tensors) -> Runners:
    return _twin_runners(torch.ops.aten.convolution.default,
                         torch.ops.aten.convolution_backward.default, layer, tensors)


def _reference_runners(layer: Layer, tensors: Tensors) -> Runners:
    return _twin_runners(reference.convolution, reference.convolution_backward, layer, tensors)


def _twin_runners(forward: Callable[..., object], backward: Callable[..., object],
                  layer: Layer, tensors: Tensors) -> Runners:
    """Runners for a ``convolution``/``convolution_backward`` pair with ATen's signatures."""
    x, w, b, go = tensors
    args = layer.args()
    sizes = [b.shape[0]]
    fns: Runners = {"forward": lambda: forward(x, w, b, *args)}
    for pass_, mask in MASKS.items():
        fns[pass_] = lambda mask=mask: backward(go, x, w, sizes, *args, list(mask))

    def step() -> object:
        forward(x, w, b, *args)
        return backward(go, x, w, sizes, *args, [True, True, True])

    fns["forward_backward"] = step
    return fns


def _thnn_runners(layer: Layer, tensors: Tensors) -> Runners:
    """THNN's convention: the forward fills ``finput`` (the columns), the backward reads it."""
    x, w, b, go = tensors
    p = layer.params
    kernel = list(w.shape[2:])
    _, finput = thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding)
    step_cols = torch.empty_like(finput)
    fgrad_input = torch.empty_like(finput)
    fns: Runners = {
        "forward": lambda: thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding,
                                               step_cols)[0],
    }
    for pass_, mask in MASKS.items():
        fns[pass_] = lambda mask=mask: thnn.conv2d_backward(
            go, x, w, kernel, p.stride, p.padding, finput, fgrad_input, mask)

    def step() -> object:
        _, cols = thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding, step_cols)
        return thnn.conv2d_backward(go, x, w, kernel, p.stride, p.padding, cols, fgrad_input)

    fns["forward_backward"] = step
    return fns


def _numpy_runners(layer: Layer, tensors: Tensors) -> Runners:
    p = layer.params
    x, w, b, go = (t.detach().cpu().numpy() for t in tensors)
    conv_args = (p.stride, p.padding, p.dilation, p.groups)
    fns: Runners = {"forward": lambda: numpy_ref.convolution(x, w, b, *conv_args)}
    for pass_, mask in MASKS.items():
        fns[pass_] = lambda mask=mask: numpy_ref.convolution_backward(
            go, x, w, [b.shape[0]], *conv_args, mask)

    def step() -> object:
        numpy_ref.convolution(x, w, b, *conv_args)
        return numpy_ref.convolution_backward(go, x, w, [b.shape[0]], *conv_args,
                                              (True, True, True))

    fns["forward_backward"] = step
    return fns


def _thnn_supports(layer: Layer) -> str | None:
    if not layer.thnn_ok:
        return "THNN's conv2d is 2-d only, without groups, dilation or transposition"
    return None


def _numpy_supports(layer: Layer) -> str | None:
    return "numpy_ref has no transposed convolution" if layer.transposed else None


PATHS: tuple[Path, ...] = (
    Path("native", "aten.convolution{,_backward} with ATen's own backend choice",
         _aten_runners),
    Path("mkldnn", "the same ops with oneDNN forced", _aten_runners, force="mkldnn",
         float64=False),
    Path("slow", "the same ops with oneDNN, NNPACK and cuDNN off (im2col + GEMM)",
         _aten_runners, force="slow"),
    Path("nnpack", "the same ops with NNPACK forced (forward; backward is SlowDilated2d)",
         _aten_runners, force="nnpack", float64=False),
    Path("cudnn", "the same ops with cuDNN forced", _aten_runners, force="cudnn"),
    Path("thnn", "convlab.scratch.thnn: THNN's conv2d, the backward reading the forward's columns",
         _thnn_runners, supports=_thnn_supports),
    Path("reference", "convlab.scratch.reference: N-d im2col + batched GEMM in torch ops",
         _reference_runners),
    Path("numpy_ref", "convlab.scratch.numpy_ref: im2col + GEMM in NumPy", _numpy_runners,
         cpu_only=True, supports=_numpy_supports),
)
PATH_NAMES: tuple[str, ...] = tuple(p.name for p in PATHS)
# Second candidates of a path's kernel (an A/A pair of its own, beside native and its
# forced twin), timed where a benchmark asks for them (``convlab.lab.bench.benchmark``'s
# ``repeats``); not registered paths: repeat -> the path it repeats.
AA_REPEATS: dict[str, str] = {"slow_aa": "slow"}
# Forced twin of each ATen backend: native and its twin run the same kernel (an A/A pair).
TWIN_OF_BACKEND: dict[str, str] = {
    "Mkldnn": "mkldnn", "MkldnnTranspose": "mkldnn", "Cudnn": "cudnn",
    "CudnnTranspose": "cudnn", "NnpackSpatial": "nnpack",
    **{name: "slow" for name in backends.SLOW_BACKENDS},
    "CudaDepthwise2d": "slow", "CudaDepthwise3d": "slow",
}


def repeat_path(name: str) -> Path:
    """The second candidate ``name`` of ``AA_REPEATS`` as a :class:`Path`: the path it
    repeats under another name (``ValueError`` if ``name`` is not a repeat)."""
    if name not in AA_REPEATS:
        raise ValueError(f"paths: {name!r} is not a repeat; choose from "
                         f"{', '.join(AA_REPEATS)}")
    original = get_path(AA_REPEATS[name])
    return dataclasses.replace(original, name=name, description=(
        f"{original.name} again, a second candidate of the same kernel (its A/A twin)"))


def get_path(name: str) -> Path:
    """The registered :class:`Path` called ``name`` (``ValueError`` if there is none)."""
    for path in PATHS:
        if path.name == name:
            return path
    raise ValueError(f"paths: unknown path {name!r}; choose from {', '.join(PATH_NAMES)}")
