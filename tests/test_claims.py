"""The claims registry and ``convlab claims``.

No test asserts what a real claim finds (that depends on the CPU), except where the test
itself forces it: a CUDA claim without CUDA, or a check fed made-up measurements.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch

from convlab.cli import main as cli_main
from convlab.lab import claims
from convlab.lab.claims import bits, core, cuda, memory, perf, probe, resolve, subnormal
from convlab.lab.method import machine, timing, verbose_probes
from convlab.lab.method.effect import median_ci

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
        assert o.status != core.ERROR, (o.claim_id, o.evidence)


def test_every_check_returns_a_valid_outcome_under_the_low_isa() -> None:
    code = ("import json; from convlab.lab import claims; "
            "print(json.dumps(claims.record_outcomes()))")
    # every claim, timed ones with their extra rounds: minutes on a busy machine
    got = probe.child_json(code, probe.LOW_ISA_ENV, timeout=900)
    assert list(got) == [c.id for c in claims.CLAIMS]
    for cid, out in got.items():
        assert out["status"] in core.STATUSES, cid
        assert out["evidence"].strip() and isinstance(out["detail"], dict), cid
        assert out["status"] != core.ERROR, (cid, out["evidence"])
    # At the low ISA the setting the two compare with is this process's own (issue 46).
    for cid in ("ch10_slow_bits_same_across_isa", "ch9_im2col_memory_independent_of_isa"):
        assert got[cid]["status"] == core.CANNOT, (cid, got[cid])
        assert "compare a setting with itself" in got[cid]["evidence"]


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
    assert out.status == core.ERROR and "RuntimeError: left everything" in out.evidence


def test_a_raising_check_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> core.Outcome:
        raise ZeroDivisionError("boom")

    table = (fake("ch3_a", core.HOLDS), core.Claim("ch3_b", 3, "s", "c", broken),
             fake("ch3_c", core.FAILS))
    monkeypatch.setattr(claims, "CLAIMS", table)
    got = claims.evaluate(3)
    assert [(o.claim_id, o.status) for o in got] == [
        ("ch3_a", core.HOLDS), ("ch3_b", core.ERROR), ("ch3_c", core.FAILS)]
    assert got[1].evidence == "check raised ZeroDivisionError: boom"
    assert got[1].detail["error"] == "ZeroDivisionError: boom"


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


def _judged(status: str, median: float) -> resolve.Judgement:
    """A made-up judgement of ``status`` around ``median`` (band 10 %, 7 rounds)."""
    return resolve.Judgement(status, median_ci([median] * 7), 0.1)


def test_flush_claim_reads_the_timing_judgements(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a CPU that takes a microcode assist (the condition; tests/test_subnormal_assist.py)
    monkeypatch.setattr(subnormal, "measure_assist", lambda: _judged(core.HOLDS, 30.0))
    slower, same = _judged(core.HOLDS, 2.0), _judged(core.FAILS, 1.0)
    unsure = _judged(core.INCONCLUSIVE, 1.3)
    not_slower, still_slower = _judged(core.HOLDS, 1.0), _judged(core.FAILS, 2.0)
    cases = [({"slow subnormal": slower, "slow flushed": not_slower}, core.HOLDS),
             ({"slow subnormal": slower, "slow flushed": still_slower}, core.FAILS),
             ({"slow subnormal": slower, "slow flushed": unsure}, core.INCONCLUSIVE),
             ({"slow subnormal": same, "slow flushed": not_slower}, core.CANNOT),
             ({"slow subnormal": unsure, "slow flushed": not_slower}, core.INCONCLUSIVE)]
    for found, status in cases:
        monkeypatch.setattr(subnormal, "measure",
                            lambda found=found: {"band": 0.1, "can_flush": True, **found})
        [out] = claims.evaluate(ids=["ch3_flush_denormal_removes_penalty"])
        assert out.status == status, (found, out)
    monkeypatch.setattr(subnormal, "measure",
                        lambda: {"band": 0.1, "can_flush": True, "slow subnormal": unsure})
    [out] = claims.evaluate(ids=["ch3_subnormal_slows_slow2d"])
    assert out.status == core.INCONCLUSIVE and "x1.30" in out.evidence


def five(chapter: int | str = 7) -> tuple[core.Claim, ...]:
    """One fake claim of each state: the four verdicts from their checks, and an error."""
    def broken() -> core.Outcome:
        raise KeyError("cudnn")

    return (fake(f"ch{chapter}_ok", core.HOLDS, chapter),
            fake(f"ch{chapter}_" + "x" * 90, core.FAILS, chapter),
            fake(f"ch{chapter}_noisy", core.INCONCLUSIVE, chapter),
            fake(f"ch{chapter}_gpu", core.CANNOT, chapter),
            core.Claim(f"ch{chapter}_broken", chapter, "s", "c", broken))


def test_report_is_phone_width_and_names_every_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "CLAIMS", (*five(7), fake("ch3_other", core.FAILS)))
    text = claims.report(7)
    assert max(len(line) for line in text.splitlines()) <= core.WIDTH
    assert "ch3_other" not in text
    assert "ch7_broken: error\n  check raised KeyError: 'cudnn'" in text
    tail = text[text.index("Chapter 7: "):]
    assert " ".join(tail.split()).startswith(
        "Chapter 7: 1 holds, 1 does not hold, 1 inconclusive, 1 cannot run here, 1 error.")
    assert "Do not hold here:" in tail and "ch7_x" in tail
    assert "Inconclusive here: ch7_noisy." in tail
    assert "Cannot run here: ch7_gpu." in tail
    assert "Errors (the check raised): ch7_broken." in tail
    assert claims.report("intro") == "No claims for chapter intro."


def test_summary_counts_every_status() -> None:
    statuses = [core.HOLDS] * 31 + [core.FAILS] * 2 + [core.INCONCLUSIVE] * 5 \
        + [core.CANNOT] * 7 + [core.ERROR]
    assert core.summary(statuses) == ("31 hold, 2 do not hold, 5 inconclusive, "
                                      "7 cannot run here, 1 error")
    assert core.summary([]) == ("0 hold, 0 do not hold, 0 inconclusive, 0 cannot run here, "
                                "0 errors")


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
                                  "ch7_b": {"status": core.FAILS},
                                  # a claim since removed from the registry: skipped
                                  "ch7_removed": {"status": core.HOLDS}}),
        _record("CPU B", "sse41", {"ch7_a": {"status": core.CANNOT}}),
        _record("CPU C", "avx512", None),
        _record("CPU D", "avx512", {"error": "RuntimeError: x"}),
        _record("CPU E", "avx2", {"ch7_a": {"status": core.INCONCLUSIVE},
                                  "ch7_b": {"status": core.ERROR}}),
        _record("CPU F", "avx2", {"ch7_a": {"status": "a status of the future"}}),
    ]
    headers, rows = claims.matrix(recs, 7)
    assert headers == ["claim", "CPU A, avx2", "CPU B, sse41", "CPU C, avx512",
                       "CPU D, avx512", "CPU E, avx2", "CPU F, avx2"]
    assert rows == [["ch7_a", "yes", "n/a", "-", "-", "?", "-"],
                    ["ch7_b", "no", "-", "-", "-", "err", "-"]]
    same, other = core.agreeing(core.Outcome("ch7_a", core.HOLDS, "e"), recs)
    assert (same, other) == (["CPU A, avx2"], ["CPU B, sse41", "CPU E, avx2"])


def test_matrix_reads_committed_records() -> None:
    from convlab.lab.record import records

    found = records.load_records()
    headers, rows = claims.matrix(found, None)
    assert len(headers) == len(found) + 1 and len(rows) == len(claims.CLAIMS)
    assert all(cell in {*core.SHORT.values(), core.MISSING} for row in rows
               for cell in row[1:])


def test_old_and_new_records_load_with_their_states(tmp_path) -> None:
    """A committed record (stored before inconclusive and error existed) and the same
    record storing every new state both load; each status reads as stored."""
    from convlab.lab.record import records

    path = sorted(records.RECORDS_DIR.glob("*__*.json"))[0]
    data = json.loads(path.read_text())
    old = data["sections"]["claims"]
    assert {o["status"] for o in old.values()} <= {core.HOLDS, core.FAILS, core.CANNOT}
    (tmp_path / path.name).write_text(path.read_text())
    [rec] = records.load_records(tmp_path)
    some = claims.CLAIMS[0]
    assert core.stored_status(core.stored_outcomes(rec)[some.id]) == old[some.id]["status"]
    ids = [c.id for c in claims.CLAIMS[:len(core.STATUSES)]]
    data["sections"]["claims"] = {cid: {"status": st, "evidence": "e", "detail": {}}
                                  for cid, st in zip(ids, core.STATUSES, strict=True)}
    (tmp_path / path.name).write_text(json.dumps(data))
    [rec] = records.load_records(tmp_path)
    assert [core.stored_status(core.stored_outcomes(rec)[cid]) for cid in ids] \
        == list(core.STATUSES)


def test_cli_json_schema(monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    table = (fake("ch7_a", core.HOLDS, 7), fake("ch7_b", core.FAILS, 7),
             fake("ch9_c", core.HOLDS, 9))
    monkeypatch.setattr(claims, "CLAIMS", table)
    assert cli_main(["claims", "--chapter", "7", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"machine", "summary", "claims"}
    assert data["summary"] == {core.HOLDS: 1, core.FAILS: 1, core.INCONCLUSIVE: 0,
                               core.CANNOT: 0, core.ERROR: 0}
    assert [c["id"] for c in data["claims"]] == ["ch7_a", "ch7_b"]
    keys = {"id", "chapter", "sentence", "condition", "status", "evidence", "detail",
            "records_agree", "records_differ", "gpu_runs"}
    for c in data["claims"]:
        assert set(c) == keys and c["chapter"] == 7
    assert data["claims"][1]["status"] == core.FAILS


def test_cli_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from convlab.lab.record import records

    monkeypatch.setattr(claims, "CLAIMS", five(7))
    monkeypatch.setattr(records, "load_records", lambda: [])
    assert cli_main(["claims"]) == 0
    out = capsys.readouterr().out
    # verdict (16 wide), agree (7 wide, right-aligned; no records: "-"), then the id
    assert ("holds" + " " * 17 + "-  ch7_ok\n  sentence of ch7_ok\n"
            "  condition: a condition\n  here: evidence of ch7_ok\n") in out
    assert "\nerror" + " " * 17 + "-  ch7_broken\n" in out
    assert "  here: check raised KeyError: 'cudnn'" in out
    assert "\ninconclusive" + " " * 10 + "-  ch7_noisy\n" in out
    assert ("1 holds, 1 does not hold, 1 inconclusive, 1 cannot run here, 1 error."
            in " ".join(out.split()))
    assert "Errors (a check raised, not a verdict on the claim): ch7_broken." in out
    assert max(len(line) for line in out.splitlines() if "ch7_xxx" not in line) <= 72


@pytest.mark.parametrize(("states", "code"), [
    ((core.HOLDS,), 0), ((core.HOLDS, core.INCONCLUSIVE, core.CANNOT), 0),
    ((core.HOLDS, core.FAILS), 1), ((core.HOLDS, "raise"), 1), ((core.INCONCLUSIVE,), 0)])
def test_cli_strict_fails_on_does_not_hold_or_error(
        states: tuple[str, ...], code: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> core.Outcome:
        raise RuntimeError("boom")

    table = tuple(core.Claim(f"ch7_c{i}", 7, "s", "c", broken) if st == "raise"
                  else fake(f"ch7_c{i}", st, 7) for i, st in enumerate(states))
    monkeypatch.setattr(claims, "CLAIMS", table)
    assert cli_main(["claims", "--strict"]) == code
    assert cli_main(["claims", "--strict", "--json"]) == code
    assert cli_main(["claims"]) == 0  # without --strict the status is 0 whatever holds
    capsys.readouterr()


def test_cli_list_runs_nothing(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    ran = []

    def check() -> core.Outcome:
        ran.append(1)
        return core.holds("e")

    monkeypatch.setattr(claims, "CLAIMS", (core.Claim("ch7_a", 7, "First sentence.", "c",
                                                      check),
                                           core.Claim("ch9_b", 9, "Second.", "c", check)))
    assert cli_main(["claims", "--list"]) == 0
    assert capsys.readouterr().out == "ch7_a\n  First sentence.\nch9_b\n  Second.\n"
    assert cli_main(["claims", "--list", "--chapter", "9"]) == 0
    assert capsys.readouterr().out == "ch9_b\n  Second.\n"
    assert ran == []


def test_cli_id_runs_that_claim_only(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    ran = []

    def check(cid: str) -> core.Claim:
        return core.Claim(cid, 7, "s", "c", lambda: ran.append(cid) or core.holds("e"))

    monkeypatch.setattr(claims, "CLAIMS", (check("ch7_a"), check("ch7_b")))
    assert cli_main(["claims", "--id", "ch7_b", "--json"]) == 0
    assert [c["id"] for c in json.loads(capsys.readouterr().out)["claims"]] == ["ch7_b"]
    assert ran == ["ch7_b"]


@pytest.mark.parametrize("argv", [["--chapter", "99"], ["--chapter", "x"],
                                  ["--chapter", "12"], ["--bogus"], ["--chapter"],
                                  ["--id", "ch7_nope"], ["--id"], ["--list", "--id", "x"]])
def test_cli_bad_arguments(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),))
    with pytest.raises(SystemExit) as stop:
        cli_main(["claims", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("convlab claims: error:")


def test_cli_counts_the_records_that_agree(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from convlab.lab.record import records

    monkeypatch.setattr(claims, "CLAIMS", (fake("ch7_a", core.HOLDS, 7),))
    stored = [_record("CPU A", "avx2", {"ch7_a": {"status": core.HOLDS}}),
              _record("CPU B", "sse41", {"ch7_a": {"status": core.FAILS}}),
              _record("CPU C", "avx2", {"ch7_a": {"status": core.HOLDS}}),
              _record("CPU D", "avx2", None)]
    monkeypatch.setattr(records, "load_records", lambda: stored)
    assert cli_main(["claims"]) == 0
    out = capsys.readouterr().out
    assert "holds" + " " * 15 + "2/3  ch7_a\n" in out
    assert "  records that differ: CPU B, sse41\n" in out
    assert cli_main(["claims", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["claims"]
    assert (row["records_agree"], row["records_differ"]) == (["CPU A, avx2", "CPU C, avx2"],
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


# --------------------------------------------------------------- noise: inconclusive


@pytest.mark.parametrize(("ratios", "band", "status"), [
    ([0.50, 0.52, 0.49, 0.51, 0.50, 0.48, 0.50], 0.10, core.HOLDS),  # clearly faster
    ([1.00, 1.02, 0.99, 1.01, 1.00, 0.98, 1.00], 0.10, core.FAILS),  # equal, narrow band
    ([1.30, 1.32, 1.29, 1.31, 1.30, 1.28, 1.30], 0.10, core.FAILS),  # slower
    ([1.00, 1.02, 0.99, 1.01, 1.00, 0.98, 1.00], 1.50, core.INCONCLUSIVE),  # band > effect
    ([0.50, 1.60, 0.70, 1.20, 0.90, 1.10, 0.60], 0.10, core.INCONCLUSIVE),  # CI too wide
    ([0.30, 0.31, 0.29, 0.30, 0.30, 0.31, 0.30], 1.50, core.HOLDS),  # clears a wide band
    ([3.00, 3.10, 2.90, 3.00, 3.00, 3.10, 3.00], 1.50, core.FAILS),  # slower beyond it
])
def test_judge_faster(ratios: list[float], band: float, status: str) -> None:
    got = resolve.judge(ratios, band, resolve.faster(band), 0.25)
    assert got.status == status, got


def test_judge_within_and_no_band() -> None:
    near = [1.1, 1.05, 1.12, 1.08, 1.1, 1.07, 1.09]
    assert resolve.judge(near, 0.2, resolve.within(1.5), 0.5).status == core.HOLDS
    assert resolve.judge(near, 0.6, resolve.within(1.5), 0.5).status == core.INCONCLUSIVE
    far = [r * 2 for r in near]
    assert resolve.judge(far, 0.2, resolve.within(1.5), 0.5).status == core.FAILS
    assert resolve.judge(near, math.nan, resolve.within(1.5), 0.5).status \
        == core.INCONCLUSIVE
    with pytest.raises(ValueError, match="effect"):
        resolve.judge(near, 0.2, resolve.within(1.5), 0)


def _timings(**rounds: list[float]) -> dict[str, timing.Timing]:
    return {k: timing.Timing(k, tuple(v), 10) for k, v in rounds.items()}


def test_adaptive_adds_rounds_until_settled_or_out_of_budget() -> None:
    calls = []

    def measure(rounds: int, seed: int) -> dict[str, timing.Timing]:
        calls.append(seed)
        return _timings(a=[1.0] * rounds)

    def settled_after(n: int) -> object:
        return lambda t: len(t["a"].rounds) >= n

    t = resolve.adaptive(measure, settled_after(21))
    assert len(t["a"].rounds) == 21 and calls == [0, 1, 2]
    calls.clear()
    t = resolve.adaptive(measure, settled_after(1000))
    assert len(t["a"].rounds) == resolve.MAX_ROUNDS and calls == [0, 1, 2, 3, 4]
    calls.clear()
    t = resolve.adaptive(measure, settled_after(1000), budget_s=0.0)
    assert len(t["a"].rounds) == resolve.ROUNDS and calls == [0]


def test_a_timed_check_is_inconclusive_under_noise_and_decides_without(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ch9_grouped_fastest fed made-up rounds: a wide A/A band that no extra round narrows
    is inconclusive (after every extra round), a narrow one decides; on the CPU clock."""
    seen = []

    def fake_rounds(aa: list[float], ratio: float) -> object:
        def interleaved(fns: dict, rounds: int, **kw: object) -> dict[str, timing.Timing]:
            seen.append(kw["clock"])
            base = [1e-3] * rounds
            return _timings(**{"grouped": [b * ratio for b in base],
                               "grouped'": [b * ratio * a for a, b in zip(aa, base, strict=True)],
                               "im2col": base, "im2col'": base})
        return interleaved

    monkeypatch.setattr(perf, "_per_sample_fns", lambda *a: {})
    monkeypatch.setattr(perf, "grouped_backward_weights_impls", lambda: ["jit:avx2"])
    monkeypatch.setattr(timing, "interleaved", fake_rounds([1, 3, 1, 0.4, 1, 2.5, 1], 0.8))
    [out] = claims.evaluate(ids=["ch9_grouped_fastest"])
    assert out.status == core.INCONCLUSIVE and out.detail["rounds"] == resolve.MAX_ROUNDS
    assert set(seen) == {"cpu"}
    monkeypatch.setattr(timing, "interleaved", fake_rounds([1, 1.02, 1, 0.99, 1, 1, 1], 0.8))
    [out] = claims.evaluate(ids=["ch9_grouped_fastest"])
    assert out.status == core.HOLDS and out.detail["rounds"] == resolve.ROUNDS
    monkeypatch.setattr(timing, "interleaved", fake_rounds([1, 1.02, 1, 0.99, 1, 1, 1], 1.0))
    [out] = claims.evaluate(ids=["ch9_grouped_fastest"])
    assert out.status == core.FAILS and "x1.00" in out.evidence
    # the sentence's condition: a JIT kernel for oneDNN's grouped backward_weights
    seen.clear()
    monkeypatch.setattr(perf, "grouped_backward_weights_impls", lambda: ["x64:gemm:jit"])
    [out] = claims.evaluate(ids=["ch9_grouped_fastest"])
    assert out.status == core.CANNOT and "x64:gemm:jit" in out.evidence and not seen


# --------------------------------------------------------------- the low ISA setting


@pytest.mark.parametrize(("env", "flags", "same"), [
    (probe.LOW_ISA_ENV, {"sse4_1", "avx", "avx2", "fma"}, True),  # make test's setting
    ({}, {"sse4_1", "avx", "avx2", "fma"}, False),  # uncapped AVX2
    ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, {"sse4_1", "avx", "avx2", "fma"}, False),  # ATen not
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"sse4_1", "avx", "avx2", "fma"}, False),
    ({}, {"sse4_1"}, True),  # an SSE4.1 CPU is at that level itself
    # a cap at or above the CPU's own ISA counts as uncapped
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512"},
     {"sse4_1", "avx", "avx2", "fma"}, False),
])
def test_at_level_of_the_low_isa(env: dict, flags: set, same: bool,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(machine, "cpu_flags", lambda: set(flags))
    assert bool(probe.at_level_of(probe.LOW_ISA_ENV)) is same


def test_capped_env_counts_a_cap_above_the_cpu_as_uncapped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"sse4_1", "avx", "avx2", "fma"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert probe.capped_env() == {"ATEN_CPU_CAPABILITY": "default"}


def test_the_isa_comparisons_do_not_compare_a_setting_with_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under make test's low setting the two claims that compare with it cannot run, and
    say why, before starting the child process."""
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"sse4_1", "avx", "avx2", "fma"})
    for k, v in probe.LOW_ISA_ENV.items():
        monkeypatch.setenv(k, v)

    def no_child(env: dict) -> dict:
        raise AssertionError("compared the setting with itself")

    monkeypatch.setattr(bits, "facts_under", no_child)
    monkeypatch.setattr(memory, "facts_under", no_child)
    got = claims.evaluate(ids=["ch10_slow_bits_same_across_isa",
                               "ch9_im2col_memory_independent_of_isa"])
    assert [o.status for o in got] == [core.CANNOT, core.CANNOT]
    assert all("compare a setting with itself" in o.evidence for o in got)


# --------------------------------------------------------------- the package's imports


def test_no_claims_module_imports_its_own_package() -> None:
    """Issue 52: ``gpu_runs`` imported ``convlab.lab.claims.cuda`` through the package that
    imports ``gpu_runs``; a module of the package imports its siblings' modules directly."""
    folder = Path(claims.__file__).parent
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            pkg = isinstance(node, ast.ImportFrom) and node.module == "convlab.lab" and any(
                a.name == "claims" for a in node.names)
            if pkg or "convlab.lab.claims" in names:
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found


@pytest.mark.parametrize(("rates", "sse41", "status"), [
    ((100.0, 100.0), 20.0, core.HOLDS),  # x5, A/A x1.0
    ((100.0, 100.0), 80.0, core.FAILS),  # x1.25: not capped
    ((100.0, 60.0), 45.0, core.INCONCLUSIVE),  # x2.2 but an A/A gap of x1.67
])
def test_mkl_cap_claim_is_inconclusive_where_the_aa_gap_decides(
        rates: tuple[float, float], sse41: float, status: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    seq = iter(rates)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"sse4_1", "avx", "avx2", "fma"})
    monkeypatch.setattr(verbose_probes, "mkl_probe", lambda: "AVX2 path")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.setattr(perf, "mkl_gflops", lambda: next(seq))
    monkeypatch.setattr(probe, "facts_under",
                        lambda env: {"mkl_gflops": sse41, "mkl": "SSE4.2 path"})
    [out] = claims.evaluate(ids=["ch7_sse41_setting_caps_mkl"])
    assert out.status == status, out
