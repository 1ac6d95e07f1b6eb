"""convlab.aten.fast_per_sample: the C++ loop route against torch.func.vmap(grad(...)) and
the scratch routes, its awkward corners, and the rule that picks it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_per_sample import CONV, GRID, vmap_reference

from convlab.aten.extension import load
from convlab.aten.fast_per_sample import choose_method, per_sample_weight_grad
from convlab.scratch import per_sample


@pytest.mark.parametrize("config", GRID)
def test_loop_matches_vmap_grad(config) -> None:
    dim, n, c_in, c_out, size, k, stride, padding, dilation, groups = config
    x = torch.randn(n, c_in, *([size] * dim), dtype=torch.float64)
    w = torch.randn(c_out, c_in // groups, *([k] * dim), dtype=torch.float64)
    go = torch.randn_like(CONV[dim](x, w, None, stride, padding, dilation, groups))
    ours = per_sample_weight_grad(x, w.shape, go, stride, padding, dilation, groups,
                                  method="loop")
    expected = vmap_reference(x, w, go, stride, padding, dilation, groups)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=60)
@given(dim=st.integers(1, 3), n=st.integers(1, 3), groups=st.integers(1, 3),
       cpg=st.integers(1, 3), kpg=st.integers(1, 6), k=st.integers(1, 4),
       stride=st.integers(1, 3), padding=st.integers(0, 3), dilation=st.integers(1, 2),
       extra=st.integers(0, 4))
def test_loop_hypothesis(dim, n, groups, cpg, kpg, k, stride, padding, dilation,
                         extra) -> None:
    """Every (output channels, taps) remainder of the 4x4 blocks, kernels wider than the
    input with padding, strides that skip columns."""
    size = max(1, dilation * (k - 1) + 1 - 2 * padding) + extra
    x = torch.randn(n, cpg * groups, *([size] * dim), dtype=torch.float64)
    w = torch.randn(kpg * groups, cpg, *([k] * dim), dtype=torch.float64)
    go = torch.randn_like(CONV[dim](x, w, None, stride, padding, dilation, groups))
    ours = per_sample_weight_grad(x, w.shape, go, stride, padding, dilation, groups,
                                  method="loop")
    expected = per_sample.per_sample_weight_grad(x, w.shape, go, stride, padding,
                                                 dilation, groups, method="im2col")
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


def test_loop_row_blocks_and_float32() -> None:
    """A plane whose tap rows take several blocks (49 taps x 64 columns: 5 rows a block of
    16384 values, 64 rows), summed block after block, in float32 and float64."""
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    go = torch.randn(2, 5, 64, 64, dtype=torch.float64)
    want = per_sample.per_sample_weight_grad(x, (5, 3, 7, 7), go, 1, 3, method="im2col")
    got = per_sample_weight_grad(x, (5, 3, 7, 7), go, 1, 3, method="loop")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got32 = per_sample_weight_grad(x.float(), (5, 3, 7, 7), go.float(), 1, 3, method="loop")
    # float32 sums of 4096 products of unit normals: about 64 * 2**-24 * sqrt(4096) off
    torch.testing.assert_close(got32.double(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape", [
    # (N, C, K, size, kernel, stride, padding, dilation, groups): K/G * C/G * taps from
    # 4096 on runs the loop's GEMM form (per-thread columns, one GEMM per block)
    (2, 64, 32, (9, 9), (3, 3), 2, 1, 1, 2),
    (1, 64, 64, (40, 40), (3, 3), 1, 1, 1, 1),  # 5 rows of 40 a block: 8 blocks
    (3, 32, 32, (20,), (5,), 1, 4, 2, 1),
    (2, 16, 16, (5, 6, 7), (3, 3, 3), (1, 2, 1), 1, 1, 1),
])
def test_gemm_form(shape) -> None:
    n, c, k, size, kernel, stride, padding, dilation, groups = shape
    dim = len(size)
    x = torch.randn(n, c, *size, dtype=torch.float64)
    w = torch.randn(k, c // groups, *kernel, dtype=torch.float64)
    go = torch.randn_like(CONV[dim](x, w, None, stride, padding, dilation, groups))
    assert k // groups * c // groups * w[0, 0].numel() >= 4096
    x[0, 1, 2] = float("inf")
    got = per_sample_weight_grad(x, w.shape, go, stride, padding, dilation, groups,
                                 method="loop")
    want = per_sample.per_sample_weight_grad(x, w.shape, go, stride, padding, dilation,
                                             groups, method="im2col")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert got.isinf().any() or got.isnan().any()


@pytest.mark.parametrize(("c_in", "c_out", "groups"), [
    (6, 8, 2),  # a tile form
    (64, 64, 1),  # the GEMM form: K/G * C/G * taps = 36864 >= 4096
])
def test_loop_is_the_same_at_any_thread_count(c_in: int, c_out: int, groups: int) -> None:
    """Each entry is summed by one thread (the tile forms in a fixed order, the GEMM form
    by the BLAS inside that thread): bit for bit the same at 1 and 2 threads."""
    x, go = torch.randn(5, c_in, 12, 12), torch.randn(5, c_out, 12, 12)
    size = (c_out, c_in // groups, 3, 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = per_sample_weight_grad(x, size, go, 1, 1, 1, groups, method="loop")
        torch.set_num_threads(2)
        two = per_sample_weight_grad(x, size, go, 1, 1, 1, groups, method="loop")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_loop_views_and_inputs_left_alone() -> None:
    base = torch.randn(4, 6, 11, 11, dtype=torch.float64)
    x = base[::2, 1:5, 1:10, 1:10]  # a strided view, not contiguous
    go = torch.randn(2, 8, 9, 9, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    before_x, before_go = x.clone(), go.clone()
    got = per_sample_weight_grad(x, (8, 4, 3, 3), go, 1, 1, method="loop")
    want = per_sample.per_sample_weight_grad(x.contiguous(), (8, 4, 3, 3), go.contiguous(),
                                             1, 1, method="im2col")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, before_x) and torch.equal(go, before_go)


def test_loop_non_finite_values_as_the_columns_give() -> None:
    """A padding position holds 0, so an inf in grad_output times it is NaN, as in the
    im2col route's zero-padded columns."""
    x = torch.randn(2, 2, 6, 6, dtype=torch.float64)
    go = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    x[0, 1, 2, 3] = float("inf")
    go[1, 2, 0, 0] = float("inf")
    got = per_sample_weight_grad(x, (3, 2, 3, 3), go, 1, 1, method="loop")
    want = per_sample.per_sample_weight_grad(x, (3, 2, 3, 3), go, 1, 1, method="im2col")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert got.isnan().any() and got.isinf().any()


@pytest.mark.parametrize("dim, size, groups, c_in, c_out", [
    (1, (13,), 1, 4, 6), (2, (7, 5), 2, 4, 6), (3, (3, 4, 5), 1, 4, 6),
    (2, (6, 5), 1, 64, 64),  # K/G * C/G = 4096: the GEMM form, the planes as columns
])
def test_pointwise_loop_reads_the_planes_in_place(dim, size, groups, c_in, c_out) -> None:
    """A 1x1 kernel, stride 1, no padding: the plane is the tap row (odd sizes leave a
    tail after the vectors); no padding product, so an inf gives inf, not NaN; and the
    call holds nothing beyond its result."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(3, c_in, *size, dtype=torch.float64)
    go = torch.randn(3, c_out, *size, dtype=torch.float64)
    x[1, 2].view(-1)[-1] = float("inf")
    weight = (c_out, c_in // groups, *([1] * dim))
    for dtype in (torch.float64, torch.float32):
        xd, god = x.to(dtype), go.to(dtype)
        got = per_sample_weight_grad(xd, weight, god, 1, 0, 1, groups, method="loop")
        want = per_sample.per_sample_weight_grad(xd, weight, god, 1, 0, 1, groups,
                                                 method="im2col")
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got.isinf().any() and not got.isnan().any()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            again = per_sample_weight_grad(xd, weight, god, 1, 0, 1, groups, method="loop")
        allocated = sum(e.self_cpu_memory_usage for e in prof.key_averages()
                        if e.self_cpu_memory_usage > 0)
        assert allocated == again.numel() * again.element_size()


def test_empty_batch_and_autograd_fall_back() -> None:
    x, go = torch.randn(3, 4, 6, 6), torch.randn(3, 6, 6, 6)
    assert per_sample_weight_grad(x[:0], (6, 4, 3, 3), go[:0], 1, 1,
                                  method="loop").shape == (0, 6, 4, 3, 3)
    xr = x.clone().requires_grad_()
    with pytest.raises(ValueError, match="without autograd"):
        per_sample_weight_grad(xr, (6, 4, 3, 3), go, 1, 1, method="loop")
    auto = per_sample_weight_grad(xr, (6, 4, 3, 3), go, 1, 1)  # a scratch route
    auto.sum().backward()
    assert xr.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(per_sample_weight_grad(xr, (6, 4, 3, 3), go, 1, 1,
                                                          method="loop"), auto.detach(),
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="float32 or float64"):
        per_sample_weight_grad(x.bfloat16(), (6, 4, 3, 3), go.bfloat16(), 1, 1,
                               method="loop")
    assert per_sample_weight_grad(x.bfloat16(), (6, 4, 3, 3), go.bfloat16(),
                                  1, 1).dtype == torch.bfloat16


def test_transforms_and_fake_tensors_take_a_scratch_route() -> None:
    """vmap over samples, and FakeTensor shapes: auto falls back to an ATen-op route, the
    loop refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import vmap

    x, go = torch.randn(3, 2, 4, 6, 6), torch.randn(3, 2, 5, 6, 6)

    def per_batch(xb, gb, method="auto"):
        return per_sample_weight_grad(xb, (5, 4, 3, 3), gb, 1, 1, method=method)

    got = vmap(per_batch)(x, go)
    want = torch.stack([per_sample_weight_grad(x[i], (5, 4, 3, 3), go[i], 1, 1,
                                               method="loop") for i in range(3)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="functorch transform"):
        vmap(lambda a, b: per_batch(a, b, "loop"))(x, go)
    x0, go0 = x[0], go[0]
    with FakeTensorMode() as mode:
        fx, fgo = mode.from_tensor(x0), mode.from_tensor(go0)
        assert per_batch(fx, fgo).shape == (2, 5, 4, 3, 3)
        with pytest.raises(ValueError, match="dispatch mode"):
            per_batch(fx, fgo, "loop")


def test_bad_input_names_the_argument() -> None:
    x, go = torch.randn(2, 4, 6, 6), torch.randn(2, 6, 6, 6)
    with pytest.raises(ValueError, match="method must be one of auto, grouped, grouped_cl, "
                       "im2col, forward, loop, got 'fast'"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, 1, 1, method="fast")
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, 1, 0, method="loop")
    with pytest.raises(TypeError, match="grad_output has dtype torch.float64"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go.double(), 1, 1, method="loop")


def test_raw_op_checks_before_it_writes() -> None:
    ops = load().ops
    x, go = torch.randn(2, 4, 6, 6), torch.randn(2, 6, 6, 6)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.per_sample_weight_grad(x.transpose(2, 3), go, [3, 3], [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(RuntimeError, match="does not follow"):
        ops.per_sample_weight_grad(x, go, [3, 3], [1, 1], [0, 0], [1, 1], 1)
    with pytest.raises(RuntimeError, match="divide"):
        ops.per_sample_weight_grad(x, go, [3, 3], [1, 1], [1, 1], [1, 1], 3)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ops.per_sample_weight_grad(x.half(), go.half(), [3, 3], [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(RuntimeError, match="one per spatial dim"):
        ops.per_sample_weight_grad(x, go, [3], [1, 1], [1, 1], [1, 1], 1)


# (n, channels per group, kernel side, block[, groups]) -> "loop", or None for the
# scratch rule's route: each clause of the rule and its edges.
LOOP_CASES = [
    ((64, 64, 3, 0), "loop"), ((64, 64, 7, 0), "loop"), ((8, 1, 3, 0), "loop"),  # 1.
    ((64, 3, 1, 0), None), ((64, 1, 3, 0), None), ((8, 3, 1, 0), "loop"),
    ((64, 8, 3, 16), "loop"), ((64, 1, 3, 16), "loop"), ((64, 3, 7, 16), "loop"),  # 2.
    ((64, 4, 5, 8), "loop"), ((2, 8, 5, 16, 2), "loop"), ((8, 1, 7, 16), "loop"),
    ((64, 1, 5, 16), None), ((9, 1, 7, 8), None), ((64, 8, 3, 8), None),
    ((8, 8, 7, 8), "loop"), ((1, 8, 5, 8), "loop"), ((9, 8, 3, 8), None),  # 3.
    ((8, 16, 1, 16), "loop"), ((1, 1, 1, 16), "loop"), ((8, 16, 1, 8), None),  # 4.
    ((9, 16, 1, 16), None), ((8, 32, 1, 16), None),
    ((1, 16, 3, 16), "loop"), ((1, 16, 5, 16), None), ((1, 32, 3, 16), None),  # 5.
    ((2, 16, 3, 16), None),
]


@pytest.mark.parametrize("case, route", LOOP_CASES)
def test_choose_method_follows_its_rule(case, route) -> None:
    n, cpg, k, block, *groups = case
    g = groups[0] if groups else 1
    scratch = per_sample.choose_method(n, cpg, (k, k), torch.float32, block, 1, g)
    assert choose_method(n, cpg, (k, k), torch.float32, block, 1, g) == (route or scratch)
    assert choose_method(n, cpg, (k, k), torch.float64, block, 1, g) == (
        route or per_sample.choose_method(n, cpg, (k, k), torch.float64, block, 1, g))
    assert choose_method(n, cpg, (k, k), torch.bfloat16, block, 1, g) == \
        per_sample.choose_method(n, cpg, (k, k), torch.bfloat16, block, 1, g)


def test_choose_method_within_its_stated_margin_on_the_committed_sweeps() -> None:
    """The docstring's numbers, recomputed from the records' per_sample_auto sections."""
    from convlab.lab.record import records
    from convlab.lab.sections import per_sample_auto

    # per setting: (near, worst) of the rule; its time against the scratch rule alone
    # (geometric mean, least, largest) and peak memory (geometric mean)
    stated = {"avx512_bf16": (115, 1.32, 0.63, 0.19, 1.14, 0.42),
              "avx512": (118, 1.14, 0.64, 0.21, 1.10, 0.42),
              "avx2": (112, 1.73, 0.71, 0.19, 1.73, 0.45),
              "sse41": (112, 1.38, 0.75, 0.24, 1.29, 0.30)}
    found, loop_wins = {}, []
    for r in records.load_records():
        if r.path.name.startswith("amd-epyc-x2-l3-32m-f25m17__"):
            section = r.section("per_sample_auto")
            now = per_sample_auto.rule_summary(section)
            vs = per_sample_auto.against_scratch(section)
            assert now["points"] == 120 and now["untimed"] == 0 and vs["points"] == 120
            found[r.isa] = tuple(round(x, 2) for x in (
                now["near"], now["worst"]["auto_over_fastest"], vs["time"],
                *vs["time_range"], vs["peak"]))
            for n in (1, 8, 64):  # chapter 9: the loop fastest at 15-24 of 24 per N
                few = [p["seconds"] for p in section["points"]
                       if p["channels_per_group"] <= 8 and p["n"] == n]
                loop_wins.append(sum(min(t, key=t.__getitem__) == "loop" for t in few))
    assert found == stated
    assert len(loop_wins) == 12 and (min(loop_wins), max(loop_wins)) == (15, 24)


def test_auto_reads_the_cpu_flags_at_most_once_per_process(monkeypatch) -> None:
    """oneDNN's block comes from /proc/cpuinfo and the ISA cap, both fixed per process:
    ``method="auto"`` read the file twice per call (x3.5-5.8 on small layers)."""
    import builtins

    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file) == "/proc/cpuinfo":
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    x, go = torch.randn(8, 3, 8, 8), torch.randn(8, 8, 6, 6)
    xg = x.clone().requires_grad_()  # the loop cannot serve it: the scratch rule decides
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for n in (1, 8, 64):
            choose_method(n, 3, (3, 3), dtype)
    for _ in range(5):
        per_sample_weight_grad(xg, (8, 3, 3, 3), go, method="auto")
    assert len(opened) <= 1
