"""ISA settings: the instruction-set caps a records run measures under, and how a cap is
checked to have taken effect.

Each :class:`IsaSetting` is the environment of a fresh process (``ONEDNN_MAX_CPU_ISA``,
``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``). Both oneDNN and ATen fix their
instruction set at start-up, so each setting runs in its own process
(:mod:`convlab.lab.record.runner`); :func:`check_setting` then reads, in that process's
fingerprint (:func:`convlab.lab.method.machine.fingerprint`), what each cap limits.

>>> [s.label for s in available_settings({"sse4_1", "avx2", "fma"})]
['avx2', 'sse41']
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convlab.lab.method import machine

# oneDNN's instruction-set names as its implementation strings spell them (``jit:avx2``,
# ``jit_bf16:avx512_core_bf16``, ``brg_conv_fwd:avx512_core_amx``), ranked as its
# ``cpu_isa_t`` hierarchy nests them (src/cpu/x64/cpu_isa_traits.hpp: each level includes
# the ones below; oneDNN 3.x also spells avx512_core_fp16 ``avx10_1_512``). Rank 0 is an
# implementation that names no instruction set (``x64:gemm:jit``, ``ref``).
ONEDNN_ISA_RANK: dict[str, int] = {
    "sse41": 1, "avx": 2, "avx2": 3, "avx2_vnni": 4, "avx2_vnni_2": 5,
    "avx512_core": 6, "avx512_core_vnni": 7, "avx512_core_bf16": 8,
    "avx512_core_fp16": 9, "avx10_1_512": 9,
    "avx512_core_amx": 10, "avx10_1_512_amx": 10,
    "avx512_core_amx_fp16": 11, "avx10_1_512_amx_fp16": 11,
}
# Longest names first, so that "avx512_core_bf16" is not read as "avx512_core".
_ONEDNN_ISA = re.compile(
    r"(?<![a-z0-9])(" + "|".join(sorted(ONEDNN_ISA_RANK, key=len, reverse=True))
    + r")(?![a-z0-9_])")


def onednn_isa_of(implementation: str) -> str | None:
    """The instruction set an oneDNN implementation string names (None: it names none).

    >>> onednn_isa_of("jit_bf16:avx512_core_bf16")
    'avx512_core_bf16'
    >>> onednn_isa_of("x64:gemm:jit") is None
    True
    """
    found = _ONEDNN_ISA.findall(implementation)
    return max(found, key=ONEDNN_ISA_RANK.__getitem__) if found else None


@dataclass(frozen=True)
class IsaSetting:
    """One instruction-set cap: the environment of a fresh process and how to check it.

    ``needs``: cpuinfo flags the CPU must have; ``aten``: the value
    ``torch.backends.cpu.get_cpu_capability()`` must then report; ``onednn_isa``: the
    oneDNN instruction set the cap names (a key of ``ONEDNN_ISA_RANK``), which the
    implementations oneDNN runs under the cap must reach and not exceed; ``mkl``: the
    widest ``MKL_ENABLE_INSTRUCTIONS`` level within the cap (MKL has no level for
    AVX512-FP16 without AMX, nor one below SSE4.2, and honours the variable on Intel CPUs
    only, so a record stores whether MKL's announced code path changed under it).
    """

    label: str
    onednn: str
    aten_env: str
    aten: str
    onednn_isa: str
    needs: tuple[str, ...]
    mkl: str = ""

    @property
    def env(self) -> dict[str, str]:
        env = {"ONEDNN_MAX_CPU_ISA": self.onednn, "ATEN_CPU_CAPABILITY": self.aten_env}
        return {**env, "MKL_ENABLE_INSTRUCTIONS": self.mkl} if self.mkl else env

    @property
    def rank(self) -> int:
        """The cap's rank in ``ONEDNN_ISA_RANK``."""
        return ONEDNN_ISA_RANK[self.onednn_isa]


# Widest first. Each one caps both libraries; a cap above the CPU is silently ignored by
# oneDNN, so only settings whose flags the CPU has are offered.
ISA_SETTINGS: tuple[IsaSetting, ...] = (
    IsaSetting("amx", "AVX512_CORE_AMX", "avx512", "AVX512", "avx512_core_amx",
               ("avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile", "amx_bf16"),
               "AVX512_E4"),
    IsaSetting("avx512_fp16", "AVX512_CORE_FP16", "avx512", "AVX512", "avx512_core_fp16",
               ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_fp16"), "AVX512_E3"),
    IsaSetting("avx512_bf16", "AVX512_CORE_BF16", "avx512", "AVX512", "avx512_core_bf16",
               ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"), "AVX512_E3"),
    IsaSetting("avx512", "AVX512_CORE", "avx512", "AVX512", "avx512_core",
               ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "AVX512"),
    IsaSetting("avx2", "AVX2", "avx2", "AVX2", "avx2", ("avx2", "fma"), "AVX2"),
    IsaSetting("sse41", "SSE41", "default", "DEFAULT", "sse41", ("sse4_1",), "SSE4_2"),
)
ISA_ORDER: tuple[str, ...] = tuple(s.label for s in ISA_SETTINGS)


def available_settings(flags: set[str] | None = None) -> list[IsaSetting]:
    """The ISA settings this CPU can offer, widest first (each caps downwards).

    ``avx512_bf16``/``avx512_fp16``/``amx`` appear only when their flags are present, so
    an AVX-512 CPU without them gives avx512, avx2 and sse41.

    >>> [s.label for s in available_settings({"sse4_1", "avx2", "fma"})]
    ['avx2', 'sse41']
    """
    flags = machine.cpu_flags() if flags is None else flags
    return [s for s in ISA_SETTINGS if all(f in flags for f in s.needs)]


def observed_implementations(fp: Mapping[str, object]) -> dict[str, str]:
    """Every oneDNN convolution implementation a fingerprint saw, ``{"dtype pass": impl}``.

    >>> fp = {"onednn_implementations": {"backward_data": "jit:avx2"}}
    >>> observed_implementations(fp)
    {'float32 backward_data': 'jit:avx2'}
    """
    seen: dict[str, str] = {}
    f32 = fp.get("onednn_implementations") or {}
    by_dtype = fp.get("onednn_dtype_implementations") or {}
    for dtype, impls in [("float32", f32), *by_dtype.items()]:  # type: ignore[union-attr]
        if isinstance(impls, Mapping):
            seen.update({f"{dtype} {step}": str(impl) for step, impl in impls.items()})
    return seen


# Older names ATen reported for a capability (torch 2.4 says "NO AVX" for "DEFAULT").
ATEN_ALIASES: dict[str, str] = {"NO AVX": "DEFAULT"}


def aten_capability(name: object) -> object:
    """ATen's reported capability under its current name (``NO AVX`` -> ``DEFAULT``)."""
    return ATEN_ALIASES.get(name, name) if isinstance(name, str) else name


def check_setting(setting: IsaSetting, fp: Mapping[str, object],
                  onednn: bool | None = None) -> list[str]:
    """Why the fingerprint of a process started with ``setting.env`` does not show that the
    cap took effect (empty list: it did).

    Only what each cap limits is read, never a vendor's description of it: ATen's reported
    capability, and the instruction sets in the names of the oneDNN implementations that ran
    (:func:`onednn_isa_of`). None may exceed the cap, and one must reach it: a cap is
    verified only where some kernel at its level was seen. ``onednn``: whether oneDNN is
    part of this torch (default: ask torch).
    """
    problems = []
    if aten_capability(fp.get("aten_cpu_capability")) != setting.aten:
        problems.append(f"ATen reports {fp.get('aten_cpu_capability')!r}, expected "
                        f"{setting.aten!r}")
    if not (torch.backends.mkldnn.is_available() if onednn is None else onednn):
        return problems
    seen = {where: (impl, onednn_isa_of(impl)) for where, impl in
            observed_implementations(fp).items()}
    above: dict[str, list[str]] = {}
    for where, (impl, isa) in seen.items():
        if isa and ONEDNN_ISA_RANK[isa] > setting.rank:
            dtypes = above.setdefault(impl, [])
            dtypes += [] if where.split()[0] in dtypes else [where.split()[0]]
    if above:
        ran = ", ".join(f"{impl} ({'/'.join(d)})" for impl, d in above.items())
        problems.append(f"oneDNN ran {ran}, above the {setting.onednn_isa} cap")
    elif not any(isa and ONEDNN_ISA_RANK[isa] == setting.rank for _, isa in seen.values()):
        ranked = [(ONEDNN_ISA_RANK[isa], impl) for impl, isa in seen.values() if isa]
        best = max(ranked)[1] if ranked else "none naming an instruction set"
        problems.append(f"cannot verify the cap: no oneDNN kernel at {setting.onednn_isa} "
                        f"was seen (highest: {best})")
    return problems


def mkl_cap(setting: IsaSetting, fp: Mapping[str, Any],
            default_path: str | None) -> dict[str, Any]:
    """Whether the setting's ``MKL_ENABLE_INSTRUCTIONS`` changed the code path MKL announced
    (``changed``: None without MKL). MKL honours the variable on Intel CPUs only."""
    path = (fp.get("blas") or {}).get("mkl_path")
    changed = None if path is None or default_path is None else path != default_path
    return {"env": setting.mkl or None, "path": path, "default_path": default_path,
            "changed": changed}
