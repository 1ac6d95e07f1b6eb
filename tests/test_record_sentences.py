"""The sentences about records (convlab.lab.record.record_sentences) and the chapters' record
scope (convlab.lab.record.record_pages), on small fake records."""

from __future__ import annotations

from types import SimpleNamespace

from convlab.lab.record import record_pages
from convlab.lab.record import record_sentences as S


def rec(machine="M1", isa="avx2", capped=False, **sections):
    names = {"avx2": "AVX2", "sse41": "SSE4.1", "avx512": "AVX-512"}
    return SimpleNamespace(machine=machine.lower(), machine_name=machine, isa=isa,
                           isa_name=names[isa], label=f"{machine}, {names[isa]}",
                           mkl_capped=capped, sections=sections)


def numerics(slow_same=(True, True, True), slow_ulps=1.0):
    return {"threads_bits": {"counts": [1, 2], "rows": [
                {"conv": "2-d", "backend": "Mkldnn", "same": [True, False, False]},
                {"conv": "3-d", "backend": "Slow3d", "same": list(slow_same)}]},
            "accuracy": [
                {"layer": "3-d", "dtype": "float32", "backend": "Slow3d",
                 "ulps": {"grad_input": 1.0, "grad_weight": slow_ulps, "grad_bias": 0.5}},
                {"layer": "3-d", "dtype": "float32", "backend": "Mkldnn",
                 "ulps": {"grad_input": 9.0, "grad_weight": 9.0, "grad_bias": 9.0}}]}


def test_slow_bits_counts_and_names_the_records_that_changed():
    recs = [rec(numerics=numerics()), rec(isa="sse41", numerics=numerics((False, True, True))),
            rec(isa="avx512", numerics={"error": "failed"})]
    text = S.slow_bits_across_threads(recs)
    assert "in 1 of 2 records" in text
    assert "M1, SSE4.1 (3-d Slow3d grad_input)" in text
    # oneDNN's changes are not the slow kernels'
    assert "Mkldnn" not in text
    assert S.slow_bits_across_threads([rec(numerics=numerics())]).endswith(
        "in 1 of 1 records.")


def test_mkl_capped_names_the_capping_records():
    recs = [rec(), rec("M2", "sse41", capped=True), rec("M2", "avx2", capped=True)]
    text = S.mkl_capped(recs)
    assert text.startswith("2 of the 3 records capped MKL too (M2 under SSE4.1, AVX2)")
    assert S.mkl_capped([rec()]).startswith("None of the 1 records capped MKL")


def roofline(mkl, onednn):
    return {"gemm": {"torch.mm": {"1": {"gflops": 1.0}, "2": {"gflops": mkl}},
                     "onednn matmul": {"1": {"gflops": 1.0}, "2": {"gflops": onednn}}}}


def test_gemm_leader_splits_by_the_mkl_cap():
    recs = [rec("A", "sse41", roofline=roofline(150, 50)),
            rec("B", "sse41", capped=True, roofline=roofline(60, 80)),
            rec("A", "avx2", roofline=roofline(10, 200))]
    text = S.gemm_leader(recs)
    assert "did not cap MKL" in text and "A 150 against 50 GF/s (MKL x3.0)" in text
    assert "capped MKL" in text and "B 60 against 80 GF/s (oneDNN x1.3)" in text
    assert "200" not in text  # the AVX2 record is another setting
    assert S.gemm_leader([rec()]).startswith("No record")


def test_slow_rows_across_isa_finds_a_changed_row():
    same = [rec(numerics=numerics()), rec(isa="sse41", numerics=numerics())]
    assert "agree across its settings" in S.slow_rows_across_isa(same)
    moved = [rec(numerics=numerics()),
             rec(isa="sse41", capped=True, numerics=numerics(slow_ulps=4.0))]
    text = S.slow_rows_across_isa(moved)
    assert "MKL capped under SSE4.1" in text and "differ between its settings on 3-d" in text


def route(ratio, rounds, kind="weight"):
    return {"kind": kind, "ratio_vs_grouped": ratio, "round_ratios": rounds,
            "median_s": 1.0}


def test_fastest_route_ranks_by_the_per_round_ratio():
    # median_s would rank "b" first; the per-round ratios rank "a" first (the table's order)
    compare = {"aa_band": 0.05, "routes": {
        "a": {**route(0.5, [0.5] * 7), "median_s": 2.0},
        "b": {**route(1.0, [1.0] * 7), "median_s": 1.0},
        "c": route(0.1, [0.1] * 7, kind="step")}}
    assert S.fastest_route(compare) == "fastest weight-only route: a (faster than b)"
    compare["aa_band"] = 5.0
    assert "not resolved (a x0.50 and b x1.00" in S.fastest_route(compare)


def test_record_pages_scope():
    recs = [rec(record_pages.REFERENCE_MACHINE, "avx2"),
            rec(record_pages.REFERENCE_MACHINE, record_pages.REFERENCE_ISA), rec("other")]
    for r in recs[:2]:
        r.machine = record_pages.REFERENCE_MACHINE
    assert record_pages.shown(recs) == recs[:2]
    assert record_pages.one(recs) == [recs[1]]
    assert "1 more record(s)" in record_pages.reference_note(recs)
    with record_pages.appendix_scope():
        assert record_pages.shown(recs) == recs and record_pages.one(recs) == recs
    assert record_pages.shown(recs) == recs[:2]


def lowp(*rows):
    return {"rows": list(rows), "support": {}}


def lowp_row(layer, dtype, impl, ratio=None, single=None):
    row = {"layer": layer, "dtype": dtype, "impl": impl}
    if ratio is not None:
        row["over_float32"] = {"median": ratio}
    if single is not None:
        row["single_call_s"] = single
    return row


def test_lowp_reference_kernels_and_same_kernel():
    fast = {"backward_data": "jit_bf16:x", "backward_weights": "jit_bf16:x"}
    ref = {"backward_data": "brg:y", "backward_weights": "ref:any"}
    recs = [rec("A", lowp=lowp(lowp_row("resnet14", "bfloat16", fast, 0.5))),
            rec("B", lowp=lowp(lowp_row("resnet14", "bfloat16", fast, 1.5),
                               lowp_row("cifar5", "float16", ref, 40.0),
                               lowp_row("resnet14", "float16", ref, single=2.5)))]
    text = S.lowp_reference_kernels(recs)
    assert text.startswith("float16 on B under AVX2: backward_weights ran")
    assert "cifar5 x40" in text and "resnet14 2.5 s for one call" in text
    assert S.lowp_reference_kernels(recs[:1]).startswith("No record")
    same = S.lowp_same_kernel(recs)
    assert same == "resnet14, jit_bf16:x in both passes, time over float32: A x0.50; B x1.50"
