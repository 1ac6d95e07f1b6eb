"""The theoretical FMA peak (convlab.lab.method.fma_peak) on fake fingerprints: the table
lookups, the arithmetic, what is not modelled and why, and bad input. Nothing here reads
this machine's CPU except through files and stand-ins the tests write."""

from __future__ import annotations

import math

import pytest

from convlab.lab.method import fma_peak, isa_settings
from convlab.lab.sections import roofline

ZEN3 = {"cpu_model": "AMD EPYC 7B13", "cpu_family_model": "25-1",
        "isa_flags": ["sse4_1", "avx2", "fma"]}
ZEN4 = {"cpu_model": "AMD EPYC 9B14", "cpu_family_model": "25-17",
        "isa_flags": ["sse4_1", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl",
                      "avx512_bf16"]}
SPR = {"cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "cpu_family_model": "6-143",
       "isa_flags": ["sse4_1", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl",
                     "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]}


def peak(fp: dict, isa: str, threads: int = 1, clock: float = 2000.0,
         cores: int | None = 64) -> dict:
    got = fma_peak.theoretical_peak(fp, isa, threads, clock_mhz=clock, cores=cores)
    assert got is not None, fma_peak.peak_and_reason(fp, isa, threads, clock, cores)[1]
    return got


@pytest.mark.parametrize(("family_model", "name"), [
    ("25-1", "Zen 3"), ("25-33", "Zen 3"), ("25-80", "Zen 3"), ("25-17", "Zen 4"),
    ("25-97", "Zen 4"), ("25-160", "Zen 4"), ("23-49", "Zen 2"), ("23-113", "Zen 2"),
    ("23-1", "Zen / Zen+"), ("26-2", "Zen 5"), ("26-68", "Zen 5")])
def test_amd_lookups(family_model: str, name: str) -> None:
    row = fma_peak.lookup({"cpu_model": "AMD EPYC", "cpu_family_model": family_model})
    assert row is not None and row.name == name


@pytest.mark.parametrize(("model", "name"), [
    (85, "Skylake-SP / Cascade Lake / Cooper Lake"), (106, "Ice Lake-SP"),
    (143, "Sapphire Rapids"), (207, "Emerald Rapids"), (173, "Granite Rapids")])
def test_intel_lookups(model: int, name: str) -> None:
    row = fma_peak.lookup({"cpu_model": "Intel(R) Xeon(R) Processor",
                           "cpu_family_model": f"6-{model}"})
    assert row is not None and row.name == name and (row.fma_pipes, row.unit_bits) == (2, 512)
    assert "one" in row.note and "SKU" in row.note  # the one-unit SKUs are stated


def test_vendor_comes_from_vendor_id_before_the_model_name() -> None:
    fp = {"cpu_model": "Common KVM processor", "cpu_family_model": "25-1"}
    assert fma_peak.lookup(fp) is None
    assert fma_peak.lookup({**fp, "vendor_id": "AuthenticAMD"}).name == "Zen 3"
    assert fma_peak.lookup({**fp, "vendor_id": "GenuineIntel"}) is None  # Intel family 25


def test_no_model_is_in_two_rows() -> None:
    for vendor in (fma_peak.AMD, fma_peak.INTEL):
        for family in {m.family for m in fma_peak.MICROARCHES}:
            for model in range(256):
                rows = [m.name for m in fma_peak.MICROARCHES
                        if m.covers(vendor, family, model)]
                assert len(rows) <= 1, (vendor, family, model, rows)


def test_every_row_cites_a_document() -> None:
    for row in fma_peak.MICROARCHES:
        doc = ("Software Optimization Guide" if row.vendor == fma_peak.AMD
               else "Optimization Reference Manual")
        assert doc in row.source, row.name


def test_zen3_avx2_arithmetic() -> None:
    p = peak(ZEN3, "avx2", threads=2, clock=2450.0, cores=2)
    assert (p["fma_pipes"], p["lanes_per_pipe_cycle"], p["flops_per_fma"]) == (2, 8, 2)
    assert p["flops_per_cycle"] == 2 * 8 * 2
    assert p["gflops_per_core"] == pytest.approx(32 * 2.45)
    assert p["gflops"] == pytest.approx(2 * 32 * 2.45)
    assert p["clock_mhz"] == 2450.0 and p["clock_source"] == "given"
    assert "EPYC 7003" in p["source"]


def test_zen4_avx512_has_avx2s_flops_per_cycle() -> None:
    a512, a2 = peak(ZEN4, "avx512"), peak(ZEN4, "avx2")
    assert a512["lanes_per_instruction"] == 16 and a2["lanes_per_instruction"] == 8
    assert a512["bits_per_pipe_cycle"] == a2["bits_per_pipe_cycle"] == 256
    assert a512["flops_per_cycle"] == a2["flops_per_cycle"] == 32
    assert a512["gflops"] == a2["gflops"]
    assert "256-bit" in a512["assumption"]


def test_sapphire_rapids_avx512_doubles_avx2() -> None:
    a512, a2 = peak(SPR, "avx512"), peak(SPR, "avx2")
    assert (a512["flops_per_cycle"], a2["flops_per_cycle"]) == (64, 32)
    assert a512["gflops"] == pytest.approx(2 * a2["gflops"])
    assert "SKU" in a512["assumption"]


def test_amx_and_bf16_settings_give_the_avx512_float32_peak() -> None:
    base = peak(SPR, "avx512")["gflops"]
    for label in ("amx", "avx512_bf16", "avx512_fp16"):
        p = peak(SPR, label)
        assert p["gflops"] == base
        assert "float32" in p["assumption"]


def test_zen5_and_zen1_widths() -> None:
    zen5 = {"cpu_model": "AMD EPYC 9575F", "cpu_family_model": "26-2"}
    assert peak(zen5, "avx512")["flops_per_cycle"] == 64
    assert peak(zen5, "avx2")["flops_per_cycle"] == 32
    zen1 = {"cpu_model": "AMD EPYC 7601", "cpu_family_model": "23-1"}
    assert peak(zen1, "avx2")["flops_per_cycle"] == 16  # 2 x 128-bit pipes


def test_threads_beyond_the_cores_add_nothing() -> None:
    p = peak(ZEN3, "avx2", threads=4, clock=1000.0, cores=2)
    assert p["cores"] == 2 and p["gflops"] == pytest.approx(2 * p["gflops_per_core"])
    assert "4 threads share 2 physical cores" in p["assumption"]


def test_unknown_cpu_is_not_modelled() -> None:
    for fp in ({"cpu_model": "AMD EPYC", "cpu_family_model": "25-48"},  # 0x30: no row
               {"cpu_model": "Intel(R) Core(TM) i7-4770", "cpu_family_model": "6-60"},
               {"cpu_model": "Mystery CPU", "cpu_family_model": "25-1"},
               {"cpu_model": "AMD EPYC"}):
        got, why = fma_peak.peak_and_reason(fp, "avx2", 1, 2000.0, 1)
        assert got is None and why is not None and why.startswith("not modelled")
        assert fma_peak.theoretical_peak(fp, "avx2", 1, 2000.0, 1) is None


def test_sse41_is_not_modelled() -> None:
    got, why = fma_peak.peak_and_reason(ZEN3, "sse41", 1, 2000.0, 1)
    assert got is None and why == "SSE4.1 has no FMA; not modelled"


def test_a_setting_the_cpu_lacks_is_not_modelled() -> None:
    got, why = fma_peak.peak_and_reason(ZEN3, "avx512", 1, 2000.0, 1)
    assert got is None and "avx512f" in why


def test_every_isa_setting_has_a_width() -> None:
    assert set(fma_peak.ISA_BITS) == set(isa_settings.ISA_ORDER)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"isa_label": "avx3"}, ValueError, "isa_label"),
    ({"isa_label": 256}, TypeError, "isa_label"),
    ({"threads": 0}, ValueError, "threads"),
    ({"threads": 1.5}, TypeError, "threads"),
    ({"threads": True}, TypeError, "threads"),
    ({"clock_mhz": -1.0}, ValueError, "clock_mhz"),
    ({"clock_mhz": math.nan}, ValueError, "clock_mhz"),
    ({"clock_mhz": "2 GHz"}, TypeError, "clock_mhz"),
    ({"cores": 0}, ValueError, "cores"),
    ({"fp": ["AMD EPYC"]}, TypeError, "fp"),
])
def test_bad_input_names_the_argument(kwargs: dict, error: type, name: str) -> None:
    args = {"fp": ZEN3, "isa_label": "avx2", "threads": 1, "clock_mhz": 2000.0, "cores": 1}
    with pytest.raises(error, match=f"^{name}:"):
        fma_peak.theoretical_peak(**{**args, **kwargs})


def test_another_machines_fingerprint_needs_clock_and_cores() -> None:
    other = {**ZEN3, "cpu_model": "AMD EPYC (not this machine's CPU)"}
    with pytest.raises(ValueError, match="^clock_mhz:"):
        fma_peak.theoretical_peak(other, "avx2", 1, cores=1)
    with pytest.raises(ValueError, match="^cores:"):
        fma_peak.theoretical_peak(other, "avx2", 1, clock_mhz=2000.0)


def test_cpuinfo_clock_and_physical_cores(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2000.000\n"
                    "physical id\t: 0\ncore id\t\t: 0\n\n"
                    "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 3000.500\n"
                    "physical id\t: 0\ncore id\t\t: 0\n\n"
                    "processor\t: 2\ncpu MHz\t\t: 2500.0\nphysical id\t: 1\ncore id\t\t: 0\n")
    assert fma_peak.kernel_clock_mhz(str(path)) == 3000.5
    assert fma_peak.physical_cores(str(path)) == 2  # cpus 0 and 1 are SMT siblings
    empty = tmp_path / "none"
    empty.write_text("processor\t: 0\n")
    assert fma_peak.kernel_clock_mhz(str(empty)) is None
    assert fma_peak.physical_cores(str(empty)) is None


def test_process_isa_label() -> None:
    avx2_cpu = {"sse4_1", "avx2", "fma"}
    assert fma_peak.process_isa_label({}, avx2_cpu) == "avx2"
    assert fma_peak.process_isa_label({}, set()) is None
    for setting in isa_settings.ISA_SETTINGS:
        assert fma_peak.process_isa_label(dict(setting.env), avx2_cpu) == setting.label
    partial = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert fma_peak.process_isa_label(partial, avx2_cpu) is None


def fake_host(monkeypatch: pytest.MonkeyPatch, fp: dict, label: str) -> None:
    """This process as a 4-core, 2000 MHz machine with ``fp``'s CPU under ``label``."""
    monkeypatch.setattr(fma_peak, "host_fingerprint", lambda: dict(fp))
    monkeypatch.setattr(fma_peak, "_is_host", lambda _fp: True)
    monkeypatch.setattr(fma_peak, "kernel_clock_mhz", lambda: 2000.0)
    monkeypatch.setattr(fma_peak, "physical_cores", lambda: 4)
    setting = next(s for s in isa_settings.ISA_SETTINGS if s.label == label)
    for key, value in setting.env.items():
        monkeypatch.setenv(key, value)


def test_roofline_puts_the_ceiling_beside_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_host(monkeypatch, SPR, "avx512")
    got = roofline.theoretical({"1": 100.0, "8": 600.0}, [1, 8])
    assert got["isa"] == "avx512" and got["reason"] is None
    assert got["model"]["microarchitecture"] == "Sapphire Rapids"
    assert got["model"]["clock_source"] == fma_peak.CLOCK_SOURCE
    assert got["gflops"] == {"1": 128.0, "8": 512.0}  # 64 FLOP/cycle x 2 GHz; 4 cores
    assert got["cores"] == {"1": 1, "8": 4}
    assert got["measured_over_peak"] == {"1": 100 / 128, "8": 600 / 512}  # above 1: shown


def test_roofline_says_why_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_host(monkeypatch, SPR, "sse41")
    got = roofline.theoretical({"1": 10.0}, [1])
    assert got == {"isa": "sse41", "reason": "SSE4.1 has no FMA; not modelled", "model": None,
                   "gflops": None, "cores": None, "measured_over_peak": None}
