"""convlab.aten.buffers.check_out_buffers: every real overlap and unsafe resize is refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.aten.buffers import check_out_buffers


def _addresses(t: torch.Tensor) -> set[int]:
    """Byte addresses of every element of ``t`` (brute force)."""
    if t.numel() == 0:
        return set()
    base = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    index = torch.zeros(t.shape, dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[dim] = size
        index = index + (torch.arange(size) * stride).view(shape)
    return {base + int(i) * t.element_size() for i in index.flatten()}


view_spec = st.tuples(
    st.integers(0, 20),  # storage offset
    st.lists(st.tuples(st.integers(1, 4), st.integers(1, 6)), min_size=1, max_size=3),
)


def _view(storage: torch.Tensor, spec) -> torch.Tensor:
    offset, dims = spec
    sizes = [s for s, _ in dims]
    strides = [st_ for _, st_ in dims]
    return storage.as_strided(sizes, strides, offset)


@given(out=view_spec, inp=view_spec)
def test_any_shared_element_is_refused(out, inp) -> None:
    storage = torch.zeros(200)
    o, i = _view(storage, out), _view(storage, inp)
    shares = bool(_addresses(o) & _addresses(i))
    try:
        check_out_buffers({"out": (o, tuple(o.shape))}, {"input": i})
    except ValueError as exc:
        assert "out" in str(exc)
        return
    assert not shares, "an output sharing elements with an input was accepted"


@given(a=view_spec, b=view_spec)
def test_separate_storages_never_conflict(a, b) -> None:
    o, i = _view(torch.zeros(200), a), _view(torch.zeros(200), b)
    if torch._debug_has_internal_overlap(o) == 1:
        return  # refused for its own sake (see the next test)
    check_out_buffers({"out": (o, tuple(o.shape))}, {"input": i})


def test_internal_overlap_and_resized_views_are_refused() -> None:
    with pytest.raises(ValueError, match="out has internal overlap"):
        check_out_buffers({"out": (torch.zeros(1).expand(4), (4,))}, {})
    big = torch.zeros(100)
    with pytest.raises(ValueError, match="out has shape \\[10\\], not \\[20\\].*view"):
        check_out_buffers({"out": (big[:10], (20,))}, {})
    check_out_buffers({"out": (big[:10], (10,))}, {})  # the right shape: written in place
    owned = torch.empty(1000)
    check_out_buffers({"out": (owned, (20,))}, {"input": torch.zeros(3)})  # its own storage


def test_a_resized_buffer_may_not_share_storage_with_an_input() -> None:
    x = torch.zeros(10)
    with pytest.raises(ValueError, match="out shares memory with input"):
        check_out_buffers({"out": (x, (2, 5, 1))}, {"input": x[5:]})


def test_outputs_are_checked_against_each_other() -> None:
    shared = torch.zeros(10)
    outs = {"a": (shared[:6], (6,)), "b": (shared[5:], (5,))}
    with pytest.raises(ValueError, match="a shares memory with b"):
        check_out_buffers(outs, {})
    check_out_buffers({"a": (shared[:5], (5,)), "b": (shared[5:], (5,))}, {})


def test_inference_tensors_are_refused_outside_inference_mode() -> None:
    with torch.inference_mode():
        buf = torch.zeros(3)
    with pytest.raises(ValueError, match="out is an inference tensor"):
        check_out_buffers({"out": (buf, (3,))}, {})
    with torch.inference_mode():
        check_out_buffers({"out": (buf, (3,))}, {})


@pytest.mark.parametrize("how", ["detach", "data"])
def test_a_detached_window_of_the_wrong_shape_is_refused(how) -> None:
    """Regression (issue 21 D3): ``big[10:12].detach()`` has no ``_base`` and passed."""
    big = torch.zeros(100)
    window = getattr(big[10:12], how)() if how == "detach" else big[10:12].data
    with pytest.raises(ValueError, match="out has shape \\[2\\], not \\[20\\]"):
        check_out_buffers({"out": (window, (20,))}, {})


def test_a_shrunk_buffer_may_shrink_again_but_not_grow_past_itself() -> None:
    buf = torch.empty(100).resize_(10)  # its storage still holds 100 floats
    check_out_buffers({"out": (buf, (5,))}, {})
    with pytest.raises(ValueError, match="out has shape \\[10\\], not \\[50\\]"):
        check_out_buffers({"out": (buf, (50,))}, {})


@given(spec=view_spec, how=st.sampled_from(["view", "detach", "data"]),
       need=st.lists(st.integers(0, 30), min_size=1, max_size=2))
def test_an_accepted_resize_writes_only_inside_the_buffer(spec, how, need) -> None:
    """Class of D2/D3: windows whose storage is larger than their view. Whatever the check
    accepts, resizing and filling the buffer changes no element of ``big`` outside it."""
    big = torch.zeros(200)
    window = _view(big, spec)
    buf = {"view": window, "detach": window.detach(), "data": window.data}[how]
    inside = _addresses(buf)
    try:
        check_out_buffers({"out": (buf, tuple(need))}, {})
    except ValueError as exc:
        assert "out" in str(exc)
        return
    ptr = big.untyped_storage().data_ptr()
    buf.resize_(need).fill_(1.0)
    if big.untyped_storage().data_ptr() != ptr:
        return  # reallocated: only a buffer spanning all of big's storage may do that
    changed = {ptr + 4 * int(i) for i in torch.nonzero(big.flatten()).flatten()}
    assert changed <= inside
