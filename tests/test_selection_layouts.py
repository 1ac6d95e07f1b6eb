"""Selection for every tensor layout ATen's ``_select_conv_backend`` takes, against ATen.

Issue 34 E1: a 1-d convolution whose input is an mkldnn-layout tensor is not viewed as 2-d
(``select_conv_backend`` skips the view for mkldnn and XPU inputs), so with oneDNN off it
reaches the "backends without support for groups" block with a 3-d input, where ATen raises
"unsupported ConvNd parameters". The mirror crashed with ``KeyError: 3`` (transposed) or
answered Slow2d/SlowDilated2d. The property test covers the class: every rank the block can
see (3, 4, 5), every layout (strided contiguous, channels_last, mkldnn), the flags and
transposed; the mirror and ATen agree, or both raise.
"""

from __future__ import annotations

import pytest
import torch
from backend_cases import backend_flags
from hypothesis import given, settings
from hypothesis import strategies as st

from convlab.aten import selection
from convlab.aten.backends import backend_name
from convlab.aten.conv_query import ConvQuery

LAYOUTS = ("contiguous", "channels_last", "mkldnn")


def _tensor(shape: list[int], layout: str) -> torch.Tensor:
    t = torch.zeros(shape)
    if layout == "mkldnn":
        return t.to_mkldnn()
    if layout == "channels_last" and len(shape) in (4, 5):
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        return t.to(memory_format=fmt)
    return t


def both(x: torch.Tensor, w: torch.Tensor, stride: int, dilation: int, transposed: bool,
         output_padding: int) -> tuple[str, str]:
    """(ATen's backend, the mirror's backend); ``"error"`` where one raises."""
    d = w.dim() - 2
    args = ([stride] * d, [0] * d, [dilation] * d, transposed, [output_padding] * d, 1)
    try:
        aten = backend_name(torch._C._select_conv_backend(x, w, None, *args))
    except RuntimeError:
        aten = "error"
    try:
        mine = selection.select(ConvQuery.from_tensors(x, w, None, *args)).backend
    except ValueError:
        mine = "error"
    return aten, mine


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dilation", [1, 2])
def test_1d_mkldnn_input_with_mkldnn_off_raises_like_aten(transposed, dilation):
    x, w = torch.zeros(2, 4, 10).to_mkldnn(), torch.zeros(4, 4, 3)
    with backend_flags(mkldnn=False, nnpack=True, threads=1):
        with pytest.raises(RuntimeError, match="unsupported ConvNd parameters"):
            torch._C._select_conv_backend(x, w, None, [1], [0], [dilation], transposed,
                                          [0], 1)
        with pytest.raises(ValueError, match="unsupported ConvNd parameters"):
            selection.select(ConvQuery.from_tensors(x, w, None, 1, 0, dilation, transposed))


def test_1d_mkldnn_input_with_mkldnn_on_selects_mkldnn_like_aten():
    x, w = torch.zeros(2, 4, 10).to_mkldnn(), torch.zeros(4, 4, 3)
    for transposed in (False, True):
        with backend_flags(mkldnn=True, nnpack=True, threads=1):
            aten, mine = both(x, w, 1, 1, transposed, 0)
        assert aten == mine == ("MkldnnTranspose" if transposed else "Mkldnn")


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("mkldnn", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ndim", [3, 4, 5])
@settings(max_examples=12)
@given(weight_layout=st.sampled_from(LAYOUTS[:2]), nnpack=st.booleans(),
       threads=st.sampled_from([1, 2]), n=st.sampled_from([0, 1, 2, 16]),
       channels=st.sampled_from([1, 3, 4]), kernel=st.sampled_from([1, 3]),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       output_padding=st.sampled_from([0, 1]))
def test_select_agrees_with_aten_for_every_rank_layout_and_flag(
        ndim, layout, mkldnn, transposed, weight_layout, nnpack, threads, n, channels, kernel,
        stride, dilation, output_padding):
    # the class is the grid (rank x layout x oneDNN flag x transposed), every cell run;
    # hypothesis varies the rest of the layer within each cell
    spatial = ndim - 2
    if not transposed or output_padding >= max(stride, dilation):
        output_padding = 0  # ATen's own argument check, before selection
    x = _tensor([n, channels, *[7] * spatial], layout)
    w = _tensor([channels, channels, *[kernel] * spatial], weight_layout)
    with backend_flags(mkldnn, nnpack, threads):
        aten, mine = both(x, w, stride, dilation, transposed, output_padding)
    assert aten == mine
