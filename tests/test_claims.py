"""The claims registry and ``convlab claims``.

No test asserts what a real claim finds (that depends on the CPU), except where the test
itself forces it: a CUDA claim without CUDA, or a check fed made-up measurements.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from convlab.cli import main as cli_main
from convlab.lab import claims, timing
from convlab.lab.claims import bits, core, cuda, probe, subnormal

ID = re.compile(r"^(intro|ch(1[0-3]|[1-9]))_[a-z0-9_]+$")


@pytest.fixture(scope="module")
def outcomes() -> list[core.Outcome]:
    before = core.flags()
    found = claims.evaluate()
    assert core.flags() == before, "evaluate changed a process flag"
    return found


def fake(cid: str, status: str, chapter: int | str = 3) -> core.Claim:
    return core.Claim(cid, chapter, f"sentence of {cid}", "a condition",
                        lambda: core.Outcome("", status, f"evidence of {cid}", {"n": 1}))


def test_rows_are_well_formed() -> None:
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))
    for c in claims.CLAIMS:
        assert ID.match(c.id), c.id
        prefix = "intro" if c.chapter == "intro" else f"ch{c.chapter}"
        assert c.id.split("_")[0] == prefix, c.id
        assert c.sentence.strip() and c.condition.strip() and callable(c.check)


def test_every_check_returns_a_valid_outcome_here(outcomes: list[core.Outcome]) -> None:
    assert [o.claim_id for o in outcomes] == [c.id for c in claims.CLAIMS]
    for o in outcomes:
        assert o.status in core.STATUSES
        assert o.evidence.strip(), o.claim_id
        json.dumps(o.detail, allow_nan=True)
        assert not o.evidence.startswith("check raised"), (o.claim_id, o.evidence)


def test_every_check_returns_a_valid_outcome_under_the_low_isa() -> None:
    code = ("import json; from convlab.lab import claims; "
            "print(json.dumps(claims.record_outcomes()))")
    got = probe.child_json(code, probe.LOW_ISA_ENV)
    assert list(got) == [c.id for c in claims.CLAIMS]
    for cid, out in got.items():
        assert out["status"] in core.STATUSES, cid
        assert out["evidence"].strip() and isinstance(out["detail"], dict), cid
        assert not out["evidence"].startswith("check raised"), (cid, out["evidence"])


def test_cuda_claims_cannot_run_without_cuda(outcomes: list[core.Outcome]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CUDA claims really run")
    cuda_ids = {c.id for c in cuda.CLAIMS}
    assert cuda_ids and cuda_ids <= {c.id for c in claims.CLAIMS}
    for o in outcomes:
        if o.claim_id in cuda_ids:
            assert o.status == core.CANNOT, o


def test_a_check_that_changes_flags_is_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    def rogue() -> core.Outcome:
        torch.set_num_threads(torch.get_num_threads() + 1)
        torch.backends.mkldnn.enabled = not torch.backends.mkldnn.enabled
        torch._C._set_nnpack_enabled(not torch._C._get_nnpack_enabled())
        torch.set_flush_denormal(True)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_grad_enabled(False)
        torch.rand(3)
        raise RuntimeError("left everything changed")

    monkeypatch.setattr(claims, "CLAIMS", (core.Claim("ch3_rogue", 3, "s", "c", rogue),))
    before, rng = core.flags(), torch.random.get_rng_state()
    [out] = claims.evaluate()
    assert core.flags() == before
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert out.status == core.CANNOT and "RuntimeError: left everything" in out.evidence


def test_a_raising_check_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> core.Outcome:
        raise ZeroDivisionError("boom")

    table = (fake("ch3_a", core.HOLDS), core.Claim("ch3_b", 3, "s", "c", broken),
             fake("ch3_c", core.FAILS))
    monkeypatch.setattr(claims, "CLAIMS", table)
    got = claims.evaluate(3)
    assert [(o.claim_id, o.status) for o in got] == [
        ("ch3_a", core.HOLDS), ("ch3_b", core.CANNOT), ("ch3_c", core.FAILS)]
    assert "ZeroDivisionError: boom" in got[1].evidence


def test_a_check_reports_what_the_gradients_show(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bits.grads_at_threads

    def perturbed(backend: str, layer: dict, threads: tuple[int, ...] = bits.THREADS):
        found = real(backend, {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3)}, threads)
        gi, gw, gb = found[max(found)]
        found[max(found)] = (gi, gw + gw.abs().max() * 1e-3, gb)
        return found

    monkeypatch.setattr(bits, "grads_at_threads", perturbed)
    [out] = claims.evaluate(ids=["ch10_slow_bits_across_threads"])
    assert out.status == core.HOLDS and out.detail["changed"] == ["grad_weight"]

    monkeypatch.setattr(bits, "grads_at_threads",
                        lambda *a, **k: {t: real("slow", {"x": (1, 3, 8, 8),
                                                          "w": (4, 3, 3, 3)}, (1,))[1]
                                         for t in (1, 2)})
    [out] = claims.evaluate(ids=["ch10_slow_bits_across_threads"])
    assert out.status == core.FAILS


def test_flush_claim_reads_the_timing_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    slower, same = timing.verdict_of([2.0] * 7, 0.1), timing.verdict_of([1.0] * 7, 0.1)
    cases = [({"slow subnormal": slower, "slow flushed": same}, core.HOLDS),
             ({"slow subnormal": slower, "slow flushed": slower}, core.FAILS),
             ({"slow subnormal": same, "slow flushed": same}, core.CANNOT)]
    for found, status in cases:
        monkeypatch.setattr(subnormal, "measure",
                            lambda found=found: {"band": 0.1, "can_flush": True, **found})
        [out] = claims.evaluate(ids=["ch3_flush_denormal_removes_penalty"])
        assert out.status == status, (found, out)
    monkeypatch.setattr(subnormal, "measure",
                        lambda: {"band": 0.1, "can_flush": True, "slow subnormal": slower})
    [out] = claims.evaluate(ids=["ch3_subnormal_slows_slow2d"])
    assert out.status == core.HOLDS and "x2.00" in out.evidence


def test_report_is_phone_width_and_names_what_does_not_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    long = "ch7_" + "x" * 90
    table = (fake("ch7_ok", core.HOLDS, 7), fake(long, core.FAILS, 7),
             fake("ch7_gpu", core.CANNOT, 7), fake("ch3_other", core.FAILS))
    monkeypatch.setattr(claims, "CLAIMS", table)
    text = claims.report(7)
    assert max(len(line) for line in text.splitlines()) <= core.WIDTH
    assert "ch3_other" not in text
    tail = text[text.index("Chapter 7: 1 of 3 claims hold here."):]
    assert "Do not hold here:" in tail and "ch7_x" in tail
    assert "Cannot run here: ch7_gpu." in tail
    assert claims.report("intro") == "No claims for chapter intro."


def test_real_report_is_phone_width() -> None:
    text = claims.report("intro")
    assert max(len(line) for line in text.splitlines()) <= core.WIDTH
    for c in claims.CLAIMS:
        if c.chapter == "intro":
            assert f"{c.id}: " in text


@pytest.mark.parametrize("bad", [0, 14, "x", True, 3.0])
def test_bad_chapter(bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="chapter"):
        claims.evaluate(bad)  # type: ignore[arg-type]


def test_unknown_ids() -> None:
    with pytest.raises(ValueError, match="ids: unknown"):
        claims.evaluate(ids=["ch3_nope"])
    with pytest.raises(TypeError, match="ids"):
        claims.evaluate(ids="ch3_bf16_routes_mkldnn")


def _record(cpu: str, isa: str, stored: dict | None) -> dict:
    sections = {} if stored is None else {"claims": stored}
    return {"isa": isa, "fingerprint": {"cpu_model": cpu}, "sections": sections}


def test_matrix_from_stored_outcomes(monkeypatch: pytest.MonkeyPatch) -> None:
    table = (fake("ch7_a", core.HOLDS, 7), fake("ch7_b", core.HOLDS, 7),
             fake("ch9_c", core.HOLDS, 9))
    monkeypatch.setattr(claims, "CLAIMS", table)
    recs = [
        _record("CPU A", "avx2", {"ch7_a": {"status": core.HOLDS},
                                  "ch7_b": {"status": core.FAILS}}),
        _record("CPU B", "sse41", {"ch7_a": {"status": core.CANNOT}}),
        _record("CPU C", "avx512", None),
        _record("CPU D", "avx512", {"error": "RuntimeError: x"}),
    ]
    headers, rows = claims.matrix(recs, 7)
    assert headers == ["claim", "CPU A, avx2", "CPU B, sse41", "CPU C, avx512",
                       "CPU D, avx512"]
    assert rows == [["ch7_a", "yes", "n/a", "-", "-"], ["ch7_b", "no", "-", "-", "-"]]
    same, other = core.agreeing(core.Outcome("ch7_a", core.HOLDS, "e"), recs)
    assert (same, other) == (["CPU A, avx2"], ["CPU B, sse41"])


def test_matrix_reads_committed_records() -> None:
    from convlab.lab import records

    found = records.load_records()
    headers, rows = claims.matrix(found, None)
    assert len(headers) == len(found) + 1 and len(rows) == len(claims.CLAIMS)
    assert all(cell in {"yes", "no", "n/a", "-"} for row in rows for cell in row[1:])


def test_cli_json_schema(monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    table = (fake("ch7_a", core.HOLDS, 7), fake("ch7_b", core.FAILS, 7),
             fake("ch9_c", core.HOLDS, 9))
    monkeypatch.setattr(claims, "CLAIMS", table)
    assert cli_main(["claims", "--chapter", "7", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"machine", "claims"}
    assert [c["id"] for c in data["claims"]] == ["ch7_a", "ch7_b"]
    keys = {"id", "chapter", "sentence", "condition", "status", "evidence", "detail",
            "records_agree", "records_differ", "gpu_runs"}
    for c in data["claims"]:
        assert set(c) == keys and c["chapter"] == 7
    assert data["claims"][1]["status"] == core.FAILS


def test_cli_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),
                                           fake("ch7_b", core.FAILS, 7)))
    assert cli_main(["claims"]) == 0
    out = capsys.readouterr().out
    assert "ch7_a: holds\n  evidence of ch7_a\n  records: none stores this claim" in out
    assert "ch7_b: does not hold" in out and "1 of 2 claims hold here." in out
    assert max(len(line) for line in out.splitlines()) <= core.WIDTH


@pytest.mark.parametrize("argv", [["--chapter", "99"], ["--chapter", "x"],
                                  ["--chapter", "12"], ["--bogus"], ["--chapter"]])
def test_cli_bad_arguments(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),))
    with pytest.raises(SystemExit) as stop:
        cli_main(["claims", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("convlab claims: error:")


def test_cli_names_the_records_that_agree(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from convlab.lab import records

    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),))
    stored = [_record("CPU A", "avx2", {"ch7_a": {"status": core.HOLDS}}),
              _record("CPU B", "sse41", {"ch7_a": {"status": core.FAILS}})]
    monkeypatch.setattr(records, "load_records", lambda: stored)
    assert cli_main(["claims"]) == 0
    assert "records agree: CPU A, avx2 (differ: CPU B, sse41)" in capsys.readouterr().out
    assert cli_main(["claims", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["claims"]
    assert (row["records_agree"], row["records_differ"]) == (["CPU A, avx2"],
                                                               ["CPU B, sse41"])


def test_record_outcomes_is_a_json_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),
                                           fake("ch9_b", core.CANNOT, 9)))
    got = claims.record_outcomes(quick=True)
    assert got == {"ch7_a": {"status": core.HOLDS, "evidence": "evidence of ch7_a",
                             "detail": {"n": 1}},
                   "ch9_b": {"status": core.CANNOT, "evidence": "evidence of ch9_b",
                             "detail": {"n": 1}}}
    json.dumps(got, allow_nan=False)
    headers, rows = claims.matrix([{"isa": "x", "fingerprint": {"cpu_model": "M"},
                                    "sections": {"claims": got}}], None)
    assert rows == [["ch7_a", "yes"], ["ch9_b", "n/a"]]


def test_cuda_checks_run_their_code_on_a_cpu_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA checks' code (not their claims) runs end to end with CPU tensors standing
    in for CUDA ones, so a GPU run does not first meet a typo; statuses are not looked at."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CUDA claims really run")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(cuda, "DEVICE", "cpu")
    monkeypatch.setattr(claims, "CLAIMS", cuda.CLAIMS)
    small = {name: (2, min(c_in, 8), 8, 12, k, s, p)  # the GPU's layers, shrunk for a CPU
             for name, (_, c_in, _, _, k, s, p) in cuda.REPEAT_LAYERS.items()}
    monkeypatch.setattr(cuda, "REPEAT_LAYERS", small)
    for out in claims.evaluate():
        assert not out.evidence.startswith("check raised"), (out.claim_id, out.evidence)


def test_cli_names_the_stored_gpu_runs_of_a_cuda_claim(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    from convlab.lab.claims import gpu_runs

    monkeypatch.setattr(claims, "CLAIMS", (fake("ch10_cuda_tf32_deterministic",
                                                core.CANNOT, 10),))
    run = {"gpu": "GPU X", "date": "2026-12-04 14:09 UTC", "outcomes": {
        "ch10_cuda_tf32_deterministic": {"status": core.HOLDS, "evidence": "same bits"}}}
    monkeypatch.setattr(gpu_runs, "load_runs", lambda directory=None: [run])
    assert cli_main(["claims"]) == 0
    assert "  stored GPU runs: GPU X 2026-12-04: holds" in capsys.readouterr().out
    assert cli_main(["claims", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["claims"]
    assert row["gpu_runs"] == ["GPU X 2026-12-04: holds"]
