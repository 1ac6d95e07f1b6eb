"""convlab.lab.machine: the fingerprint, its parsers and the ISA settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from convlab.lab import machine

AVX512_BF16 = {"sse4_1", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl",
               "avx512_bf16"}


def test_available_settings_cap_downwards_only():
    labels = lambda flags: [s.label for s in machine.available_settings(flags)]  # noqa: E731
    assert labels({"sse4_1", "avx2", "fma"}) == ["avx2", "sse41"]
    assert labels(AVX512_BF16) == ["avx512_bf16", "avx512", "avx2", "sse41"]
    assert labels(AVX512_BF16 - {"avx512_bf16"}) == ["avx512", "avx2", "sse41"]
    assert labels(AVX512_BF16 | {"amx_tile", "amx_bf16", "avx512_fp16"}) == [
        "amx", "avx512_fp16", "avx512_bf16", "avx512", "avx2", "sse41"]
    assert labels({"sse4_1"}) == ["sse41"]
    assert labels(set()) == []


def test_settings_name_both_libraries():
    for s in machine.ISA_SETTINGS:
        assert set(s.env) == {"ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"}
        assert s.env["ATEN_CPU_CAPABILITY"] in {"default", "avx2", "avx512"}
    assert machine.ISA_ORDER[-1] == "sse41"


@pytest.mark.parametrize(("model", "cores", "slug"), [
    ("AMD EPYC", 2, "amd-epyc-x2"),
    ("Intel(R) Xeon(R) Platinum 8488C", 16, "intel-xeon-platinum-8488c-x16"),
    ("", 4, "cpu-x4"),
])
def test_machine_slug(model, cores, slug):
    assert machine.machine_slug(model, cores) == slug


def test_parse_onednn_verbose():
    text = "\n".join([
        "onednn_verbose,v1,info,oneDNN v3.12.0 (commit x)",
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ "
        "extensions",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32 dst:f32,,2x8,0.1",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,"
        "src:f32,,alg:convolution_direct,mb2,0.3",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,x64:gemm:jit,backward_weights,"
        "src:f32,,alg:convolution_direct,mb2,0.3",
    ])
    got = machine.parse_onednn_verbose(text)
    assert got["isa_info"].startswith("Intel AVX-512 with AVX512BW")
    assert got["implementations"] == {"forward_training": "jit:avx512_core",
                                      "backward_weights": "x64:gemm:jit"}
    assert machine.parse_onednn_verbose("") == {"isa_info": None, "implementations": {}}


def test_parse_mkl_verbose():
    generic = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 "
               "architecture Intel(R) Architecture processors, Lnx 2.45GHz lp64 gnu_thread")
    avx2 = ("MKL_VERBOSE oneMKL 2024.0 Product build 20240605 for Intel(R) 64 architecture "
            "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx")
    assert machine.parse_mkl_verbose(generic) == "Intel(R) Architecture processors"
    assert machine.parse_mkl_verbose(avx2).endswith("(Intel(R) AVX2) enabled processors")
    assert machine.parse_mkl_verbose("nothing") is None


def test_check_setting_names_what_did_not_take_effect():
    avx2 = next(s for s in machine.ISA_SETTINGS if s.label == "avx2")
    good = {"aten_cpu_capability": "AVX2", "onednn_isa_info": "Intel AVX2"}
    assert machine.check_setting(avx2, good) == []
    bad = machine.check_setting(avx2, {"aten_cpu_capability": "DEFAULT",
                                       "onednn_isa_info": "Intel SSE4.1"})
    assert len(bad) == (2 if torch.backends.mkldnn.is_available() else 1)
    assert "ATen reports 'DEFAULT'" in bad[0]


def test_fingerprint_of_this_process():
    fp = machine.fingerprint()
    json.dumps(fp)  # JSON-serialisable
    assert fp["cores"] == os.cpu_count()
    assert fp["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["threads"] == torch.get_num_threads()
    assert fp["torch_version"] == torch.__version__
    assert set(fp["isa_flags"]) <= set(machine.ISA_FLAGS)
    if torch.backends.mkldnn.is_available():
        assert fp["onednn_isa"] and fp["onednn_isa_info"]
        assert set(fp["onednn_implementations"]) >= {"backward_data", "backward_weights"}
    line = machine.fingerprint_line(fp)
    assert f"x{fp['cores']}" in line and str(fp["aten_cpu_capability"]) in line


def test_fingerprint_leaves_verbose_off_and_prints_nothing(capfd):
    machine.onednn_probe.cache_clear()
    machine.mkl_probe.cache_clear()
    machine.fingerprint()
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    torch.nn.functional.conv2d(x, torch.randn(2, 2, 3, 3)).sum().backward()
    out = capfd.readouterr()
    assert "onednn_verbose" not in out.out and "MKL_VERBOSE" not in out.out


def test_a_fresh_process_under_the_lowest_setting_reports_it():
    """The caps take effect in a new process (and are checked as records.py checks them)."""
    sse = machine.ISA_SETTINGS[-1]
    if not machine.available_settings() or sse.label not in {
            s.label for s in machine.available_settings()}:
        pytest.skip("this CPU has no SSE4.1")
    code = ("import json, convlab.lab.machine as m; fp = m.fingerprint(); "
            "print(json.dumps([fp['aten_cpu_capability'], "
            "m.check_setting(m.ISA_SETTINGS[-1], fp)]))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **sse.env},
                         capture_output=True, text=True, check=True).stdout
    capability, problems = json.loads(out.strip().splitlines()[-1])
    assert capability == "DEFAULT" and problems == []
