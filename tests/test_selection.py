"""convlab.aten.selection against ATen's own ``torch._C._select_conv_backend`` (CPU).

A seeded grid over dims 1-3, dtypes (bf16/fp16/float32/float64/int), groups, depthwise,
transposed, dilation, channels_last, batch sizes around the thresholds (N = 0, 1, 2, 15, 16,
17), the 20480-element rule, threads 1/2 and the mkldnn/nnpack flags; plus hypothesis.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from backend_cases import backend_flags
from hypothesis import given, settings
from hypothesis import strategies as st

from convlab.aten import selection
from convlab.aten.backends import backend_name
from convlab.aten.conv_query import ConvQuery, Environment

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)


@dataclass(frozen=True)
class Case:
    dim: int
    n: int
    c_in: int
    c_out: int
    groups: int
    kernel: int
    size: int
    stride: int
    padding: int
    dilation: int
    transposed: bool
    output_padding: int
    dtype: torch.dtype
    channels_last: bool
    threads: int
    mkldnn: bool
    nnpack: bool
    requires_grad: bool
    bias: bool


def random_case(rng: random.Random) -> Case:
    dim = rng.choice((1, 2, 2, 3))
    c_in = rng.choice((1, 2, 3, 4, 8))
    groups = rng.choice([g for g in (1, 2, 4, c_in) if c_in % g == 0])
    c_out = groups * rng.choice((1, 2, 3)) if groups > 1 else rng.choice((1, 4, 6))
    kernel = rng.choice((1, 1, 3, 4, 5))
    size = rng.choice((1, 5, 12, 72)) if dim < 3 else rng.choice((1, 5, 12))
    stride, dilation = rng.choice((1, 1, 2)), rng.choice((1, 1, 2))
    transposed = rng.random() < 0.25
    output_padding = rng.choice((0, 1)) if transposed and max(stride, dilation) > 1 else 0
    return Case(dim, rng.choice((0, 1, 2, 15, 16, 17)), c_in, c_out, groups, kernel, size,
                stride, rng.choice((0, 1, 2)), dilation, transposed, output_padding,
                rng.choice(DTYPES + (torch.float32,) * 4), dim > 1 and rng.random() < 0.3,
                rng.choice((1, 2)),
                rng.random() < 0.8, rng.random() < 0.7, rng.random() < 0.7, rng.random() < 0.5)


def tensors(case: Case):
    spatial = (case.size,) * case.dim
    kernel = (case.kernel,) * case.dim
    if case.transposed:
        wshape = (case.c_in, case.c_out // case.groups, *kernel)
        out_c = case.c_out
    else:
        wshape = (case.c_out, case.c_in // case.groups, *kernel)
        out_c = case.c_out
    x = torch.empty(case.n, case.c_in, *spatial, dtype=case.dtype)
    w = torch.empty(*wshape, dtype=case.dtype)
    if case.channels_last:
        fmt = torch.channels_last if case.dim == 2 else torch.channels_last_3d
        x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    b = torch.empty(out_c, dtype=case.dtype) if case.bias else None
    if case.requires_grad and case.dtype.is_floating_point:
        x.requires_grad_(True)
    return x, w, b


def flags(case: Case):
    """The flags of ``case`` for a block (restored after)."""
    return backend_flags(case.mkldnn, case.nnpack, case.threads)


def compare(case: Case) -> tuple[str, str] | None:
    """(aten, mirror) backends when they differ, ``None`` when they agree; the case counts
    only if ATen accepts it (or both reject it)."""
    x, w, b = tensors(case)
    args = ([case.stride] * case.dim, [case.padding] * case.dim, [case.dilation] * case.dim,
            case.transposed, [case.output_padding] * case.dim, case.groups)
    with flags(case):
        try:
            aten = backend_name(torch._C._select_conv_backend(x, w, b, *args))
        except RuntimeError:
            aten = "error"
        try:
            q = ConvQuery.from_tensors(x, w, b, *args)
            mine = selection.select(q)
            mine_backend = mine.backend
        except ValueError:
            mine_backend = "error"
        if aten not in ("error", "Empty") and case.dim > 1:
            enum = torch._C._ConvBackend(selection_index(aten))
            fmt = torch._C._conv_determine_backend_memory_format(x, w, enum)
            name = {torch.channels_last: "channels_last",
                    torch.channels_last_3d: "channels_last_3d"}.get(fmt, "contiguous")
            if mine_backend == aten and mine.memory_format != name:
                return (f"{aten} {name}", f"{mine_backend} {mine.memory_format}")
    return None if aten == mine_backend else (aten, mine_backend)


def selection_index(name: str) -> int:
    from convlab.aten.backends import CONV_BACKENDS
    return CONV_BACKENDS.index(name)


def threshold_cases() -> list[Case]:
    """Float32 2-d cases at the edges of use_mkldnn / use_nnpack: N around 1 and 16, 1x1 and
    4x4 kernels, N*C*H*W = 20480 exactly and one above, padding = kernel, flags, threads."""
    cases = []
    for n in (1, 2, 15, 16, 17):
        for kernel, size, c_in in ((1, 64, 5), (1, 65, 5), (4, 8, 1), (3, 8, 1), (17, 20, 1)):
            for padding in (0, kernel):
                for threads in (1, 2):
                    for mkldnn in (True, False):
                        for nnpack in (True, False):
                            cases.append(Case(2, n, c_in, 2, 1, kernel, size, 1, padding, 1,
                                              False, 0, torch.float32, False, threads, mkldnn,
                                              nnpack, True, True))
    return cases


def run_grid(count: int, seed: int = 0) -> tuple[int, list]:
    """Check the threshold cases, then random cases until ``count`` configurations."""
    rng = random.Random(seed)
    fixed = threshold_cases()
    checked, bad = 0, []
    while checked < count:
        case = fixed[checked] if checked < len(fixed) else random_case(rng)
        result = compare(case)
        checked += 1
        if result is not None:
            bad.append((case, result))
    return checked, bad


def test_grid_of_6000_agrees_with_aten():
    # ~5 s on a loaded 2-core machine, so not marked slow
    checked, bad = run_grid(6000, seed=2)
    assert checked == 6000 and not bad, bad[:5]


case_strategy = st.builds(
    lambda r: random_case(random.Random(r)), st.integers(0, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(case_strategy)
def test_hypothesis_cases_agree_with_aten(case):
    assert compare(case) is None


def test_environment_reads_the_isa_checks_live():
    env = Environment.current()
    assert env.mkldnn_bf16 == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert env.mkldnn_fp16 == bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    assert env.threads == torch.get_num_threads()


def test_threads_flip_a_single_sample_1x1_conv_and_the_path_says_why():
    q = ConvQuery.create([1, 64, 56, 56], [64, 64, 1, 1])
    env = Environment.current()
    one = selection.select(q, selection.replace(env, threads=1))
    two = selection.select(q, selection.replace(env, threads=2))
    assert (one.backend, two.backend) == ("Slow2d", "Mkldnn")
    term = next(t for t in one.path if t.name.startswith("strided || dilated"))
    assert term.value is False and "threads=1" in term.detail
    assert [t.name for t in one.decisive()][-1] == "cpu || cuda"


def test_a_device_not_here_is_labelled_from_source():
    q = ConvQuery.create([8, 32, 56, 56], [32, 1, 3, 3], groups=32, device="cuda")
    sel = selection.select(q)
    if not torch.cuda.is_available():
        assert sel.checked_here is False
    assert sel.backend in ("CudaDepthwise2d", "Cudnn")
    assert any(t.name == "is_depthwise" and t.value for t in sel.path)


def test_cuda_rules_from_source():
    env = Environment.typical("cuda")
    sel = lambda **k: selection.select(ConvQuery.create(**k), env).backend  # noqa: E731
    assert sel(input_shape=[2, 3, 8, 8], weight_shape=[4, 3, 3, 3], device="cuda") == "Cudnn"
    assert sel(input_shape=[2, 4, 8, 8, 8], weight_shape=[4, 1, 3, 3, 3], groups=4,
               device="cuda") == "CudaDepthwise3d"
    off = selection.replace(env, cudnn_enabled=False)
    q3 = ConvQuery.create([2, 4, 8, 8, 8], [4, 4, 3, 3, 3], transposed=True,
                                    device="cuda")
    assert selection.select(q3, off).backend == "SlowTranspose3d"
    q3d = ConvQuery.create([2, 4, 8, 8, 8], [4, 4, 3, 3, 3], device="cuda")
    assert selection.select(q3d, off).backend == "SlowDilated3d"
    assert sel(input_shape=[2, 3, 8, 8], weight_shape=[4, 3, 3, 3],
               device="meta") == "Overrideable"


def test_meta_tensors_reach_overrideable_like_aten():
    x, w = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
    aten = backend_name(torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1],
                                                      False, [0, 0], 1))
    assert selection.select(ConvQuery.from_tensors(x, w)).backend == aten


@pytest.mark.parametrize("kwargs, error", [
    (dict(input_shape=[1, 3, 8, 8], weight_shape=[4, 3, 3, 3], stride=0), ValueError),
    (dict(input_shape=[1, 3, 8, 8], weight_shape=[4, 2, 3, 3]), ValueError),
    (dict(input_shape=[1, 3, 8, 8], weight_shape=[4, 3, 3, 3], device="tpu"), ValueError),
    (dict(input_shape=[1, 3, 8, 8, 8, 8], weight_shape=[4, 3, 3, 3, 3, 3]), ValueError),
    (dict(input_shape=[1, 3, 8, 8], weight_shape=[4, 3, 3, 3], dtype="float32"), TypeError),
    (dict(input_shape=[1, 3, 8, 8], weight_shape=[4, 3, 3, 3], groups=1.5), TypeError),
])
def test_bad_queries_raise_before_any_work(kwargs, error):
    with pytest.raises(error):
        ConvQuery.create(**kwargs)


def test_select_rejects_a_non_query():
    with pytest.raises(TypeError, match="ConvQuery"):
        selection.select("conv2d")


def test_flowchart_is_the_rule_table():
    dot = selection.flowchart_dot()
    for rule in selection.RULES:
        assert f'label="{rule.name}"' in dot
    assert dot.count("->") == 2 * len(selection.RULES)


@pytest.mark.parametrize("shape, expected", [((1, 4, 4, 4, 1300), "Slow3d"),
                                             ((1, 4, 4, 1300, 4), "Mkldnn")])
def test_use_mkldnn_size_term_ignores_the_last_dim_of_a_3d_input(shape, expected):
    # N*C*size(2)*size(3) > 20480: for a 5-d input W is not counted, so the same number of
    # elements selects differently depending on which spatial dim is long
    x, w = torch.empty(*shape), torch.empty(4, 4, 1, 1, 1)
    case = Case(3, 1, 4, 4, 1, 1, 1, 1, 0, 1, False, 0, torch.float32, False, 2, True, True,
                False, False)
    with flags(case):
        aten = backend_name(torch._C._select_conv_backend(
            x, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1))
        mine = selection.select(ConvQuery.from_tensors(x, w)).backend
    assert aten == mine == expected
