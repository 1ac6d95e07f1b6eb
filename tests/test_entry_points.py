"""One validation (ConvParams) for every convlab entry point: 1-3 spatial dims, int64 limits.

Issue 21 D7 (a 4-d spatial convolution was accepted, then failed with ``KeyError: 4``) and
D8 (values beyond int64 reached torch, whose message carries C++ frames; ``make_conv``
lacked the reference's int64 check). Each entry point must raise a ``ValueError`` naming
the argument before any work.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from convlab import autograd as cla
from convlab.aten import dispatch, native
from convlab.scratch import numpy_ref, per_sample, reference, thnn
from convlab.scratch.params import INT64_MAX, ConvParams

F64 = torch.float64
BIG = INT64_MAX + 1


def _tensors(dim: int):
    x = torch.randn(1, 2, *([4] * dim), dtype=F64)
    w = torch.randn(3, 2, *([2] * dim), dtype=F64)
    return x, w


def _go(x, w, **kw):
    p = ConvParams.create(w.dim() - 2, **kw)
    try:
        shape = p.output_shape(tuple(x.shape), tuple(w.shape))
    except ValueError:
        shape = (1, 3, *([1] * (w.dim() - 2)))
    return torch.randn([max(1, min(int(s), 4)) for s in shape], dtype=F64)


# Each entry point as f(dim, **hyper-parameters); the tensors have `dim` spatial dims.
def _args(kw):
    return [kw.get(k, d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1),
                                      ("transposed", False), ("output_padding", 0),
                                      ("groups", 1))]


def _reference(dim, **kw):
    x, w = _tensors(dim)
    return reference.convolution(x, w, None, *_args(kw))


def _reference_backward(dim, **kw):
    x, w = _tensors(dim)
    args = _args(kw)
    return reference.convolution_backward(_go(x, w, **kw), x, w, None, *args, [True] * 3)


def _native_backward(dim, **kw):
    x, w = _tensors(dim)
    args = _args(kw)
    return native.convolution_backward(_go(x, w, **kw), x, w, None, *args, [True] * 3)


def _numpy(dim, **kw):
    x, w = _tensors(dim)
    kw.pop("transposed", None)
    kw.pop("output_padding", None)
    return numpy_ref.convolution(x.numpy(), w.numpy(), None, **kw)


def _function(dim, **kw):
    x, w = _tensors(dim)
    return cla.convolution(x, w, None, **kw)


def _op(dim, **kw):
    x, w = _tensors(dim)
    return cla.convolution_op(x, w, None, **kw)


def _make_conv(dim, **kw):
    return dispatch.make_conv([1, 2, *([4] * dim)], [3, 2, *([2] * dim)], **kw)


def _per_sample(dim, **kw):
    x, w = _tensors(dim)
    kw.pop("transposed", None)
    kw.pop("output_padding", None)
    return per_sample.per_sample_weight_grad(x, tuple(w.shape), _go(x, w, **kw), **kw)


def _thnn(dim, **kw):
    x, w = _tensors(dim)
    if dim != 2 or set(kw) - {"stride", "padding"}:
        pytest.skip("thnn is 2-d with stride and padding only")
    return thnn.conv2d_forward(x, w, 2, None, kw.get("stride", 1), kw.get("padding", 0))


ENTRY_POINTS = {
    "reference.convolution": _reference,
    "reference.convolution_backward": _reference_backward,
    "native.convolution_backward": _native_backward,
    "numpy_ref.convolution": _numpy,
    "autograd.convolution": _function,
    "autograd.convolution_op": _op,
    "dispatch.make_conv": _make_conv,
    "per_sample.per_sample_weight_grad": _per_sample,
    "thnn.conv2d_forward": _thnn,
}

BEYOND_INT64 = [
    ({"stride": BIG}, "stride"),
    ({"stride": [1, BIG]}, "stride"),
    ({"padding": BIG}, "padding"),
    ({"padding": 10**20}, "padding"),
    ({"dilation": BIG}, "dilation"),
    ({"stride": -BIG}, "stride"),
]


@pytest.mark.parametrize("change, name", BEYOND_INT64, ids=lambda v: str(v)[:24])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_values_beyond_int64_are_refused_naming_the_argument(entry, change, name) -> None:
    """Regression (D8): every entry point refuses what ATen's int64 cannot hold."""
    with pytest.raises(ValueError, match=f"{name}=.*int64"):
        ENTRY_POINTS[entry](2, **change)


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if "thnn" not in e])
@pytest.mark.parametrize("dim", [4, 5])
def test_more_than_three_spatial_dims_is_refused(entry, dim) -> None:
    """Regression (D7): a 4-d spatial convolution is refused with a clear ValueError."""
    with pytest.raises(ValueError, match="1, 2 or 3 spatial dimensions|3, 4 or 5 dims"):
        ENTRY_POINTS[entry](dim)


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if "thnn" not in e])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_one_to_three_dims_still_work(entry, dim) -> None:
    ENTRY_POINTS[entry](dim)


def test_output_padding_and_groups_beyond_int64_are_refused() -> None:
    with pytest.raises(ValueError, match="output_padding=.*int64"):
        ConvParams.create(2, output_padding=BIG, transposed=True)
    with pytest.raises(ValueError, match="groups=.*int64"):
        ConvParams.create(2, groups=BIG)


def test_an_output_beyond_int64_elements_is_refused() -> None:
    p = ConvParams.create(1, stride=2**62, transposed=True)
    with pytest.raises(ValueError, match="int64 elements"):
        p.check_shapes((1, 2, 5), (2, 3, 1))


def test_the_int64_limit_itself_passes_create() -> None:
    ConvParams.create(2, padding=INT64_MAX)  # fits: refused later for its output, not here
    assert np.int64(INT64_MAX) == INT64_MAX
