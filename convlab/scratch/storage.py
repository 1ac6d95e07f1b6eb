"""When may a caller's buffer be resized in place: one ownership rule, from the storage itself.

``Tensor.resize_`` keeps the storage when it is large enough and writes the new contiguous
shape from the tensor's storage offset. A buffer handed in by a caller may be a window on
a bigger tensor even when it does not look like a view: ``big[:10].detach()`` and
``big[:10].data`` have ``_base is None`` and ``_is_view() == False``, yet share ``big``'s
storage. Resizing such a buffer overwrites ``big`` outside the window.

So the rule looks at the storage, not at the autograd view bookkeeping:
:func:`safe_to_resize` allows a resize only when every byte it will write is already
covered by the tensor, or when the tensor spans its whole storage (then nothing but this
tensor's own elements lives there). Used by :mod:`convlab.scratch.thnn` and by
:mod:`convlab.aten.buffers` for ATen's ``out=`` kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def extent(t: torch.Tensor) -> int:
    """Elements of storage ``t`` spans from its offset: ``1 + sum((size-1)*stride)``, 0 if empty."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def spans_storage(t: torch.Tensor) -> bool:
    """True when ``t`` starts at offset 0 and its extent is its whole storage."""
    return (t.storage_offset() == 0
            and extent(t) * t.element_size() == t.untyped_storage().nbytes())


def safe_to_resize(t: torch.Tensor, shape: Sequence[int]) -> bool:
    """True when ``t.resize_(shape)`` writes only memory that is ``t``'s own.

    Either ``t`` spans its whole storage (a resize may grow or reallocate it; no other
    tensor's elements are in it), or ``t`` is contiguous and the new shape needs no more
    elements than ``t`` has (the resize stays inside the elements ``t`` already covers).
    """
    if spans_storage(t):
        return True
    return t.is_contiguous() and math.prod(shape) <= t.numel()


def resize_refusal(name: str, t: torch.Tensor, shape: Sequence[int]) -> str:
    """The message for a buffer :func:`safe_to_resize` refuses."""
    return (
        f"{name} has shape {list(t.shape)}, not {list(shape)}, and shares a storage of "
        f"{t.untyped_storage().nbytes()} bytes with memory outside it (a view, a .detach() "
        f"or .data of a slice, or a shrunk buffer): resizing it would write outside it; pass a "
        f"tensor of shape {list(shape)} or a fresh torch.empty(0)"
    )
