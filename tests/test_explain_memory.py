"""``explain`` answers every valid layer without owning its memory (issue 34 E2).

It used to cross-check the rule against ATen on empty tensors of the layer's full size, so a
valid large layer (the 64-bit-indexing layers ``needs_64bit_indexing_no_split`` is about)
failed with "can't allocate memory", printed as a bad argument. Large layers are now asked
with zero-stride stand-ins (one element expanded), which the property test below shows ATen
reads exactly as the real tensors; where no stand-in is faithful the output says the
cross-check was skipped and why.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.aten import explain as ex
from convlab.aten.backends import backend_name
from convlab.aten.conv_query import ConvQuery, Environment
from convlab.cli import main as cli_main

# float32, 128 GiB of input; one sample has 2**35 elements (> INT_MAX)
HUGE_2D = ([1, 128, 16384, 16384], [64, 128, 3, 3])


def test_a_layer_of_128_gib_is_answered_under_a_4_gib_address_space_cap() -> None:
    # RLIMIT_AS makes any full-size allocation fail, whatever the machine's overcommit
    code = textwrap.dedent("""
        import resource, sys
        import torch
        from convlab.aten.conv_query import ConvQuery
        from convlab.aten.explain import explain, format_explanation
        vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize"))
                 .split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 4 * 2**30, resource.RLIM_INFINITY))
        layers = [
            ConvQuery.create([1, 128, 16384, 16384], [64, 128, 3, 3]),
            ConvQuery.create([1, 128, 16384, 16384], [128, 64, 3, 3], transposed=True),
            ConvQuery.create([2, 64, 1024, 1024, 64], [64, 8, 3, 3, 3], groups=8,
                             dtype=torch.bfloat16),
            ConvQuery.create([1, 128, 16384, 16384], [64, 128, 3, 3], channels_last=True),
            ConvQuery.create([4, 64, 2**31], [64, 64, 3], padding=1),
        ]
        for q in layers:
            e = explain(q)
            print(e.forward.backend, e.aten.backend, "|", e.aten.how)
            assert e.aten.how in format_explanation(e)
        try:
            torch.empty(2**34)  # the cap is real: a 64 GiB tensor cannot be owned here
        except RuntimeError:
            print("capped")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "capped"
    for line in lines[:3]:  # contiguous 2-d/3-d: ATen asked on stand-ins, and agrees
        ours, aten, how = line.replace(" |", "").split(" ", 2)
        assert ours == aten and how == "on zero-stride stand-ins", line
    for line, kind in zip(lines[3:5], ("channels_last", "1-d"), strict=True):
        assert " None | this machine's rules; ATen not asked: a " in line
        assert f"GiB {kind} layer needs its memory" in line


def test_cli_answers_a_64bit_indexing_layer(capsys) -> None:
    rc = cli_main(["explain", "--input", ",".join(map(str, HUGE_2D[0])), "--weight",
                   ",".join(map(str, HUGE_2D[1]))])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ATen's own _select_conv_backend agrees on zero-stride stand-ins" in out


def _real_and_stand_in(q: ConvQuery) -> tuple[str, str]:
    answers = []
    for stand_in in (False, True):
        x, w, *b = ex._aten_tensors(q, stand_in)
        answers.append(backend_name(torch._C._select_conv_backend(
            x, w, b[0] if b else None, *q.params.aten_args())))
    return answers[0], answers[1]


@given(dim=st.sampled_from([2, 3]), n=st.sampled_from([0, 1, 2, 15, 16, 17]),
       c=st.sampled_from([1, 3, 4, 8]), groups=st.sampled_from([1, 2, 4]),
       kernel=st.sampled_from([1, 3]), size=st.sampled_from([1, 6, 40]),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       transposed=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
       bias=st.booleans(), requires_grad=st.booleans(), mkldnn=st.booleans(),
       threads=st.sampled_from([1, 2]))
def test_aten_reads_a_stand_in_as_the_real_tensors(dim, n, c, groups, kernel, size, stride,
                                                    dilation, transposed, dtype, bias,
                                                    requires_grad, mkldnn, threads) -> None:
    # the class: whatever the layer, ATen's selection on zero-stride stand-ins is its
    # selection on the real (contiguous) tensors, so the large-layer cross-check is sound
    if c % groups or size < dilation * (kernel - 1) + 1:
        return  # not a valid layer
    wshape = [c, c // groups, *[kernel] * dim]  # C_in == C_out: the same both ways
    q = ConvQuery.create([n, c, *[size] * dim], wshape, stride, 0, dilation, transposed,
                         0, groups, dtype, bias=bias, requires_grad=requires_grad)
    old = (torch._C._get_mkldnn_enabled(), torch.get_num_threads())
    torch._C._set_mkldnn_enabled(mkldnn)
    torch.set_num_threads(threads)
    try:
        real, stand_in = _real_and_stand_in(q)
    finally:
        torch._C._set_mkldnn_enabled(old[0])
        torch.set_num_threads(old[1])
    assert real == stand_in


def test_stand_ins_own_no_memory() -> None:
    q = ConvQuery.create(*HUGE_2D)
    x, w, b = ex._aten_tensors(q, stand_in=True)
    assert x.shape == torch.Size(HUGE_2D[0]) and b.shape == (64,)
    assert all(t.untyped_storage().nbytes() == 4 for t in (x, w, b))


def test_small_layers_are_still_asked_on_real_tensors() -> None:
    q = ConvQuery.create([8, 3, 32, 32], [16, 3, 3, 3], channels_last=True)
    check = ex.aten_check(q, Environment.current())
    assert check.how == "on empty tensors" and check.backend == ex.explain(q).forward.backend


@pytest.mark.parametrize("device", ["mps", "xpu"])
def test_no_device_here_says_so(device) -> None:
    q = ConvQuery.create([1, 3, 8, 8], [4, 3, 3, 3], device=device)
    check = ex.aten_check(q, Environment.typical(device))
    assert check.backend is None and f"no {device} device here" in check.how


def test_an_aten_error_is_shown_beside_the_rule_not_raised(monkeypatch) -> None:
    def refuses(*args):
        raise RuntimeError("refused here\n  C++ frames that stay out of the answer")

    monkeypatch.setattr(torch._C, "_select_conv_backend", refuses)
    e = ex.explain(ConvQuery.create([1, 3, 8, 8], [4, 3, 3, 3]))
    assert e.aten.backend is None
    assert e.aten.how == "this machine's rules; ATen raised: refused here"
    assert e.forward.backend  # the rule still answers
