"""Shared by test_backends, test_native and the selection tests: convolution cases, one
or more per CPU backend, a snapshot of the process-wide backend flags (no test may leave
them changed) and a block that sets the flags selection reads.

Each row: (expected backend, input shape, weight shape, options for :func:`make_case`,
forced backend name or None).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

F64 = torch.float64


def flags_now() -> tuple:
    """The global flags that forcing a backend touches."""
    return (
        torch.backends.mkldnn.enabled,
        torch._C._get_nnpack_enabled(),
        torch.backends.cudnn.enabled,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


@contextmanager
def backend_flags(mkldnn: bool, nnpack: bool, threads: int) -> Iterator[None]:
    """The oneDNN and NNPACK flags and the thread count set for a block, restored after."""
    old = (torch._C._get_mkldnn_enabled(), torch._C._get_nnpack_enabled(),
           torch.get_num_threads())
    torch._C._set_mkldnn_enabled(mkldnn)
    torch._C._set_nnpack_enabled(nnpack)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(old[0])
        torch._C._set_nnpack_enabled(old[1])
        torch.set_num_threads(old[2])


def make_case(shape_x, shape_w, dtype=F64, transposed=False, stride=1, padding=0, dilation=1,
          output_padding=0, groups=1, bias=True):
    x = torch.randn(*shape_x, dtype=dtype)
    w = torch.randn(*shape_w, dtype=dtype)
    out_ch = shape_w[1] * groups if transposed else shape_w[0]
    b = torch.randn(out_ch, dtype=dtype) if bias else None
    return x, w, b, dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                         output_padding=output_padding, groups=groups)


# (expected backend, input shape, weight shape, options, forced backend name or None)
CPU_BACKEND_CASES = [
    ("Slow2d", (2, 4, 9, 9), (6, 4, 3, 3), {}, None),
    ("Slow2d", (2, 4, 9), (6, 4, 3), {}, None),  # fp64 conv1d is viewed as 2-d
    ("SlowDilated2d", (2, 4, 9, 9), (6, 4, 3, 3), {"dilation": 2}, None),
    ("SlowTranspose2d", (2, 4, 5, 5), (4, 3, 3, 3), {"transposed": True, "stride": 2}, None),
    ("Slow3d", (2, 4, 5, 6, 5), (6, 2, 3, 3, 2), {"groups": 2, "stride": (1, 2, 1)}, None),
    ("SlowDilated3d", (1, 2, 7, 7, 7), (3, 2, 3, 3, 3), {"dilation": 2}, None),
    ("SlowTranspose3d", (1, 2, 4, 4, 4), (2, 3, 2, 2, 2), {"transposed": True, "stride": 2}, None),
    ("Empty", (0, 4, 9, 9), (6, 4, 3, 3), {}, None),
    ("Mkldnn", (2, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, None),
    ("MkldnnTranspose", (2, 4, 5, 5), (4, 3, 3, 3),
     {"dtype": torch.float32, "transposed": True, "stride": 2, "output_padding": 1}, None),
    ("Slow2d", (2, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "slow"),
    ("NnpackSpatial", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "nnpack"),
    ("NnpackSpatial", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32, "stride": 2},
     "nnpack"),
    ("Slow2d", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "slow"),
]
