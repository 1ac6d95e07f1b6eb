"""convlab.lab.sections.per_sample_timing: the peers compute the same per-sample gradients, missing
peers are recorded as skipped, and the verdict/crossover logic. No assertion on a time."""

from __future__ import annotations

import json

import pytest
import torch

from convlab.lab.sections import per_sample_timing as pst

SMALL = (3, 4, 6, 8, 3)  # N, C_in, C_out, size, kernel


def test_every_weight_route_matches_convlab_im2col() -> None:
    weight, step = pst.routes(SMALL)
    truth = weight["convlab im2col"]()
    assert truth.shape == (3, 6, 4, 3, 3)
    for name, fn in {**weight, **step}.items():
        if isinstance(fn, str) or name == "forward only":
            continue
        torch.testing.assert_close(fn(), truth, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("peer", ["opacus", "backpack", "unfoldNd"])
def test_peer_routes_run_when_installed(peer: str) -> None:
    pytest.importorskip(peer)
    weight, _ = pst.routes(SMALL)
    assert not any(isinstance(fn, str) for fn in weight.values())


def test_missing_peers_are_recorded_as_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pst, "installed", lambda package: False)
    weight, _ = pst.routes(SMALL)
    skipped = {name for name, fn in weight.items() if isinstance(fn, str)}
    assert skipped == {"Opacus (unfold + einsum)", "unfoldNd + einsum",
                       "BackPACK BatchGrad (grouped conv)"}


def test_record_quick_structure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pst, "LAYER", SMALL)
    monkeypatch.setattr(pst, "installed", lambda package: False)
    before = torch.get_num_threads()
    rec = pst.record(quick=True)
    assert torch.get_num_threads() == before
    json.dumps(rec)
    routes = rec["compare"]["routes"]
    assert routes["Opacus (unfold + einsum)"] == {"skipped": "not installed"}
    assert routes["convlab grouped"]["ratio_vs_grouped"] == 1.0
    for name, row in routes.items():
        if "skipped" in row:
            continue
        assert row["median_s"] > 0 and row["min_s"] <= row["median_s"] <= row["max_s"]
        if name != "forward only":
            assert row["matches_im2col"] is True
    assert rec["compare"]["expanded_weights_threshold"] == 32
    for axis in ("N", "positions"):
        assert all(p["im2col_over_grouped"] > 0 for p in rec["sweep"][axis])


def test_verdict_is_the_timing_sign_test() -> None:
    assert pst.verdict([1.3] * 7, band=0.1)["verdict"] == "slower"
    assert pst.verdict([0.75] * 7, band=0.1)["verdict"] == "faster"
    assert pst.verdict([0.9] + [1.4] * 6, band=0.1)["verdict"] == "within noise"
    assert pst.verdict([1.05] * 7, band=0.1)["verdict"] == "within noise"  # inside the band


def test_crossover_sentences() -> None:
    def pts(*verdicts: str) -> list[dict[str, object]]:
        return [{"n": 2**i, "verdict": v} for i, v in enumerate(verdicts)]

    assert pst.crossover(pts("slower", "slower"), "n") == "n = 1-2: grouped faster"
    assert pst.crossover(pts("faster"), "n") == "n = 1: im2col faster"
    assert pst.crossover(pts("within noise", "slower", "slower"), "n") == (
        "n = 1: within noise; n = 2-4: grouped faster")
