"""convlab.lab.reference_speed: its candidates compute ATen's gradients; rows and shares."""

from __future__ import annotations

import pytest
import torch

from convlab.lab import paths, reference_speed
from convlab.lab.timing import Timing


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
