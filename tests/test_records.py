"""convlab.lab.record.records: the schema of every committed record, the loader, the runner's
bookkeeping (sections run in a fresh process, errors kept per section, merges)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.cpu_fixtures import fixture_run, intel_fixture, setting

from convlab.lab.claims import gpu_runs
from convlab.lab.method import isa_settings, machine
from convlab.lab.record import record_schema, records, runner
from convlab.lab.sections import SECTIONS

COMMITTED = sorted(p for p in records.RECORDS_DIR.glob("*.json")
                   if not p.name.endswith(record_schema.MANIFEST_SUFFIX))


def _record(isa: str = "avx2", model: str = "AMD EPYC", cores: int = 2, **sections) -> dict:
    fp = {key: None for key in record_schema.FINGERPRINT_KEYS}
    fp.update(cpu_model=model, cores=cores, aten_cpu_capability="AVX2", threads=2,
              isa_flags=["avx2"], blas={}, torch_version="2.13.0+cpu", torch_build="cpu",
              python="3.12.0")
    return {"schema": 1, "isa": isa, "env": {}, "created": "2026-12-01T20:40:00Z",
            "quick": False, "load": {"before": [1.0, 2.0, 3.0], "after": [1.0, 2.0, 3.0]},
            "fingerprint": fp, "sections": sections or {"suite": {"x": 1}},
            "section_meta": {}}


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_every_committed_record_is_valid(path: Path):
    data = json.loads(path.read_text())
    assert record_schema.validate(data) == []
    rec = records.read_record(path)
    assert path.name == f"{rec.machine}__{rec.isa}.json"
    assert rec.fingerprint["aten_cpu_capability"] == next(
        s.aten for s in isa_settings.ISA_SETTINGS if s.label == rec.isa)
    env = next(s.env for s in isa_settings.ISA_SETTINGS if s.label == rec.isa)
    # records taken before settings capped MKL lack its variable, and say so
    assert rec.env in (env, {k: v for k, v in env.items() if k != "MKL_ENABLE_INSTRUCTIONS"})
    assert rec.mkl_capped is (rec.mkl_cap["changed"] if "MKL_ENABLE_INSTRUCTIONS" in rec.env
                              else False)
    for name, section in rec.sections.items():
        assert name in SECTIONS
        assert isinstance(section, dict)


def test_committed_records_cover_every_setting_of_their_machine():
    """Each offered setting has a record or, in the machine's manifest, a reason."""
    assert COMMITTED, f"no record in {records.RECORDS_DIR}: run `make records`"
    by_machine: dict[str, set[str]] = {}
    for rec in records.load_records():
        by_machine.setdefault(rec.machine, set()).add(rec.isa)
        flags = set(rec.fingerprint["isa_flags"])
        assert rec.isa in {s.label for s in isa_settings.available_settings(flags)}
    manifests = records.load_manifests()
    assert set(manifests) <= set(by_machine), "a manifest for a machine with no record"
    for slug, isas in by_machine.items():
        rec = next(r for r in records.load_records() if r.machine == slug)
        want = {s.label for s in isa_settings.available_settings(set(rec.fingerprint["isa_flags"]))}
        skipped = manifests.get(slug, {})
        assert not isas & set(skipped), f"{slug}: both a record and a skip reason"
        assert isas | set(skipped) == want, slug


def test_manifest_round_trip_and_validation(tmp_path):
    path = records.note_skipped("cpu-x2", "avx512_fp16", "cap  not\nobserved", tmp_path)
    assert path.name == "cpu-x2.manifest.json"
    records.note_skipped("cpu-x2", "amx", "no AMX kernel seen", tmp_path)
    assert records.load_manifests(tmp_path) == {"cpu-x2": {
        "amx": "no AMX kernel seen", "avx512_fp16": "cap not observed"}}
    assert list(records.read_manifest(path)) == ["amx", "avx512_fp16"]  # widest first
    (tmp_path / "cpu-x2__avx2.json").write_text(json.dumps(_record(model="CPU")))
    assert [r.isa for r in records.load_records(tmp_path)] == ["avx2"]  # not a record
    records.note_skipped("cpu-x2", "amx", None, tmp_path)
    records.note_skipped("cpu-x2", "avx512_fp16", None, tmp_path)
    assert not path.exists() and records.load_manifests(tmp_path) == {}


@pytest.mark.parametrize(("data", "problem"), [
    ([], "a manifest is a JSON object"),
    ({"schema": 1, "machine": "other", "skipped_settings": {}}, "machine must be"),
    ({"schema": 1, "machine": "m", "skipped_settings": []}, "must be an object"),
    ({"schema": 1, "machine": "m", "skipped_settings": {"avx9": "x"}}, "'avx9' is none"),
    ({"schema": 1, "machine": "m", "skipped_settings": {"amx": " "}}, "non-empty reason"),
    ({"schema": True, "machine": "m", "skipped_settings": {}}, "schema must be 1"),
    ({"schema": 1, "machine": "m", "skipped_settings": {}, "x": 1}, "unknown keys 'x'"),
])
def test_manifest_validation_names_the_problem(tmp_path, data, problem):
    path = tmp_path / "m.manifest.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"m.manifest.json: invalid manifest: .*{problem}"):
        records.read_manifest(path)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d.pop("fingerprint"), "missing key 'fingerprint'"),
    (lambda d: d.update(schema=2), "schema 2 is not 1"),
    (lambda d: d.update(isa="avx9"), "isa 'avx9'"),
    (lambda d: d.update(quick="no"), "'quick' must be bool"),
    (lambda d: d["load"].update(before=[1]), "load['before']"),
    (lambda d: d["fingerprint"].pop("onednn_isa"), "fingerprint lacks onednn_isa"),
    (lambda d: d.update(created="yesterday"), "not an ISO time"),
    (lambda d: d["sections"].update(suite=[1]), "section 'suite' must be an object"),
    (lambda d: d["fingerprint"].update(cores="2"), "fingerprint.cores must be int, got str"),
    (lambda d: d["fingerprint"].update(cores=True), "fingerprint.cores must be int, got bool"),
    (lambda d: d["fingerprint"].update(cpu_model=None), "fingerprint.cpu_model must be str"),
    (lambda d: d["fingerprint"].update(blas=[]), "fingerprint.blas must be dict, got list"),
    (lambda d: d["fingerprint"].update(cpu_family_model="Zen 4"),
     "fingerprint.cpu_family_model must be '<family>-<model>' or null"),
    (lambda d: d.update(section_meta=[]), "'section_meta' must be dict, got list"),
    (lambda d: d["section_meta"].update(suite=3), "section_meta['suite'] must be an object"),
    (lambda d: d["load"].update(after=[1.0, float("nan"), 2.0]),
     "record.load.after[1] is not a finite number"),
    (lambda d: d["sections"]["suite"].update(t=float("inf")),
     "record.sections.suite.t is not a finite number"),
    (lambda d: d["sections"].update(claims={"ch3_x": {"evidence": "e"}}),
     "sections.claims['ch3_x'] must be an object with a string status"),
    (lambda d: d["sections"].update(dpsgd={"runs": []}),
     "sections.dpsgd.runs must be a non-empty list"),
    (lambda d: d["sections"].update(dpsgd={"runs": [{"n": 8, "threads": "1", "steps": {}}]}),
     "sections.dpsgd.runs[0] must have int n and threads"),
    (lambda d: d["sections"].update(dpsgd={"runs": [{"n": 8, "threads": 1, "steps": {
        "BackPACK BatchGrad": {"median_s": 0.1}}}]}),
     "sections.dpsgd.runs[0].steps['BackPACK BatchGrad'] must have numbers"),
])
def test_validate_names_the_problem(change, problem):
    data = _record()
    change(data)
    assert any(problem in p for p in record_schema.validate(data)), record_schema.validate(data)
    assert record_schema.validate([]) == ["a record is a JSON object, got list"]


@pytest.mark.parametrize(("change", "key"), [
    (lambda d: d["fingerprint"].update(cores="2"), "fingerprint.cores"),
    (lambda d: d.update(section_meta=["suite"]), "'section_meta'"),
    (lambda d: d["load"].update(before=[float("nan")] * 3), "record.load.before[0]"),
])
def test_loader_names_file_and_key(tmp_path, change, key):
    data = _record()
    change(data)
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(data))  # json writes NaN as the token json.loads accepts
    with pytest.raises(ValueError, match="amd-epyc-x2__avx2.json: invalid record: "
                       f".*{re.escape(key)}"):
        records.read_record(path)


def test_a_record_without_claims_or_section_meta_still_loads(tmp_path):
    data = _record()
    del data["section_meta"]
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(data))
    rec = records.read_record(path)
    assert rec.section_meta == {} and "claims" not in rec.sections
    data["sections"]["claims"] = {"ch3_bf16_routes_mkldnn": {"status": "holds"}}
    path.write_text(json.dumps(data))
    assert records.read_record(path).section("claims")["ch3_bf16_routes_mkldnn"]["status"] \
        == "holds"


def test_loader_sorts_by_machine_then_widest_isa(tmp_path):
    for isa, model in [("sse41", "AMD EPYC"), ("avx512", "AMD EPYC"), ("avx2", "AMD EPYC"),
                       ("avx2", "Intel Xeon")]:
        rec = _record(isa, model)
        (tmp_path / f"{machine.machine_slug(model, 2)}__{isa}.json").write_text(json.dumps(rec))
    got = records.load_records(tmp_path)
    assert [(r.machine, r.isa) for r in got] == [
        ("amd-epyc-x2", "avx512"), ("amd-epyc-x2", "avx2"), ("amd-epyc-x2", "sse41"),
        ("intel-xeon-x2", "avx2")]
    assert got[0].label == "AMD EPYC x2, AVX-512" and got[2].isa_name == "SSE4.1"
    assert got[0].section("suite") == {"x": 1}
    with pytest.raises(KeyError, match="has no section 'peers'"):
        got[0].section("peers")
    assert records.load_records(tmp_path / "missing") == []
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: not JSON"):
        records.load_records(tmp_path)


def test_merge_keeps_sections_not_rerun():
    old = _record(suite={"a": 1}, roofline={"b": 2})
    old["section_meta"] = {"suite": {"quick": False}, "roofline": {"quick": True}}
    new = _record(suite={"a": 3})
    new["section_meta"] = {"suite": {"quick": False}}
    merged = runner.merge(old, new)
    assert merged["sections"] == {"suite": {"a": 3}, "roofline": {"b": 2}}
    assert merged["quick"] is True  # a kept section was quick
    assert runner.merge(None, new) is new


def test_a_record_of_another_cpu_is_not_merged_into(tmp_path):
    """Two CPUs behind one file name (a VM reporting "AMD EPYC" for an AVX2 and an AVX-512
    part): the old sections must not travel under the new fingerprint."""
    old = _record(suite={"a": 1}, roofline={"b": 2})
    new = _record(suite={"a": 3})
    new["fingerprint"]["isa_flags"] = [*old["fingerprint"]["isa_flags"], "avx512f"]
    with pytest.raises(ValueError, match="another CPU"):
        runner.merge(old, new)
    target = tmp_path / "amd-epyc-x2__avx2.json"
    target.write_text(json.dumps(old))
    path = runner._write_merged(target, old, "", new)
    assert path != target and json.loads(target.read_text()) == old
    assert json.loads(path.read_text())["sections"] == {"suite": {"a": 3}}


def test_attach_derived_puts_suite_paths_on_the_roofline():
    suite = {"method": {"threads": 2}, "layers": [{"layer": "dw", "times": {"mkldnn": {
        "backend": "Mkldnn", "flops": 100, "min_bytes": 50, "gflops": 10.0,
        "gbytes_s": 5.0}}}]}
    roof = {"peak_gflops": {"1": 50.0, "2": 100.0}, "triad_gbytes_s": {"1": 10.0, "2": 20.0}}
    rec = runner.attach_derived(_record(suite=suite, roofline=roof))
    (row,) = rec["sections"]["roofline"]["fractions"]
    assert row["flops_per_byte"] == 2.0 and row["bound_gflops"] == 40.0  # 2 FLOP/B x 20 GB/s
    assert row["bound_by"] == "memory" and row["of_bound"] == pytest.approx(0.25)
    assert row["of_peak"] == pytest.approx(0.1) and row["of_bandwidth"] == pytest.approx(0.25)


def test_parse_sections():
    assert runner.parse_sections("") == list(SECTIONS)
    assert runner.parse_sections("suite roofline,suite") == ["suite", "roofline"]
    with pytest.raises(ValueError, match="unknown 'nope'"):
        runner.parse_sections("nope")


def test_run_section_keeps_an_error_as_one_line(monkeypatch):
    monkeypatch.setitem(SECTIONS, "boom", "json:no_such_function")
    got = runner.run_section("boom", quick=True)
    assert set(got) == {"error"} and got["error"].startswith("AttributeError")
    monkeypatch.setattr(records, "_returns_a_list", lambda quick=False: [1], raising=False)
    monkeypatch.setitem(SECTIONS, "list", "convlab.lab.record.records:_returns_a_list")
    assert "returned list, not a dict" in runner.run_section("list", quick=True)["error"]


FAKE_SECTIONS = ("import os, torch\n"
                 "from convlab.lab.method import timing\n"
                 "def record(quick=False):\n"
                 "    return {'capability': torch.backends.cpu.get_cpu_capability(),\n"
                 "            'cap': os.environ.get('ONEDNN_MAX_CPU_ISA'),\n"
                 "            'clock': timing.default_clock(),\n"
                 "            'quick': quick, 'nan': float('nan')}\n"
                 "def fails(quick=False):\n"
                 "    raise RuntimeError('broken\\nsecond line')\n")
# every process of a run (parent and children) swaps in the stand-in sections
SWAP_SECTIONS = ("from convlab.lab.sections import SECTIONS\n"
                 "SECTIONS.clear()\n"
                 "SECTIONS.update(fake='fake_section:record', "
                 "bad='fake_section:fails')\n")
# ... and, with a CPU fixture, sees that CPU: its flags, and per cap the fingerprint a
# process under it reports (this machine's fingerprint with the fixture's ATen/oneDNN part)
SWAP_CPU = ("import json, os\n"
            "from convlab.lab.method import machine\n"
            "_cpu = json.load(open(os.environ['CONVLAB_TEST_CPU']))\n"
            "_real = machine.fingerprint\n"
            "machine.cpu_flags = lambda: set(_cpu['flags'])\n"
            "machine.cpu_model = lambda: _cpu['model']\n"
            "machine.cache_sizes = lambda *a: dict(_cpu.get('caches', {}))\n"
            "machine.cpu_family_model = lambda: _cpu.get('family_model')\n"
            "def _fingerprint():\n"
            "    fp = dict(_real())\n"
            "    fp.update(_cpu['runs'][os.environ['ONEDNN_MAX_CPU_ISA']])\n"
            "    fp.update(cpu_model=_cpu['model'], isa_flags=sorted(_cpu['flags']),\n"
            "              cpu_family_model=_cpu.get('family_model'))\n"
            "    return fp\n"
            "machine.fingerprint = _fingerprint\n")


def _run(tmp_path: Path, *args: str, cpu: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m convlab.lab.record.runner --quick --dir tmp/out ARGS`` with stand-in sections."""
    (tmp_path / "fake_section.py").write_text(FAKE_SECTIONS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    custom = SWAP_SECTIONS
    if cpu is not None:
        (tmp_path / "cpu.json").write_text(json.dumps(cpu))
        env["CONVLAB_TEST_CPU"] = str(tmp_path / "cpu.json")
        custom += SWAP_CPU
    (tmp_path / "sitecustomize.py").write_text(custom)
    argv = ["--quick", "--dir", str(tmp_path / "out"), *args]
    code = f"import sys; from convlab.lab.record import runner; sys.exit(runner.main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False, timeout=300)


def test_runner_writes_a_checked_record_or_a_reason_per_setting(tmp_path):
    """End to end on this CPU, in fresh processes, with stand-in sections (no timing).

    Whatever this CPU is, each setting it offers ends as a record whose caps were observed
    or as a reason in the machine's manifest; neither is an error."""
    settings = isa_settings.available_settings()
    if not settings:
        pytest.skip("no ISA setting on this CPU")
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    got = {r.isa: r for r in records.load_records(tmp_path / "out")}
    skipped = records.load_manifests(tmp_path / "out").get(machine.machine_slug(), {})
    assert got, "no setting could be verified on this CPU"
    for isa in settings:
        assert (isa.label in got) != (isa.label in skipped), isa.label
        if isa.label in skipped:
            assert "cannot verify" in skipped[isa.label] or "above" in skipped[
                isa.label] or "ATen reports" in skipped[isa.label]
            continue
        rec = got[isa.label]
        assert rec.env == isa.env and rec.quick is True
        # torch 2.4 reports ATen's default kernels as "NO AVX"
        assert isa_settings.aten_capability(rec.sections["fake"]["capability"]) == isa.aten
        assert rec.clock == rec.section_clock("fake") == rec.sections["fake"]["clock"] == "wall"
        assert rec.sections["fake"]["nan"] is None  # NaN stored as null
        assert rec.sections["bad"] == {"error": "RuntimeError: broken"}
        assert isa_settings.check_setting(isa, rec.fingerprint) == []
        assert rec.mkl_cap["env"] == isa.mkl and rec.mkl_capped in (True, False, None)


def _intel_cpu() -> dict:
    runs = {s.onednn: {**fixture_run("intel", s.label), "blas": {
        "mkl_version": "2024.2", "mkl_path": f"fixture path under {s.onednn}"}}
        for s in isa_settings.ISA_SETTINGS}
    return {"model": "Intel(R) Xeon(R) Processor", "flags": sorted(intel_fixture()["flags"]),
            "runs": runs}


def test_runner_on_the_intel_fixture_skips_the_caps_it_cannot_verify(tmp_path):
    result = _run(tmp_path, cpu=_intel_cpu())
    assert result.returncode == 0, result.stdout[-3000:]
    out = tmp_path / "out"
    assert [r.isa for r in records.load_records(out)] == ["avx512", "avx2", "sse41"]
    (slug, skipped), = records.load_manifests(out).items()
    assert slug.startswith("intel-xeon-processor-x")
    assert list(skipped) == ["amx", "avx512_fp16", "avx512_bf16"]
    assert skipped["amx"].startswith("cannot verify the cap: no oneDNN kernel at "
                                     "avx512_core_amx was seen (highest: jit:avx512_core)")
    for rec in records.load_records(out):
        assert rec.sections["fake"]["cap"] == rec.env["ONEDNN_MAX_CPU_ISA"]
        # the fixture's MKL announces a path per cap, unlike this process's MKL
        assert rec.mkl_cap["env"] == setting(rec.isa).mkl and rec.mkl_capped is True
        assert rec.mkl_cap["path"] == f"fixture path under {rec.env['ONEDNN_MAX_CPU_ISA']}"
    # a later run that verifies a setting clears its reason; a rerun merges
    cpu = _intel_cpu()
    cpu["runs"]["AVX512_CORE_AMX"]["onednn_dtype_implementations"] = {
        "bfloat16": {"forward_training": "brg_conv_fwd:avx512_core_amx"}}
    result = _run(tmp_path, "--isa", "amx,avx2", cpu=cpu)
    assert result.returncode == 0, result.stdout[-3000:]
    assert [r.isa for r in records.load_records(out)] == ["amx", "avx512", "avx2", "sse41"]
    assert list(records.load_manifests(out)[slug]) == ["avx512_fp16", "avx512_bf16"]


def test_runner_keeps_a_bad_old_record_and_the_new_measurement(tmp_path):
    """The old file is validated before the child measures; if it cannot take the merge,
    the new record goes beside it and the other settings still run."""
    cpu = {"model": "AMD EPYC", "flags": ["sse4_1", "sse4_2", "avx2", "fma"], "runs": {
        s.onednn: fixture_run("amd-epyc-avx2-x2", s.label) for s in isa_settings.ISA_SETTINGS
        if s.label in ("avx2", "sse41")}}
    out = tmp_path / "out"
    out.mkdir()
    slug = f"amd-epyc-x{os.cpu_count()}"
    bad = _record("avx2", "AMD EPYC", os.cpu_count())
    bad["fingerprint"]["cores"] = "two"
    target = out / f"{slug}__avx2.json"
    target.write_text(json.dumps(bad))
    before = target.read_text()
    result = _run(tmp_path, cpu=cpu)
    assert result.returncode == 1, result.stdout[-3000:]
    text = result.stdout
    assert text.index("will not merge into") < text.index("records [avx2] fake ...")
    assert "fingerprint.cores must be int" in text
    assert target.read_text() == before  # the old file untouched
    (beside,) = out.glob(f"{slug}__avx2.json.*.new")
    new = record_schema.validate(json.loads(beside.read_text()))
    assert new == [] and json.loads(beside.read_text())["sections"]["fake"]["cap"] == "AVX2"
    assert (out / f"{slug}__sse41.json").exists()  # the next setting still ran


def test_a_failing_merge_writes_the_new_record_beside(tmp_path, monkeypatch):
    target = tmp_path / "amd-epyc-x2__avx2.json"
    old = _record(suite={"a": 1})
    target.write_text(json.dumps(old))
    new = _record(suite={"a": 2})

    def broken(old, new):
        raise KeyError("sections")

    monkeypatch.setattr(runner, "merge", broken)
    path = runner._write_merged(target, old, "", new)
    assert path != target and path.name.startswith(target.name) and path.suffix == ".new"
    assert json.loads(path.read_text())["sections"]["suite"] == {"a": 2}
    assert json.loads(target.read_text()) == old
    with pytest.raises(ValueError, match=re.escape(path.name)):  # not silently unread
        records.load_records(tmp_path)
    path.unlink()
    assert records.load_records(tmp_path)[0].sections["suite"] == {"a": 1}
    monkeypatch.undo()
    assert runner._write_merged(target, old, "", new) == target
    assert json.loads(target.read_text())["sections"]["suite"] == {"a": 2}


def test_records_travel_with_an_installed_package(tmp_path):
    """Colab installs a wheel, with no checkout: the wheel holds the committed records and
    the stored GPU runs, and ``RECORDS_DIR`` and ``gpu_runs.GPU_DIR`` find them there (a
    copy of the tree is built, the repository is left alone; the installed copy is
    imported from another folder)."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[1]
    package = Path(records.__file__).resolve().parents[3]
    if package != root:  # the tests run against an installed convlab (as `make compat` does)
        assert records.RECORDS_DIR.is_relative_to(package)
        assert records.load_records() and not (root / "convlab").exists()
        return
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "build")
    shutil.copytree(root / "convlab", src / "convlab", symlinks=True, ignore=ignore)
    shutil.copytree(records.RECORDS_DIR, src / "book" / "data" / "records")
    shutil.copytree(gpu_runs.GPU_DIR, src / "book" / "data" / "gpu")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w",
                    str(tmp_path / "wheel")], check=True, timeout=120, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("convlab-*.whl")
    names = {Path(n).name for n in zipfile.ZipFile(wheel).namelist()
             if n.startswith("convlab/lab/data/records/")}
    committed = {p.name for p in records.RECORDS_DIR.glob("*.json")}
    assert committed and names == committed
    gpu = {Path(n).name for n in zipfile.ZipFile(wheel).namelist()
           if n.startswith("convlab/lab/data/gpu/")}
    assert gpu and gpu == {p.name for p in gpu_runs.GPU_DIR.glob("*.json")}
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=120, capture_output=True)
    code = ("import json, convlab; from convlab.lab.record import records; "
            "from convlab.lab.claims import gpu_runs; "
            "print(json.dumps([convlab.__file__, str(records.RECORDS_DIR), "
            "[r.path.name for r in records.load_records()], "
            "sorted(records.load_manifests()), "
            "[r['gpu'] for r in gpu_runs.load_runs()]]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(site)})
    module, folder, loaded, manifests, gpus = json.loads(out.stdout.strip().splitlines()[-1])
    assert gpus == [r["gpu"] for r in gpu_runs.load_runs()]
    assert Path(module).is_relative_to(site) and Path(folder).is_relative_to(site)
    assert set(loaded) == {p.name for p in COMMITTED}
    assert manifests == sorted(p.name.removesuffix(record_schema.MANIFEST_SUFFIX)
                               for p in records.RECORDS_DIR.glob("*.manifest.json"))


def test_records_store_claim_outcomes_as_a_section(tmp_path):
    """The runner's ``claims`` section is the claims registry's payload; a record that has
    it feeds the claims x records matrix, one without it shows "-"."""
    import importlib
    import inspect

    from convlab.lab import claims
    from convlab.lab.claims import core

    module, _, name = SECTIONS["claims"].partition(":")
    fn = getattr(importlib.import_module(module), name)
    assert fn is claims.record_outcomes and "quick" in inspect.signature(fn).parameters
    some = claims.CLAIMS[0]
    stored = {some.id: {"status": core.HOLDS, "evidence": "e", "detail": {}}}
    for isa, payload in (("avx2", stored), ("sse41", None)):
        data = _record(isa, **({"claims": payload} if payload else {}))
        (tmp_path / f"amd-epyc-x2__{isa}.json").write_text(json.dumps(data))
    got = records.load_records(tmp_path)
    headers, rows = claims.matrix(got, some.chapter)
    row = next(r for r in rows if r[0] == some.id)
    assert len(headers) == 3 and row[1:] == ["yes", "-"]  # avx2 stored it, sse41 has none


@pytest.mark.parametrize(("llc", "available", "elements", "over", "capped"), [
    (300 * 2**20, 64 * 2**30, 300 * 2**20, 4.0, False),  # Intel: 1200 MiB arrays
    (2**25, 64 * 2**30, 2**25, 4.0, False),  # AMD EPYC, 32 MiB L3: 128 MiB arrays
    (2**20, 64 * 2**30, 2**24, 64.0, False),  # a small cache: the 64 MiB floor
    (300 * 2**20, 3 * 2**30, 2**27, 1.71, True),  # not enough memory: the record says so
    (None, None, 2**24, None, False),  # no sysfs: the floor
])
def test_stream_arrays_are_four_times_the_last_level_cache(llc, available, elements, over,
                                                          capped):
    from convlab.lab.sections import roofline

    got, sizing = roofline.stream_elements(2**24, llc, 4, available)
    assert got == elements
    assert sizing == {"llc_bytes": llc, "array_over_llc": over, "capped_by_memory": capped}
    assert roofline.stream_elements(2**23, llc, 0, None)[0] == 2**23  # quick: not sized
    assert roofline.FULL["llc_multiple"] == 4


def test_mkl_cap_says_whether_mkl_took_the_cap():
    avx2 = setting("avx2")
    fp = {"blas": {"mkl_path": "Intel(R) AVX2 enabled processors"}}
    assert isa_settings.mkl_cap(avx2, fp, "Intel(R) AVX-512 ...") == {
        "env": "AVX2", "path": "Intel(R) AVX2 enabled processors",
        "default_path": "Intel(R) AVX-512 ...", "changed": True}
    generic = {"blas": {"mkl_path": "Intel(R) Architecture processors"}}  # MKL on AMD
    same = isa_settings.mkl_cap(avx2, generic, "Intel(R) Architecture processors")
    assert same["changed"] is False
    assert isa_settings.mkl_cap(avx2, {"blas": {}}, None)["changed"] is None  # no MKL
    data = _record()
    data["mkl_cap"] = {"env": "AVX2", "path": None}
    assert any("'mkl_cap' must be an object" in p for p in record_schema.validate(data))


def test_runner_times_on_the_cpu_clock_when_asked(tmp_path):
    """``--clock cpu``: the children's sections see it, the record and each section say it."""
    settings = isa_settings.available_settings()
    if not settings:
        pytest.skip("no ISA setting on this CPU")
    result = _run(tmp_path, "--clock", "cpu", "--isa", settings[-1].label)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "cpu clock" in result.stdout
    for rec in records.load_records(tmp_path / "out"):
        assert rec.clock == "cpu" and rec.sections["fake"]["clock"] == "cpu"
        assert rec.section_clock("fake") == rec.section_clock("bad") == "cpu"
    bad = _run(tmp_path, "--clock", "sundial")
    assert bad.returncode == 2 and "invalid choice: 'sundial'" in bad.stdout


def test_old_records_time_on_the_wall_clock_and_clocks_are_checked(tmp_path):
    data = _record()
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(data))
    rec = records.read_record(path)
    assert rec.clock == "wall" and rec.section_clock("suite") == "wall"
    data.update(clock="sundial")
    data["section_meta"]["suite"] = {"clock": "gpu"}
    problems = record_schema.validate(data)
    assert any("clock must be one of wall, cpu, got 'sundial'" in p for p in problems)
    assert any("section_meta['suite'].clock" in p for p in problems)


def test_no_roofline_fractions_for_a_cpu_time_suite():
    from convlab.lab.sections import roofline

    suite = {"method": {"threads": 2, "clock": "cpu"}, "layers": []}
    with pytest.raises(ValueError, match="suite: timed on the 'cpu' clock"):
        roofline.fractions(suite, {"peak_gflops": {"1": 1.0}, "triad_gbytes_s": {"1": 1.0}})
    record = {"sections": {"suite": suite, "roofline": {"peak_gflops": {}}}}
    assert "fractions" not in runner.attach_derived(record)["sections"]["roofline"]


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    """Not UnicodeDecodeError from deep in the reader: ValueError with the file's name."""
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_bytes(b'{"schema": 1, "isa": "avx2\xff\xfe"}')
    with pytest.raises(ValueError, match=r"amd-epyc-x2__avx2\.json: not UTF-8"):
        records.read_record(path)
    with pytest.raises(ValueError, match=r"amd-epyc-x2__avx2\.json: not UTF-8"):
        records.load_records(tmp_path)
    with pytest.raises(ValueError, match=r"amd-epyc-x2__avx2\.json: not UTF-8"):
        record_schema.load_checked(path, lambda data: [])


@pytest.mark.parametrize("key", ["LLC", "L", "l2", "L2x", "Ld", "L0", "3"])
def test_a_cache_name_the_loader_cannot_read_is_refused_naming_file_and_key(tmp_path, key):
    """``last_level`` reads the level from the name (``L3`` -> 3): ``LLC`` must not pass
    the schema and then fail in ``int('LC')`` inside ``load_records``."""
    rec = _record()
    rec["fingerprint"]["caches"] = {"L1d": 32768, key: 2**20}
    assert any(f"fingerprint.caches[{key!r}]" in p for p in record_schema.validate(rec))
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=rf"amd-epyc-x2__avx2\.json: .*caches\[{key!r}\]"):
        records.load_records(tmp_path)
    rec["fingerprint"]["caches"] = {"L1d": 32768, "L1i": 32768, "L2": 2**20, "L3": 2**25}
    assert record_schema.validate(rec) == []


def test_a_record_left_beside_is_an_error_not_silently_unread(tmp_path):
    """A record the runner could not merge goes to ``<record>.json.<time>.new``; the
    loader refuses the folder, naming that file, until someone resolves it."""
    (tmp_path / "amd-epyc-x2__avx2.json").write_text(json.dumps(_record()))
    beside = tmp_path / "amd-epyc-x2__avx2.json.20261201T204000Z.new"
    beside.write_text(json.dumps(_record()))
    with pytest.raises(ValueError, match=re.escape(beside.name)):
        records.load_records(tmp_path)
    beside.unlink()
    assert len(records.load_records(tmp_path)) == 1


# A timed section (registered as "suite", a name the runner repeats) whose ratio differs
# from one process to the next: the process id picks it.
TIMED_SECTION = ("import os\n"
                 "def record(quick=False):\n"
                 "    r = 1.0 + (os.getpid() % 7) / 10\n"
                 "    return {'aa_band': 0.05, 'layers': [{'layer': 'tiny', 'slow_over_onednn':\n"
                 "            {'median': r, 'verdict': 'within noise'}}]}\n")
SWAP_TIMED = ("from convlab.lab.sections import SECTIONS\n"
              "SECTIONS.clear()\n"
              "SECTIONS.update(suite='timed_section:record', fake='fake_section:record')\n")


def test_runner_repeats_timed_sections_in_fresh_processes(tmp_path):
    """``--processes 3``: the timed section runs in three processes (their headline
    numbers and spread stored), the untimed one in the first only; every section stores
    its method and the machine's load."""
    settings = isa_settings.available_settings()
    if not settings:
        pytest.skip("no ISA setting on this CPU")
    (tmp_path / "timed_section.py").write_text(TIMED_SECTION)
    (tmp_path / "fake_section.py").write_text(FAKE_SECTIONS)
    (tmp_path / "sitecustomize.py").write_text(SWAP_TIMED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = ["--quick", "--dir", str(tmp_path / "out"), "--isa", settings[-1].label,
            "--processes", "3"]
    code = f"import sys; from convlab.lab.record import runner; sys.exit(runner.main({argv!r}))"
    result = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "fresh process 3 of 3 (suite)" in result.stdout
    (rec,) = records.load_records(tmp_path / "out")
    meta = rec.section_meta["suite"]
    heads = [p["headline"] for p in meta["processes"]]
    assert len(heads) == 3 and all(set(h) == {"layers[tiny]/slow_over_onednn"} for h in heads)
    assert heads[0]["layers[tiny]/slow_over_onednn"] == rec.sections["suite"]["layers"][0][
        "slow_over_onednn"]["median"]  # the first process is the one stored in full
    values = [h["layers[tiny]/slow_over_onednn"] for h in heads]
    spread = rec.section_spread("suite")
    assert spread["ratio"]["processes"] == 3 and spread["rate"]["median"] is None
    assert spread["ratio"]["max"] == pytest.approx(max(values) / min(values) - 1)
    assert "processes" not in rec.section_meta["fake"] and rec.section_spread("fake") is None
    for name in ("suite", "fake"):
        assert rec.section_method(name) == runner.METHOD
        assert isinstance(rec.section_load(name)["quiet"], bool)


def test_processes_must_be_positive(capsys):
    assert runner.main(["--processes", "0"]) == 2
    assert "processes must be at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="processes"):
        runner.run_all(["suite"], True, processes=0)


def test_add_replicates_skips_a_section_that_raised_in_any_process():
    def rec(ratio, error=False):
        section = {"error": "RuntimeError: x"} if error else {
            "rows": [{"layer": "a", "r": {"median": ratio, "verdict": "slower"}}]}
        return {"sections": {"suite": section, "numerics": {"ok": 1}},
                "section_meta": {"suite": {"seconds": 1.0, "load": None},
                                 "numerics": {"seconds": 1.0}}}

    first = runner.add_replicates(rec(1.0), [rec(1.5), rec(1.2)])
    assert first["section_meta"]["suite"]["process_spread"]["ratio"]["max"] == \
        pytest.approx(0.5)
    assert "processes" not in first["section_meta"]["numerics"]  # not a timed section
    assert "processes" not in runner.add_replicates(rec(1.0), [rec(1.5, error=True)])[
        "section_meta"]["suite"]
    assert "processes" not in runner.add_replicates(rec(1.0), [])["section_meta"]["suite"]


@pytest.mark.parametrize(("meta", "problem"), [
    ({"method": 0}, "method must be a positive int"),
    ({"method": "2"}, "method must be a positive int"),
    ({"load": {"steal": 0.1}}, "'quiet'"),
    ({"process_spread": {"ratio": {}}}, "'ratio' and 'rate'"),
])
def test_section_meta_fields_are_checked(meta, problem):
    data = _record()
    data["section_meta"] = {"suite": meta}
    assert any(problem in p for p in record_schema.validate(data))


def test_an_old_section_reads_as_the_earlier_method(tmp_path):
    path = tmp_path / "amd-epyc-x2__avx2.json"
    path.write_text(json.dumps(_record()))
    rec = records.read_record(path)
    assert rec.section_method("suite") == 1
    assert rec.section_load("suite") is None and rec.section_spread("suite") is None
