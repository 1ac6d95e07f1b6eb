"""convlab.lab.sections.reference_speed: its candidates compute ATen's gradients; rows and
shares."""

from __future__ import annotations

import pytest
import torch

from convlab.lab import paths
from convlab.lab.method.timing import Timing
from convlab.lab.sections import reference_speed


@pytest.mark.parametrize("name", reference_speed.QUICK_LAYERS)
def test_every_candidate_gives_atens_gradients(name: str) -> None:
    layer = paths.suite_layers([name])[0]
    fns, around, chosen = reference_speed.candidates(layer)
    assert chosen in ("shift", "im2col", "depthwise")
    assert {"reference", "reference fast", "aten slow", "onednn (A/A)"} <= set(fns)
    x, w, b, go = layer.tensors()
    want = torch.ops.aten.convolution_backward(go, x, w, [b.shape[0]], *layer.args(),
                                               [True, True, True])
    for label, fn in fns.items():
        with around.get(label, paths.get_path("native").held)():
            got = fn()
        for g, e in zip(got, want, strict=True):  # float32 sums of up to ~10^4 terms
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3 * e.abs().max().item())


def test_rows_pool_the_band_and_name_the_ratios() -> None:
    layer = paths.suite_layers(["conv1d"])[0]
    names = ["reference", "reference fast", "fast im2col", "aten slow", "aten slow (A/A)",
             "onednn", "onednn (A/A)"]
    seconds = {"reference": 2.0, "reference fast": 1.0, "fast im2col": 1.5, "aten slow": 1.0,
               "aten slow (A/A)": 1.0, "onednn": 0.5, "onednn (A/A)": 0.5}
    timings = {n: Timing(n, tuple(seconds[n] * (1 + 0.001 * i) for i in range(6)), 1)
               for n in names}
    rows, band = reference_speed.rows_of([(layer, timings, "shift")])
    ratios = rows[0]["ratios"]
    assert ratios["reference / aten slow"]["median"] == pytest.approx(2.0)
    assert ratios["reference fast / onednn"]["median"] == pytest.approx(2.0)
    assert ratios["reference fast / fast im2col"]["median"] == pytest.approx(1 / 1.5)
    assert "reference fast / fast shift" not in ratios
    assert rows[0]["form"] == "shift" and band == pytest.approx(0.0, abs=1e-12)


def test_copy_shares_are_fractions() -> None:
    layer = paths.Layer("small", (2, 16, 8, 8), (16, 16, 3, 3), padding=1)
    shares = reference_speed.copy_shares(layer, repeat=1)
    for form in ("reference", "reference fast"):
        assert 0.0 <= shares[form]["copy_share"] <= shares[form]["moves_share"] <= 1.0
        assert shares[form]["top"]


def _section(forms: dict[str, str], times: dict[str, list[float]]) -> dict:
    """A stored section: each layer of ``forms`` with the same per-round ``times``."""
    rows = [{"layer": name, "shape": "", "form": form,
             "times": {k: {"rounds_s": v} for k, v in times.items()}}
            for name, form in forms.items()]
    return {"method": {"threads": 2}, "layers": rows}


def test_rule_rows_follow_the_current_rule_at_the_records_thread_count() -> None:
    times = {"reference": [4.0, 6.0, 5.0], "reference fast": [1.0, 1.0, 1.0],
             "fast im2col": [3.0, 2.0, 4.0], "aten slow": [2.0, 2.0, 2.0],
             "onednn": [1.0, 1.0, 1.0]}
    # mid3x3 was timed when the rule gave it the shift form ("reference fast"); at two
    # threads the rule now picks im2col, so its numbers are the stored "fast im2col".
    rows = reference_speed.rule_rows(_section({"mid3x3": "shift"}, times))
    (row,) = rows
    assert row["form"] == "im2col"
    assert row["fast / slow"] == pytest.approx(1.5)  # median of 1.5, 1.0, 2.0
    assert row["fast / onednn"] == pytest.approx(3.0)
    assert row["simple / slow"] == pytest.approx(2.5)
    assert row["simple / fast"] == pytest.approx(4 / 3)  # median of 4/3, 3, 5/4
    same = reference_speed.rule_rows(_section({"mid3x3": "im2col"}, times))
    assert same[0]["fast / slow"] == pytest.approx(0.5)  # "reference fast" itself


def test_rule_rows_refuse_a_record_without_the_rules_form() -> None:
    times = {"reference": [1.0], "reference fast": [1.0], "fast shift": [1.0],
             "aten slow": [1.0], "onednn": [1.0]}
    with pytest.raises(ValueError, match="mid3x3.*'im2col'"):
        reference_speed.rule_rows(_section({"mid3x3": "shift"}, times))


def test_rule_rows_of_the_committed_records() -> None:
    from convlab.lab.record import records

    found = [r for r in records.load_records()
             if "error" not in r.sections.get("reference_speed", {"error": "absent"})]
    assert found, "no committed record has a reference_speed section"
    for r in found:
        rows = reference_speed.rule_rows(r.section("reference_speed"))
        assert {row["layer"] for row in rows} >= {"mid3x3", "conv1d", "depthwise"}
        forms = {row["layer"]: row["form"] for row in rows}
        assert forms["depthwise"] == "depthwise" and forms["mid3x3"] == "im2col"
        assert all(v > 0 for row in rows for k, v in row.items() if "/" in k)
