"""Convolution hyper-parameters: normalisation, validation and output shapes.

Every other `convlab` module goes through :class:`ConvParams`, so a bad argument is
rejected once, early, with a message that names it, instead of surfacing as an
``IndexError`` deep inside an im2col.

Conventions follow ATen's ``aten::convolution``:

* input ``[N, C_in, *spatial]`` (a batch dimension is required);
* weight ``[C_out, C_in / groups, *kernel]`` for a normal convolution and
  ``[C_in, C_out / groups, *kernel]`` for a transposed one;
* ``output_padding`` only matters when ``transposed`` is true.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

IntOrSeq = int | Sequence[int]

INT64_MAX = 2**63 - 1
"""ATen takes stride, padding, dilation, output_padding and groups as int64 (``int[]``)."""

MAX_SPATIAL_DIMS = 3
"""torch has 1-, 2- and 3-d convolutions (``conv1d``..``conv3d``) and no 4-d one."""


def as_int(value: object, name: str) -> int:
    """``value`` as a Python int, accepting what ATen accepts for an ``int`` argument.

    Any integer type (``int``, ``numpy.int64``, a one-element integer tensor: anything with
    ``__index__``) is accepted; ``bool`` (an int in Python, but never meant as a size) and
    floats are rejected with a ``TypeError`` that names ``name``.

    >>> import numpy as np
    >>> as_int(np.int64(3), "stride")
    3
    """
    if isinstance(value, torch.SymInt):  # symbolic sizes seen by fake kernels under compile
        return value  # type: ignore[return-value]
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def normalize(value: IntOrSeq, dim: int, name: str) -> tuple[int, ...]:
    """Turn an int or a sequence of ints into a ``dim``-tuple of Python ints.

    A single int (or a one-element sequence) is repeated, as ATen does. Integer types other
    than ``int`` (NumPy integers, integer tensors) are accepted like ATen accepts them;
    ``bool``, floats and strings raise a ``TypeError`` naming ``name``.

    >>> normalize(2, 3, "stride")
    (2, 2, 2)
    >>> normalize((1, 2), 2, "padding")
    (1, 2)
    """
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an int or a sequence of ints, got the string {value!r}")
    if not isinstance(value, Sequence):
        if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
            raise TypeError(
                f"{name} must be an int or a sequence of ints, got {type(value).__name__} "
                f"{value!r}"
            )
        return (as_int(value, name),) * dim
    items = tuple(as_int(item, f"each entry of {name}={list(value)!r}") for item in value)
    if len(items) == 1:
        return items * dim
    if len(items) != dim:
        raise ValueError(
            f"{name} must be an int or a sequence of {dim} ints for a {dim}-d convolution, "
            f"got {len(items)} values: {list(items)}"
        )
    return items


@dataclass(frozen=True)
class ConvParams:
    """Normalised hyper-parameters of one N-d convolution (N = ``dim``).

    Build it with :meth:`create` (arguments only) or :meth:`for_tensors` (arguments and
    tensors, fully validated).

    >>> p = ConvParams.create(2, stride=2, padding=1)
    >>> p.output_shape((8, 3, 32, 32), (16, 3, 3, 3))
    (8, 16, 16, 16)
    """

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int

    @property
    def dim(self) -> int:
        """Number of spatial dimensions."""
        return len(self.stride)

    @classmethod
    def create(
        cls,
        dim: int,
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        transposed: bool = False,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
    ) -> ConvParams:
        """Normalise and validate the arguments that do not depend on tensor shapes.

        The one validation every convlab entry point goes through: ``dim`` must be 1, 2 or 3
        (torch has no 4-d convolution), every value must fit in int64 (ATen's ``int``), and
        the values must make sense (positive stride, dilation and groups, ...).
        """
        dim = as_int(dim, "dim")
        if not 1 <= dim <= MAX_SPATIAL_DIMS:
            raise ValueError(
                f"a convolution has 1, 2 or 3 spatial dimensions (torch has no {dim}-d one), "
                f"got dim={dim!r}: input must be [N, C, *spatial] and weight "
                f"[C_out, C_in/groups, *kernel] with 3, 4 or 5 dimensions"
            )
        if not isinstance(transposed, (bool, np.bool_)):
            raise TypeError(f"transposed must be a bool, got {type(transposed).__name__}")
        params = cls(
            stride=normalize(stride, dim, "stride"),
            padding=normalize(padding, dim, "padding"),
            dilation=normalize(dilation, dim, "dilation"),
            transposed=bool(transposed),
            output_padding=normalize(output_padding, dim, "output_padding"),
            groups=as_int(groups, "groups"),
        )
        params._check_values()
        return params

    def _check_values(self) -> None:
        for name in ("stride", "padding", "dilation", "output_padding"):
            values = getattr(self, name)
            if any(_symbolic(v) for v in values):
                continue
            if any(abs(v) > INT64_MAX for v in values):
                raise ValueError(
                    f"{name}={list(values)} does not fit in int64 (ATen's int; at most "
                    f"{INT64_MAX})"
                )
        if not _symbolic(self.groups) and abs(self.groups) > INT64_MAX:
            raise ValueError(f"groups={self.groups} does not fit in int64 (at most {INT64_MAX})")
        if any(s <= 0 for s in self.stride):
            raise ValueError(f"stride must be positive, got {self.stride}")
        if any(d <= 0 for d in self.dilation):
            raise ValueError(f"dilation must be positive, got {self.dilation}")
        if any(p < 0 for p in self.padding):
            raise ValueError(f"padding must be non-negative, got {self.padding}")
        if any(p < 0 for p in self.output_padding):
            raise ValueError(f"output_padding must be non-negative, got {self.output_padding}")
        if self.groups <= 0:
            raise ValueError(f"groups must be positive, got groups={self.groups}")
        if self.transposed:
            for op, s, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
                if op >= s and op >= d:
                    raise ValueError(
                        f"output_padding={self.output_padding} must be smaller than either "
                        f"stride={self.stride} or dilation={self.dilation} in every dimension"
                    )

    @classmethod
    def for_tensors(
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
    ) -> ConvParams:
        """Validate tensors and arguments together; the spatial rank comes from ``weight``.

        Checks types, ranks, floating dtypes, matching dtypes and devices, channels,
        groups, bias length and that the (dilated) kernel fits the padded input.
        """
        check_tensor(input, "input")
        check_tensor(weight, "weight")
        if weight.dim() < 3:
            raise ValueError(
                f"weight must have at least 3 dimensions [out, in/groups, *kernel], "
                f"got shape {list(weight.shape)}"
            )
        params = cls.create(
            weight.dim() - 2, stride, padding, dilation, transposed, output_padding, groups
        )
        check_same(input, weight, "input", "weight")
        if bias is not None:
            check_tensor(bias, "bias")
            check_same(input, bias, "input", "bias")
        params.check_shapes(
            tuple(input.shape), tuple(weight.shape), None if bias is None else tuple(bias.shape)
        )
        return params

    def check_shapes(
        self,
        input_shape: Sequence[int],
        weight_shape: Sequence[int],
        bias_shape: Sequence[int] | None = None,
    ) -> None:
        """Validate shapes against these parameters (ranks, channels, groups, bias, sizes).

        Raises a ``ValueError`` naming the offending tensor (input, weight, bias) for a
        negative size, a rank, channel count, group split or bias length that does not fit,
        a kernel size of 0, or a kernel that does not fit the padded input.
        """
        dim = self.dim
        for shape, name in ((input_shape, "input"), (weight_shape, "weight"), (bias_shape, "bias")):
            if shape is not None and any(as_int(n, f"{name} size") < 0 for n in shape):
                raise ValueError(f"{name} sizes must be non-negative, got shape {list(shape)}")
        if len(weight_shape) != dim + 2:
            raise ValueError(
                f"weight must have {dim + 2} dimensions for a {dim}-d convolution, "
                f"got shape {list(weight_shape)}"
            )
        if len(input_shape) != dim + 2:
            raise ValueError(
                f"input must have {dim + 2} dimensions [N, C, *spatial] to match weight of "
                f"shape {list(weight_shape)}, got shape {list(input_shape)}"
            )
        in_channels = input_shape[1]
        g = self.groups
        if self.transposed:
            if weight_shape[0] != in_channels:
                raise ValueError(
                    f"input has {in_channels} channels but a transposed weight must have "
                    f"weight.shape[0] == in_channels, got weight of shape {list(weight_shape)}"
                )
            if in_channels % g:
                raise ValueError(f"groups={g} must divide in_channels={in_channels}")
            out_channels = weight_shape[1] * g
        else:
            if in_channels % g:
                raise ValueError(f"groups={g} must divide in_channels={in_channels}")
            if weight_shape[1] * g != in_channels:
                raise ValueError(
                    f"input has {in_channels} channels but weight of shape {list(weight_shape)} "
                    f"with groups={g} expects {weight_shape[1] * g} "
                    f"(weight.shape[1] * groups)"
                )
            out_channels = weight_shape[0]
            if out_channels % g:
                raise ValueError(f"groups={g} must divide out_channels={out_channels}")
        if any(k <= 0 for k in weight_shape[2:]):
            raise ValueError(
                f"weight's kernel sizes must be positive, got weight shape {list(weight_shape)}"
            )
        if bias_shape is not None and tuple(bias_shape) != (out_channels,):
            raise ValueError(
                f"bias must have shape [{out_channels}] (one value per output channel), "
                f"got {list(bias_shape)}"
            )
        if not self.transposed:
            padded = tuple(i + 2 * p for i, p in zip(input_shape[2:], self.padding, strict=True))
            extent = self.kernel_extent(weight_shape[2:])
            if any(e > s for e, s in zip(extent, padded, strict=True)):
                raise ValueError(
                    f"kernel extent {extent} (dilation * (kernel - 1) + 1) is larger than the "
                    f"padded input size {padded}"
                )
        out = self.output_shape(input_shape, weight_shape)
        if any(o <= 0 for o in out[2:]):
            raise ValueError(
                f"computed output size {tuple(out[2:])} is not positive for input size "
                f"{tuple(input_shape[2:])}: padding={self.padding} is too large"
            )
        if not any(_symbolic(o) for o in out) and max(math.prod(out), *out) > INT64_MAX:
            raise ValueError(
                f"computed output shape {list(out)} has more than int64 elements "
                f"(stride={self.stride}, padding={self.padding}, "
                f"output_padding={self.output_padding})"
            )

    def aten_args(self) -> tuple[list[int], list[int], list[int], bool, list[int], int]:
        """``(stride, padding, dilation, transposed, output_padding, groups)`` as ATen takes them.

        >>> ConvParams.create(2, stride=2).aten_args()
        ([2, 2], [0, 0], [1, 1], False, [0, 0], 1)
        """
        return (list(self.stride), list(self.padding), list(self.dilation), self.transposed,
                list(self.output_padding), self.groups)

    def kernel_extent(self, kernel: Sequence[int]) -> tuple[int, ...]:
        """Span of a dilated kernel: ``dilation * (k - 1) + 1`` per dimension."""
        return tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, kernel, strict=True))

    def output_size(self, input_size: Sequence[int], kernel: Sequence[int]) -> tuple[int, ...]:
        """Spatial output size for spatial ``input_size`` and ``kernel`` sizes."""
        extent = self.kernel_extent(kernel)
        if self.transposed:
            return tuple(
                (i - 1) * s - 2 * p + e + op
                for i, s, p, e, op in zip(
                    input_size, self.stride, self.padding, extent, self.output_padding, strict=True
                )
            )
        return tuple(
            (i + 2 * p - e) // s + 1
            for i, s, p, e in zip(input_size, self.stride, self.padding, extent, strict=True)
        )

    def output_shape(
        self, input_shape: Sequence[int], weight_shape: Sequence[int]
    ) -> tuple[int, ...]:
        """Full output shape ``(N, C_out, *spatial)``."""
        out_channels = weight_shape[1] * self.groups if self.transposed else weight_shape[0]
        spatial = self.output_size(input_shape[2:], weight_shape[2:])
        return (input_shape[0], out_channels, *spatial)

    def check_grad_output(
        self,
        grad_output: torch.Tensor,
        input: torch.Tensor,
        weight: torch.Tensor,
    ) -> None:
        """Validate ``grad_output`` against the forward output shape, dtype and device."""
        check_tensor(grad_output, "grad_output")
        check_same(input, grad_output, "input", "grad_output")
        expected = self.output_shape(tuple(input.shape), tuple(weight.shape))
        if tuple(grad_output.shape) != expected:
            raise ValueError(
                f"grad_output must have the forward output's shape {list(expected)}, "
                f"got {list(grad_output.shape)}"
            )

    def macs(self, input_shape: Sequence[int], weight_shape: Sequence[int]) -> int:
        """Multiply-accumulates of the forward pass (each backward GEMM costs as many)."""
        if self.transposed:
            per_input = math.prod(weight_shape[1:])
            return int(math.prod(input_shape) * per_input)
        out = self.output_shape(input_shape, weight_shape)
        return int(math.prod(out) * math.prod(weight_shape[1:]))


def _symbolic(value: object) -> bool:
    return isinstance(value, torch.SymInt)


def check_output_mask(output_mask: object) -> tuple[bool, bool, bool]:
    """Validate ``output_mask`` (which of [grad_input, grad_weight, grad_bias] to compute).

    A ``TypeError`` for a non-sequence or non-bool entries, a ``ValueError`` for a length
    other than 3. Returns the mask as a tuple of Python bools.
    """
    if isinstance(output_mask, torch.Tensor):
        output_mask = output_mask.tolist()
    if isinstance(output_mask, (str, bytes)) or not isinstance(output_mask, Sequence):
        raise TypeError(f"output_mask must be a sequence of 3 bools, got {output_mask!r}")
    if len(output_mask) != 3:
        raise ValueError(
            f"output_mask must be 3 bools [input, weight, bias], got {list(output_mask)!r}"
        )
    if not all(isinstance(m, (bool, np.bool_)) for m in output_mask):  # numpy_ref takes np.bool_
        raise TypeError(f"output_mask must contain bools, got {list(output_mask)!r}")
    return bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2])


def check_bias_sizes(bias_sizes: object, out_channels: int) -> list[int] | None:
    """Validate ``bias_sizes`` of ``convolution_backward``: None, ``[out_channels]`` or ``[0]``.

    The one rule every convlab backward follows, whatever ``output_mask`` says. ATen's
    contract (the comment on ``convolution_backward`` in aten/src/ATen/native/Convolution.cpp)
    is "None, or the shape of the forward's bias", and autograd passes ``[0]`` (the sizes of
    an undefined tensor) when the forward had no bias. ATen itself reads ``bias_sizes`` only
    for an empty batch, where ``grad_bias = zeros(bias_sizes)``; other values would give a
    gradient of the wrong shape there, so they are rejected. ``grad_bias`` itself is always
    ``[out_channels]``.

    Returns the sizes as a list of ints, or None. ``TypeError`` for a non-sequence or
    non-int entries, ``ValueError`` for any other value.

    >>> check_bias_sizes((4,), 4), check_bias_sizes([0], 4), check_bias_sizes(None, 4)
    ([4], [0], None)
    """
    if bias_sizes is None:
        return None
    if isinstance(bias_sizes, torch.Tensor):
        bias_sizes = bias_sizes.tolist()
    if isinstance(bias_sizes, (str, bytes)) or not isinstance(bias_sizes, Sequence):
        raise TypeError(
            f"bias_sizes must be None or a sequence of ints, got {type(bias_sizes).__name__} "
            f"{bias_sizes!r}"
        )
    sizes = list(bias_sizes)
    # SymInt: symbolic sizes, as a fake kernel sees them under torch.compile(dynamic=True).
    integral = int | np.integer | torch.SymInt
    if any(isinstance(s, (bool, np.bool_)) or not isinstance(s, integral) for s in sizes):
        raise TypeError(f"bias_sizes must contain ints, got {sizes!r}")
    sizes = [s if isinstance(s, torch.SymInt) else int(s) for s in sizes]
    if sizes not in ([out_channels], [0]):
        raise ValueError(
            f"bias_sizes must be None, [{out_channels}] (out_channels) or [0] (no bias), "
            f"got {sizes}"
        )
    return sizes


def check_tensor(t: object, name: str) -> None:
    """Raise ``TypeError`` unless ``t`` is a floating-point tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")


def check_same(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise ``TypeError``/``ValueError`` when two tensors differ in dtype or device."""
    if a.dtype != b.dtype:
        raise TypeError(f"{name_b} has dtype {b.dtype} but {name_a} has dtype {a.dtype}")
    if a.device != b.device:
        raise ValueError(f"{name_b} is on {b.device} but {name_a} is on {a.device}")


def threads_or_current(threads: object) -> int:
    """``threads`` as a positive int, or torch's current thread count for None (the thread
    term of the rules that pick a form or a route; ``ValueError`` otherwise)."""
    if threads is None:
        return torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    return threads
