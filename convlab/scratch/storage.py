"""When may a caller's buffer be resized in place: one ownership rule, from the storage itself.

``Tensor.resize_`` keeps the storage when it is large enough and writes the new contiguous
shape from the tensor's storage offset. A buffer handed in by a caller may be a window on
a bigger tensor even when it does not look like a view: ``big[:10].detach()`` and
``big[:10].data`` have ``_base is None`` and ``_is_view() == False``, yet share ``big``'s
storage. Resizing such a buffer overwrites ``big`` outside the window.

So the rule looks at the storage, not at the autograd view bookkeeping:
:func:`safe_to_resize` allows a resize only when every byte it will write is already
covered by the tensor, or when the tensor owns its storage (:func:`owns_storage`): it spans
the whole storage (then nothing but this tensor's own elements lives there), or convlab
itself shrank it there with :func:`resize_owned` (a workspace reused by a smaller layer
stays its own, so a bigger layer may grow it again in the same storage, as ``resize_`` let
PyTorch 1.9's ``finput`` do). Used by :mod:`convlab.scratch.thnn` and by
:mod:`convlab.aten.buffers` for ATen's ``out=`` kernels.

The record of shrunk buffers holds the tensor object weakly and the storage it had
(address and size): a ``.detach()``, ``.data`` or view of a shrunk buffer is another
tensor and is not trusted, nor is the buffer once its storage changed hands (``set_``,
a resize elsewhere). A tensor that someone builds on the spare part of such a storage with
``set_`` is not seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

# tensor (weakly) -> (storage address, storage bytes) it had when resize_owned shrank it
_SHRUNK: WeakIdKeyDictionary = WeakIdKeyDictionary()


def extent(t: torch.Tensor) -> int:
    """Elements of storage ``t`` spans from its offset: ``1 + sum((size-1)*stride)``, 0 if empty."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def spans_storage(t: torch.Tensor) -> bool:
    """True when ``t`` starts at offset 0 and its extent is its whole storage."""
    return (t.storage_offset() == 0
            and extent(t) * t.element_size() == t.untyped_storage().nbytes())


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def owns_storage(t: torch.Tensor) -> bool:
    """True when all of ``t``'s storage is ``t``'s to write: it spans the storage, or
    :func:`resize_owned` shrank this very tensor inside the storage it still has (and it
    is still contiguous from offset 0)."""
    if spans_storage(t):
        return True
    return (_SHRUNK.get(t) == _storage_key(t) and t.storage_offset() == 0
            and t.is_contiguous())


def safe_to_resize(t: torch.Tensor, shape: Sequence[int]) -> bool:
    """True when ``t.resize_(shape)`` writes only memory that is ``t``'s own.

    Either ``t`` owns its storage (:func:`owns_storage`: a resize may grow or reallocate
    it; no other tensor's elements are in it), or ``t`` is contiguous and the new shape
    needs no more elements than ``t`` has (the resize stays inside the elements ``t``
    already covers).
    """
    if owns_storage(t):
        return True
    return t.is_contiguous() and math.prod(shape) <= t.numel()


def resize_owned(t: torch.Tensor, shape: Sequence[int], name: str) -> torch.Tensor:
    """``t.resize_(shape)`` when :func:`safe_to_resize` allows it (else ValueError naming
    ``name``); a tensor that owned its storage keeps owning it after a shrink, so a later
    bigger shape reuses the same storage. Returns ``t``."""
    if not safe_to_resize(t, shape):
        raise ValueError(resize_refusal(name, t, shape))
    owned = owns_storage(t)
    t.resize_(shape)
    if owned and not spans_storage(t):
        _SHRUNK[t] = _storage_key(t)
    else:
        _SHRUNK.pop(t, None)
    return t


def resize_refusal(name: str, t: torch.Tensor, shape: Sequence[int]) -> str:
    """The message for a buffer :func:`safe_to_resize` refuses."""
    return (
        f"{name} has shape {list(t.shape)}, not {list(shape)}, and shares a storage of "
        f"{t.untyped_storage().nbytes()} bytes with memory outside it (a view, or a "
        f".detach() or .data of a slice): resizing it would write outside it; pass a "
        f"tensor of shape {list(shape)} or a fresh torch.empty(0)"
    )
