"""ConvParams: every validation rule raises a clear error where torch also rejects the case,
and output shapes agree with torch on random valid configurations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.scratch.params import ConvParams, normalize

aten = torch.ops.aten


@dataclass
class Case:
    """One invalid configuration: the tensors and arguments of ``aten.convolution``."""

    input: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    stride: object = 1
    padding: object = 0
    dilation: object = 1
    transposed: bool = False
    output_padding: object = 0
    groups: int = 1

    def convlab(self) -> ConvParams:
        return ConvParams.for_tensors(
            self.input, self.weight, self.bias, self.stride, self.padding, self.dilation,
            self.transposed, self.output_padding, self.groups,
        )

    def torch(self) -> torch.Tensor:
        dim = self.weight.dim() - 2

        def as_list(v: object) -> list[int]:
            return [v] * dim if isinstance(v, int) else list(v)  # type: ignore[arg-type]

        if not self.transposed:
            # The public functional op: it also checks the bias dtype, which aten.convolution
            # alone does not.
            conv = getattr(torch.nn.functional, f"conv{dim}d")
            return conv(self.input, self.weight, self.bias, as_list(self.stride),
                        as_list(self.padding), as_list(self.dilation), self.groups)
        return aten.convolution(
            self.input, self.weight, self.bias, as_list(self.stride), as_list(self.padding),
            as_list(self.dilation), self.transposed, as_list(self.output_padding), self.groups,
        )


def x(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


# (id, case, exception type, words the message must contain)
INVALID: list[tuple[str, Callable[[], Case], type[Exception], tuple[str, ...]]] = [
    ("zero stride", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), stride=(0, 1)),
     ValueError, ("stride", "positive")),
    ("negative stride", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), stride=-1),
     ValueError, ("stride", "positive")),
    ("zero dilation", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), dilation=0),
     ValueError, ("dilation", "positive")),
    ("negative padding", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), padding=(-1, 0)),
     ValueError, ("padding", "non-negative")),
    ("negative output_padding", lambda: Case(
        x(1, 2, 5, 5), x(2, 3, 3, 3), transposed=True, stride=2, output_padding=-1),
     ValueError, ("output_padding", "non-negative")),
    ("output_padding >= stride and dilation", lambda: Case(
        x(1, 2, 5, 5), x(2, 3, 3, 3), transposed=True, stride=2, output_padding=2),
     ValueError, ("output_padding", "stride", "dilation")),
    ("zero groups", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), groups=0),
     ValueError, ("groups", "positive")),
    ("groups not dividing in_channels", lambda: Case(x(1, 8, 5, 5), x(6, 3, 3, 3), groups=3),
     ValueError, ("groups=3", "in_channels=8")),
    ("groups not dividing out_channels", lambda: Case(x(1, 4, 5, 5), x(3, 2, 3, 3), groups=2),
     ValueError, ("groups=2", "out_channels=3")),
    ("transposed groups not dividing in_channels", lambda: Case(
        x(1, 3, 5, 5), x(3, 2, 3, 3), transposed=True, groups=2),
     ValueError, ("groups=2", "in_channels=3")),
    ("input rank mismatch", lambda: Case(x(1, 2, 5), x(3, 2, 3, 3)),
     ValueError, ("input", "dimensions")),
    ("channel mismatch", lambda: Case(x(1, 4, 5, 5), x(3, 2, 3, 3)),
     ValueError, ("channels", "weight")),
    ("transposed channel mismatch", lambda: Case(x(1, 4, 5, 5), x(2, 3, 3, 3), transposed=True),
     ValueError, ("channels", "weight.shape[0]")),
    ("bias of wrong length", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), bias=x(2)),
     ValueError, ("bias", "[3]")),
    ("stride of wrong length", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), stride=(1, 1, 1)),
     ValueError, ("stride", "2 ints")),
    ("padding of wrong length", lambda: Case(x(1, 2, 5, 5, 5), x(3, 2, 3, 3, 3), padding=(1, 1)),
     ValueError, ("padding", "3 ints")),
    ("input/weight dtype mismatch", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3, dtype=torch.float32)),
     TypeError, ("weight", "dtype")),
    ("bias dtype mismatch", lambda: Case(
        x(1, 2, 5, 5), x(3, 2, 3, 3), bias=x(3, dtype=torch.float32)),
     TypeError, ("bias", "dtype")),
    ("kernel larger than padded input", lambda: Case(x(1, 2, 5, 5), x(3, 2, 6, 6)),
     ValueError, ("kernel", "padded input")),
    ("dilated kernel larger than input", lambda: Case(x(1, 2, 5, 5), x(3, 2, 3, 3), dilation=3),
     ValueError, ("kernel", "padded input")),
    ("transposed output not positive", lambda: Case(
        x(1, 2, 1, 1), x(2, 3, 1, 1), transposed=True, padding=1),
     ValueError, ("output size", "padding")),
]


@pytest.mark.parametrize(
    ("case", "exc", "words"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_configuration_is_rejected_by_torch_and_convlab(
    case: Callable[[], Case], exc: type[Exception], words: tuple[str, ...]
) -> None:
    c = case()
    with pytest.raises(RuntimeError):
        c.torch()
    with pytest.raises(exc) as info:
        c.convlab()
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


def test_non_floating_dtype_is_rejected() -> None:
    # aten.convolution computes integer convolutions on CPU, but they cannot be
    # differentiated: torch refuses requires_grad on them, so convlab refuses them up front.
    i = torch.ones(1, 2, 5, 5, dtype=torch.long)
    w = torch.ones(3, 2, 3, 3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="floating point"):
        i.requires_grad_()
    with pytest.raises(TypeError, match="input must have a floating-point dtype"):
        ConvParams.for_tensors(i, w)


@pytest.mark.parametrize(
    ("arg", "value", "exc"),
    [
        ("stride", 1.5, TypeError),
        ("stride", True, TypeError),
        ("padding", "same", TypeError),
        ("dilation", (1, 2.0), TypeError),
        ("groups", 1.0, TypeError),
        ("transposed", 1, TypeError),
    ],
)
def test_argument_types_are_checked(arg: str, value: object, exc: type[Exception]) -> None:
    with pytest.raises(exc, match=arg):
        ConvParams.for_tensors(x(1, 2, 5, 5), x(3, 2, 3, 3), **{arg: value})


def test_non_tensor_input_names_the_argument() -> None:
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        ConvParams.for_tensors(x(1, 2, 5, 5), [[1.0]])  # type: ignore[arg-type]


def test_device_mismatch_names_the_argument() -> None:
    meta = torch.empty(3, 2, 3, 3, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="weight is on meta"):
        ConvParams.for_tensors(x(1, 2, 5, 5), meta)


def test_normalize() -> None:
    assert normalize(2, 3, "stride") == (2, 2, 2)
    assert normalize([3], 2, "padding") == (3, 3)
    assert normalize((1, 2), 2, "dilation") == (1, 2)
    assert normalize(torch.tensor([1, 2]), 2, "stride") == (1, 2)


def test_grad_output_shape_is_checked() -> None:
    i, w = x(2, 2, 5, 5), x(3, 2, 3, 3)
    p = ConvParams.for_tensors(i, w)
    p.check_grad_output(x(2, 3, 3, 3), i, w)
    expected = r"grad_output must have the forward output's shape \[2, 3, 3, 3\]"
    with pytest.raises(ValueError, match=expected):
        p.check_grad_output(x(2, 3, 4, 4), i, w)


def test_macs_match_a_hand_count() -> None:
    # 1 x 1 x 3 x 3 input, 2 x 1 x 2 x 2 kernel: 2 x 2 outputs per channel, 4 MACs each, 2 channels.
    p = ConvParams.create(2)
    assert p.macs((1, 1, 3, 3), (2, 1, 2, 2)) == 2 * 2 * 2 * 4
    # The transposed conv with the same weight scatters each of the 9 inputs through 2 x 4 taps.
    t = ConvParams.create(2, transposed=True)
    assert t.macs((1, 2, 3, 3), (2, 1, 2, 2)) == 2 * 9 * 4


@st.composite
def configurations(draw: st.DrawFn) -> tuple:
    dim = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dim))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(dim))
    if transposed:
        output_padding = tuple(
            draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)
        )
        weight_shape = (c_in, c_out // groups, *kernel)
    else:
        output_padding = (0,) * dim
        weight_shape = (c_out, c_in // groups, *kernel)
    size = tuple(
        draw(st.integers(max(1, d * (k - 1) + 1 - 2 * p), 7))
        for d, k, p in zip(dilation, kernel, padding, strict=True)
    )
    input_shape = (draw(st.integers(1, 2)), c_in, *size)
    return input_shape, weight_shape, stride, padding, dilation, transposed, output_padding, groups


@given(configurations())
def test_output_shape_matches_torch(config: tuple) -> None:
    input_shape, weight_shape, stride, padding, dilation, transposed, output_padding, groups = (
        config
    )
    i, w = x(*input_shape), x(*weight_shape)
    try:
        expected = aten.convolution(
            i, w, None, list(stride), list(padding), list(dilation), transposed,
            list(output_padding), groups,
        ).shape
    except RuntimeError:
        # torch rejects it (e.g. a transposed output of size <= 0): convlab must too.
        with pytest.raises(ValueError):
            ConvParams.for_tensors(i, w, None, stride, padding, dilation, transposed,
                                   output_padding, groups)
        return
    p = ConvParams.for_tensors(i, w, None, stride, padding, dilation, transposed,
                               output_padding, groups)
    assert p.output_shape(input_shape, weight_shape) == tuple(expected)


# ----------------------------------------------------------------- integer types and signs

HYPER_ARGS = ("stride", "padding", "dilation", "output_padding", "groups")


INTEGER_TYPES = {
    "np.int64": np.int64, "np.int32": np.int32, "0-d tensor": torch.tensor,
    "tuple of np.int64": lambda v: (np.int64(v), np.int64(v)),
}


def as_aten(value: object, arg: str) -> object:
    """aten.convolution's form: groups a single int, the others a list of 2."""
    if arg == "groups" or isinstance(value, tuple):
        return list(value) if isinstance(value, tuple) else value
    return [value, value]


@pytest.mark.parametrize(
    ("arg", "kind"),
    [(a, k) for a in HYPER_ARGS for k in INTEGER_TYPES if a != "groups" or "tuple" not in k],
)
def test_integer_types_aten_accepts_are_accepted(arg: str, kind: str) -> None:
    """ATen takes anything with ``__index__`` for an int; so does convlab, with the same result."""
    i, w = x(1, 4, 5, 5), x(4, 3, 3, 3)  # transposed, groups 2: 6 output channels
    kw = {"stride": 2, "padding": 1, "dilation": 1, "output_padding": 1, "groups": 2}
    kw[arg] = INTEGER_TYPES[kind](kw[arg])
    names = ("stride", "padding", "dilation")
    expected = aten.convolution(i, w, None, *(as_aten(kw[n], n) for n in names), True,
                                as_aten(kw["output_padding"], "output_padding"), kw["groups"])
    p = ConvParams.for_tensors(i, w, None, transposed=True, **kw)
    assert p.output_shape(i.shape, w.shape) == tuple(expected.shape)
    assert all(type(v) is int for v in (*p.stride, *p.padding, *p.dilation, p.groups))


@pytest.mark.parametrize("arg", HYPER_ARGS)
@pytest.mark.parametrize("bad", [True, 1.0, np.float64(2.0), np.bool_(True), "2", (1, 1.5),
                                 (1, False), torch.tensor(1.0)], ids=repr)
def test_bools_floats_and_strings_are_type_errors(arg: str, bad: object) -> None:
    with pytest.raises(TypeError, match=arg):
        ConvParams.for_tensors(x(1, 2, 5, 5), x(2, 1, 3, 3), **{arg: bad})


@given(
    st.integers(1, 3).flatmap(lambda dim: st.tuples(
        st.just(dim),
        st.lists(st.integers(1, 4), min_size=dim + 2, max_size=dim + 2),
        st.lists(st.integers(1, 3), min_size=dim + 2, max_size=dim + 2),
        st.sampled_from(["input", "weight", "bias"]),
        st.integers(0, dim + 1),
        st.integers(-5, -1),
    ))
)
def test_negative_sizes_are_rejected_naming_the_tensor(case: tuple) -> None:
    dim, input_shape, weight_shape, which, index, value = case
    shapes = {"input": list(input_shape), "weight": list(weight_shape), "bias": [weight_shape[0]]}
    shapes[which][min(index, len(shapes[which]) - 1)] = value
    p = ConvParams.create(dim)
    with pytest.raises(ValueError, match=which):
        p.check_shapes(shapes["input"], shapes["weight"], shapes["bias"])


@pytest.mark.parametrize("transposed", [False, True])
def test_zero_kernel_and_negative_channels_are_rejected(transposed: bool) -> None:
    p = ConvParams.create(2, transposed=transposed)
    with pytest.raises(ValueError, match="weight"):
        p.check_shapes((1, 2, 5, 5), (2, 2, 0, 3))
    with pytest.raises(ValueError, match="input"):
        p.check_shapes((1, -2, 5, 5), (2, 2, 3, 3))
    with pytest.raises(ValueError, match="weight"):
        p.check_shapes((1, 2, 5, 5), (-2, 2, 3, 3))
