"""Checks for caller-provided output buffers (``out=`` tensors) before a kernel writes them.

ATen's out= kernels resize a buffer whose shape is wrong and then write into it. Two things
can then go silently wrong, and :func:`check_out_buffers` rejects both before any work:

* **overlap**: an output shares memory with an input or another output, so the kernel
  reads what it has already overwritten (ATen's ``assert_no_overlap`` guards its own
  out= ops the same way);
* **resizing a window**: ``resize_`` keeps the storage when it is big enough, so a view
  such as ``big[:10]`` (or its ``.detach()``, or ``.data``, which share the storage
  without being views) grown to the needed size writes over ``big`` outside the window.

Buffers are plain memory with no locking: do not hand the same buffer to calls running in
two threads at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from convlab.scratch.storage import resize_refusal, safe_to_resize, spans_storage


def _byte_range(t: torch.Tensor, shape: Sequence[int] | None = None) -> tuple[int, int] | None:
    """``[start, end)`` bytes ``t`` touches (with ``shape``: after a contiguous resize)."""
    size = t.element_size()
    start = t.untyped_storage().data_ptr() + t.storage_offset() * size
    if shape is not None and tuple(shape) != tuple(t.shape):
        numel = math.prod(shape)
        if numel == 0:
            return None
        if spans_storage(t):  # may grow its storage: it covers at least all of it
            return start, start + max(numel * size, t.untyped_storage().nbytes())
        return start, start + numel * size
    if t.numel() == 0:
        return None
    lo = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if s > 0)
    return start + lo * size, start + (hi + 1) * size


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0


def _intersect(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def check_out_buffers(
    outputs: Mapping[str, tuple[torch.Tensor, Sequence[int]]],
    inputs: Mapping[str, torch.Tensor],
) -> None:
    """Raise ``ValueError`` unless every output buffer can be written safely.

    ``outputs`` maps argument names to ``(buffer, required_shape)``; ``inputs`` maps names
    to the tensors the kernel reads. Rejected, with both argument names in the message:

    * an output overlapping an input or another output (by memory range, after the resize
      a wrong-shaped buffer will get);
    * a wrong-shaped output whose resize could write outside it: decided from its storage
      (:func:`convlab.scratch.storage.safe_to_resize`, the rule :mod:`convlab.scratch.thnn`
      uses too), so a ``big[10:12].detach()`` or ``.data`` window is refused like a view,
      and one sharing its storage with a given tensor is refused as an alias;
    * an output with internal overlap (``expand``-ed), where one element is written twice;
    * an inference tensor outside ``torch.inference_mode`` (ATen would refuse the in-place
      write with an internal error).

    >>> x = torch.randn(2, 3)
    >>> check_out_buffers({"out": (x, (2, 3))}, {"input": x})
    Traceback (most recent call last):
    ...
    ValueError: out shares memory with input: an output may not alias an input
    """
    for name, (buf, shape) in outputs.items():
        if buf.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(
                f"{name} is an inference tensor (made under torch.inference_mode) and cannot "
                "be written outside inference mode: allocate it outside, or call this inside "
                "torch.inference_mode()"
            )
        resized = tuple(shape) != tuple(buf.shape)
        if resized and not safe_to_resize(buf, shape):
            raise ValueError(resize_refusal(name, buf, shape))
        if not resized and buf.numel() and torch._debug_has_internal_overlap(buf) == 1:
            raise ValueError(f"{name} has internal overlap (e.g. an expanded tensor)")
    names = list(outputs)
    for i, name in enumerate(names):
        buf, shape = outputs[name]
        span = _byte_range(buf, shape)
        resized = tuple(shape) != tuple(buf.shape)
        others = {n: (t, None) for n, t in inputs.items()}
        others.update({n: outputs[n] for n in names[i + 1:]})
        for other, (t, other_shape) in others.items():
            if not _same_storage(buf, t):
                continue
            if resized or _intersect(span, _byte_range(t, other_shape)):
                kind = "an input" if other in inputs else "another output"
                raise ValueError(
                    f"{name} shares memory with {other}: an output may not alias {kind}"
                )
