"""convlab.lab.per_sample_auto: the sweep's record has every route at every point and names
the auto route's worst point. No assertion on a time."""

from __future__ import annotations

import json

import torch

from convlab.lab import per_sample_auto as psa
from convlab.scratch.per_sample import ROUTES, per_sample_weight_grad


def test_grid_layers_have_their_channels_per_group() -> None:
    for cpg in psa.GRID["channels_per_group"]:
        x, size, go, groups = psa.layer(cpg, 2, 3)
        assert size[1] == cpg and x.shape[1] == cpg * groups
        got = per_sample_weight_grad(x, size, go, 1, 1, 1, groups)
        assert got.shape == (2, *size)


def test_record_quick_structure() -> None:
    before = torch.get_num_threads()
    rec = psa.record(quick=True)
    assert torch.get_num_threads() == before
    json.dumps(rec)
    assert len(rec["points"]) == 2
    for p in rec["points"]:
        assert set(p["seconds"]) == set(ROUTES)
        assert p["fastest"] in ROUTES and p["auto"] in ROUTES
        assert p["auto_over_fastest"] > 0
    assert rec["worst"] in rec["points"]
    assert rec["worst"]["auto_over_fastest"] == max(p["auto_over_fastest"]
                                                    for p in rec["points"])


def test_rule_summary_applies_the_current_rule_to_stored_times() -> None:
    # depthwise 3x3 at N = 8: the rule now takes grouped, whatever "auto" was stored.
    stored = {"channels_per_group": 1, "n": 8, "kernel": 3, "threads": 1,
              "seconds": {"grouped": 2.0, "grouped_cl": 1.0, "im2col": 4.0},
              "fastest": "grouped_cl", "auto": "im2col", "auto_over_fastest": 4.0}
    one = {**stored, "n": 1}  # one sample: im2col
    now = psa.rule_summary({"block": 16, "points": [stored, one]})
    assert now["points"] == 2 and now["near"] == 0
    assert now["worst"]["auto"] == "im2col" and now["worst"]["n"] == 1
    assert now["worst"]["auto_over_fastest"] == 4.0
    best = {**stored, "seconds": {"grouped": 1.0, "grouped_cl": 1.05, "im2col": 3.0}}
    assert psa.rule_summary({"block": 16, "points": [best]})["near"] == 1
