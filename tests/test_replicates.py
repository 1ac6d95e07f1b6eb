"""convlab.lab.record.replicates and record_method: the headline numbers of a section, their
spread between processes, and the appendix's table of how each section was taken."""

from __future__ import annotations

import json

import pytest

from convlab.lab.record import record_method, records, replicates


def test_headline_finds_verdicts_named_ratios_and_rates():
    section = {
        "aa_band": 0.1,
        "layers": [{"layer": "a", "slow_over_onednn": {"median": 1.3, "verdict": "slower",
                                                       "per_round": [1.2, 1.4]},
                    "times": {"slow": {"gflops": 50.0, "rounds_s": [1.0]}}}],
        "points": [{"channels_per_group": 1, "n": 8, "auto_over_fastest": 1.1,
                    "auto_over_fastest_per_round": [1.0, 1.2]}],
        "runs": [{"n": 64, "threads": 1, "steps": {"DP": {"ratio_vs_sgd": 1.5,
                                                           "process_ratios_vs_sgd": [1.5]}}}],
        "zero": {"median": 0.0, "verdict": "?"},
    }
    assert replicates.headline(section) == {
        "layers[a]/slow_over_onednn": 1.3,
        "layers[a]/times/slow/gflops": 50.0,
        "points[channels_per_group=1,n=8]/auto_over_fastest": 1.1,
        "runs[n=64,threads=1]/steps/DP/ratio_vs_sgd": 1.5,
    }
    with pytest.raises(TypeError, match="section"):
        replicates.headline([1.0])


def test_spread_separates_ratios_from_rates():
    heads = [{"r": 1.0, "x/gflops": 100.0, "only_here": 2.0, "itself": 1.0},
             {"r": 1.2, "x/gflops": 90.0, "itself": 1.0},
             {"r": 1.1, "x/gflops": 95.0, "itself": 1.0}]
    ratio = replicates.spread(heads, "ratio")
    # only_here is not shared; itself is 1 in every process (a candidate over itself)
    assert ratio["keys"] == 1 and ratio["max"] == pytest.approx(0.2)
    assert ratio["max_key"] == "r" and ratio["processes"] == 3
    rate = replicates.spread(heads, "rate")
    assert rate["max"] == pytest.approx(100 / 90 - 1) and rate["median"] == rate["max"]
    one = replicates.spread(heads[:1], "ratio")
    assert one["median"] is None and one["max"] is None  # one process has no spread
    with pytest.raises(ValueError, match="kind"):
        replicates.spread(heads, "speed")
    with pytest.raises(TypeError, match="processes"):
        replicates.spread({"r": 1.0}, "ratio")


def _rec(tmp_path, sections, meta):
    from test_records import _record

    data = _record(**sections)
    data["section_meta"] = meta
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(data))
    return records.read_record(path)


def test_taken_table_labels_both_noise_figures_and_the_load(tmp_path):
    rec = _rec(tmp_path, {
        "suite": {"aa_band": 0.12}, "per_sample": {"compare": {"aa_band": 0.3}},
        "peers": {"error": "RuntimeError: no"},
        "dpsgd": {"runs": [{"n": 64, "threads": 1, "aa_band": 0.2, "steps": {"DP": {
            "median_s": 1.0, "min_s": 1.0, "calls_per_round": 1, "peak_mb": 1.0,
            "process_ratios_vs_sgd": [1.0, 1.1, 1.05], "process_spread": 0.1}}}]},
        "numerics": {"x": 1}}, {
        "suite": {"method": 2, "load": {"quiet": False, "why": "steal 9% of the core-seconds",
                                        "steal": 0.09, "others": 0.0},
                  "process_spread": {"ratio": {"processes": 3, "median": 0.04, "max": 0.2},
                                     "rate": {"median": None}}},
        "per_sample": {"method": 2, "load": {"quiet": True, "steal": 0.0, "others": 0.01}}})
    table = record_method.taken_table([rec])
    rows = {row[1]: row for row in table.rows}
    assert set(rows) == {"suite", "per_sample", "peers", "dpsgd"}  # numerics is not timed
    assert rows["suite"][2:] == ["A/A + 3 processes", "12%", "3 processes: median 4%, max 20%",
                                 "NOT QUIET: steal 9% of the core-seconds"]
    assert rows["per_sample"][3:] == ["30%", "-", "quiet (others 1%, steal 0%)"]
    assert rows["peers"][-1] == "error: RuntimeError: no"
    assert rows["dpsgd"][2:] == ["earlier (one process)", "20%",
                                 "3 processes (its own): max 10%", "not stored"]
    assert "within-run A/A band" in table.headers
    assert "between-process spread" in table.headers
    rates = {"ratio": {"median": None}, "rate": {"processes": 3, "median": 0.05, "max": 0.1}}
    assert record_method.spread_text(rates) == "3 processes: median 5%, max 10% of the GF/s"
    assert record_method.spread_text(None) == "-"
