"""convlab.lab.claims.gpu_runs: the CUDA claims as a GPU checked them, stored and shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from convlab.lab import claims
from convlab.lab.claims import core, cuda, gpu_runs

RUN = {"schema": 1, "date": "2026-12-04 14:09 UTC", "gpu": "NVIDIA Test GPU 80GB",
       "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900, "cpu_model": "Some CPU",
       "cores": 16,
       "outcomes": {"ch10_cuda_tf32_deterministic": {
           "status": "holds", "evidence": "TF32 + deterministic, 5 calls: same bits",
           "detail": {"differ": []}}},
       "checks": {"pytest -m cuda tests/": "PASS: 118 passed", "book/01_math.ipynb": "PASS"}}


def test_the_stored_runs_are_valid_cuda_claims() -> None:
    for data in gpu_runs.load_runs():
        assert gpu_runs.validate(data) == []
        assert set(data["outcomes"]) <= {c.id for c in cuda.CLAIMS}


@pytest.mark.parametrize(("change", "problem"), [
    ({"schema": 2}, "schema 1"),
    ({"gpu": None}, "'gpu' must be str"),
    ({"cudnn": "9"}, "'cudnn' must be int or null"),
    ({"outcomes": {}}, "'outcomes' must map"),
    ({"checks": {"pytest": "ok"}}, "'checks' must map"),
    ({"outcomes": {"ch3_not_a_claim": {"status": "holds", "evidence": ""}}}, "not a CUDA"),
    ({"outcomes": {"ch10_cuda_tf32_deterministic": {"status": "maybe", "evidence": ""}}},
     "needs a status"),
])
def test_validate_names_the_bad_key(change: dict, problem: str) -> None:
    assert any(problem in p for p in gpu_runs.validate({**RUN, **change}))


@pytest.mark.parametrize("key", list(gpu_runs.INFO_KEYS), ids=lambda k: f"without_{k}")
def test_a_run_without_an_info_key_is_refused_naming_file_and_key(key: str, tmp_path) -> None:
    """Issue 52: a run without ``cudnn`` passed (``data.get`` gave None, which cudnn may
    be) and then every chapter's live-claims cell raised a bare KeyError in report()."""
    data = {k: v for k, v in RUN.items() if k != key}
    assert f"'{key}' is missing" in gpu_runs.validate(data)
    (tmp_path / "gpu-x.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"gpu-x.json: '{key}' is missing"):
        gpu_runs.load_runs(tmp_path)
    assert gpu_runs.validate({**RUN, "cudnn": None}) == []  # null: a build without cuDNN


def test_a_run_may_store_every_state() -> None:
    outcomes = {c.id: {"status": st, "evidence": "e"}
                for c, st in zip(cuda.CLAIMS, core.STATUSES, strict=False)}
    assert gpu_runs.validate({**RUN, "outcomes": outcomes}) == []


def test_store_then_load_round_trips_under_the_device_name(tmp_path) -> None:
    path = gpu_runs.store(RUN, tmp_path)
    assert path.name == "nvidia-test-gpu-80gb.json"
    assert gpu_runs.load_runs(tmp_path) == [RUN]
    with pytest.raises(ValueError, match="not a CUDA claim"):
        gpu_runs.store({**RUN, "outcomes": {"x": {"status": "holds", "evidence": ""}}},
                       tmp_path)
    path.write_text(json.dumps({**RUN, "cores": "many"}))
    with pytest.raises(ValueError, match="nvidia-test-gpu-80gb.json: 'cores' must be int"):
        gpu_runs.load_runs(tmp_path)
    assert gpu_runs.load_runs(tmp_path / "absent") == []


def test_report_shows_a_chapters_stored_outcomes_with_the_device() -> None:
    text = gpu_runs.report(10, [RUN])
    assert text.splitlines()[0].startswith("Stored on a GPU: NVIDIA Test GPU 80GB, torch "
                                           "2.11.0+cu130")
    assert "ch10_cuda_tf32_deterministic: holds" in text
    assert "2026-12-04" in text and "14:09" not in text
    assert all(len(line) <= core.WIDTH for line in text.splitlines())
    assert gpu_runs.report(3, [RUN]) == ""  # no stored outcome of chapter 3's claims


def test_live_report_adds_the_stored_run_only_without_cuda(monkeypatch) -> None:
    live = [core.Outcome("ch10_cuda_tf32_deterministic", core.CANNOT, "no CUDA device")]
    monkeypatch.setattr(claims, "evaluate", lambda chapter=None, ids=None: live)
    monkeypatch.setattr(gpu_runs, "load_runs", lambda directory=None: [RUN])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "Stored on a GPU: NVIDIA Test GPU" in claims.report(10)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "Stored on a GPU" not in claims.report(10)


def test_run_here_needs_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        gpu_runs.run_here()


def test_chapter_5_names_a_stored_run_in_which_it_passed() -> None:
    # Chapter 5's CUDA note says it was checked on a GPU: a stored run must back it.
    book = Path(__file__).resolve().parent.parent / "book"
    text = " ".join((book / "05_calling_native.ipynb").read_text().split())
    named = [r for r in gpu_runs.load_runs()
             if r["gpu"] in text and r["torch"] in text and r["date"][:10] in text]
    assert named, "chapter 5 names no stored GPU run"
    for r in named:
        assert r["checks"]["book/05_calling_native.ipynb"] == "PASS"
        assert r["checks"]["pytest -m cuda tests/"].startswith("PASS")
