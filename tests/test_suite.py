"""The record sections suite, roofline and peers: their bookkeeping on tiny stand-in layers
(one or two short rounds; no assertion about how fast anything ran)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from convlab.lab import paths
from convlab.lab.paths import Layer
from convlab.lab.sections import peers, roofline, suite

TINY_SUITE = (
    Layer("resnet28", (2, 8, 8, 8), (8, 8, 3, 3), padding=1),
    Layer("cifar5", (2, 3, 8, 8), (4, 3, 5, 5), padding=2),
    Layer("depthwise", (2, 8, 6, 6), (8, 1, 3, 3), padding=1, groups=8),
    Layer("conv1d", (2, 4, 16), (4, 4, 3), padding=1),
    Layer("grouped", (2, 8, 6, 6), (8, 2, 3, 3), padding=1, groups=4),
)
TINY = {"rounds": 2, "min_calls": 1, "min_run_time": 1e-4}


@pytest.fixture(scope="module")
def suite_record() -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "SUITE", TINY_SUITE)
        mp.setattr(suite, "QUICK", TINY)
        mp.setattr(suite, "QUICK_C_IN", (1, 3))
        return suite.record(quick=True)


def test_suite_record_is_json_and_self_describing(suite_record: dict) -> None:
    text = json.dumps(suite_record, allow_nan=True)
    assert "median_s" in text and "gflops" in text and "gbytes_s" in text
    assert suite_record["method"]["rounds"] == 2
    assert [r["layer"] for r in suite_record["layers"]] == list(suite.QUICK_LAYERS)


def test_suite_layers_have_both_backends_and_the_a_a_pairs(suite_record: dict) -> None:
    for row in suite_record["layers"]:
        assert {"mkldnn", "slow"} <= set(row["times"])
        assert row["times"]["mkldnn"]["backend"] == "Mkldnn"
        assert ("native" in row["times"]) == (row["layer"] in suite.AA_LAYERS)
        assert ("slow_aa" in row["times"]) == (row["layer"] in suite.AA_LAYERS)
        if row["layer"] in suite.AA_LAYERS:  # both pairs, their per-round ratios pooled
            assert row["aa_pairs"] == ["native / mkldnn (Mkldnn)",
                                       f"slow / slow_aa ({row['times']['slow']['backend']})"]
            t = row["times"]
            assert row["aa_per_round"] == pytest.approx(
                [a / b for a, b in zip(t["native"]["rounds_s"], t["mkldnn"]["rounds_s"],
                                       strict=True)]
                + [a / b for a, b in zip(t["slow"]["rounds_s"], t["slow_aa"]["rounds_s"],
                                         strict=True)])
        v = row["slow_over_onednn"]
        slow, mk = row["times"]["slow"]["rounds_s"], row["times"]["mkldnn"]["rounds_s"]
        assert v["per_round"] == pytest.approx([a / b for a, b in zip(slow, mk, strict=True)])
        assert v["verdict"] == "within noise"  # 2 rounds can never reject noise
    assert suite_record["aa_pairs"] == 2 * sum(r["layer"] in suite.AA_LAYERS
                                               for r in suite_record["layers"])
    assert set(suite_record["aa_band_by_family"]) == {"Mkldnn", "slow"}
    assert suite_record["aa_band"] >= 0
    assert suite_record["summary"]["layers"] == len(suite_record["layers"])


def test_suite_split_channels_last_c_in_threads(suite_record: dict) -> None:
    split = [r for r in suite_record["split"] if "path" in r]
    assert {r["path"] for r in split} == {"mkldnn", "slow"}
    for r in split:
        gi, gw = r["grad_input"]["median_s"], r["grad_weight"]["median_s"]
        assert r["grad_weight_share"] == pytest.approx(gw / (gi + gw))
    cl = suite_record["channels_last"]
    assert set(cl["times"]) == {"mkldnn contiguous", "mkldnn channels_last",
                                "slow contiguous", "slow channels_last"}
    assert set(cl["onednn_reorders"]) == {"contiguous", "channels_last"}
    assert [r["c_in"] for r in suite_record["c_in_sweep"]["rows"]] == [1, 3]
    threads = suite_record["threads"]
    assert threads["counts"][0] == 1 and threads["counts"] == sorted(set(threads["counts"]))
    assert {r["path"] for r in threads["rows"]} == {"mkldnn", "slow"}


def test_flop_check_shows_the_counter_over_counting_groups(suite_record: dict) -> None:
    rows = {(r["layer"], r["pass"]): r for r in suite_record["flop_check"]}
    assert rows[("resnet28", "backward_weight")]["ratio"] == 1.0
    assert rows[("depthwise", "backward_input")]["ratio"] == 1.0
    grouped = rows[("grouped", "backward_weight")]
    assert grouped["ratio"] in (1.0, 4.0)  # 4.0 until upstream PR #183405 is in torch


def test_roofline_record_and_fractions(monkeypatch) -> None:
    monkeypatch.setattr(roofline, "QUICK", {**TINY, "gemm_n": 32, "stream_log2": 12})
    rec = roofline.record(quick=True)
    counts = [str(n) for n in suite.thread_counts()]
    assert set(rec["peak_gflops"]) == set(counts) == set(rec["triad_gbytes_s"])
    for k in counts:
        assert rec["peak_gflops"][k] == max(g[k]["gflops"] for g in rec["gemm"].values())
        assert rec["peak_from"][k] in rec["gemm"]
    assert "torch.mm" in rec["gemm"]
    if torch.backends.mkldnn.is_available():
        assert "onednn matmul" in rec["gemm"]
    triad = rec["stream"]["triad"][counts[0]]
    assert triad["min_bytes"] == 3 * 4 * 2**12
    method = rec["method"]
    assert (method["stream_elements"], method["stream_array_bytes"]) == (2**12, 4 * 2**12)
    assert method["gemm_matrix_bytes"] == 4 * 32 * 32
    theory = rec["theoretical_peak"]
    if theory["reason"] is None:  # this machine's CPU is in the table
        assert set(theory["gflops"]) == set(counts)
        for k in counts:
            assert theory["measured_over_peak"][k] == pytest.approx(
                rec["peak_gflops"][k] / theory["gflops"][k])
        assert theory["model"]["clock_mhz"] > 0 and theory["model"]["source"]
    else:
        assert theory["gflops"] is None and theory["measured_over_peak"] is None
        assert "not modelled" in theory["reason"]
    fake_suite = {"method": {"threads": int(counts[-1])}, "layers": [{"layer": "x", "times": {
        "slow": {"backend": "Slow2d", "flops": 10**9, "min_bytes": 10**9,
                 "gflops": 1.0, "gbytes_s": 1.0}}}]}
    (row,) = roofline.fractions(fake_suite, rec)
    assert row["flops_per_byte"] == 1.0
    peak = max(rec["peak_gflops"].values())
    bw = max(rec["triad_gbytes_s"].values())
    assert row["bound_gflops"] == pytest.approx(min(peak, bw))


def test_the_triad_computes_the_triad() -> None:
    fns = roofline._stream_candidates(8)
    fns["triad"]()
    # a = b + 3 c with b = 2, c = 0.5
    assert fns["triad"]().tolist() == [2.0 + roofline.TRIAD_SCALAR * 0.5] * 8


def test_peers_record(monkeypatch) -> None:
    monkeypatch.setattr(peers, "QUICK", TINY)
    monkeypatch.setattr(peers, "LAYERS", (Layer("t", (2, 3, 7, 6), (4, 3, 3, 3), padding=1),))
    rec = peers.record(quick=True)
    (row,) = rec["layers"]
    assert set(row["times"]) == {"aten slow", "aten slow (A/A)", "onednn", "onednn (A/A)",
                                 "reference", "thnn", "numpy_ref", "torch.nn.grad"}
    assert all(t["matches"] for t in row["times"].values())
    assert "reference / aten slow" in row["ratios"] and "onednn / aten slow" in row["ratios"]
    assert not math.isnan(rec["aa_band"])


def test_peers_matches_catches_a_wrong_gradient() -> None:
    good = [torch.ones(3), torch.ones(2)]
    assert peers._matches(good, good)
    assert not peers._matches([torch.ones(3), torch.ones(2) * 1.01], good)
    assert not peers._matches([torch.ones(4), torch.ones(2)], good)
