"""convlab.lab.sections.lowp: bfloat16/float16 oneDNN backward against float32, where ATen routes
them to oneDNN; elsewhere stored as not supported with the reason."""

from __future__ import annotations

import pytest
import torch

from convlab.lab import paths
from convlab.lab.record import record_schema
from convlab.lab.sections import lowp

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="no oneDNN in this build")


def test_support_follows_atens_query():
    got = lowp.support()
    assert set(got) == {"bfloat16", "float16"}
    for name, (_, query) in lowp.LOW.items():
        assert got[name]["supported"] is getattr(torch.ops.mkldnn, query)()
        if not got[name]["supported"]:
            assert query in got[name]["reason"]


def test_unsupported_dtypes_are_stored_with_their_reason_not_timed(monkeypatch):
    none = {name: {"supported": False, "reason": f"torch.ops.mkldnn.{q}() is False"}
            for name, (_, q) in lowp.LOW.items()}
    monkeypatch.setattr(lowp, "support", lambda: none)
    section = lowp.record(quick=True)
    assert record_schema.SECTION_CHECKS["lowp"](section) == []
    assert section["support"] == none
    assert [(r["layer"], r["dtype"]) for r in section["rows"]] == [("cifar5", "float32")]
    row = section["rows"][0]
    assert "over_float32" not in row and set(row["impl"]) == {"backward_data",
                                                             "backward_weights"}
    # float32 against float64 on the same inputs: sums of up to 32768 products in
    # float32, so a few 1e-6 relative (measured 8e-7 and 3e-6); 1e-4 catches a wrong one
    assert max(row["max_rel_error"].values()) < 1e-4
    assert section["aa_pairs"] == 1


def test_quick_section_times_what_this_machine_supports():
    section = lowp.record(quick=True)
    assert record_schema.SECTION_CHECKS["lowp"](section) == []
    supported = [n for n, s in section["support"].items() if s["supported"]]
    rows = {r["dtype"]: r for r in section["rows"]}
    assert set(rows) == {"float32", *supported}
    for name in supported:
        row = rows[name]
        assert row["aten_picks"] == "Mkldnn" and all(row["impl"].values())
        # a bfloat16/float16 gradient keeps 8/11 significant bits: errors of a few units
        # of 2^-8 are its rounding; 2^-5 still catches a wrong kernel or dtype
        assert 0 < max(row["max_rel_error"].values()) < 2**-5
        if "times" in row:
            ratio = row["over_float32"]
            assert ratio["ci_low"] <= ratio["median"] <= ratio["ci_high"]
        else:
            assert row["single_call_s"] > lowp.MAX_CALL_S


def test_max_rel_errors_measures_against_float64():
    layer = paths.suite_layers(["cifar5"])[0]
    f32 = lowp.max_rel_errors(layer, torch.float32)
    assert set(f32) == {"grad_input", "grad_weight"} and max(f32.values()) < 1e-4


@pytest.mark.parametrize(("section", "problem"), [
    ({"support": {"bfloat16": {"supported": False}}, "rows": []}, "a reason where not"),
    ({"support": {}, "rows": {}}, "sections.lowp.rows must be a list"),
    ({"support": {}, "rows": [{"layer": "x", "dtype": "bfloat16", "impl": {}}]},
     "needs impl, max_rel_error and times or single_call_s"),
])
def test_schema_names_a_bad_lowp_section(section, problem):
    assert any(problem in p for p in record_schema.SECTION_CHECKS["lowp"](section))
