"""What ATen's convolution backend selection reads, and what it returns.

* :class:`ConvQuery`: one convolution as the selection sees it (shapes, parameters, dtype,
  device, memory formats, whether a gradient is needed);
* :class:`Environment`: the process state it reads (build, ``torch.backends`` flags, the
  CPU's bf16/fp16 checks, threads), read live by :meth:`Environment.current`;
* :class:`Term` and :class:`Selection`: one evaluated predicate, and the answer with its
  decision path.

The rules themselves are :mod:`convlab.aten.selection`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from convlab.scratch.params import ConvParams, IntOrSeq

DEVICE_TYPES = ("cpu", "cuda", "hip", "mps", "xpu", "meta")


@dataclass(frozen=True)
class Environment:
    """The global state the selection reads: build, flags, CPU ISA checks, threads.

    :meth:`current` reads it live from this process; :meth:`typical` gives a stated build
    for a device that is not here (a CUDA build with cuDNN 9.10, compute capability 8).
    """

    mkldnn_compiled: bool = True  # AT_MKLDNN_ENABLED()
    mkldnn_enabled: bool = True  # globalContext().userEnabledMkldnn()
    mkldnn_bf16: bool = False  # mkldnn_bf16_device_check(): the CPU's ISA decides
    mkldnn_fp16: bool = False  # mkldnn_fp16_device_check()
    nnpack_available: bool = True  # at::_nnpack_available() (built and initialised)
    nnpack_enabled: bool = True  # globalContext().userEnabledNNPACK()
    threads: int = 1  # at::get_num_threads()
    cudnn_compiled: bool = False  # getCUDAHooks().compiledWithCuDNN()
    cudnn_enabled: bool = True  # globalContext().userEnabledCuDNN()
    cudnn_version: int = -1  # versionRuntimeCuDNN(), e.g. 91000 for 9.10
    cudnn_v8_api: bool = True  # cudnnv8_enabled_check_debug(): no TORCH_CUDNN_V8_API_DISABLED
    cuda_bf16_conv: bool = True  # supportsBFloat16ConvolutionWithCuDNNv8() (sm >= 80)
    depthwise_kernel: str = "auto"  # globalContext().cudnnDepthwiseKernel()
    miopen_compiled: bool = False  # getCUDAHooks().compiledWithMIOpen()
    miopen_suggest_nhwc: bool = False  # PYTORCH_MIOPEN_SUGGEST_NHWC
    mps_built: bool = False  # USE_MPS
    grad_enabled: bool = True  # GradMode::is_enabled()

    @classmethod
    def current(cls) -> Environment:
        """This process's state, read live (never assumed)."""
        cudnn = bool(torch._C._has_cudnn)
        hip = torch.version.hip is not None
        return cls(
            mkldnn_compiled=torch.backends.mkldnn.is_available(),
            mkldnn_enabled=torch._C._get_mkldnn_enabled(),
            mkldnn_bf16=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            mkldnn_fp16=bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
            nnpack_available=bool(torch._nnpack_available()),
            nnpack_enabled=torch._C._get_nnpack_enabled(),
            threads=torch.get_num_threads(),
            cudnn_compiled=cudnn and not hip,
            cudnn_enabled=torch.backends.cudnn.enabled,
            cudnn_version=(torch.backends.cudnn.version() or -1) if cudnn and not hip else -1,
            cudnn_v8_api=os.environ.get("TORCH_CUDNN_V8_API_DISABLED", "0") in ("", "0"),
            miopen_compiled=hip and cudnn,
            miopen_suggest_nhwc=os.environ.get("PYTORCH_MIOPEN_SUGGEST_NHWC", "0")
            not in ("", "0"),
            mps_built=torch.backends.mps.is_built(),
            grad_enabled=torch.is_grad_enabled(),
        )

    @classmethod
    def typical(cls, device: str) -> Environment:
        """This process's flags with a stated build for ``device`` (CUDA: cuDNN 9.10; ROCm:
        MIOpen; MPS: an MPS build). For a device that is not here: from source, not run."""
        env = cls.current()
        if device == "cuda" and not env.cudnn_compiled:
            env = replace(env, cudnn_compiled=True, cudnn_version=91000, miopen_compiled=False)
        if device == "hip":
            env = replace(env, cudnn_compiled=False, miopen_compiled=True)
        if device == "mps":
            env = replace(env, mps_built=True)
        return env


@dataclass(frozen=True)
class ConvQuery:
    """One convolution as the selection sees it: shapes, parameters, dtype, device, layout.

    ``input_format`` / ``weight_format`` are what ``Tensor::suggest_memory_format`` gives
    (``"contiguous"``, ``"channels_last"``, ``"channels_last_3d"``).
    """

    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    params: ConvParams
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    input_format: str = "contiguous"
    weight_format: str = "contiguous"
    bias: bool = True
    requires_grad: bool = True
    is_mkldnn: bool = False

    @classmethod
    def create(
        cls,
        input_shape: Sequence[int],
        weight_shape: Sequence[int],
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        transposed: bool = False,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        channels_last: bool = False,
        bias: bool = True,
        requires_grad: bool = True,
    ) -> ConvQuery:
        """A query from shapes, validated by :class:`~convlab.scratch.params.ConvParams`.

        Raises ValueError/TypeError naming the argument.
        """
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        device = str(device).split(":")[0]
        if device not in DEVICE_TYPES:
            raise ValueError(f"device must be one of {', '.join(DEVICE_TYPES)}, got {device!r}")
        if len(weight_shape) not in (3, 4, 5):
            raise ValueError(
                f"weight must have 3, 4 or 5 dims (a 1-, 2- or 3-d convolution), "
                f"got shape {list(weight_shape)}"
            )
        p = ConvParams.create(len(weight_shape) - 2, stride, padding, dilation, transposed,
                              output_padding, groups)
        out_channels = weight_shape[1] * p.groups if p.transposed else weight_shape[0]
        p.check_shapes(input_shape, weight_shape, (out_channels,) if bias else None)
        fmt = "contiguous"
        if channels_last:
            if len(input_shape) not in (4, 5):
                raise ValueError("channels_last needs a 4-d or 5-d input")
            fmt = "channels_last" if len(input_shape) == 4 else "channels_last_3d"
        return cls(tuple(input_shape), tuple(weight_shape), p, dtype, device, fmt, fmt, bias,
                   requires_grad)

    @classmethod
    def from_tensors(
        cls,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        transposed: bool = False,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
    ) -> ConvQuery:
        """The query ATen's ``select_conv_backend`` would see for these tensors."""
        for t, name in ((input, "input"), (weight, "weight")):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        p = ConvParams.create(weight.dim() - 2, stride, padding, dilation, transposed,
                              output_padding, groups)
        grad = any(t is not None and t.requires_grad for t in (input, weight, bias))
        return cls(tuple(input.shape), tuple(weight.shape), p, input.dtype, input.device.type,
                   _suggest_format(input), _suggest_format(weight), bias is not None, grad,
                   input.is_mkldnn)


def _suggest_format(t: torch.Tensor) -> str:
    if t.layout != torch.strided:
        return "contiguous"
    fmt = torch._prims_common.suggest_memory_format(t)
    return {torch.channels_last: "channels_last",
            torch.channels_last_3d: "channels_last_3d"}.get(fmt, "contiguous")


@dataclass(frozen=True)
class Term:
    """One evaluated predicate: its C++ name, value, the values that decided it, source."""

    name: str
    value: bool
    detail: str
    source: str
    depth: int = 0

    def line(self) -> str:
        """``name = value  (detail)`` indented by depth."""
        return f"{'  ' * self.depth}{self.name} = {self.value}  ({self.detail})"


@dataclass(frozen=True)
class Selection:
    """The backend chosen, the decision path, and whether this machine could check it."""

    backend: str
    path: tuple[Term, ...]
    memory_format: str
    device: str
    checked_here: bool

    def decisive(self) -> tuple[Term, ...]:
        """The top-level rule terms (depth 0), in order; the last one chose the backend."""
        return tuple(t for t in self.path if t.depth == 0)
