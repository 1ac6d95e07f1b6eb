"""convlab.scratch.storage: which buffers may be resized in place (E9 and the round-3 rule).

A workspace that convlab itself shrank for a smaller layer is still its storage's owner and
grows back in the same storage (PyTorch 1.9's ``resize_`` reuse); a window on another
tensor's storage (a view, a ``.detach()`` or ``.data`` of a slice) is never resized past
its own elements.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.scratch.storage import owns_storage, resize_owned, safe_to_resize

F64 = torch.float64
WINDOWS = {"view": lambda t: t, "detach": lambda t: t.detach(), "data": lambda t: t.data}


def ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_large_small_mid_large_keeps_one_storage() -> None:
    buf = torch.empty(0, dtype=F64)
    resize_owned(buf, (1000,), "buf")
    first = ptr(buf)
    for n in (10, 500, 1000, 3, 999):
        assert resize_owned(buf, (n,), "buf") is buf
        assert buf.shape == (n,) and ptr(buf) == first and owns_storage(buf)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=10))
def test_a_workspace_reuses_its_storage_for_every_size_that_fits(sizes: list[int]) -> None:
    """Class property: after any sequence of sizes, a size within the storage reuses it
    (same address); only a bigger one reallocates, and the buffer keeps owning it."""
    buf = torch.empty(0, dtype=F64)
    for n in sizes:
        before, capacity = ptr(buf), buf.untyped_storage().nbytes() // 8
        resize_owned(buf, (n,), "buf")
        assert buf.shape == (n,) and owns_storage(buf)
        if 0 < n <= capacity:
            assert ptr(buf) == before


@pytest.mark.parametrize("how", sorted(WINDOWS))
def test_a_window_of_a_shrunk_buffer_is_not_its_owner(how: str) -> None:
    """Only the tensor convlab shrank is trusted: a view, .detach() or .data of it is another
    tensor on the same storage and may not grow over the buffer's spare memory."""
    buf = torch.full((100,), 5.0, dtype=F64)
    resize_owned(buf, (10,), "buf")
    other = WINDOWS[how](buf[:4] if how == "view" else buf)
    assert not owns_storage(other)
    with pytest.raises(ValueError, match="finput has shape .* shares a storage"):
        resize_owned(other, (50,), "finput")
    assert torch.equal(buf.new_empty(0).set_(buf.untyped_storage()),
                       torch.full((100,), 5.0, dtype=F64))


def test_a_buffer_the_caller_shrank_is_a_window_like_any_slice() -> None:
    """``buf.resize_(10)`` by the caller looks exactly like ``big[:10].detach()`` (offset 0,
    contiguous, a bigger storage): convlab cannot tell them apart, so it refuses both."""
    buf = torch.empty(100, dtype=F64)
    buf.resize_(10)
    assert not safe_to_resize(buf, (50,)) and safe_to_resize(buf, (10,))


def test_a_shrunk_buffer_whose_storage_changed_is_no_longer_trusted() -> None:
    buf = torch.empty(100, dtype=F64)
    resize_owned(buf, (10,), "buf")
    assert owns_storage(buf)
    big = torch.empty(1000, dtype=F64)
    buf.set_(big.untyped_storage(), 0, (10,))  # now a window on big
    assert not owns_storage(buf)
    with pytest.raises(ValueError, match="shares a storage"):
        resize_owned(buf, (50,), "buf")


@given(st.integers(0, 200), st.integers(1, 300), st.sampled_from(sorted(WINDOWS)),
       st.lists(st.integers(0, 400), min_size=1, max_size=5))
def test_windows_on_a_bigger_tensor_are_never_written_outside(start: int, length: int, how: str,
                                                              sizes: list[int]) -> None:
    """Round-3 rule, as a property: resizing a window on ``big`` to any sizes either stays
    inside the window or is refused; the rest of ``big`` keeps its values."""
    big = torch.full((600,), 5.0, dtype=F64)
    window = WINDOWS[how](big[start:start + length])
    for n in sizes:
        try:
            resize_owned(window, (n,), "buf")
        except ValueError:
            pass
        window.fill_(-1.0)
    outside = torch.cat([big[:start], big[start + length:]])
    assert (outside == 5).all() and big.shape == (600,)
