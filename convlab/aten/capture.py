"""Process-wide capture state, serialised: torch's profiler and C-level stdout/stderr.

Two things convlab's measuring code touches are global to the process, not to a thread:

* torch's profiler (kineto) is not re-entrant: two threads profiling at once can crash the
  process. Every ``torch.profiler.profile`` convlab opens runs under ``PROFILER_LOCK``.
* a file descriptor (1 = stdout, 2 = stderr) belongs to the process: two threads that
  redirect it with overlapping lifetimes restore each other's targets in the wrong order and
  leave stdout pointing at a deleted file. :func:`redirect_fd` holds the same lock.

One re-entrant lock for both, so that no order of taking them can deadlock and a profiler
block may redirect stderr (kineto logs there from C++).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator

PROFILER_LOCK = threading.RLock()
"""Held by every convlab call that runs torch's profiler or redirects a file descriptor."""


@contextlib.contextmanager
def redirect_fd(fd: int, target: str = os.devnull) -> Iterator[None]:
    """Send what C code writes to file descriptor ``fd`` to ``target`` inside the block.

    torch.profiler's kineto and oneDNN's verbose mode print from C, past ``sys.stdout``.
    Holds ``PROFILER_LOCK`` for the whole block, so concurrent redirections from other
    threads wait and each restores exactly what it replaced.
    """
    if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
        raise ValueError(f"fd must be a non-negative int file descriptor, got {fd!r}")
    with PROFILER_LOCK:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = os.dup(fd)
        try:
            with open(target, "wb") as sink:
                os.dup2(sink.fileno(), fd)
                try:
                    yield
                finally:
                    _flush_c_streams()
                    os.dup2(saved, fd)
        finally:
            os.close(saved)


def _flush_c_streams() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
