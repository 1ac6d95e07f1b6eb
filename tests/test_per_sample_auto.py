"""convlab.lab.sections.per_sample_auto: the sweep's record has every route at every point and names
the auto route's worst point. No assertion on a time."""

from __future__ import annotations

import json
import math

import torch

from convlab.aten.fast_per_sample import ROUTES, per_sample_weight_grad
from convlab.lab.sections import per_sample_auto as psa
from convlab.scratch import per_sample


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
        assert set(p["peak_mib"]) == set(ROUTES) | set(p["peers"])
        assert all(isinstance(v, float) and v > 0 for v in p["peers"].values())
        assert all(v > 0 for v in p["peak_mib"].values()) and p["forward_s"] > 0
        assert p["auto_over_fastest"] > 0
    assert psa.against_peers(rec)["speed"]["of"] == 2
    assert rec["worst"] in rec["points"]
    assert rec["worst"]["auto_over_fastest"] == max(p["auto_over_fastest"]
                                                    for p in rec["points"])


def test_rule_summary_applies_the_current_rule_to_stored_times() -> None:
    # 16 channels, 3x3, N = 64: the rule now takes grouped, whatever "auto" was stored.
    stored = {"channels_per_group": 16, "n": 64, "kernel": 3, "threads": 1,
              "seconds": {"grouped": 2.0, "grouped_cl": 1.0, "im2col": 4.0},
              "fastest": "grouped_cl", "auto": "im2col", "auto_over_fastest": 4.0}
    one = {**stored, "channels_per_group": 64, "kernel": 1}  # 1x1, 64 samples: im2col
    now = psa.rule_summary({"block": 16, "points": [stored, one]})
    assert now["points"] == 2 and now["near"] == 0 and now["untimed"] == 0
    assert now["worst"]["auto"] == "im2col" and now["worst"]["kernel"] == 1
    assert now["worst"]["auto_over_fastest"] == 4.0
    best = {**stored, "seconds": {"grouped": 1.0, "grouped_cl": 1.05, "im2col": 3.0}}
    assert psa.rule_summary({"block": 16, "points": [best]})["near"] == 1
    # depthwise 5x5 at N = 8: the rule takes the loop, which this old sweep did not time
    old = {**stored, "channels_per_group": 1, "n": 8, "kernel": 5}
    now = psa.rule_summary({"block": 16, "points": [old]})
    assert now == {"near": 0, "points": 0, "untimed": 1, "worst": None}


def test_every_peer_gives_convlabs_per_sample_gradients_at_every_layer() -> None:
    from convlab.lab.sections import per_sample_timing

    for cpg in psa.GRID["channels_per_group"]:
        x, size, go, groups = psa.layer(cpg, 3, 3)
        w = torch.randn(size)
        want = per_sample_weight_grad(x, size, go, 1, 1, 1, groups)
        for name, fn in per_sample_timing.peer_routes(x, w, go, 1, groups).items():
            assert callable(fn), (name, fn)  # the pinned requirements install every peer
            # float32 sums of up to N * 16 * 16 = 768 products of N(0, 1) values
            torch.testing.assert_close(fn(), want, rtol=1e-4, atol=1e-3,
                                       msg=f"{name}, {cpg} channels per group")


def test_against_peers_reads_speed_step_and_peak_per_point() -> None:
    pts = [{"channels_per_group": 16, "n": 64, "kernel": 3, "threads": 1,
            "seconds": {"grouped": 1.0, "grouped_cl": 3.0, "im2col": 2.0},
            "peers": {"vmap(conv backward)": 0.5, "Opacus (unfold + einsum)": 4.0,
                      "BackPACK BatchGrad (grouped conv)": "not installed",
                      "ExpandedWeights": 3.0},
            "forward_s": 0.5, "peak_mib": {"grouped": 2.0, "grouped_cl": 2.0,
                                           "im2col": 8.0, "vmap(conv backward)": 1.0,
                                           "Opacus (unfold + einsum)": 9.0,
                                           "ExpandedWeights": 0.5}}]
    section = {"block": 16, "points": pts}
    out = psa.against_peers(section)
    auto = out["speed"]["worst"]["auto"]
    t = {**pts[0]["seconds"], "vmap(conv backward)": 0.5}
    assert out["speed"]["worst"]["speed"] == t[auto] / 0.5
    assert out["step"]["worst"]["step"] == (0.5 + t[auto]) / 3.0
    assert out["peak"]["worst"]["peak"] == pts[0]["peak_mib"][auto] / 1.0  # not EW's 0.5
    assert out["speed"]["of"] == 1 and out["points"] == 1
    assert psa.against_peers({"block": 16, "points": [
        {k: v for k, v in pts[0].items() if k != "peers"}]}) is None


def test_route_facts_read_the_fastest_route_and_the_depthwise_ratio() -> None:
    def pt(c, n, k, **seconds):
        return {"channels_per_group": c, "n": n, "kernel": k, "threads": 1, "seconds": seconds}
    section = {"points": [
        pt(16, 8, 1, grouped=2.0, im2col=1.0, forward=3.0),
        pt(16, 8, 1, grouped=1.0, im2col=1.5, forward=3.0),
        pt(16, 1, 1, grouped=2.0, im2col=1.0, forward=3.0, loop=0.5),  # loop left out
        pt(1, 8, 5, grouped=6.0, im2col=2.0, forward=1.0),
        pt(1, 64, 7, grouped=20.0, im2col=5.0, forward=2.0),
        pt(1, 1, 7, grouped=9.0, im2col=1.0, forward=1.0),  # one sample: not counted
        pt(1, 8, 3, grouped=1.0, im2col=2.0, forward=1.0),  # 3x3: not counted
    ]}
    facts = psa.route_facts(section)
    assert facts == {"one_by_one": (2, 3), "depthwise_forward": (6.0, 10.0)}
    for p in section["points"]:
        del p["seconds"]["forward"]
    assert psa.route_facts(section)["depthwise_forward"] is None


def test_against_scratch_compares_the_rule_with_the_scratch_rule_per_point() -> None:
    def pt(c, n, k, seconds, peaks=None):
        p = {"channels_per_group": c, "n": n, "kernel": k, "threads": 1, "seconds": seconds}
        return p if peaks is None else {**p, "peak_mib": peaks}
    stem = pt(3, 8, 3, {"loop": 1.0, "im2col": 4.0, "grouped": 2.0},
              {"loop": 1.0, "im2col": 4.0, "grouped": 3.0})
    wide = pt(64, 64, 3, {"loop": 9.0, "im2col": 4.0, "grouped": 2.0},
              {"loop": 1.0, "im2col": 4.0, "grouped": 3.0})
    # the routes each rule takes at these points (block 16): loop / im2col, grouped / grouped
    assert psa.rule_route(stem, 16) == "loop" and psa.rule_route(wide, 16) == "grouped"
    assert per_sample.choose_method(8, 3, [3, 3], torch.float32, 16, 1, 1) == "im2col"
    untimed = pt(3, 8, 3, {"im2col": 4.0, "grouped": 2.0})  # a sweep before the loop
    out = psa.against_scratch({"block": 16, "points": [stem, wide, untimed]})
    assert out["points"] == 2 and out["loop"] == 1
    assert math.isclose(out["time"], 0.5) and out["time_range"] == (0.25, 1.0)
    assert math.isclose(out["peak"], 0.5)  # sqrt(1/4 * 3/3)
    old = psa.against_scratch({"block": 16, "points": [untimed]})
    assert old == {"points": 0, "loop": 0, "time": None, "time_range": None, "peak": None}
    no_peaks = psa.against_scratch({"block": 16, "points": [
        {k: v for k, v in stem.items() if k != "peak_mib"}]})
    assert no_peaks["time"] == 0.25 and no_peaks["peak"] is None
