"""convlab.aten.backends against ATen: backend names, selection, forcing (also from threads)."""

from __future__ import annotations

import itertools
import re
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from backend_cases import CPU_BACKEND_CASES, flags_now
from backend_cases import make_case as _case

from convlab.aten import backends, native
from convlab.aten.backends import (
    CONV_BACKENDS,
    BackendMismatch,
    available_backends,
    backend_name,
    select_backend,
    use_backend,
)

F64 = torch.float64


def raw_backend(x, w, b, stride, padding, dilation, transposed, output_padding, groups) -> str:
    """ATen's own answer, mapped by enum value (independent of convlab's argument handling)."""
    value = torch._C._select_conv_backend(
        x, w, b, stride, padding, dilation, transposed, output_padding, groups
    )
    return CONV_BACKENDS[int(value)]


@pytest.fixture(autouse=True)
def _flags_and_threads_restored():
    """Every test leaves global flags and the thread count as it found them."""
    before, threads = flags_now(), torch.get_num_threads()
    yield
    assert flags_now() == before, "a test (or convlab) leaked backend flags"
    assert torch.get_num_threads() == threads


# --- enum names ------------------------------------------------------------------------------


def test_names_match_the_installed_conv_utils_header() -> None:
    header = Path(torch.__file__).parent / "include/ATen/native/ConvUtils.h"
    body = re.search(r"enum class ConvBackend \{(.*?)\};", header.read_text(), re.S)
    assert body is not None, f"no ConvBackend enum in {header}"
    names = [n.strip() for n in body.group(1).split(",") if n.strip()]
    assert tuple(names) == CONV_BACKENDS


def test_names_agree_with_the_python_enum_and_fix_its_quirks() -> None:
    members = torch._C._ConvBackend.__members__
    for member_name, member in members.items():
        assert backend_name(member) == member_name.rstrip(",")
    assert "MpsTranspose," in members  # the binding's typo, mapped to "MpsTranspose"
    assert backend_name(22) == "MpsTranspose"
    assert "???" in str(torch._C._ConvBackend(9))  # no name in the binding
    assert backend_name(torch._C._ConvBackend(9)) == "MkldnnTranspose"
    with pytest.raises(ValueError, match="99"):
        backend_name(99)


# --- select_backend --------------------------------------------------------------------------


def _available(forced: str | None) -> bool:
    return forced is None or forced in available_backends("cpu")


@pytest.mark.parametrize("expected, xs, ws, opts, forced", CPU_BACKEND_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CPU_BACKEND_CASES)])
def test_select_backend_gives_the_documented_backend(expected, xs, ws, opts, forced) -> None:
    if not _available(forced):
        pytest.skip(f"{forced} is not built into this torch")  # only NNPACK-less builds
    if expected.startswith("Mkldnn") and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    x, w, b, kw = _case(xs, ws, **opts)
    if forced is None:
        got = select_backend(x, w, b, **kw)
    else:
        with use_backend(forced, x, w, b, **kw) as got:
            pass
    assert got == expected


def test_mkldnn_disabled_falls_back_to_nnpack_then_slow() -> None:
    x, w, b, kw = _case((16, 4, 9, 9), (6, 4, 3, 3), dtype=torch.float32)
    saved = torch.backends.mkldnn.enabled
    try:
        torch.backends.mkldnn.enabled = False
        expect = "NnpackSpatial" if torch.backends.nnpack.is_available() else "Slow2d"
        assert select_backend(x, w, b, **kw) == expect
        with torch.backends.nnpack.flags(enabled=False):
            assert select_backend(x, w, b, **kw) == "Slow2d"
        assert select_backend(x[:2], w, b, **kw) == "Slow2d"  # N < 16: no NNPACK either
    finally:
        torch.backends.mkldnn.enabled = saved


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_thread_count_flips_a_pointwise_batch_one_conv() -> None:
    x = torch.randn(1, 64, 32, 32)  # N*C*H*W = 65536 > 20480, kernel 1x1, stride 1, N = 1
    w = torch.randn(64, 64, 1, 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert select_backend(x, w) == "Slow2d"
        torch.set_num_threads(2)
        assert select_backend(x, w) == "Mkldnn"
    finally:
        torch.set_num_threads(threads)


def test_meta_tensors_select_overrideable() -> None:
    x = torch.randn(2, 3, 8, 8, device="meta")
    w = torch.randn(4, 3, 3, 3, device="meta")
    assert select_backend(x, w) == "Overrideable"


GRID = list(itertools.product(
    [torch.float32, F64],  # dtype
    [1, 2],  # stride
    [0, 1],  # padding
    [1, 2],  # dilation
    [1, 2],  # groups
    [False, True],  # transposed
    [2, 3],  # spatial dims
))


@pytest.mark.parametrize("mkldnn", [True, False])
def test_select_backend_agrees_with_aten_on_a_grid(mkldnn: bool) -> None:
    saved = torch.backends.mkldnn.enabled
    seen = set()
    try:
        torch.backends.mkldnn.enabled = mkldnn
        for dtype, s, p, d, g, t, dim in GRID:
            xs = (2, 4) + (7,) * dim
            ws = ((4, 6 // g) if t else (6, 4 // g)) + (3,) * dim
            x, w, b, kw = _case(xs, ws, dtype=dtype, transposed=t, stride=s, padding=p,
                                dilation=d, groups=g, output_padding=1 if t and s > 1 else 0)
            got = select_backend(x, w, b, **kw)
            want = raw_backend(x, w, b, [s] * dim, [p] * dim, [d] * dim, t,
                               [kw["output_padding"]] * dim, g)
            assert got == want, (dtype, s, p, d, g, t, dim)
            seen.add(got)
    finally:
        torch.backends.mkldnn.enabled = saved
    assert len(seen) >= 5, seen  # the grid really exercises several backends


def test_select_backend_accepts_ints_and_sequences_and_validates() -> None:
    x, w = torch.randn(1, 4, 9, 9, dtype=F64), torch.randn(6, 2, 3, 3, dtype=F64)
    assert select_backend(x, w, None, 2, [1], (1, 1), False, 0, 2) == "Slow2d"
    with pytest.raises(ValueError, match="groups=3 must divide"):
        select_backend(x, w, groups=3)
    with pytest.raises(ValueError, match="stride"):
        select_backend(x, w, stride=(1, 2, 3), groups=2)
    with pytest.raises(TypeError, match="weight has dtype"):
        select_backend(x, w.float(), groups=2)


def test_backend_memory_format_follows_the_layout_rules() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    cl = x.to(memory_format=torch.channels_last)
    fmt = backends.backend_memory_format
    assert fmt(x, w, "Slow2d") == torch.contiguous_format
    assert fmt(cl, w, "Slow2d") == torch.channels_last
    assert fmt(cl, w, "Mkldnn") == torch.channels_last
    assert fmt(cl, w, "Slow3d") == torch.contiguous_format  # no channels_last slow 3-d kernel
    x5 = torch.randn(1, 2, 4, 4, 4).to(memory_format=torch.channels_last_3d)
    assert fmt(x5, torch.randn(3, 2, 2, 2, 2), "Mkldnn") == torch.channels_last_3d
    with pytest.raises(ValueError, match="unknown backend 'Fast'"):
        fmt(x, w, "Fast")

# --- use_backend -----------------------------------------------------------------------------


def test_unknown_backend_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="valid names: mkldnn, slow, nnpack, cudnn"):
        with use_backend("cudaa"):
            pass
    with pytest.raises(TypeError, match="backend must be a str"):
        with use_backend(3):  # type: ignore[arg-type]
            pass


def test_cudnn_on_cpu_tensors_raises() -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    for name in ("cudnn", "cudnn-deterministic", "cudnn-benchmark"):
        with pytest.raises(ValueError, match=f"backend '{name}' is not available"):
            with use_backend(name, x, w):
                pass
    if not torch.cuda.is_available():
        assert "cudnn" not in available_backends("cpu")
        with pytest.raises(ValueError, match="no CUDA device"):
            with use_backend("cudnn"):
                pass


def test_mkldnn_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert "mkldnn" not in available_backends("cpu")
    with pytest.raises(ValueError, match="built without oneDNN"):
        with use_backend("mkldnn"):
            pass


def test_forcing_a_backend_that_cannot_serve_the_inputs_raises() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    with pytest.raises(BackendMismatch) as info:
        with use_backend("mkldnn", x, w):
            pass
    assert (info.value.requested, info.value.chosen) == ("mkldnn", "Slow2d")
    assert "Mkldnn" in info.value.expected and isinstance(info.value, ValueError)
    if "nnpack" in available_backends("cpu"):
        with pytest.raises(BackendMismatch) as info:  # N=2 < 16
            with use_backend("nnpack", x.float(), w.float()):
                pass
        assert info.value.chosen == "Slow2d"


def test_flags_are_set_inside_and_restored_after_an_exception() -> None:
    before = flags_now()
    with pytest.raises(RuntimeError, match="boom"):
        with use_backend("slow"):
            assert torch.backends.mkldnn.enabled is False
            assert torch._C._get_nnpack_enabled() is False
            assert torch.backends.cudnn.enabled is False
            raise RuntimeError("boom")
    assert flags_now() == before


def test_nested_forcing_restores_each_level() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with use_backend("slow", x, w) as outer:
        with use_backend("mkldnn", x, w) as inner:
            assert select_backend(x, w) == "Mkldnn"
        assert select_backend(x, w) == "Slow2d"
    assert (outer, inner) == ("Slow2d", "Mkldnn")


def test_use_backend_emits_no_warning() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in available_backends("cpu"):
            xs = x.repeat(8, 1, 1, 1) if name == "nnpack" else x
            with use_backend(name, xs, w):
                pass


def test_use_backend_needs_both_tensors() -> None:
    with pytest.raises(ValueError, match="both input and weight"):
        with use_backend("slow", torch.randn(1, 2, 5, 5)):
            pass


# --- bad arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["Slow2d", "13", 3.0, None, True])
def test_backend_name_rejects_non_enum_values_with_a_type_error(bad) -> None:
    with pytest.raises(TypeError, match="backend must be a torch._C._ConvBackend or an int"):
        backend_name(bad)


@pytest.mark.parametrize("which", ["input", "weight", "bias"])
def test_use_backend_rejects_non_tensors_before_touching_flags(which) -> None:
    x, w, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    args = {"input": x, "weight": w, "bias": b}
    args[which] = args[which].tolist()
    before = flags_now()
    with pytest.raises(TypeError, match=f"{which} must be a torch.Tensor"):
        with use_backend("slow", args["input"], args["weight"], args["bias"]):
            pass
    assert flags_now() == before


# --- threads ----------------------------------------------------------------------------------


def run_threads(worker, n: int) -> None:
    """Run ``worker(t)`` for t in range(n) on n threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            worker(t)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _thread_case(i: int) -> tuple:
    g = torch.Generator().manual_seed(i)
    dtype = (torch.float32, F64)[i % 2]
    x = torch.randn(2, 4, 7, 7, generator=g, dtype=dtype)
    w = torch.randn(6, 4, 3, 3, generator=g, dtype=dtype)
    go = torch.randn(2, 6, 5, 5, generator=g, dtype=dtype)
    return x, w, go


def test_threads_forcing_mixed_backends_restore_flags_and_compute_right() -> None:
    """8 threads x 20 calls of convolution_backward with mixed forced backends."""
    names = ["slow", None] + (["mkldnn"] if "mkldnn" in available_backends("cpu") else [])
    before = flags_now()
    start = threading.Barrier(8)

    def worker(t: int) -> None:
        start.wait()
        for i in range(20):
            x, w, go = _thread_case(t * 20 + i)
            name = names[(t + i) % len(names)]
            if name == "mkldnn" and x.dtype == F64:
                name = "slow"
            got = native.convolution_backward(go, x, w, [6], 1, 0, 1, False, 0, 1,
                                              [True, True, True], backend=name)
            want = torch.ops.aten.convolution_backward(
                go.double(), x.double(), w.double(), [6], [1, 1], [0, 0], [1, 1], False,
                [0, 0], 1, [True, True, True])
            tol = 1e-10 if x.dtype == F64 else 1e-4  # float32: ~100-term sums
            for g, r in zip(got, want, strict=True):
                torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol)

    run_threads(worker, 8)
    assert flags_now() == before


def test_a_thread_sees_the_flags_it_forces_while_others_force_another() -> None:
    """Inside a block, the thread's own backend is in force, whatever other threads do."""
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    names = ["slow"] + (["mkldnn"] if "mkldnn" in available_backends("cpu") else [])
    expect = {"slow": "Slow2d", "mkldnn": "Mkldnn"}
    seen: list[tuple[str, str]] = []

    def worker(t: int) -> None:
        for i in range(10):
            name = names[(t + i) % len(names)]
            with use_backend(name, x, w):
                seen.append((name, select_backend(x, w)))

    run_threads(worker, 6)
    assert len(seen) == 60 and all(expect[n] == got for n, got in seen), seen


def test_a_thread_waits_for_another_backend_to_be_released(monkeypatch) -> None:
    monkeypatch.setattr(backends, "WAIT_SECONDS", 0.2)
    entered = threading.Event()
    release = threading.Event()
    outcome: list[object] = []

    def holder() -> None:
        with use_backend("slow"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    entered.wait(5)
    other = "nnpack" if "nnpack" in available_backends("cpu") else "mkldnn"
    if other not in available_backends("cpu"):
        release.set()
        t.join()
        pytest.skip("needs a second forcible CPU backend")
    try:
        with use_backend(other):
            outcome.append("entered")
    except RuntimeError as exc:
        outcome.append(str(exc))
    release.set()
    t.join()
    assert "waited" in str(outcome[0])
    with use_backend(other):  # free again once the holder left
        pass


def _second_backend() -> str:
    other = next((n for n in ("mkldnn", "nnpack") if n in available_backends("cpu")), None)
    if other is None:
        pytest.skip("needs a second forcible CPU backend")
    return other


def test_two_threads_nesting_a_switch_inside_a_shared_block_fail_fast() -> None:
    """Regression (issue 21, nested use_backend across threads): both threads inside
    use_backend("slow") nest another backend; each waits for the other to leave, which
    used to block both for WAIT_SECONDS (120 s) and then raise a bare "waited" error. Now the
    second to ask raises at once, saying it would deadlock and naming the other thread; the
    first then switches and finishes."""
    other = _second_backend()
    before = flags_now()
    inside = threading.Barrier(2, timeout=10)
    first_waits = threading.Event()
    results: dict[str, object] = {}

    def worker(t: int) -> None:
        name = f"nester-{t}"
        threading.current_thread().name = name
        try:
            with use_backend("slow"):
                inside.wait()
                if t == 1:
                    first_waits.wait(0.5)  # let thread 0 start waiting first
                else:
                    first_waits.set()
                with use_backend(other):
                    results[name] = "switched"
        except RuntimeError as exc:
            results[name] = exc

    start = time.monotonic()
    run_threads(worker, 2)
    elapsed = time.monotonic() - start
    errors = [r for r in results.values() if isinstance(r, RuntimeError)]
    assert sorted(results) == ["nester-0", "nester-1"]
    assert len(errors) == 1 and list(results.values()).count("switched") == 1, results
    text = str(errors[0])
    assert "deadlock" in text and "'slow'" in text and "nester-" in text
    assert elapsed < 60  # not the 120 s wait
    assert flags_now() == before


def test_a_timed_out_wait_names_the_holder_and_its_backend(monkeypatch) -> None:
    other = _second_backend()
    monkeypatch.setattr(backends, "WAIT_SECONDS", 0.2)
    entered, release = threading.Event(), threading.Event()

    def holder() -> None:
        with use_backend("slow"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=holder, name="slow-holder")
    t.start()
    entered.wait(5)
    try:
        with pytest.raises(RuntimeError) as info, use_backend(other):
            pass
    finally:
        release.set()
        t.join()
    text = str(info.value)
    assert "'slow-holder'" in text and "use_backend('slow')" in text and "process-wide" in text
