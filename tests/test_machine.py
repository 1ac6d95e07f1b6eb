"""convlab.lab.method.machine: the fingerprint, its parsers and the ISA settings, the settings'
checks over fixtures of several CPUs (tests/fixtures/cpus: none depends on this CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from fixtures.cpu_fixtures import INTEL, fixture_run, intel_fixture, json_fixture, setting

from convlab.lab import notebook
from convlab.lab.method import isa_settings, machine, verbose_probes
from convlab.lab.record import record_schema, records, runner

OFFERED = {
    "intel": ["amx", "avx512_fp16", "avx512_bf16", "avx512", "avx2", "sse41"],
    "amd-epyc-avx512-bf16-x2": ["avx512_bf16", "avx512", "avx2", "sse41"],
    "amd-epyc-avx2-x2": ["avx2", "sse41"],
    "synthetic-avx512-no-bf16": ["avx512", "avx2", "sse41"],
    "synthetic-sse42-only": ["sse41"],
}
# What the fixtures show (absent: the cap is observed to take effect). The Intel strings
# hold float32 kernels only, and oneDNN runs jit:avx512_core for float32 under every AVX-512
# cap, so the bf16/fp16/AMX caps cannot be verified from them (a records run skips them).
NOT_VERIFIED = {
    ("intel", "amx"): "cannot verify the cap: no oneDNN kernel at avx512_core_amx",
    ("intel", "avx512_fp16"): "cannot verify the cap: no oneDNN kernel at avx512_core_fp16",
    ("intel", "avx512_bf16"): "cannot verify the cap: no oneDNN kernel at avx512_core_bf16",
}
CASES = [(cpu, label) for cpu, labels in OFFERED.items() for label in labels]

AVX512_BF16 = {"sse4_1", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl",
               "avx512_bf16"}


def test_available_settings_cap_downwards_only():
    labels = lambda flags: [s.label for s in isa_settings.available_settings(flags)]  # noqa: E731
    assert labels({"sse4_1", "avx2", "fma"}) == ["avx2", "sse41"]
    assert labels(AVX512_BF16) == ["avx512_bf16", "avx512", "avx2", "sse41"]
    assert labels(AVX512_BF16 - {"avx512_bf16"}) == ["avx512", "avx2", "sse41"]
    assert labels(AVX512_BF16 | {"amx_tile", "amx_bf16", "avx512_fp16"}) == [
        "amx", "avx512_fp16", "avx512_bf16", "avx512", "avx2", "sse41"]
    assert labels({"sse4_1"}) == ["sse41"]
    assert labels(set()) == []


def test_settings_name_both_libraries():
    for s in isa_settings.ISA_SETTINGS:
        assert set(s.env) == set(machine.ISA_ENV_VARS) == {
            "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"}
        assert s.env["ATEN_CPU_CAPABILITY"] in {"default", "avx2", "avx512"}
    # MKL's levels within each cap (its mkl_enable_instructions reference, oneMKL 2024.2)
    assert [s.mkl for s in isa_settings.ISA_SETTINGS] == [
        "AVX512_E4", "AVX512_E3", "AVX512_E3", "AVX512", "AVX2", "SSE4_2"]
    assert isa_settings.ISA_ORDER[-1] == "sse41"


@pytest.mark.parametrize(("model", "cores", "caches", "slug"), [
    ("AMD EPYC", 2, {}, "amd-epyc-x2"),
    ("Intel(R) Xeon(R) Platinum 8488C", 16, {}, "intel-xeon-platinum-8488c-x16"),
    ("", 4, {}, "cpu-x4"),
    # one reported model, two hosts: the last-level cache tells them apart
    ("Intel(R) Xeon(R) Processor", 2, {"L1d": 49152, "L2": 2**21, "L3": 300 * 2**20},
     "intel-xeon-processor-x2-l3-300m"),
    ("Intel(R) Xeon(R) Processor", 2, {"L1d": 49152, "L1i": 65536, "L2": 2**21,
                                       "L3": 503316480}, "intel-xeon-processor-x2-l3-480m"),
    # a cache that is not a whole MiB is named exactly, in KiB
    ("AMD EPYC", 2, {"L1d": 2**15, "L2": 2**19}, "amd-epyc-x2-l2-512k"),
    ("AMD EPYC", 2, {"L1d": 2**15, "L2": 2**20}, "amd-epyc-x2-l2-1m"),
    ("Intel(R) Xeon(R) Processor", 2, {"L3": 3 * 2**19}, "intel-xeon-processor-x2-l3-1536k"),
])
def test_machine_slug(model, cores, caches, slug):
    assert machine.machine_slug(model, cores, caches) == slug


@pytest.mark.parametrize("sizes", [(2**18, 2**19, 2**20), (3 * 2**19, 5 * 2**19, 2 * 2**20)])
def test_hosts_whose_caches_differ_get_distinct_names(sizes):
    """256 KiB, 512 KiB and 1 MiB (or 1.5, 2.5 and 2 MiB) of last-level cache were one
    file name when rounded to whole MiB: the second host's records then went unread."""
    fps = [{"cpu_model": "AMD EPYC", "cores": 2, "caches": {"L1d": 2**15, "L2": size}}
           for size in sizes]
    assert len({machine.slug_of(fp) for fp in fps}) == len(sizes)
    assert len({machine.display_name(fp) for fp in fps}) == len(sizes)


@pytest.mark.parametrize(("size", "slug", "name"), [
    (2**18, "l2-256k", "L2 256 KiB"), (3 * 2**19, "l2-1536k", "L2 1536 KiB"),
    (2**20, "l2-1m", "L2 1 MiB"), (480 * 2**20, "l2-480m", "L2 480 MiB"),
    (1000, "l2-1000b", "L2 1000 B"),
])
def test_the_cache_size_is_named_exactly(size, slug, name):
    fp = {"cpu_model": "AMD EPYC", "cores": 2, "caches": {"L2": size}}
    assert machine.slug_of(fp) == f"amd-epyc-x2-{slug}"
    assert machine.display_name(fp) == f"AMD EPYC x2 ({name})"


def test_records_of_two_hosts_of_one_model_get_two_names():
    """Record.machine and cpu_identity see the cache: no merge across hosts."""
    def rec(l3):
        fp = {"cpu_model": "Intel(R) Xeon(R) Processor", "cores": 2, "isa_flags": ["avx2"],
              "caches": {"L2": 2**21, "L3": l3}}
        return fp, {"fingerprint": fp}
    (fp_a, a), (fp_b, b) = rec(300 * 2**20), rec(480 * 2**20)
    assert runner.cpu_identity(a) != runner.cpu_identity(b)
    with pytest.raises(ValueError, match="another CPU"):
        runner.merge({"schema": record_schema.SCHEMA, **a}, {"sections": {}, **b})
    assert (machine.machine_slug("Intel(R) Xeon(R) Processor", 2, fp_a["caches"])
            != machine.machine_slug("Intel(R) Xeon(R) Processor", 2, fp_b["caches"]))


def test_two_hosts_of_one_model_and_cache_differ_by_cpuid_family_and_model():
    """'AMD EPYC' with 32 MiB of L3 named two hosts on two days (one of them cpuid family
    25, model 17, with other ISA flags and L1d than the other)."""
    def fp(family_model):
        return {"cpu_model": "AMD EPYC", "cores": 2, "isa_flags": ["avx2"],
                "caches": {"L3": 32 * 2**20}, "cpu_family_model": family_model}
    zen4, zen5, old = fp("25-17"), fp("26-2"), fp(None)
    assert machine.slug_of(zen4) == "amd-epyc-x2-l3-32m-f25m17"
    assert machine.slug_of(old) == "amd-epyc-x2-l3-32m"  # records from before the field
    assert len({machine.slug_of(f) for f in (zen4, zen5, old)}) == 3
    assert machine.display_name(zen4) == "AMD EPYC x2 (L3 32 MiB, family 25 model 17)"
    assert machine.display_name(old) == "AMD EPYC x2 (L3 32 MiB)"
    assert runner.cpu_identity({"fingerprint": zen4}) != runner.cpu_identity(
        {"fingerprint": zen5})


def test_cpu_family_model_reads_cpuinfo(monkeypatch):
    monkeypatch.setattr(machine, "_cpuinfo", lambda: "processor\t: 0\ncpu family\t: 25\n"
                        "model\t\t: 17\nmodel name\t: AMD EPYC\n")
    assert machine.cpu_family_model() == "25-17"
    monkeypatch.setattr(machine, "_cpuinfo", lambda: "model name\t: Apple M2\n")
    assert machine.cpu_family_model() is None


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
    got = verbose_probes.parse_onednn_verbose(text)
    assert got["isa_info"].startswith("Intel AVX-512 with AVX512BW")
    assert got["implementations"] == {"forward_training": "jit:avx512_core",
                                      "backward_weights": "x64:gemm:jit"}
    assert verbose_probes.parse_onednn_verbose("") == {"isa_info": None, "implementations": {}}


def test_parse_mkl_verbose():
    generic = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 "
               "architecture Intel(R) Architecture processors, Lnx 2.45GHz lp64 gnu_thread")
    avx2 = ("MKL_VERBOSE oneMKL 2024.0 Product build 20240605 for Intel(R) 64 architecture "
            "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx")
    assert verbose_probes.parse_mkl_verbose(generic) == "Intel(R) Architecture processors"
    assert verbose_probes.parse_mkl_verbose(avx2).endswith("(Intel(R) AVX2) enabled processors")
    assert verbose_probes.parse_mkl_verbose("nothing") is None


def test_the_mkl_code_path_is_kept_whole():
    """The Intel AMX header: the path holds commas; it runs up to the OS field."""
    (line,) = [ln for ln in INTEL.read_text().splitlines() if ln.startswith("MKL_VERBOSE")]
    path = verbose_probes.parse_mkl_verbose(line)
    assert path == ("Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support "
                    "for INT8, BF16, FP16 (limited) instructions, and Intel(R) Advanced "
                    "Matrix Extensions (Intel(R) AMX) with INT8 and BF16")
    assert verbose_probes.parse_mkl_verbose(line.replace(", Lnx", ", Win")) == path
    fp = {"cpu_model": "Intel Xeon", "cores": 2, "blas": {"mkl_version": "2024.2",
                                                          "mkl_path": path}}
    assert f"MKL 2024.2 ({path})" in machine.fingerprint_line(fp)


@pytest.mark.parametrize(("impl", "isa"), [
    ("jit:avx2", "avx2"), ("jit:sse41", "sse41"), ("x64:gemm:jit", None), ("ref:any", None),
    ("jit_bf16:avx512_core_bf16", "avx512_core_bf16"), ("jit:avx512_core", "avx512_core"),
    ("brg_conv_fwd:avx512_core_amx", "avx512_core_amx"), ("jit:avx2_vnni_2", "avx2_vnni_2"),
    ("brg_conv_fwd:avx10_1_512_amx", "avx10_1_512_amx"), ("jit_dw:avx512_core", "avx512_core"),
])
def test_onednn_isa_of_an_implementation(impl, isa):
    assert isa_settings.onednn_isa_of(impl) == isa


def test_every_setting_names_a_ranked_onednn_isa_widest_first():
    ranks = [s.rank for s in isa_settings.ISA_SETTINGS]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)


@pytest.mark.parametrize("cpu", OFFERED)
def test_fixture_cpus_offer_their_settings(cpu):
    flags = intel_fixture()["flags"] if cpu == "intel" else json_fixture(cpu)["flags"]
    assert [s.label for s in isa_settings.available_settings(flags)] == OFFERED[cpu]
    if cpu != "intel":
        assert list(json_fixture(cpu)["runs"]) == OFFERED[cpu]


@pytest.mark.parametrize(("cpu", "label"), CASES, ids=[f"{c}-{lb}" for c, lb in CASES])
def test_a_setting_counts_as_taken_when_its_cap_is_observed(cpu, label):
    problems = isa_settings.check_setting(setting(label), fixture_run(cpu, label), onednn=True)
    want = NOT_VERIFIED.get((cpu, label))
    if want:
        assert len(problems) == 1 and problems[0].startswith(want), problems
    else:
        assert problems == []


def test_vendor_prose_is_never_read():
    """oneDNN 3.12 calls the AVX512_CORE_FP16 cap "Intel AVX 10.1": a description plays no
    part, only the kernels that ran do."""
    run = fixture_run("amd-epyc-avx512-bf16-x2", "avx512_bf16")
    for info in (None, "Intel AVX 10.1", "with float16", "anything"):
        assert isa_settings.check_setting(setting("avx512_bf16"), {**run, "onednn_isa_info": info},
                                     onednn=True) == []


def test_a_cap_that_did_not_take_effect_is_named():
    intel_uncapped = {**intel_fixture()["runs"][None], "aten_cpu_capability": "AVX2"}
    (problem,) = isa_settings.check_setting(setting("avx2"), intel_uncapped, onednn=True)
    assert problem == "oneDNN ran jit:avx512_core (float32), above the avx2 cap"
    bf16 = fixture_run("amd-epyc-avx512-bf16-x2", "avx512_bf16")
    (problem,) = isa_settings.check_setting(setting("avx512"), bf16, onednn=True)
    assert problem == ("oneDNN ran jit_bf16:avx512_core_bf16 (bfloat16), above the "
                       "avx512_core cap")
    aten = {**fixture_run("amd-epyc-avx2-x2", "sse41"), "aten_cpu_capability": "AVX2"}
    assert isa_settings.check_setting(setting("sse41"), aten, onednn=True) == [
        "ATen reports 'AVX2', expected 'DEFAULT'"]
    # the Intel strings as taken: ATen was not capped then
    raw = intel_fixture()["runs"]["SSE41"]
    assert "ATen reports 'AVX512'" in isa_settings.check_setting(setting("sse41"), raw,
                                                            onednn=True)[0]


def test_without_onednn_only_aten_is_checked():
    run = {"aten_cpu_capability": "AVX2", "onednn_implementations": {}}
    assert isa_settings.check_setting(setting("avx2"), run, onednn=False) == []
    (problem,) = isa_settings.check_setting(setting("avx2"), run, onednn=True)
    assert problem.startswith("cannot verify the cap") and "highest: none" in problem


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
        by_dtype = fp["onednn_dtype_implementations"]
        assert ("bfloat16" in by_dtype) == bool(fp["mkldnn_bf16_supported"])
    line = machine.fingerprint_line(fp)
    assert f"x{fp['cores']}" in line and str(fp["aten_cpu_capability"]) in line


def test_fingerprint_leaves_verbose_off_and_prints_nothing(capfd):
    verbose_probes.onednn_probe.cache_clear()
    verbose_probes.mkl_probe.cache_clear()
    machine.fingerprint()
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    torch.nn.functional.conv2d(x, torch.randn(2, 2, 3, 3)).sum().backward()
    out = capfd.readouterr()
    assert "onednn_verbose" not in out.out and "MKL_VERBOSE" not in out.out


def test_a_fresh_process_under_the_lowest_setting_reports_it():
    """The caps take effect in a new process (and are checked as records.py checks them)."""
    sse = isa_settings.ISA_SETTINGS[-1]
    if not isa_settings.available_settings() or sse.label not in {
            s.label for s in isa_settings.available_settings()}:
        pytest.skip("this CPU has no SSE4.1")
    code = ("import json; from convlab.lab.method import machine as m, isa_settings as s; "
            "fp = m.fingerprint(); print(json.dumps([fp['aten_cpu_capability'], "
            "s.check_setting(s.ISA_SETTINGS[-1], fp)]))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **sse.env},
                         capture_output=True, text=True, check=True).stdout
    capability, problems = json.loads(out.strip().splitlines()[-1])
    assert isa_settings.aten_capability(capability) == "DEFAULT" and problems == []


def test_an_older_torch_name_of_the_default_capability_is_the_same_setting():
    """torch 2.4 reports ATen's default kernels as "NO AVX"; the setting still verifies."""
    sse = isa_settings.ISA_SETTINGS[-1]
    fp = {"aten_cpu_capability": "NO AVX", "onednn_implementations": {}}
    assert not any("ATen reports" in p for p in isa_settings.check_setting(sse, fp, False))
    fp["aten_cpu_capability"] = "AVX2"
    assert any("ATen reports" in p for p in isa_settings.check_setting(sse, fp, False))


def _sysfs(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    return root


@pytest.mark.parametrize(("caches", "sizes", "llc"), [
    # the Intel fixture's CPU: L2 4 MiB, L3 300 MiB
    ([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "4096K"),
      (3, "Unified", "307200K")],
     {"L1d": 48 * 2**10, "L1i": 32 * 2**10, "L2": 4 * 2**20, "L3": 300 * 2**20}, 300 * 2**20),
    # the AMD EPYC records' CPU: L3 32 MiB
    ([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
      (3, "Unified", "32768K")],
     {"L1d": 2**15, "L1i": 2**15, "L2": 2**20, "L3": 2**25}, 2**25),
    ([(1, "Data", "32K"), (2, "Unified", "2M")], {"L1d": 2**15, "L2": 2 * 2**20}, 2 * 2**20),
    ([], {}, None),
])
def test_cache_sizes_from_sysfs(tmp_path, caches, sizes, llc):
    root = _sysfs(tmp_path / "cache", caches)
    assert machine.cache_sizes(root) == sizes
    assert machine.last_level_cache(machine.cache_sizes(root)) == llc
    assert machine.cache_sizes(tmp_path / "missing") == {}


def _rec(model: str, caches: dict | None = None, isa: str = "avx2") -> records.Record:
    fp = {"cpu_model": model, "cores": 2, **({"caches": caches} if caches else {})}
    return records.Record(path=records.RECORDS_DIR / "x.json", isa=isa, env={}, created="",
                          quick=False, load={}, fingerprint=fp, sections={})


def test_two_hosts_of_one_model_get_two_short_names():
    """Without the cache in the name, their rows would merge in the chapters' tables."""
    amd = _rec("AMD EPYC")
    old = _rec("Intel(R) Xeon(R) Processor")
    new = _rec("Intel(R) Xeon(R) Processor", {"L2": 2**21, "L3": 480 * 2**20}, "amx")
    assert new.label == "Intel Xeon x2 (L3 480 MiB), AMX"
    assert old.label == "Intel Xeon x2, AVX2"
    assert notebook.short_machine_names([amd, old, new, old]) == {
        "AMD EPYC x2": "AMD", "Intel Xeon x2": "Intel",
        "Intel Xeon x2 (L3 480 MiB)": "Intel (L3 480 MiB)"}
    # one machine of a vendor: the vendor alone, however long its name
    zen4 = records.Record(path=records.RECORDS_DIR / "z.json", isa="avx2", env={}, created="",
                          quick=False, load={}, sections={}, fingerprint={
                              "cpu_model": "AMD EPYC", "cores": 2, "caches": {"L3": 2**25},
                              "cpu_family_model": "25-17"})
    assert notebook.short_machine_names([zen4, old, new])[zen4.machine_name] == "AMD"
    # two hosts no short form tells apart keep their whole names
    other = _rec("Intel(R) Core(TM) i7", {"L3": 480 * 2**20})
    assert notebook.short_machine_names([new, other]) == {
        "Intel Xeon x2 (L3 480 MiB)": "Intel Xeon x2 (L3 480 MiB)",
        "Intel Core i7 x2 (L3 480 MiB)": "Intel Core i7 x2 (L3 480 MiB)"}


FP = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "cores": 2, "caches": {"L3": 105 * 2**20},
      "cpu_family_model": "6-143", "aten_cpu_capability": "AVX512",
      "onednn_isa": "jit:avx512_core_amx", "torch_version": "2.13.0+cpu"}


def test_stamp_names_the_machine_within_its_width(monkeypatch):
    monkeypatch.setattr(machine, "fingerprint", lambda: dict(FP))
    text = machine.stamp(width=40)
    lines = text.splitlines()
    assert lines[0].startswith("this machine: ") and len(lines) > 1
    assert all(len(line) <= 40 for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(text.split()) == "this machine: " + machine.identity_line(FP)
    assert machine.stamp("cpu") == machine.stamp()


def test_stamp_names_the_gpu_for_a_cuda_device(monkeypatch):
    monkeypatch.setattr(machine, "fingerprint", lambda: dict(FP))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    text = " ".join(machine.stamp("cuda:0").split())
    assert text.endswith(f"; GPU NVIDIA H100, CUDA {torch.version.cuda}, cuDNN 91900")


@pytest.mark.parametrize(("width", "error"), [(19, ValueError), (0, ValueError),
                                              (40.0, TypeError), (True, TypeError),
                                              ("78", TypeError)])
def test_stamp_refuses_a_bad_width(width, error):
    with pytest.raises(error, match="width"):
        machine.stamp(width=width)
