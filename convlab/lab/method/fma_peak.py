"""A CPU's theoretical float32 peak: FMA pipes x lanes x 2 FLOPs x clock, per core and per
thread count, from a small table of microarchitectures keyed by cpuid vendor, family and
model.

The number is a model, not a measurement, and :func:`theoretical_peak` returns its inputs
so it can be audited: the table entry (pipes, their width, the document it is read from),
the instruction set's width, the clock and where it came from, the cores counted, and the
assumptions. The clock is the one the kernel reports (``cpu MHz`` in ``/proc/cpuinfo``); a
VM often reports the nominal base clock and turbo can run above it, so a measured GEMM
ceiling above this "peak" is possible and is a finding to show, not an error.

>>> fp = {"cpu_model": "AMD EPYC 7B13", "cpu_family_model": "25-1",
...       "isa_flags": ["avx2", "fma"]}
>>> p = theoretical_peak(fp, "avx2", 2, clock_mhz=2000.0, cores=2)
>>> p["microarchitecture"], p["flops_per_cycle"], p["gflops_per_core"], p["gflops"]
('Zen 3', 32, 64.0, 128.0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from convlab.lab.method import isa_settings, machine

AMD, INTEL = "AuthenticAMD", "GenuineIntel"
FLOAT32_BITS = 32
FLOPS_PER_FMA = 2  # a fused multiply-add counts as two FLOPs, as a GEMM's 2 n^3 counts them

# The float32 vector width each ISA setting's widest FMA instruction has. SSE4.1 has no FMA
# instruction (FMA3 came with AVX2-era CPUs), so no FMA-based peak is modelled for it. The
# AMX setting's tiles multiply bf16/int8 (and fp16), not float32: its float32 peak is
# AVX-512's. avx512_bf16's VDPBF16PS is a bf16 dot product; the roofline GEMM is float32.
ISA_BITS: dict[str, int | None] = {
    "sse41": None, "avx2": 256, "avx512": 512, "avx512_bf16": 512, "avx512_fp16": 512,
    "amx": 512,
}
ISA_NOTES: dict[str, str] = {
    "sse41": "SSE4.1 has no FMA; not modelled",
    "amx": "AMX tiles compute bf16/int8, not float32: the float32 peak is AVX-512's",
    "avx512_bf16": "float32 FMA peak (bf16 dot products are not counted)",
    "avx512_fp16": "float32 FMA peak (fp16 arithmetic is not counted)",
}
CLOCK_SOURCE = ("the clock the kernel reports (largest 'cpu MHz' in /proc/cpuinfo); a VM "
                "often reports the nominal base clock, turbo can exceed it, so a measured "
                "ceiling above this peak is possible")
INTEL_SKU_NOTE = (
    "assumes two 512-bit FMA units per core (port 0, fused with port 1, and port 5); some "
    "SKUs have one (e.g. Skylake-SP Xeon Bronze/Silver) and cpuid family/model cannot tell "
    "SKUs apart, so on such a part the AVX-512 peak is half of this; heavy 512-bit code "
    "may also run below the reported clock (AVX-512 frequency licence)")


@dataclass(frozen=True)
class Microarch:
    """One table row: cpuid vendor and family, model ranges (inclusive), the number of
    FMA pipes per core and each pipe's native width in bits, the source, and a note."""

    name: str
    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]
    fma_pipes: int
    unit_bits: int
    source: str
    note: str = ""

    def covers(self, vendor: str, family: int, model: int) -> bool:
        """Whether this row is the CPU with cpuid ``vendor``, ``family`` and ``model``."""
        return (vendor, family) == (self.vendor, self.family) and any(
            lo <= model <= hi for lo, hi in self.models)


_AMD17 = "AMD, Software Optimization Guide for AMD Family 17h Processors"
_AMD17_30 = "AMD, Software Optimization Guide for AMD Family 17h Models 30h and Greater Processors"
_AMD19_ZEN3 = "AMD, Software Optimization Guide for AMD EPYC 7003 Processors (Zen 3, family 19h)"
_AMD19_ZEN4 = "AMD, Software Optimization Guide for the AMD Zen4 Microarchitecture (family 19h)"
_AMD1A_ZEN5 = "AMD, Software Optimization Guide for the AMD Zen5 Microarchitecture (family 1Ah)"
_INTEL = "Intel 64 and IA-32 Architectures Optimization Reference Manual"

# Family/model ranges as compilers' CPU detection reads them (GCC's and LLVM's
# host-CPU tables); FMA pipes and widths from the vendors' optimisation guides. A CPU not
# listed is not modelled (None), never guessed: e.g. Zen 5 mobile parts (family 1Ah models
# 20h-3Fh, 60h-7Fh), whose FP datapath may be 256 bits wide, are left out.
MICROARCHES: tuple[Microarch, ...] = (
    # FP pipes 0 and 1 do FMA, 128 bits each; a 256-bit AVX op is split in two.
    Microarch("Zen / Zen+", AMD, 0x17, ((0x00, 0x2F),), 2, 128, _AMD17),
    # The FP datapath widened to 256 bits; FMA on pipes 0 and 1.
    Microarch("Zen 2", AMD, 0x17, ((0x30, 0xFF),), 2, 256, _AMD17_30),
    # FMA on FP pipes 0 and 1, 256 bits each.
    Microarch("Zen 3", AMD, 0x19, ((0x00, 0x0F), (0x20, 0x2F), (0x40, 0x5F)), 2, 256,
              _AMD19_ZEN3),
    # AVX-512 on 256-bit units ("double-pumped"): a 512-bit FMA takes both halves, so the
    # FLOPs per cycle equal AVX2's.
    Microarch("Zen 4", AMD, 0x19, ((0x10, 0x1F), (0x60, 0x7F), (0xA0, 0xAF)), 2, 256,
              _AMD19_ZEN4, "AVX-512 runs on 256-bit units: same FLOP/cycle as AVX2"),
    # Server (Turin, Turin dense) and desktop (Granite Ridge) parts: 512-bit FMA pipes.
    Microarch("Zen 5", AMD, 0x1A, ((0x00, 0x1F), (0x40, 0x4F)), 2, 512, _AMD1A_ZEN5),
    # Intel server cores: 512-bit FMA on port 0 (ports 0+1 fused) and port 5; 256-bit
    # FMA on ports 0 and 1, so AVX2 also has two pipes.
    Microarch("Skylake-SP / Cascade Lake / Cooper Lake", INTEL, 6, ((85, 85),), 2, 512,
              _INTEL, INTEL_SKU_NOTE),
    Microarch("Ice Lake-SP", INTEL, 6, ((106, 106), (108, 108)), 2, 512, _INTEL,
              INTEL_SKU_NOTE),
    Microarch("Sapphire Rapids", INTEL, 6, ((143, 143),), 2, 512, _INTEL, INTEL_SKU_NOTE),
    Microarch("Emerald Rapids", INTEL, 6, ((207, 207),), 2, 512, _INTEL, INTEL_SKU_NOTE),
    Microarch("Granite Rapids", INTEL, 6, ((173, 174),), 2, 512, _INTEL, INTEL_SKU_NOTE),
)


def _vendor(fp: Mapping[str, Any]) -> str | None:
    """The cpuid vendor of a fingerprint: its ``vendor_id`` where stored, else read from
    the model name (``AMD EPYC`` -> AuthenticAMD); None when neither says."""
    if fp.get("vendor_id"):
        return str(fp["vendor_id"])
    model = str(fp.get("cpu_model") or "")
    if re.search(r"\bAMD\b", model):
        return AMD
    if re.search(r"\bIntel\b", model, re.IGNORECASE):
        return INTEL
    return None


def _family_model(fp: Mapping[str, Any]) -> tuple[int, int] | None:
    """The cpuid family and model of a fingerprint (``cpu_family_model`` ``"25-1"``)."""
    match = re.fullmatch(r"(\d+)-(\d+)", str(fp.get("cpu_family_model") or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def lookup(fp: Mapping[str, Any]) -> Microarch | None:
    """The table row of a fingerprint's CPU (None: not modelled)."""
    if not isinstance(fp, Mapping):
        raise TypeError(f"fp: expected a fingerprint mapping, got {type(fp).__name__}")
    vendor, fm = _vendor(fp), _family_model(fp)
    if vendor is None or fm is None:
        return None
    return next((m for m in MICROARCHES if m.covers(vendor, *fm)), None)


def _cpuinfo(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@lru_cache(maxsize=4)
def kernel_clock_mhz(path: str = "/proc/cpuinfo") -> float | None:
    """The largest ``cpu MHz`` the kernel reports over the CPUs (None: it reports none)."""
    values = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)\s*$",
                                           _cpuinfo(path), re.MULTILINE)]
    return max(values) if values else None


@lru_cache(maxsize=4)
def physical_cores(path: str = "/proc/cpuinfo") -> int | None:
    """Distinct (``physical id``, ``core id``) pairs in ``/proc/cpuinfo``: the cores whose
    FMA pipes the threads can share out (SMT siblings share one core's). None: not shown."""
    pairs = set()
    for block in _cpuinfo(path).split("\n\n"):
        package = re.search(r"^physical id\s*:\s*(\d+)", block, re.MULTILINE)
        core = re.search(r"^core id\s*:\s*(\d+)", block, re.MULTILINE)
        if package and core:
            pairs.add((package.group(1), core.group(1)))
    return len(pairs) or None


@lru_cache(maxsize=4)
def _vendor_id(path: str = "/proc/cpuinfo") -> str | None:
    match = re.search(r"^vendor_id\s*:\s*(\S+)", _cpuinfo(path), re.MULTILINE)
    return match.group(1) if match else None


def host_fingerprint() -> dict[str, Any]:
    """What :func:`theoretical_peak` reads of this machine, without the full (slow)
    :func:`~convlab.lab.method.machine.fingerprint`: model, cpuid vendor, family and
    model, and the ISA flags."""
    flags = machine.cpu_flags()
    return {"cpu_model": machine.cpu_model(), "vendor_id": _vendor_id(),
            "cpu_family_model": machine.cpu_family_model(),
            "isa_flags": [f for f in machine.ISA_FLAGS if f in flags]}


def _is_host(fp: Mapping[str, Any]) -> bool:
    """Whether ``fp`` names this machine's CPU (model name and cpuid family/model)."""
    return (fp.get("cpu_model"), fp.get("cpu_family_model")) == (
        machine.cpu_model(), machine.cpu_family_model())


def process_isa_label(environ: Mapping[str, str], flags: set[str]) -> str | None:
    """The ISA setting a process runs under: the one whose environment ``environ`` holds
    (``convlab.lab.method.isa_settings.ISA_SETTINGS``), or with none of the ISA
    variables set the widest setting a CPU with ``flags`` offers; None when the variables
    match no setting."""
    if not any(k in environ for k in machine.ISA_ENV_VARS):
        offered = isa_settings.available_settings(flags)
        return offered[0].label if offered else None
    for s in isa_settings.ISA_SETTINGS:
        if all(environ.get(k) == v for k, v in s.env.items()) and all(
                environ.get(k) in (None, s.env.get(k)) for k in machine.ISA_ENV_VARS):
            return s.label
    return None


def _check_args(isa_label: object, threads: object, clock_mhz: object,
                cores: object) -> None:
    """TypeError/ValueError naming the bad argument of :func:`theoretical_peak`."""
    if not isinstance(isa_label, str):
        raise TypeError(f"isa_label: expected str, got {type(isa_label).__name__}")
    if isa_label not in ISA_BITS:
        raise ValueError(f"isa_label: {isa_label!r} is not one of {sorted(ISA_BITS)}")
    checks: tuple[tuple[str, object, type | tuple[type, ...], str], ...] = (
        ("threads", threads, int, "int"), ("cores", cores, int, "int or None"),
        ("clock_mhz", clock_mhz, (int, float), "a number or None"))
    for name, value, kind, wanted in checks:
        if value is None and name != "threads":
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TypeError(f"{name}: expected {wanted}, got {type(value).__name__}")
        if not (math.isfinite(value) and value > 0):  # type: ignore[call-overload,operator]
            raise ValueError(f"{name}: must be positive and finite, got {value!r}")


def _table_reason(fp: Mapping[str, Any], isa_label: str) -> str | None:
    """Why the table and the ISA give no peak for ``fp`` under ``isa_label`` (None: they
    do)."""
    if ISA_BITS[isa_label] is None:
        return ISA_NOTES[isa_label]
    if lookup(fp) is None:
        fm = _family_model(fp)
        where = f"family {fm[0]} model {fm[1]:#x}" if fm else "no cpuid family/model"
        return (f"not modelled: {_vendor(fp) or 'unknown vendor'} {where} is not in the "
                "FMA table")
    have = fp.get("isa_flags")
    setting = next(s for s in isa_settings.ISA_SETTINGS if s.label == isa_label)
    missing = [f for f in setting.needs if have is not None and f not in have]
    if missing:
        return f"not modelled: the CPU lacks {', '.join(missing)} for {isa_label}"
    return None


def peak_and_reason(fp: Mapping[str, Any], isa_label: str, threads: int,
                    clock_mhz: float | None = None,
                    cores: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`theoretical_peak` and, where it is None, why (the text a table shows in
    its place); the reason is None where the peak is modelled."""
    if not isinstance(fp, Mapping):
        raise TypeError(f"fp: expected a fingerprint mapping, got {type(fp).__name__}")
    _check_args(isa_label, threads, clock_mhz, cores)
    for name, value in (("clock_mhz", clock_mhz), ("cores", cores)):
        if value is None and not _is_host(fp):
            raise ValueError(f"{name}: required for a fingerprint of another machine")
    reason = _table_reason(fp, isa_label)
    if reason is not None:
        return None, reason
    row = lookup(fp)
    assert row is not None
    clock = kernel_clock_mhz() if clock_mhz is None else float(clock_mhz)
    if clock is None:
        return None, "not modelled: the kernel reports no clock (no 'cpu MHz')"
    known_cores = physical_cores() if cores is None else cores
    isa_bits = ISA_BITS[isa_label]
    assert isa_bits is not None
    bits = min(isa_bits, row.unit_bits)
    per_cycle = row.fma_pipes * (bits // FLOAT32_BITS) * FLOPS_PER_FMA
    counted = min(threads, known_cores) if known_cores else threads
    on_cores = ("physical cores unknown: one per thread" if not known_cores else
                f"{threads} threads share {counted} physical cores" if threads > counted
                else "")
    assumption = "; ".join(part for part in (row.note, ISA_NOTES.get(isa_label, ""), on_cores)
                           if part) or "only the table row and the reported clock"
    per_core = per_cycle * clock * 1e6 / 1e9
    return {
        "microarchitecture": row.name, "vendor": row.vendor,
        "family_model": fp.get("cpu_family_model"), "isa": isa_label, "isa_bits": isa_bits,
        "fma_pipes": row.fma_pipes, "unit_bits": row.unit_bits, "bits_per_pipe_cycle": bits,
        "lanes_per_instruction": isa_bits // FLOAT32_BITS,
        "lanes_per_pipe_cycle": bits // FLOAT32_BITS, "flops_per_fma": FLOPS_PER_FMA,
        "flops_per_cycle": per_cycle, "clock_mhz": clock,
        "clock_source": CLOCK_SOURCE if clock_mhz is None else "given",
        "threads": threads, "cores": counted, "gflops_per_core": per_core,
        "gflops": per_core * counted, "assumption": assumption, "source": row.source,
    }, None


def theoretical_peak(fp: Mapping[str, Any], isa_label: str, threads: int,
                     clock_mhz: float | None = None,
                     cores: int | None = None) -> dict[str, Any] | None:
    """The float32 FMA peak of ``threads`` threads of ``fp``'s CPU under ``isa_label``:
    pipes x (min(ISA width, unit width) / 32) x 2 x clock, per core and for the cores the
    threads occupy, with every input (None: not modelled; :func:`peak_and_reason` says why).

    ``clock_mhz`` and ``cores`` (physical cores) default to what this machine's kernel
    reports, and only when ``fp`` is this machine's CPU (ValueError naming the argument
    otherwise). Threads beyond ``cores`` add nothing: SMT siblings share a core's pipes.
    """
    return peak_and_reason(fp, isa_label, threads, clock_mhz, cores)[0]
