"""Measurement records: one JSON file per machine and instruction set, and the command that
writes them (``make records``, i.e. ``python -m convlab.lab.records``).

For each ISA setting this CPU can offer (:func:`convlab.lab.isa_settings.available_settings`:
capping downwards only, e.g. avx2 and sse41 on an AVX2 CPU; avx512, avx2 and sse41 on an
AVX-512 one, plus avx512_bf16/avx512_fp16/amx where the CPU has them) the command starts a
fresh Python process with ``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY`` and
``MKL_ENABLE_INSTRUCTIONS`` set, checks in it that the caps took effect (ATen's reported
capability and the instruction sets of the oneDNN kernels that ran;
:func:`convlab.lab.isa_settings.check_setting`), runs every section of ``SECTIONS``
and writes ``book/data/records/<machine-slug>__<isa>.json``. Records of other machines in
that folder are left alone, so a record from another machine is added by running the same
command there. A section that raises is stored as ``{"error": "..."}``.

The record and manifest formats (schema 1) are in :mod:`convlab.lab.record_schema`;
``--clock cpu`` times process CPU time for a busy machine (never the roofline). A setting
the runner offers but could not verify (its cap was not observed to take effect) is not
measured; the runner writes why into that machine's manifest,
``<machine-slug>.manifest.json``, so a record set says why a setting is absent
(:func:`load_manifests`).

The chapters read them with :func:`load_records` (``r.label``: ``AMD EPYC x2, AVX2``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convlab.lab import isa_settings, machine, record_schema, timing

# name -> "module:function"; each function is record(quick: bool = False) -> dict.
SECTIONS: dict[str, str] = {
    "suite": "convlab.lab.suite:record",
    "roofline": "convlab.lab.roofline:record",
    "peers": "convlab.lab.peers:record",
    # the from-scratch backward, simple and fast (optional in older records)
    "reference_speed": "convlab.lab.reference_speed:record",
    "per_sample": "convlab.lab.per_sample_timing:record",
    "per_sample_auto": "convlab.lab.per_sample_auto:record",
    "dpsgd": "convlab.lab.dpsgd:record",
    "numerics": "convlab.lab.numerics:record",
    # optional in older records: the book's claims checked here; oneDNN's implementation
    # per suite layer and pass; the bfloat16/float16 oneDNN backward against float32
    "claims": "convlab.lab.claims:record_outcomes",
    "impls": "convlab.lab.impls:record",
    "lowp": "convlab.lab.lowp:record",
    # optional: convlab's reference and per-sample routes in those dtypes
    "lowp_ours": "convlab.lab.lowp_ours:record",
}
# In a checkout convlab/lab/data/records links to book/data/records; an installed package
# (a wheel, as on Colab) holds a copy of those files there (pyproject's package data).
RECORDS_DIR = (Path(__file__).parent / "data" / "records").resolve()
NEW_SUFFIX = ".new"  # a record written beside the one it could not merge into (run_all)
ISA_NAMES: dict[str, str] = {
    "amx": "AMX", "avx512_fp16": "AVX-512-FP16", "avx512_bf16": "AVX-512-BF16",
    "avx512": "AVX-512", "avx2": "AVX2", "sse41": "SSE4.1",
}
@dataclass(frozen=True)
class Record:
    """One record file: the measurements of one machine under one ISA setting."""

    path: Path
    isa: str
    env: Mapping[str, str]
    created: str
    quick: bool
    load: Mapping[str, Any]
    fingerprint: Mapping[str, Any]
    sections: Mapping[str, Any]
    section_meta: Mapping[str, Any] = field(default_factory=dict)
    mkl_cap: Mapping[str, Any] | None = None
    clock: str = "wall"

    def section_clock(self, name: str) -> str:
        """The clock section ``name`` was timed on (``wall`` where the record says none)."""
        return str(self.section_meta.get(name, {}).get("clock", "wall"))

    @property
    def mkl_capped(self) -> bool | None:
        """True where this setting capped MKL too (MKL's announced path changed under
        ``MKL_ENABLE_INSTRUCTIONS``); False where it did not or the record's run did not
        set the variable; None where there is no MKL."""
        if "MKL_ENABLE_INSTRUCTIONS" not in self.env:
            return False
        return None if self.mkl_cap is None else self.mkl_cap.get("changed")

    @property
    def machine(self) -> str:
        """The machine slug (the file name's first part)."""
        return machine.slug_of(self.fingerprint)

    @property
    def isa_name(self) -> str:
        """The ISA as the text writes it, e.g. ``AVX-512``."""
        return ISA_NAMES.get(self.isa, self.isa)

    @property
    def machine_name(self) -> str:
        """E.g. ``AMD EPYC x2`` (:func:`convlab.lab.machine.display_name`)."""
        return machine.display_name(self.fingerprint)

    @property
    def label(self) -> str:
        """E.g. ``AMD EPYC x2, AVX2``."""
        return f"{self.machine_name}, {self.isa_name}"

    def section(self, name: str) -> Any:
        """The data of section ``name`` (``KeyError`` naming the record if absent)."""
        if name not in self.sections:
            raise KeyError(f"record {self.path.name} has no section {name!r} "
                           f"(it has: {', '.join(self.sections) or 'none'})")
        return self.sections[name]


def read_record(path: str | os.PathLike[str]) -> Record:
    """One record file (``ValueError`` naming the file and the problems if invalid)."""
    path = Path(path)
    data = record_schema.read_json(path)
    problems = record_schema.validate(data)
    if problems:
        raise ValueError(f"{path}: invalid record: {'; '.join(problems)}")
    return Record(path=path, isa=data["isa"], env=data["env"], created=data["created"],
                  quick=data["quick"], load=data["load"], fingerprint=data["fingerprint"],
                  sections=data["sections"], section_meta=data.get("section_meta", {}),
                  mkl_cap=data.get("mkl_cap"), clock=data.get("clock", "wall"))


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _isa_rank(isa: str) -> int:
    order = isa_settings.ISA_ORDER
    return order.index(isa) if isa in order else len(order)


def load_records(directory: str | os.PathLike[str] | None = None) -> list[Record]:
    """Every ``*.json`` record in ``directory`` (default: ``book/data/records``), sorted by
    machine, then ISA from widest to narrowest. A missing folder gives an empty list.
    ValueError naming them where the folder holds records :func:`run_all` wrote beside
    one it could not merge into (``*.json.<time>.new``): resolved, not left unread."""
    folder = RECORDS_DIR if directory is None else Path(directory)
    if not folder.is_dir():
        return []
    beside = sorted(p.name for p in folder.glob(f"*.json.*{NEW_SUFFIX}"))
    if beside:
        raise ValueError(f"{folder}: records not merged (the runner said why): "
                         f"{', '.join(beside)}; move each to its own name or delete it")
    records = [read_record(p) for p in sorted(folder.glob("*.json"))
               if not p.name.endswith(record_schema.MANIFEST_SUFFIX)]
    return sorted(records, key=lambda r: (r.machine, _isa_rank(r.isa), r.path.name))


def manifest_path(slug: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where the manifest of machine ``slug`` lives (``<slug>.manifest.json``)."""
    folder = RECORDS_DIR if directory is None else Path(directory)
    return folder / f"{slug}{record_schema.MANIFEST_SUFFIX}"


def read_manifest(path: str | os.PathLike[str]) -> dict[str, str]:
    """A manifest's skipped settings, ``{isa: reason}`` (``ValueError`` naming the file)."""
    path = Path(path)
    data = record_schema.read_json(path, parse_constant=_refuse_constant)
    slug = path.name.removesuffix(record_schema.MANIFEST_SUFFIX)
    problems = record_schema.validate_manifest(data, slug)
    if problems:
        raise ValueError(f"{path}: invalid manifest: {'; '.join(problems)}")
    return dict(data["skipped_settings"])


def load_manifests(directory: str | os.PathLike[str] | None = None) -> dict[str, dict[str, str]]:
    """Every machine's skipped settings: ``{machine slug: {isa: reason}}``."""
    folder = RECORDS_DIR if directory is None else Path(directory)
    if not folder.is_dir():
        return {}
    return {p.name.removesuffix(record_schema.MANIFEST_SUFFIX): read_manifest(p)
            for p in sorted(folder.glob(f"*{record_schema.MANIFEST_SUFFIX}"))}


def note_skipped(slug: str, label: str, reason: str | None,
                 directory: str | os.PathLike[str] | None = None) -> Path:
    """Record (``reason``) or clear (``None``) why machine ``slug`` has no ``label`` record.

    The manifest is removed when no setting is skipped any more."""
    path = manifest_path(slug, directory)
    skipped = read_manifest(path) if path.exists() else {}
    if reason is None:
        skipped.pop(label, None)
    else:
        skipped[label] = " ".join(reason.split())
    if skipped:
        ordered = {k: skipped[k] for k in sorted(skipped, key=_isa_rank)}
        data = {"schema": record_schema.SCHEMA, "machine": slug, "skipped_settings": ordered}
        path.write_text(json.dumps(data, indent=1) + "\n")
    elif path.exists():
        path.unlink()
    return path


def record_path(isa: str, directory: str | os.PathLike[str] | None = None,
                slug: str | None = None) -> Path:
    """Where this machine's record for ``isa`` lives."""
    folder = RECORDS_DIR if directory is None else Path(directory)
    return folder / f"{slug or machine.machine_slug()}__{isa}.json"


# ------------------------------------------------------------------------------- running


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _clean(value: Any) -> Any:
    """JSON without NaN/inf (stored as null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def run_section(name: str, quick: bool) -> dict[str, Any]:
    """Import and run one section (in this process); an exception becomes ``{"error": ...}``."""
    module_name, _, function = SECTIONS[name].partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), function)
        data = fn(quick=quick)
        if not isinstance(data, dict):
            raise TypeError(f"{SECTIONS[name]} returned {type(data).__name__}, not a dict")
        json.dumps(_clean(data), allow_nan=False)
        return data
    except Exception as err:  # noqa: BLE001 - one failing section must not lose the others
        first = (str(err).strip().splitlines() or [""])[0]
        return {"error": f"{type(err).__name__}: {first}"[:300]}


def child(label: str, sections: Sequence[str], quick: bool, out: Path) -> int:
    """The fresh process of one ISA setting: check the cap, run the sections, write ``out``."""
    setting = next(s for s in isa_settings.ISA_SETTINGS if s.label == label)
    load_before = _load()
    fp = machine.fingerprint()
    problems = isa_settings.check_setting(setting, fp)
    if problems:
        reason = f"{'; '.join(problems)} [{machine.fingerprint_line(fp)}]"
        print(f"records: skipping {label}: {reason}", file=sys.stderr, flush=True)
        out.write_text(json.dumps({"skipped": reason}) + "\n")
        return SKIPPED
    print(f"records [{label}] {machine.fingerprint_line(fp)}", file=sys.stderr, flush=True)
    clock = timing.default_clock()
    data: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for name in sections:
        start = time.perf_counter()
        print(f"records [{label}] {name} ...", file=sys.stderr, flush=True)
        data[name] = run_section(name, quick)
        seconds = round(time.perf_counter() - start, 1)
        meta[name] = {"created": _now(), "seconds": seconds, "quick": quick,
                      "clock": "wall" if name == "roofline" else clock}
        status = data[name].get("error", "ok")
        print(f"records [{label}] {name}: {status} ({seconds} s)", file=sys.stderr, flush=True)
    record = {
        "schema": record_schema.SCHEMA, "isa": label, "env": setting.env, "created": _now(),
        "quick": quick,
        "load": {"before": load_before, "after": _load()}, "fingerprint": fp,
        "sections": data, "section_meta": meta, "clock": clock,
    }
    out.write_text(json.dumps(_clean(record), indent=1, allow_nan=False) + "\n")
    return 0


def merge(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` plus the sections of ``old`` that ``new`` did not rerun (same machine and ISA).

    The load and fingerprint are the new run's; ``quick`` is true if any kept section was.
    Raises ValueError when the two fingerprints name different CPUs (model, cores or ISA
    flags): a file name holds the model as the CPU reports it, and a cloud VM may report
    one name ("AMD EPYC") for CPUs of different generations.
    """
    if not old or old.get("schema") != record_schema.SCHEMA:
        return new
    was, now = cpu_identity(old), cpu_identity(new)
    if was != now:
        raise ValueError(f"the old record was taken on another CPU ({was} vs {now})")
    merged = dict(new)
    merged["sections"] = {**old.get("sections", {}), **new["sections"]}
    merged["section_meta"] = {**old.get("section_meta", {}), **new.get("section_meta", {})}
    merged["quick"] = any(m.get("quick", old.get("quick", False))
                          for m in merged["section_meta"].values()) or new["quick"]
    return merged


def cpu_identity(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells two CPUs apart in a record: model name, logical cores, ISA flags, the
    last-level cache and the cpuid family and model (None in records written before
    fingerprints held them)."""
    fp = record.get("fingerprint", {})
    return (fp.get("cpu_model"), fp.get("cores"), tuple(sorted(fp.get("isa_flags") or ())),
            machine.last_level_cache(fp.get("caches") or {}), fp.get("cpu_family_model"))


def attach_derived(record: dict[str, Any]) -> dict[str, Any]:
    """Add what combines two sections of one record: the suite's paths on the roofline
    (``roofline["fractions"]``, :func:`convlab.lab.roofline.fractions`)."""
    suite, roof = record["sections"].get("suite"), record["sections"].get("roofline")
    if suite and roof and "error" not in suite and "error" not in roof \
            and suite["method"].get("clock", "wall") == "wall":
        from convlab.lab import roofline

        roof["fractions"] = _clean(roofline.fractions(suite, roof))
    return record


# The child runs records.main from the imported module (not as __main__), so that what the
# module's importers set up (e.g. a site's extra sections) holds in the child too.
CHILD = "import sys; from convlab.lab.records import main; sys.exit(main(sys.argv[1:]))"
SKIPPED = 3  # the child's exit status when its setting could not be verified


def _old_record(target: Path, slug: str, label: str) -> tuple[dict[str, Any] | None, str]:
    """The existing record at ``target`` to merge into (None if absent), or why it cannot
    be: it does not load, or it is another machine's or setting's."""
    if not target.exists():
        return None, ""
    try:
        rec = read_record(target)
    except (ValueError, OSError) as err:
        return None, str(err)
    if (rec.machine, rec.isa) != (slug, label):
        return None, f"{target}: holds {rec.machine}/{rec.isa}, not {slug}/{label}"
    return record_schema.read_json(target), ""


def _beside(target: Path) -> Path:
    """A free name next to ``target`` (:func:`load_records` refuses the folder until the
    file there is resolved)."""
    stamp = _now().replace(":", "").replace("-", "")
    path = target.with_name(f"{target.name}.{stamp}{NEW_SUFFIX}")
    n = 1
    while path.exists():
        n += 1
        path = target.with_name(f"{target.name}.{stamp}-{n}{NEW_SUFFIX}")
    return path


def run_all(sections: Sequence[str], quick: bool, isas: Sequence[str] | None = None,
            directory: Path | None = None, clock: str = "wall") -> int:
    """Run every offered ISA setting (or those in ``isas``) in fresh processes; write files.

    A setting whose cap cannot be verified is skipped and its reason written into the
    machine's manifest (:func:`note_skipped`), not counted as an error. The existing record
    of each setting is validated before its child measures; if it cannot take a merge, the
    new record is written beside it (``<record>.json.<time>.new``) so that no measurement
    is lost, and the other settings still run (exit status 1; :func:`load_records` refuses
    the folder until it is resolved). ``clock`` (``wall`` or
    ``cpu``) is the clock the children time on (``CONVLAB_CLOCK`` in their environment).
    """
    clock = timing.check_clock(clock)
    settings = isa_settings.available_settings()
    if isas:
        settings = [s for s in settings if s.label in isas]
    folder = RECORDS_DIR if directory is None else directory
    folder.mkdir(parents=True, exist_ok=True)
    slug = machine.machine_slug()
    print(f"records: {machine.cpu_model()} offers {', '.join(s.label for s in settings)}; "
          f"sections {', '.join(sections)}{' (quick)' if quick else ''}; "
          f"{clock} clock", flush=True)
    status = 0
    start = time.perf_counter()
    default_mkl_path = machine.mkl_probe()  # this process: no cap of this run's settings
    for setting in settings:
        target = record_path(setting.label, folder, slug)
        old, old_problem = _old_record(target, slug, setting.label)
        if old_problem:
            print(f"records: will not merge into {target.name}: {old_problem}", flush=True)
        env = {**os.environ, **setting.env, timing.CLOCK_ENV: clock}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "record.json"
            cmd = [sys.executable, "-c", CHILD, "--child", setting.label,
                   "--sections", ",".join(sections), "--out", str(out)]
            if quick:
                cmd.append("--quick")
            code = subprocess.run(cmd, env=env, check=False).returncode
            if code == SKIPPED and out.exists():
                reason = json.loads(out.read_text())["skipped"]
                path = note_skipped(slug, setting.label, reason, folder)
                print(f"records: {setting.label} skipped (reason in {path.name})", flush=True)
                continue
            if code or not out.exists():
                print(f"records: {setting.label} failed (exit {code}); no file written",
                      flush=True)
                status = 1
                continue
            new = json.loads(out.read_text())
        new["mkl_cap"] = isa_settings.mkl_cap(setting, new["fingerprint"], default_mkl_path)
        written = _write_merged(target, old, old_problem, new)
        status = max(status, 0 if written == target else 1)
        note_skipped(slug, setting.label, None, folder)
        errors = [n for n, s in new["sections"].items() if "error" in s]
        print(f"records: wrote {written}" + (f" (errors in {', '.join(errors)})"
                                             if errors else ""), flush=True)
    print(f"records: done in {time.perf_counter() - start:.0f} s", flush=True)
    return status


def _write_merged(target: Path, old: dict[str, Any] | None, old_problem: str,
                  new: dict[str, Any]) -> Path:
    """Write ``new`` merged into ``old`` at ``target``; where that cannot be done, write
    ``new`` alone beside ``target`` and return that path."""
    if not old_problem:
        try:
            merged = attach_derived(merge(old, new))
            text = json.dumps(merged, indent=1, allow_nan=False) + "\n"
            problems = record_schema.validate(json.loads(text))
            if problems:
                raise ValueError("; ".join(problems))
            target.write_text(text)
            return target
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            old_problem = f"merge failed: {type(err).__name__}: {err}"
    path = _beside(target)
    try:
        new = attach_derived(new)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass  # the measurements themselves are what must not be lost
    path.write_text(json.dumps(new, indent=1, allow_nan=False) + "\n")
    print(f"records: {target.name} kept as it was ({old_problem}); the new record is "
          f"{path.name} (move it to its own name or delete it)", flush=True)
    return path


def parse_sections(text: str | None) -> list[str]:
    """A comma- or space-separated list of section names (all when empty)."""
    names = [n for n in (text or "").replace(",", " ").split() if n]
    if not names:
        return list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(SECTIONS)}")
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m convlab.lab.records [--quick] [--sections "suite roofline"] [--isa ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m convlab.lab.records",
        description="Run the measurement sections under every ISA setting this CPU offers, "
        "each in a fresh process, and write one record per ISA into book/data/records.")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and layers")
    parser.add_argument("--sections", default="", help=f"from {', '.join(SECTIONS)}")
    parser.add_argument("--isa", default="", help="only these ISA labels (comma-separated)")
    parser.add_argument("--dir", default=None, help="records folder (default book/data/records)")
    parser.add_argument("--clock", default="wall", choices=sorted(timing.CLOCKS),
                        help="time elapsed seconds (wall) or the process's CPU seconds "
                        "(cpu, for a busy machine); the roofline always times the wall")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        sections = parse_sections(args.sections)
        isas = [i for i in args.isa.replace(",", " ").split() if i]
        bad = [i for i in isas if i not in isa_settings.ISA_ORDER]
        if bad:
            raise ValueError(f"isa: unknown {', '.join(bad)}; choose from "
                             f"{', '.join(isa_settings.ISA_ORDER)}")
    except ValueError as err:
        print(f"records: error: {err}", file=sys.stderr)
        return 2
    if args.child:
        return child(args.child, sections, args.quick, Path(args.out))
    return run_all(sections, args.quick, isas or None,
                   Path(args.dir) if args.dir else None, args.clock)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
