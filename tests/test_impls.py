"""convlab.lab.sections.impls: oneDNN's implementation per pass, parsed from verbatim verbose lines
of an Intel Xeon (fixture) and measured on this machine (any CPU with oneDNN)."""

from __future__ import annotations

import re

import pytest
import torch
from fixtures.cpu_fixtures import CPUS

from convlab.lab.method import profiling
from convlab.lab.record import record_schema
from convlab.lab.sections import impls

BACKWARD = CPUS / "intel-xeon-sapphire-rapids-x2-backward.txt"


def fixture_cases() -> dict[tuple[str, str], list[str]]:
    """(cap, "layer dtype format") -> the verbose lines of that case."""
    cases: dict[tuple[str, str], list[str]] = {}
    cap = case = None
    for line in BACKWARD.read_text().splitlines():
        if line.startswith("## ONEDNN_MAX_CPU_ISA="):
            cap = line.split("=", 1)[1]
        elif line.startswith("### "):
            case = line[4:]
            cases[(cap, case)] = []
        elif line.startswith("onednn_verbose"):
            cases[(cap, case)].append(line)
    return cases


CASES = fixture_cases()


@pytest.mark.parametrize(("cap", "case", "data", "weights"), [
    ("unset", "resnet14 float32 contiguous", "jit:avx512_core", "jit:avx512_core"),
    ("unset", "resnet14 float32 channels_last",
     "brg_conv_bwd:avx512_core+brg_conv_fwd:avx512_core", "jit:avx512_core"),
    ("unset", "transposed float32 contiguous", "conv:any+jit:avx512_core",
     "conv:any+jit:avx512_core"),
    ("unset", "resnet14 bfloat16 contiguous",
     "brg_conv_bwd:avx10_1_512_amx+brg_conv_fwd:avx10_1_512_amx",
     "brgconv_bwd_w:avx10_1_512_amx"),
    ("unset", "resnet14 float16 contiguous",
     "brg_conv_bwd:avx10_1_512+brg_conv_fwd:avx10_1_512", "ref:any"),
    ("unset", "depthwise bfloat16 contiguous", "jit_dw:avx512_core_bf16",
     "jit_dw:avx512_core_bf16"),
    ("AVX2", "resnet14 float32 contiguous", "jit:avx2", "jit:avx2"),
    ("SSE41", "resnet14 float32 contiguous", "x64:gemm:jit", "x64:gemm:jit"),
    ("SSE41", "resnet14 float32 channels_last", "x64:gemm:jit", "x64:gemm:jit"),
])
def test_parser_names_each_pass_on_fixture_lines(cap, case, data, weights):
    calls = profiling.parse_trace(CASES[(cap, case)])
    assert impls.conv_impls(calls) == {"backward_data": data, "backward_weights": weights}


def test_parser_skips_other_lines_and_keeps_the_first_of_a_pass():
    lines = CASES[("unset", "resnet14 float32 contiguous")]
    noisy = ["onednn_verbose,v1,info,cpu,isa:Intel AVX2", "not oneDNN", "", *lines]
    assert impls.conv_impls(profiling.parse_trace(noisy)) == impls.conv_impls(
        profiling.parse_trace(lines))
    second = re.sub(r"convolution,jit:avx512_core,backward_data",
                    "convolution,ref:any,backward_data", lines[2])
    assert impls.conv_impls(profiling.parse_trace([*lines, second]))["backward_data"] \
        == "jit:avx512_core"
    assert impls.conv_impls([]) == {}


def test_layout_reorders_count_only_changes_of_tag():
    calls = profiling.parse_trace(CASES[("unset", "resnet14 float32 contiguous")])
    reorders = [c for c in calls if c.op == "reorder"]
    # 7 reorders, one of them a copy of the bias from layout a to layout a
    assert len(reorders) == 7 and impls.layout_reorders(calls) == 6
    same = [c for c in reorders if "src:f32::blocked:a::f0 dst:f32::blocked:a::f0"
            in c.layouts]
    assert len(same) == 1 and impls.layout_reorders(same) == 0


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this build")
def test_quick_section_on_this_machine_is_schema_valid():
    section = impls.record(quick=True)
    assert record_schema.SECTION_CHECKS["impls"](section) == []
    assert [row["layer"] for row in section["layers"]] == list(impls.QUICK_LAYERS)
    for row in section["layers"]:
        contiguous = row["passes"]["contiguous"]
        assert set(contiguous) == {"backward_data", "backward_weights"}, row
        assert all(isinstance(v, str) and v for v in contiguous.values())
    conv1d = next(r for r in section["layers"] if r["layer"] == "conv1d")
    assert "channels_last" in conv1d["skipped_formats"]


@pytest.mark.parametrize(("section", "problem"), [
    ({"layers": 3}, "sections.impls.layers must be a list"),
    ({"layers": [{"passes": {}}]}, "layers[0] must be an object with a string layer"),
    ({"layers": [{"layer": "x", "passes": {"contiguous": {"backward_data": 1}}}]},
     "layers[0].passes must map formats"),
])
def test_schema_names_a_bad_impls_section(section, problem):
    assert any(problem in p for p in record_schema.SECTION_CHECKS["impls"](section))
    assert record_schema.SECTION_CHECKS["impls"]({"layers": [{"layer": "x",
                                                              "skipped": "why"}]}) == []
