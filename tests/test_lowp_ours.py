"""convlab.lab.sections.lowp_ours: convlab's routes in reduced precision. No assertion on a time."""

from __future__ import annotations

import json

import torch

from convlab.lab.sections import lowp, lowp_ours
from convlab.scratch.per_sample import ROUTES


def test_per_sample_routes_in_bfloat16_are_within_its_rounding() -> None:
    fns, errors = lowp_ours._per_sample_fns("bfloat16")
    _, errors32 = lowp_ours._per_sample_fns("float32")
    assert set(fns) == {f"{r} bfloat16" for r in ROUTES}
    for route in ROUTES:
        low, full = errors[f"{route} bfloat16"], errors32[f"{route} float32"]
        # bfloat16 keeps 8 significant bits: a relative error near 2**-9 per rounding
        assert full < 1e-5 < low < 2**-5, (route, low, full)
        assert fns[f"{route} bfloat16"]().dtype == torch.bfloat16


def test_record_quick_has_a_row_per_candidate_and_supported_dtype() -> None:
    before = torch.get_num_threads()
    rec = lowp_ours.record(quick=True)
    assert torch.get_num_threads() == before
    json.dumps(rec)
    dtypes = {"float32", *(n for n, s in lowp.support().items() if s["supported"])}
    assert rec["support"] == lowp.support()
    assert {(r["candidate"], r["dtype"]) for r in rec["reference"]} == {
        (f"{who} cifar5", d) for who in ("reference", "onednn") for d in dtypes}
    assert {(r["candidate"], r["dtype"]) for r in rec["per_sample"]} == {
        (route, d) for route in ROUTES for d in dtypes}
    for row in rec["reference"] + rec["per_sample"]:
        assert row["median_s"] > 0 and row["over_float32"] > 0
        if row["dtype"] == "float32":
            assert row["over_float32"] == 1.0 and row["max_rel_error"] < 1e-4
        else:
            assert 1e-5 < row["max_rel_error"] < 2**-4
