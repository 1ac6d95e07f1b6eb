"""convlab.lab.record.version_runs: the stored runs of chapters 12 and 13 on other torch
versions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from convlab.lab.record import version_runs

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("old_torch_runs",
                                               ROOT / "scripts" / "old_torch_runs.py")
old_torch_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(old_torch_runs)

RUN = {"date": "2026-12-02", "machine": "m-x2", "python": "3.11",
       "results": {"bug": "bug present: True", "old": "AttributeError: no attribute"}}


def test_store_then_load_orders_versions_numerically(tmp_path):
    path = tmp_path / "runs.json"
    for version in ("2.13.0", "2.9.1", "2.11.0"):
        version_runs.store_run(version, RUN, path)
    version_runs.store_run("2.9.1", {**RUN, "python": "3.10"}, path)  # replaces
    runs = version_runs.load_runs(path)
    assert list(runs) == ["2.9.1", "2.11.0", "2.13.0"]
    assert runs["2.9.1"]["python"] == "3.10"


@pytest.mark.parametrize(("data", "problem"), [
    ([], "schema 1"),
    ({"schema": 1, "runs": []}, "'runs'"),
    ({"schema": 1, "runs": {"2.9": RUN}}, "not a version"),
    ({"schema": 1, "runs": {"2.9.1": {**RUN, "extra": 1}}}, "exactly"),
    ({"schema": 1, "runs": {"2.9.1": {**RUN, "results": {"a": 1}}}}, "result lines"),
])
def test_invalid_files_are_refused_naming_the_problem(tmp_path, data, problem):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=problem):
        version_runs.load_runs(path)
    with pytest.raises(ValueError, match=problem):
        version_runs.store_run("2.9.1", RUN, path)


def test_a_missing_file_is_no_runs(tmp_path):
    assert version_runs.load_runs(tmp_path / "absent.json") == {}


@pytest.mark.parametrize(("line", "cell"), [
    ("bug present: True", "present"), ("bug present: False", "absent"),
    ("exit -6: terminate called", "abort"),
    ("AttributeError: 'module' object has no attribute 'x'", "AttributeError"),
    ("TypeError: 'tuple' object is not callable", "TypeError"),
    ("ran without error", "works"), ("timed out after 300 s", "timed out after 300 s"),
])
def test_short_result(line, cell):
    assert version_runs.short_result(line) == cell


def test_spans_group_consecutive_versions_with_one_result():
    runs = {v: {**RUN, "results": {"bug": f"bug present: {v != '2.11.0'}"}}
            for v in ("2.4.1", "2.9.1", "2.11.0", "2.13.0")}
    rows = version_runs.spans(["bug", "old"], runs, {"bug": "bug present: True"})
    assert rows == [["bug", "present", "2.4.1-2.9.1, 2.13.0, installed"],
                    ["bug", "absent", "2.11.0"]]
    assert version_runs.spans(["bug"], {}, None) == []


def test_the_committed_file_is_valid_and_names_known_repros():
    """Every stored name is a repro of chapter 13 or an old call of chapter 12 today."""
    known = set(old_torch_runs.repros()) | set(old_torch_runs.OLD_CALLS)
    for version, run in version_runs.load_runs().items():
        assert set(run["results"]) <= known, version


@pytest.mark.parametrize("key", ["date", "machine", "python"])
@pytest.mark.parametrize("value", [None, 3, ["m-x2"]])
def test_a_run_with_a_non_string_field_is_refused_naming_file_and_key(tmp_path, key, value):
    """Chapter 13's caption joins the runs' machines: a non-string one must not load."""
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"schema": 1, "runs": {"2.9.1": {**RUN, key: value}}}))
    with pytest.raises(ValueError, match=rf"runs\.json: .*runs\['2\.9\.1'\]\.{key}"):
        version_runs.load_runs(path)
    with pytest.raises(ValueError, match=rf"runs\['2\.9\.1'\]\.{key}"):
        version_runs.store_run("2.9.1", {**RUN, key: value}, tmp_path / "new.json")
