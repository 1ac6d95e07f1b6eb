"""ideep's bf16/fp16 rule (convlab.aten.onednn_types) on CPUs this machine may not be, and
on this one against torch's own check."""

from __future__ import annotations

import os

import pytest
import torch

from convlab.aten.onednn_types import effective_isa, half_types_by_rule

AVX2 = {"sse4_1", "avx", "avx2", "fma"}
ALDER_LAKE = AVX2 | {"avx_vnni"}
LUNAR_LAKE = ALDER_LAKE | {"avx_vnni_int8", "avx_ne_convert"}
SKYLAKE_X = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
ZEN4 = SKYLAKE_X | {"avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx512_fp16", "amx_tile", "amx_bf16"}


@pytest.mark.parametrize(("flags", "isa", "bf16", "fp16"), [
    (AVX2, "avx2", False, False),
    (ALDER_LAKE, "avx2_vnni", False, False),
    (LUNAR_LAKE, "avx2_vnni_2", True, True),
    (SKYLAKE_X, "avx512_core", True, False),
    (ZEN4, "avx512_core_bf16", True, False),
    (SAPPHIRE_RAPIDS, "avx512_core_fp16", True, True),
])
def test_rule_per_cpu(flags: set[str], isa: str, bf16: bool, fp16: bool) -> None:
    assert effective_isa(flags) == isa
    assert half_types_by_rule(flags) == {"bfloat16": bf16, "float16": fp16}


@pytest.mark.parametrize(("flags", "cap", "isa"), [
    (SAPPHIRE_RAPIDS, "SSE41", "sse41"),
    (SAPPHIRE_RAPIDS, "avx2", "avx2"),
    (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", "avx512_core_bf16"),
    (SAPPHIRE_RAPIDS, "AVX10_1_512", "avx512_core_fp16"),
    (SAPPHIRE_RAPIDS, "ALL", "avx512_core_fp16"),
    (LUNAR_LAKE, "AVX2_VNNI", "avx2_vnni"),
    (LUNAR_LAKE, "AVX512_CORE", "avx2"),
    (ZEN4, "AVX2_VNNI_2", "avx2"),
    (set(), None, None),
])
def test_cap_lowers_the_level(flags: set[str], cap: str, isa: str | None) -> None:
    assert effective_isa(flags, cap) == isa


def test_a_capped_lunar_lake_sends_nothing_to_onednn() -> None:
    assert half_types_by_rule(LUNAR_LAKE, "AVX2") == {"bfloat16": False, "float16": False}


def test_bad_caps_are_refused() -> None:
    with pytest.raises(ValueError, match="cap='AVX512_CORE_AMX'"):
        effective_isa(ZEN4, "AVX512_CORE_AMX")
    with pytest.raises(ValueError, match="cap='pentium'"):
        effective_isa(ZEN4, "pentium")
    with pytest.raises(TypeError, match="cap must be a str"):
        effective_isa(ZEN4, 3)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_rule_agrees_with_torch_here() -> None:
    from convlab.lab.method.machine import cpu_flags

    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    try:
        rule = half_types_by_rule(cpu_flags(), cap)
    except ValueError:
        pytest.skip(f"ONEDNN_MAX_CPU_ISA={cap} is a cap the rule does not model")
    assert rule == {"bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                    "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported()}
