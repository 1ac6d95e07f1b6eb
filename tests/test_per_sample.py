"""Per-sample weight and bias gradients (both routes) against torch.func.vmap(grad(...))."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import devices
from hypothesis import given
from hypothesis import strategies as st
from torch.func import grad, vmap

from convlab.scratch import per_sample
from convlab.scratch.per_sample import (
    METHODS,
    ROUTES,
    choose_method,
    per_sample_bias_grad,
    per_sample_weight_grad,
)

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def vmap_reference(x, w, go, stride, padding, dilation, groups):
    """Per-sample grad_weight by vmap over single samples of F.conv*d."""
    conv = CONV[w.dim() - 2]

    def loss(weight, xi, gi):
        y = conv(xi[None], weight, None, stride, padding, dilation, groups)
        return (y * gi[None]).sum()

    return vmap(grad(loss), in_dims=(None, 0, 0))(w, x, go)


GRID = [
    # dim, N, C_in, C_out, size, kernel, stride, padding, dilation, groups
    (1, 3, 2, 4, 9, 3, 1, 0, 1, 1),
    (1, 2, 4, 4, 10, 3, 2, 1, 2, 2),
    (2, 3, 3, 5, 7, 3, 1, 1, 1, 1),
    (2, 2, 4, 6, 8, 2, 2, 0, 1, 2),
    (2, 2, 4, 8, 9, 3, (2, 1), (1, 0), (1, 2), 4),
    (2, 1, 1, 1, 5, 5, 1, 0, 1, 1),
    (3, 2, 2, 4, 5, 2, 1, 1, 1, 2),
    (3, 2, 3, 3, 6, 3, 2, 0, 1, 3),
    (2, 3, 4, 6, 5, 1, 1, 0, 1, 2),  # 1x1, stride 1, no padding: the input is the columns
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("config", GRID)
def test_matches_vmap_grad(config, device, method) -> None:
    dim, n, c_in, c_out, size, k, stride, padding, dilation, groups = config
    opts = {"dtype": torch.float64, "device": device}
    x = torch.randn(n, c_in, *([size] * dim), **opts)
    w = torch.randn(c_out, c_in // groups, *([k] * dim), **opts)
    go = torch.randn_like(CONV[dim](x, w, None, stride, padding, dilation, groups))
    ours = per_sample_weight_grad(x, w.shape, go, stride, padding, dilation, groups,
                                  method=method)
    expected = vmap_reference(x, w, go, stride, padding, dilation, groups)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
    # Summed over the batch it is the ordinary weight gradient.
    summed = torch.ops.aten.convolution_backward(
        go, x, w, None, *(list(v) for v in _lists(dim, stride, padding, dilation)),
        False, [0] * dim, groups, [False, True, False],
    )[1]
    torch.testing.assert_close(ours.sum(0), summed, rtol=1e-12, atol=1e-12)


def _lists(dim, *args):
    return [[a] * dim if isinstance(a, int) else list(a) for a in args]


@given(
    method=st.sampled_from(METHODS),
    dim=st.integers(1, 3),
    n=st.integers(1, 3),
    groups=st.integers(1, 2),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    extra=st.integers(0, 3),
)
def test_hypothesis_configurations(method, dim, n, groups, k, stride, padding, dilation,
                                   extra) -> None:
    size = max(1, dilation * (k - 1) + 1 - 2 * padding) + extra
    x = torch.randn(n, 2 * groups, *([size] * dim), dtype=torch.float64)
    w = torch.randn(groups * 2, 2, *([k] * dim), dtype=torch.float64)
    go = torch.randn_like(CONV[dim](x, w, None, stride, padding, dilation, groups))
    ours = per_sample_weight_grad(x, tuple(w.shape), go, stride, padding, dilation, groups,
                                  method=method)
    expected = vmap_reference(x, w, go, stride, padding, dilation, groups)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


def test_bad_input_names_the_argument() -> None:
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    go = torch.randn(2, 6, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        per_sample_weight_grad(x, (6, 4, 2, 2), go)
    with pytest.raises(ValueError, match="groups=3 must divide in_channels=4"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, groups=3)
    with pytest.raises(TypeError, match="grad_output has dtype torch.float32"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go.float())
    with pytest.raises(ValueError, match="weight_size"):
        per_sample_weight_grad(x, (6, 4), go)
    with pytest.raises(ValueError, match="stride must be positive"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, stride=0)
    with pytest.raises(TypeError, match="weight_size must be a sequence of ints"):
        per_sample_weight_grad(x, (6, 4, 3.7, 3), go)
    with pytest.raises(TypeError, match="weight_size must be a sequence of ints"):
        per_sample_weight_grad(x, "6433", go)
    with pytest.raises(ValueError, match="method must be one of auto, grouped, grouped_cl, "
                       "im2col, forward, got 'loop'"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, method="loop")
    with pytest.raises(ValueError, match="method must be one of .*, got None"):
        per_sample_weight_grad(x, (6, 4, 3, 3), go, method=None)
    with pytest.raises(ValueError, match="grad_output must be"):
        per_sample_bias_grad(torch.ones(2, 3))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 3])
def test_every_route_is_differentiable(method, k) -> None:
    """Inputs that require grad: every route keeps autograd's graph (the im2col route
    then gives each chunk its own columns instead of out= into one buffer)."""
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    go = torch.randn(3, 4, 5 - k, 5 - k, dtype=torch.float64, requires_grad=True)

    def fn(a, b):
        return per_sample_weight_grad(a, (4, 2, k, k), b, method=method)

    assert torch.autograd.gradcheck(fn, (x, go))


@pytest.mark.parametrize("method", METHODS)
def test_every_route_under_vmap(method) -> None:
    """vmap over batches of samples: the im2col route then builds its columns without
    out= or a reused buffer (neither has a batching rule)."""
    x = torch.randn(3, 2, 4, 6, 6, dtype=torch.float64)
    go = torch.randn(3, 2, 5, 6, 6, dtype=torch.float64)

    def one(a, b):
        return per_sample_weight_grad(a, (5, 4, 3, 3), b, 1, 1, method=method)

    want = torch.stack([one(x[i], go[i]) for i in range(3)])
    torch.testing.assert_close(vmap(one)(x, go), want, rtol=1e-12, atol=1e-12)


def test_numpy_integer_sizes_and_empty_batch() -> None:
    import numpy as np

    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    go = torch.randn(2, 6, 4, 4, dtype=torch.float64)
    size = tuple(np.int64(v) for v in (6, 4, 3, 3))
    torch.testing.assert_close(per_sample_weight_grad(x, size, go),
                               per_sample_weight_grad(x, (6, 4, 3, 3), go))
    for method in METHODS:
        empty = per_sample_weight_grad(x[:0], (6, 4, 3, 3), go[:0], method=method)
        assert empty.shape == (0, 6, 4, 3, 3)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_bias_matches_vmap_grad(dim) -> None:
    x = torch.randn(3, 2, *([5] * dim), dtype=torch.float64)
    w = torch.randn(4, 2, *([3] * dim), dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    go = torch.randn_like(CONV[dim](x, w, b))

    def loss(bias, xi, gi):
        return (CONV[dim](xi[None], w, bias) * gi[None]).sum()

    expected = vmap(grad(loss), in_dims=(None, 0, 0))(b, x, go)
    torch.testing.assert_close(per_sample_bias_grad(go), expected, rtol=1e-12, atol=1e-12)
    summed = torch.ops.aten.convolution_backward(
        go, x, w, [4], [1] * dim, [0] * dim, [1] * dim, False, [0] * dim, 1,
        [False, False, True])[2]
    torch.testing.assert_close(per_sample_bias_grad(go).sum(0), summed)


# (channels per group, N, kernel, threads) points of the auto rule's sweep, and layouts.
AUTO_CASES = [(1, 8, 3, 1), (3, 2, 5, 2), (8, 4, 1, 1), (16, 1, 7, 2), (16, 64, 3, 1)]


@pytest.mark.parametrize("case", AUTO_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_auto_equals_every_route(case, dtype) -> None:
    cpg, n, k, threads = case
    groups = 2 if cpg == 8 else 1
    x = torch.randn(n, cpg * groups, 10, 10, dtype=dtype)
    go = torch.randn(n, 4 * groups, 10, 10, dtype=dtype)
    size = (4 * groups, cpg, k, k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        auto = per_sample_weight_grad(x, size, go, 1, k // 2, 1, groups, method="auto")
        for method in ROUTES:
            got = per_sample_weight_grad(x, size, go, 1, k // 2, 1, groups, method=method)
            if dtype == torch.float64:
                torch.testing.assert_close(got, auto, rtol=1e-12, atol=1e-12)
            else:  # float32 sums of up to C k^2 * 100 products, in other orders per route
                torch.testing.assert_close(got, auto, rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(before)


def test_channels_last_input_and_chunked_columns(monkeypatch) -> None:
    x = torch.randn(6, 4, 9, 9, dtype=torch.float64)
    go = torch.randn(6, 8, 9, 9, dtype=torch.float64)
    expected = per_sample_weight_grad(x, (8, 2, 3, 3), go, 1, 1, 1, 2, method="grouped")
    xc = x.contiguous(memory_format=torch.channels_last)
    gc = go.contiguous(memory_format=torch.channels_last)
    for method in METHODS:
        got = per_sample_weight_grad(xc, (8, 2, 3, 3), gc, 1, 1, 1, 2, method=method)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # Columns of one sample: C_in k^2 L = 4*9*81 float64 values; 2 samples per chunk.
    monkeypatch.setattr(per_sample, "CHUNK_BYTES", 4 * 9 * 81 * 8 * 2)
    got = per_sample_weight_grad(x, (8, 2, 3, 3), go, 1, 1, 1, 2, method="im2col")
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["grouped", "grouped_cl"])
def test_grouped_routes_call_in_chunks_of_bounded_gradients(monkeypatch, method) -> None:
    x = torch.randn(7, 4, 9, 9, dtype=torch.float64)
    go = torch.randn(7, 8, 9, 9, dtype=torch.float64)
    size = (8, 2, 3, 3)
    expected = vmap_reference(x, torch.zeros(size, dtype=torch.float64), go, 1, 1, 1, 2)
    x1 = x.clone().requires_grad_()
    one_call = per_sample_weight_grad(x1, size, go, 1, 1, 1, 2, method=method)
    one_call.sum().backward()
    calls = []
    inner = per_sample._grouped_call

    def spy(input, *args, **kwargs):
        calls.append(input.shape[0])
        return inner(input, *args, **kwargs)

    monkeypatch.setattr(per_sample, "_grouped_call", spy)
    # One sample's gradients: 8*2*3*3 float64 values; 3 samples per call at most.
    monkeypatch.setattr(per_sample, "GROUPED_CHUNK_BYTES", 8 * 2 * 3 * 3 * 8 * 3)
    xr = x.clone().requires_grad_()
    got = per_sample_weight_grad(xr, size, go, 1, 1, 1, 2, method=method)
    assert calls == [3, 3, 1]
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, one_call, rtol=1e-12, atol=1e-12)
    got.sum().backward()  # the chunks' copies keep the graph to the input
    torch.testing.assert_close(xr.grad, x1.grad, rtol=1e-12, atol=1e-12)


# (n, channels per group, kernel side, block, threads[, groups]) -> route: each row of
# the rule, and its edges.
RULE_CASES = [
    # 2. 1x1 kernels: the input is the columns
    ((8, 8, 1, 16, 2), "im2col"), ((1, 64, 1, 0, 1), "im2col"), ((8, 1, 1, 8, 1), "im2col"),
    # 3. depthwise: one sample up to 5x5 im2col, 3x3 with a block grouped, else the
    # swapped-roles forward
    ((1, 1, 3, 16, 1), "im2col"), ((1, 1, 5, 0, 2), "im2col"), ((1, 1, 7, 8, 1), "forward"),
    ((8, 1, 3, 8, 2), "grouped"), ((64, 1, 3, 16, 1), "grouped"),
    ((8, 1, 3, 0, 2), "forward"), ((8, 1, 5, 16, 1), "forward"),
    # 4. one sample: im2col for a grouped layer; else grouped at 3x3 (any block), and
    # larger with a block and C/g >= 8
    ((1, 3, 3, 0, 1), "grouped"), ((1, 16, 5, 16, 1), "grouped"),
    ((1, 8, 7, 8, 2), "grouped"), ((1, 3, 5, 16, 1), "im2col"),
    ((1, 16, 5, 0, 1), "im2col"), ((1, 8, 3, 16, 1, 2), "im2col"),
    ((1, 8, 7, 8, 2, 2), "im2col"),
    # 5. no JIT block
    ((8, 16, 3, 0, 1), "im2col"), ((64, 64, 7, 0, 2), "im2col"),
    # 6. few channels per group: grouped_cl from 5x5 with 16-wide blocks and N >= 32
    ((64, 3, 5, 16, 1), "grouped_cl"), ((32, 7, 7, 16, 2), "grouped_cl"),
    ((8, 3, 5, 16, 1), "im2col"), ((64, 3, 3, 16, 1), "im2col"),
    ((64, 3, 5, 8, 2), "im2col"),
    # 7. otherwise
    ((64, 64, 3, 8, 1), "grouped"), ((8, 8, 7, 16, 2), "grouped"),
    ((8, 4, 3, 8, 1), "grouped"),
]


@pytest.mark.parametrize("case, route", RULE_CASES)
def test_choose_method_follows_its_rule(case, route) -> None:
    n, cpg, k, block, threads, *groups = case
    g = groups[0] if groups else 1
    assert choose_method(n, cpg, (k, k), torch.float32, block, threads, g) == route
    assert choose_method(n, cpg, (k, k), torch.float64, block, threads, g) == "im2col"


@pytest.mark.parametrize("groups", [0, -1, 1.0, True, "2"])
def test_choose_method_refuses_bad_groups(groups: object) -> None:
    with pytest.raises(ValueError, match="groups"):
        choose_method(1, 8, (3, 3), torch.float32, 16, 1, groups)


@pytest.mark.parametrize("threads", [0, -2, 1.5, True, "1"])
def test_choose_method_refuses_a_bad_thread_count(threads: object) -> None:
    with pytest.raises(ValueError, match="threads"):
        choose_method(8, 16, (3, 3), torch.float32, 16, threads)


def test_choose_method_within_its_stated_margin_on_the_committed_sweeps() -> None:
    """The docstring's numbers, recomputed from the records' per_sample_auto sections:
    the scratch rule's route against the fastest of the scratch routes."""
    from convlab.lab.record import records
    from convlab.lab.sections import per_sample_auto

    stated = {"avx512_bf16": (114, 1.23), "avx512": (117, 1.19), "avx2": (112, 1.61),
              "sse41": (119, 1.35)}
    found, grouped = {}, []
    for r in records.load_records():
        if r.path.name.startswith("amd-epyc-x2-l3-32m-f25m17__"):
            section = r.section("per_sample_auto")
            ratios = []
            for p in section["points"]:
                route = choose_method(p["n"], p["channels_per_group"], [p["kernel"]] * 2,
                                      torch.float32, section["block"], p["threads"],
                                      per_sample_auto.LAYERS[p["channels_per_group"]][2])
                ours = {k: v for k, v in p["seconds"].items() if k in ROUTES}
                ratios.append(ours[route] / min(ours.values()))
            assert len(ratios) == 120
            found[r.isa] = (sum(q <= 1.1 for q in ratios), round(max(ratios), 2))
            grouped += [p["seconds"]["grouped"] / p["seconds"]["im2col"]
                        for p in section["points"]
                        if (p["channels_per_group"], p["n"], p["kernel"]) == (8, 1, 3)]
    assert found == stated
    # rule 4's fact: one sample of the grouped layer at 3x3, im2col faster x1.1-x1.7
    assert len(grouped) == 8 and (round(min(grouped), 1), round(max(grouped), 1)) == (1.1, 1.7)


@pytest.mark.parametrize("cap, flags, block", [
    (None, {"avx512f", "avx2"}, 16), ("AVX2", {"avx512f", "avx2"}, 8),
    ("AVX512_CORE_AMX", {"avx512f", "avx2"}, 16), ("SSE41", {"avx512f"}, 0),
    ("AVX512_CORE", {"avx2"}, 8), (None, set(), 0), ("ALL", {"avx2"}, 8),
])
def test_onednn_block_from_flags_and_cap(cap, flags, block) -> None:
    assert per_sample._block(cap, frozenset(flags)) == block


def test_checked_geometries_are_cached_and_errors_are_not() -> None:
    from convlab.scratch import per_sample

    x, go = torch.randn(2, 4, 6, 6), torch.randn(2, 6, 6, 6)
    per_sample._checked.cache_clear()
    first = per_sample_weight_grad(x, (6, 4, 3, 3), go, 1, [1, 1])
    again = per_sample_weight_grad(x, (6, 4, 3, 3), go, 1, (1, 1))  # list and tuple: one key
    assert per_sample._checked.cache_info().hits == 1
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    for _ in range(2):  # the same geometry with a wrong grad_output fails every time
        with pytest.raises(ValueError, match="grad_output must have"):
            per_sample_weight_grad(x, (6, 4, 3, 3), go[:, :, :5], 1, 1)
    with pytest.raises(TypeError, match="groups"):  # a bool is not cached as 1
        per_sample_weight_grad(x, (6, 4, 3, 3), go, 1, 1, 1, True)
