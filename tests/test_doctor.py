"""convlab doctor: passes on this machine, fails loudly when any path is wrong, and
checks ATen's paths against an independent implementation (never against themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convlab.lab import doctor, paths
from convlab.scratch import numpy_ref, reference, thnn

CPU = torch.device("cpu")


def _scaled(fn, index: int, factor: float = 1.001):
    """Wrap ``fn`` so that output ``index`` of its result tuple is off by ``factor``."""

    def wrong(*args, **kwargs):
        out = list(fn(*args, **kwargs))
        out[index] = out[index] * factor
        return tuple(out)

    return wrong


@pytest.fixture(scope="module")
def doctor_output() -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = doctor.main(["--device", "cpu"])
    return code, buf.getvalue()


def test_doctor_passes_here(doctor_output) -> None:
    code, text = doctor_output
    assert code == 0
    for path in ("reference", "thnn", "numpy_ref", "native", "forced slow", "forced mkldnn"):
        line = next(ln for ln in text.splitlines() if f" {path} " in ln)
        assert line.split()[0] == "ok", line
    forced_slow = next(ln for ln in text.splitlines() if " forced slow " in ln)
    assert "float64  vs reference" in forced_slow  # an independent path, not Slow2d again
    assert "C++ extension:" in text and "all checked paths agree" in text
    assert "resnet56" in text and "MkldnnTranspose" in text and "SlowDilated2d" in text


def test_doctor_prints_the_machine_fingerprint(doctor_output) -> None:
    from convlab.lab.method import machine

    _, text = doctor_output
    section = text.split("== machine fingerprint")[1].split("\n==")[0]
    fp = machine.fingerprint()
    assert machine.fingerprint_line(fp) in section
    assert f"ATen {torch.backends.cpu.get_cpu_capability()}" in section
    assert "ISA settings `make records` measures here: " in section
    if torch.backends.mkldnn.is_available():
        assert str(fp["onednn_isa"]) in section


def test_doctor_prints_the_mkl_code_path_whole(monkeypatch) -> None:
    """E5: MKL's path on an AVX-512/AMX CPU holds commas (tests/fixtures/cpus, Intel)."""
    from convlab.lab.method import machine, verbose_probes

    fixture = (Path(__file__).parent / "fixtures" / "cpus"
               / "intel-xeon-sapphire-rapids-x2.txt").read_text()
    path = verbose_probes.parse_mkl_verbose(fixture)
    fp = {**machine.fingerprint(), "blas": {"mkl_version": "2024.2", "mkl_path": path,
                                            "numpy_blas": []}}
    monkeypatch.setattr(machine, "fingerprint", lambda: fp)
    lines = doctor.fingerprint_lines()
    assert f"MKL code path: {path}" in lines
    assert f"MKL 2024.2 ({path})" in lines[0]
    assert path.endswith("Intel(R) AMX) with INT8 and BF16") and "BF16, FP16" in path


def test_doctor_has_an_accuracy_section(doctor_output) -> None:
    _, text = doctor_output
    section = text.split("== accuracy")[1].split("==")[0]
    assert "float32" in section


@pytest.mark.parametrize("device", ["gpu", "meta", "cuda:x"])
def test_bad_device_is_a_one_line_error(device, capsys) -> None:
    if device == "cuda:x" or not torch.cuda.is_available():
        assert doctor.main(["--device", device]) == 2
        err = capsys.readouterr().err.strip()
        assert "device" in err and len(err.splitlines()) == 1


def test_doctor_fails_when_reference_is_wrong(monkeypatch) -> None:
    monkeypatch.setattr(reference, "convolution_backward",
                        _scaled(reference.convolution_backward, 1))
    results, _ = doctor.checks(CPU, only=["reference", "native", "slow", "thnn"])
    failed = {r.path for r in results if r.failures}
    # reference fails against ATen; every ATen path fails against the wrong reference
    assert failed == {"reference", "native", "forced slow"}


@pytest.mark.parametrize(
    ("module", "name", "index", "path"),
    [
        (thnn, "conv2d_forward", 0, "thnn"),
        (thnn, "conv2d_backward", 0, "thnn"),
        (numpy_ref, "convolution_backward", 2, "numpy_ref"),
    ],
)
def test_each_convlab_path_is_really_checked(monkeypatch, module, name, index, path) -> None:
    monkeypatch.setattr(module, name, _scaled(getattr(module, name), index))
    results, _ = doctor.checks(CPU, only=[path, "reference"])
    assert {r.path for r in results if r.failures} == {path}


def test_a_wrong_forced_backend_is_caught() -> None:
    slow = paths.get_path("slow")

    def wrong_build(layer, tensors):
        fns = slow.build(layer, tensors)
        return {**fns, "backward": _scaled(fns["backward"], 1)}

    broken = paths.Path("slow*", "a wrong slow path", wrong_build, force="slow")
    result = doctor.check_path("slow*", doctor.path_runner(broken, torch.float64), CPU,
                               "float64", doctor.TOL64, oracle=doctor.reference_expected)
    assert result.status == "FAIL" and "grad_weight: relative diff" in result.failures[0]


def test_float32_tolerance_catches_a_small_error() -> None:
    """The looser float32 bound of the oneDNN check still sees a 0.1 % error."""
    right = doctor.path_runner(paths.get_path("mkldnn"), torch.float32)

    def runner(case, device):
        y, grads = right(case, device)
        return y * 1.001, grads

    result = doctor.check_path("mkldnn*", runner, CPU, "float32", doctor.TOL32,
                               cases=paths.CASES[:2])
    assert result.status == "FAIL" and "output: relative diff" in result.failures[0]


def test_a_crash_is_a_failure_not_an_exception() -> None:
    def broken(case, device):
        raise IndexError("deep inside")

    result = doctor.check_path("broken", broken, CPU, "float64", doctor.TOL64,
                               cases=paths.CASES[:2])
    assert result.status == "FAIL"
    assert result.failures == ["plain2d: IndexError: deep inside",
                               "strided2d: IndexError: deep inside"]


def test_wrong_shape_is_reported() -> None:
    right = doctor.path_runner(paths.get_path("reference"), torch.float64)

    def flat(case, device):
        y, grads = right(case, device)
        return y.flatten(), grads

    result = doctor.check_path("flat", flat, CPU, "float64", doctor.TOL64,
                               cases=paths.CASES[:1])
    assert "shape" in result.failures[0]


def test_not_applicable_cases_are_skipped_not_failed() -> None:
    runner = doctor.path_runner(paths.get_path("thnn"), torch.float64)
    result = doctor.check_path("thnn", runner, CPU, "float64", doctor.TOL64)
    assert result.status == "ok"
    assert set(result.skipped) == {c.name for c in paths.CASES if not c.thnn_ok}
    assert set(result.checked) == {c.name for c in paths.CASES if c.thnn_ok}


def test_extension_not_built_is_reported(monkeypatch, tmp_path) -> None:
    from convlab.aten import extension

    monkeypatch.setattr(extension, "build_directory", lambda: tmp_path / "none")
    ext, status = doctor.extension_status(build=False)
    assert ext is None and status.startswith("not built")


def test_selection_table_covers_the_suite() -> None:
    rows = doctor.selection_table(CPU)
    assert [r[0] for r in rows] == [layer.name for layer in paths.SUITE]
    by_name = {r[0]: r for r in rows}
    assert by_name["resnet56"][2:] == ("Mkldnn", "Slow2d", "Slow2d")
    assert by_name["transposed"][2:] == ("MkldnnTranspose", "SlowTranspose2d",
                                         "SlowTranspose2d")


def test_ctrl_c_is_exit_130_without_a_traceback(monkeypatch, capsys) -> None:
    from convlab import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "checks", interrupted)
    assert cli.main(["doctor", "--device", "cpu"]) == 130
    assert capsys.readouterr().err.strip() == "convlab doctor: interrupted"
