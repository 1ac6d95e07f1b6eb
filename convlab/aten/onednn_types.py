"""Which reduced-precision types oneDNN takes on an x86 CPU: ideep's rule, from the CPU's
flags and the oneDNN instruction-set cap.

On x86, ATen's ``mkldnn_bf16_device_check`` and ``mkldnn_fp16_device_check``
(``aten/src/ATen/native/mkldnn/Utils.h``) ask ideep, whose ``has_bf16_type_support`` is
"oneDNN's effective ISA >= ``avx2_vnni_2``" and ``has_fp16_type_support`` is ">=
``avx512_core_fp16`` or == ``avx2_vnni_2``" (intel/ideep ``include/ideep/abstract_types.hpp``,
ideep PR #232, 2023). ``avx2_vnni_2`` is AVX2 with AVX-VNNI, AVX-VNNI-INT8 and
AVX-NE-CONVERT (Lunar Lake, Arrow Lake, Sierra Forest): such CPUs send bfloat16 and float16
convolutions to oneDNN, whose *backward* then refuses them ("DNNL does not support bf16/f16
backward on the platform with avx2_vnni_2", pytorch/pytorch#148861).

:func:`half_types_by_rule` computes the rule from ``/proc/cpuinfo`` flag names, so it can be
checked against ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` on this machine and
tested on CPUs this machine is not.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["HIERARCHY", "effective_isa", "half_types_by_rule"]

# oneDNN's x86 levels that decide the rule, lowest first, each with the cpuinfo flags it
# needs on top of the level it extends (src/cpu/x64/cpu_isa_traits.hpp). avx2_vnni_2 sits
# on a branch beside the AVX-512 chain: a CPU reaches it only without AVX-512.
HIERARCHY: tuple[tuple[str, str | None, frozenset[str]], ...] = (
    ("sse41", None, frozenset({"sse4_1"})),
    ("avx", "sse41", frozenset({"avx"})),
    ("avx2", "avx", frozenset({"avx2"})),
    ("avx2_vnni", "avx2", frozenset({"avx_vnni"})),
    ("avx2_vnni_2", "avx2_vnni", frozenset({"avx_vnni_int8", "avx_ne_convert"})),
    ("avx512_core", "avx2", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
    ("avx512_core_vnni", "avx512_core", frozenset({"avx512_vnni"})),
    ("avx512_core_bf16", "avx512_core_vnni", frozenset({"avx512_bf16"})),
    ("avx512_core_fp16", "avx512_core_bf16", frozenset({"avx512_fp16"})),
)
_ORDER = {name: i for i, (name, _, _) in enumerate(HIERARCHY)}
# Other names ONEDNN_MAX_CPU_ISA accepts for the levels above (oneDNN 3.x spells fp16
# AVX10_1_512), and its "no cap". The AMX caps are not modelled: which of the levels above
# they contain is not settled here, so they raise.
_CAP_ALIASES: dict[str, str | None] = {"avx10_1_512": "avx512_core_fp16", "all": None,
                                       "default": None}


def _reached(flags: Collection[str]) -> set[str]:
    """Every level whose flags (and its parents' flags) the CPU has."""
    reached: set[str] = set()
    for name, parent, needs in HIERARCHY:
        if (parent is None or parent in reached) and needs <= set(flags):
            reached.add(name)
    return reached


def effective_isa(flags: Collection[str], cap: str | None = None) -> str | None:
    """The highest level of ``HIERARCHY`` the CPU reaches, under ``cap`` (the value of
    ``ONEDNN_MAX_CPU_ISA``, any case; None, ``ALL`` or ``DEFAULT``: no cap). None: not even
    SSE4.1. A cap allows a level when the level is the cap or one of its ancestors (the
    avx2_vnni_2 branch is under no AVX-512 cap). An AMX cap raises ``ValueError``."""
    if not isinstance(cap, (str, type(None))):
        raise TypeError(f"cap must be a str or None, not {type(cap).__name__}")
    allowed: set[str] | None = None
    if cap is not None:
        name = cap.strip().lower()
        key = _CAP_ALIASES[name] if name in _CAP_ALIASES else name
        if key is not None:
            if key not in _ORDER:
                raise ValueError(f"cap={cap!r} is not an ONEDNN_MAX_CPU_ISA level this rule "
                                 f"knows ({', '.join(_ORDER)})")
            allowed = _ancestors(key)
    reached = _reached(flags)
    if allowed is not None:
        reached &= allowed
    return max(reached, key=_ORDER.__getitem__) if reached else None


def _ancestors(name: str) -> set[str]:
    parents = {n: p for n, p, _ in HIERARCHY}
    found: set[str] = set()
    at: str | None = name
    while at is not None:
        found.add(at)
        at = parents[at]
    return found


def half_types_by_rule(flags: Collection[str], cap: str | None = None) -> dict[str, bool]:
    """``{"bfloat16": ..., "float16": ...}``: whether ideep's check lets oneDNN take the type
    on a CPU with these ``/proc/cpuinfo`` flags under the oneDNN ISA ``cap``.

    >>> half_types_by_rule({"sse4_1", "avx", "avx2"})
    {'bfloat16': False, 'float16': False}
    >>> lunar_lake = {"sse4_1", "avx", "avx2", "avx_vnni", "avx_vnni_int8", "avx_ne_convert"}
    >>> half_types_by_rule(lunar_lake)
    {'bfloat16': True, 'float16': True}
    """
    isa = effective_isa(flags, cap)
    rank = -1 if isa is None else _ORDER[isa]
    on_avx512 = isa is not None and isa.startswith("avx512")
    return {"bfloat16": isa == "avx2_vnni_2" or on_avx512,
            "float16": isa == "avx2_vnni_2" or rank >= _ORDER["avx512_core_fp16"]}
