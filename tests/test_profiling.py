"""convlab.lab.method.profiling and convlab.aten.capture: process-wide state is serialised
and restored.

D11 (overlapping ``redirect_fd`` left stdout on a deleted file), D12 (tracemalloc left running
when the measured function raised), D13 (two threads in torch's profiler crash the process).
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

import pytest
import torch
import torch.nn.functional as F

from convlab.aten import capture
from convlab.lab.method import profiling


def _fd_target(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _run_threads(target, n: int) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def test_redirect_fd_rejects_a_bad_fd():
    with pytest.raises(ValueError, match="fd"), capture.redirect_fd(-1):
        pass


def _overlapping_redirects(redirect, tmp_path, fd: int) -> None:
    """Two threads redirect ``fd``; without a lock both get inside, and the one that entered
    first leaves first (not last-in first-out), which restored the second one's saved
    target: the first thread's file, deleted by then."""
    order: list[int] = []
    in_block = threading.Barrier(2, timeout=0.5)

    def body(i: int) -> None:
        with redirect(fd, str(tmp_path / f"log{i}")):
            order.append(i)
            try:  # with the lock the other thread cannot be inside at the same time
                in_block.wait()
            except threading.BrokenBarrierError:
                pass
            if order.index(i) == 1:
                time.sleep(0.1)  # the second to enter leaves last
            os.write(fd, b"x")

    errors = _run_threads(body, 2)
    assert not errors, errors


@pytest.mark.parametrize("fd", [1, 2])
def test_overlapping_redirects_from_threads_restore_stdout_and_stderr(tmp_path, fd):
    """Regression (D11): each thread's redirection restores exactly what it replaced."""
    before = _fd_target(1), _fd_target(2)
    _overlapping_redirects(capture.redirect_fd, tmp_path, fd)
    assert (_fd_target(1), _fd_target(2)) == before


def test_overlapping_onednn_traces_restore_stdout(tmp_path):
    """D11 as it was found: concurrent onednn_trace calls."""
    before = _fd_target(1), _fd_target(2)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    errors = _run_threads(lambda i: profiling.onednn_trace(lambda: F.conv2d(x, w)), 4)
    assert not errors, errors
    assert (_fd_target(1), _fd_target(2)) == before


def test_measure_memory_stops_tracemalloc_when_fn_raises():
    """D12."""
    assert not tracemalloc.is_tracing()

    def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        profiling.measure_memory(boom)
    assert not tracemalloc.is_tracing()
    with pytest.raises(RuntimeError, match="boom"):
        profiling.alloc_peak(boom, torch.device("cpu"))
    assert not tracemalloc.is_tracing()


def test_alloc_peak_leaves_running_tracemalloc_running():
    tracemalloc.start()
    try:
        peak = profiling.alloc_peak(lambda: torch.empty(2**16), torch.device("cpu"))
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert peak >= 2**16 * 4


@pytest.mark.parametrize("what", ["profile_ops", "measure_memory", "mixed"])
def test_concurrent_profiling_from_threads_is_serialised(what):
    """D13: torch's profiler is not re-entrant; convlab's callers take PROFILER_LOCK."""
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)

    def call() -> object:
        return F.conv2d(x, w)

    def body(i: int) -> None:
        pick = what if what != "mixed" else ("profile_ops", "measure_memory")[i % 2]
        for _ in range(3):
            if pick == "profile_ops":
                rows = profiling.profile_ops(call, repeat=1)
                assert any("conv" in r.name for r in rows)
            else:
                alloc, _ = profiling.measure_memory(call)
                assert alloc > 0

    errors = _run_threads(body, 4)
    assert not errors, errors
    assert not tracemalloc.is_tracing()


def test_profiler_lock_is_held_during_the_measured_call():
    seen: list[bool] = []

    def probe() -> object:
        # another thread cannot take the lock while we are being profiled
        got: list[bool] = []

        def try_lock() -> None:
            got.append(capture.PROFILER_LOCK.acquire(timeout=0.05))
            if got[0]:
                capture.PROFILER_LOCK.release()

        t = threading.Thread(target=try_lock)
        t.start()
        t.join()
        seen.append(got[0])
        return torch.zeros(1)

    profiling.profile_ops(probe, repeat=1)
    profiling.measure_memory(probe)
    assert seen and not any(seen[1:])  # the warm-up call of profile_ops runs unlocked
