"""convlab doctor: passes on this machine, and fails loudly when any path is wrong."""

from __future__ import annotations

import pytest
import torch

from convlab import doctor, native, numpy_ref, reference, thnn

CPU = torch.device("cpu")


def _scaled(fn, index: int, factor: float = 1.001):
    """Wrap ``fn`` so that output ``index`` of its result tuple is off by ``factor``."""

    def wrong(*args, **kwargs):
        out = list(fn(*args, **kwargs))
        out[index] = out[index] * factor
        return tuple(out)

    return wrong


def test_doctor_passes_here(capsys) -> None:
    assert doctor.main(["--device", "cpu"]) == 0
    text = capsys.readouterr().out
    for path in ("reference", "thnn", "numpy_ref", "forced slow", "forced mkldnn"):
        line = next(ln for ln in text.splitlines() if f" {path} " in ln)
        assert line.split()[0] == "ok", line
    assert "C++ extension:" in text
    assert "all checked paths agree" in text
    # the selection table lists every benchmark layer with its ATen backend
    assert "resnet56" in text and "MkldnnTranspose" in text and "SlowDilated2d" in text


def test_doctor_fails_when_reference_is_wrong(monkeypatch, capsys) -> None:
    monkeypatch.setattr(
        reference, "convolution_backward", _scaled(reference.convolution_backward, 1)
    )
    assert doctor.main(["--device", "cpu"]) == 1
    text = capsys.readouterr().out
    assert "FAIL     reference" in text and "grad_weight: relative diff" in text
    assert "FAILED: reference disagree" in text


@pytest.mark.parametrize(
    ("module", "name", "index", "path"),
    [
        (thnn, "conv2d_forward", 0, "thnn"),
        (thnn, "conv2d_backward", 0, "thnn"),
        (numpy_ref, "convolution_backward", 2, "numpy_ref"),
        (native, "convolution_backward", 0, "forced slow"),
    ],
)
def test_each_path_is_really_checked(monkeypatch, module, name, index, path) -> None:
    monkeypatch.setattr(module, name, _scaled(getattr(module, name), index))
    results, _ = doctor.checks(CPU)
    failed = {r.path for r in results if r.failures}
    if path == "forced slow":  # native.convolution_backward serves every forced backend
        assert {"forced slow", "forced mkldnn", "forced nnpack"} <= failed
    else:
        assert failed == {path}


def test_float32_tolerance_catches_a_small_error() -> None:
    """The looser float32 bound of the oneDNN check still sees a 0.1 % error."""
    wrong = doctor._forced_runner("mkldnn", torch.float32)

    def runner(case, device):
        y, grads = wrong(case, device)
        return y * 1.001, grads

    result = doctor.check_path("mkldnn*", runner, CPU, "float32", doctor.TOL32)
    assert result.status == "FAIL" and "output: relative diff" in result.failures[0]


def test_a_crash_is_a_failure_not_an_exception() -> None:
    def broken(case, device):
        raise IndexError("deep inside")

    result = doctor.check_path("broken", broken, CPU, "float64", doctor.TOL64,
                               cases=doctor.CASES[:2])
    assert result.status == "FAIL"
    assert result.failures == ["plain2d: IndexError: deep inside",
                               "strided2d: IndexError: deep inside"]


def test_wrong_shape_is_reported() -> None:
    def flat(case, device):
        y, grads = doctor._run_reference(case, device)
        return y.flatten(), grads

    result = doctor.check_path("flat", flat, CPU, "float64", doctor.TOL64, cases=doctor.CASES[:1])
    assert "shape" in result.failures[0]


def test_not_applicable_cases_are_skipped_not_failed() -> None:
    result = doctor.check_path("thnn", doctor._run_thnn, CPU, "float64", doctor.TOL64)
    assert result.status == "ok"
    assert set(result.skipped) == {c.name for c in doctor.CASES if not c.thnn_ok}
    assert set(result.checked) == {c.name for c in doctor.CASES if c.thnn_ok}


def test_extension_not_built_is_reported(monkeypatch, tmp_path) -> None:
    from convlab import extension

    monkeypatch.setattr(extension, "build_directory", lambda: tmp_path / "none")
    ext, status = doctor.extension_status(build=False)
    assert ext is None and status.startswith("not built")


def test_selection_table_covers_the_suite() -> None:
    rows = doctor.selection_table(CPU)
    assert [r[0] for r in rows] == [layer.name for layer in doctor.bench.SUITE]
    by_name = {r[0]: r for r in rows}
    assert by_name["resnet56"][2:] == ("Mkldnn", "Slow2d", "Slow2d")
    assert by_name["transposed"][2:] == ("MkldnnTranspose", "SlowTranspose2d", "SlowTranspose2d")
