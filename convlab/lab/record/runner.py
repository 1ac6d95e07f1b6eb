"""``make records`` (``python -m convlab.lab.record.runner``): the command that writes the
measurement records, one JSON file per machine and instruction set.

For each ISA setting this CPU can offer
(:func:`convlab.lab.method.isa_settings.available_settings`: capping downwards only, e.g.
avx2 and sse41 on an AVX2 CPU; avx512, avx2 and sse41 on an AVX-512 one, plus
avx512_bf16/avx512_fp16/amx where the CPU has them) the command starts a fresh Python
process with ``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY`` and
``MKL_ENABLE_INSTRUCTIONS`` set, checks in it that the caps took effect (ATen's reported
capability and the instruction sets of the oneDNN kernels that ran;
:func:`convlab.lab.method.isa_settings.check_setting`), runs every section of
:data:`convlab.lab.sections.SECTIONS` and writes
``book/data/records/<machine-slug>__<isa>.json``. Records of other machines in that
folder are left alone, so a record from another machine is added by running the same
command there. A section that raises is stored as ``{"error": "..."}``.

``--clock cpu`` times process CPU time for a busy machine (never the roofline). A setting
whose cap cannot be verified is skipped, its reason written into the machine's manifest
(:func:`convlab.lab.record.records.note_skipped`). The records are read back with
:mod:`convlab.lab.record.records`.
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
from pathlib import Path
from typing import Any

from convlab.lab.method import cpu_load, isa_settings, machine, timing, verbose_probes
from convlab.lab.record import record_schema, records, replicates
from convlab.lab.sections import SECTIONS


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
        before = cpu_load.snapshot()
        data[name] = run_section(name, quick)
        load = cpu_load.between(before, cpu_load.snapshot())
        seconds = round(time.perf_counter() - start, 1)
        meta[name] = {"created": _now(), "seconds": seconds, "quick": quick,
                      "clock": "wall" if name == "roofline" else clock,
                      "method": METHOD, "load": load}
        status = data[name].get("error", "ok")
        busy = "" if load["quiet"] else f"; NOT QUIET: {load['why']}"
        print(f"records [{label}] {name}: {status} ({seconds} s{busy})", file=sys.stderr,
              flush=True)
    record = {
        "schema": record_schema.SCHEMA, "isa": label, "env": setting.env, "created": _now(),
        "quick": quick,
        "load": {"before": load_before, "after": _load()}, "fingerprint": fp,
        "sections": data, "section_meta": meta, "clock": clock,
    }
    out.write_text(json.dumps(_clean(record), indent=1, allow_nan=False) + "\n")
    return 0


def add_replicates(first: dict[str, Any], others: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Store in ``first`` (a child's record) the between-process spread of each timed
    section: ``section_meta[name]["processes"]`` holds every process's headline numbers
    (:func:`convlab.lab.record.replicates.headline`, ``first``'s own first), its seconds and
    its machine load; ``["process_spread"]`` the spread of the ratios and of the rates
    (:func:`convlab.lab.record.replicates.spread`, without the per-key values). A section
    that raised in any process gets no spread. ``others``: records of the same setting
    from later fresh processes."""
    for name in first["sections"]:
        runs = [first, *(o for o in others if name in o.get("sections", {}))]
        if name not in replicates.TIMED or len(runs) < 2 \
                or any("error" in r["sections"][name] for r in runs):
            continue
        meta = first["section_meta"][name]
        meta["processes"] = [
            {"headline": replicates.headline(r["sections"][name]),
             "seconds": r["section_meta"][name]["seconds"],
             "load": r["section_meta"][name].get("load")} for r in runs]
        heads = [p["headline"] for p in meta["processes"]]
        meta["process_spread"] = {
            kind: {k: v for k, v in replicates.spread(heads, kind).items() if k != "per_key"}
            for kind in ("ratio", "rate")}
    return first


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
    (``roofline["fractions"]``, :func:`convlab.lab.sections.roofline.fractions`)."""
    suite, roof = record["sections"].get("suite"), record["sections"].get("roofline")
    if suite and roof and "error" not in suite and "error" not in roof \
            and suite["method"].get("clock", "wall") == "wall":
        from convlab.lab.sections import roofline

        roof["fractions"] = _clean(roofline.fractions(suite, roof))
    return record


# The child runs runner.main from the imported module (not as __main__), so that what the
# module's importers set up (e.g. a site's extra sections) holds in the child too.
CHILD = "import sys; from convlab.lab.record.runner import main; sys.exit(main(sys.argv[1:]))"
SKIPPED = 3  # the child's exit status when its setting could not be verified
# The measurement method a section was taken under, stored per section. 2: every timed
# family has an A/A pair and >= 7 rounds, the timed sections run in >= 3 fresh processes
# (their spread stored beside the within-run band), the machine's load and steal stored per
# section. Sections without the key were taken under method 1 (no between-process spread,
# no slow-path A/A pair in the suite, 5-6 rounds in some sections, load per record only).
METHOD = 2
PROCESSES = 3  # fresh processes per ISA setting for the timed sections (make records)


def _old_record(target: Path, slug: str, label: str) -> tuple[dict[str, Any] | None, str]:
    """The existing record at ``target`` to merge into (None if absent), or why it cannot
    be: it does not load, or it is another machine's or setting's."""
    if not target.exists():
        return None, ""
    try:
        rec = records.read_record(target)
    except (ValueError, OSError) as err:
        return None, str(err)
    if (rec.machine, rec.isa) != (slug, label):
        return None, f"{target}: holds {rec.machine}/{rec.isa}, not {slug}/{label}"
    return record_schema.read_json(target), ""


def _beside(target: Path) -> Path:
    """A free name next to ``target`` (:func:`~convlab.lab.record.records.load_records`
    refuses the folder until the file there is resolved)."""
    stamp = _now().replace(":", "").replace("-", "")
    path = target.with_name(f"{target.name}.{stamp}{records.NEW_SUFFIX}")
    n = 1
    while path.exists():
        n += 1
        path = target.with_name(f"{target.name}.{stamp}-{n}{records.NEW_SUFFIX}")
    return path


def _run_child(label: str, sections: Sequence[str], quick: bool, env: Mapping[str, str]
               ) -> tuple[int, dict[str, Any] | None]:
    """One fresh child process of setting ``label``: (its exit status, its record or the
    ``{"skipped": reason}`` it wrote, None when it wrote nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, "-c", CHILD, "--child", label,
               "--sections", ",".join(sections), "--out", str(out)]
        if quick:
            cmd.append("--quick")
        code = subprocess.run(cmd, env=dict(env), check=False).returncode
        return code, json.loads(out.read_text()) if out.exists() else None


def run_all(sections: Sequence[str], quick: bool, isas: Sequence[str] | None = None,
            directory: Path | None = None, clock: str = "wall",
            processes: int = PROCESSES) -> int:
    """Run every offered ISA setting (or those in ``isas``) in fresh processes; write files.

    A setting whose cap cannot be verified is skipped and its reason written into the
    machine's manifest (:func:`~convlab.lab.record.records.note_skipped`), not counted as
    an error. The existing record of each setting is validated before its child measures;
    if it cannot take a merge, the new record is written beside it
    (``<record>.json.<time>.new``) so that no measurement is lost, and the other settings
    still run (exit status 1; :func:`~convlab.lab.record.records.load_records` refuses the
    folder until it is resolved). ``clock`` (``wall`` or ``cpu``) is the clock the
    children time on (``CONVLAB_CLOCK`` in their environment). The timed sections
    (:data:`convlab.lab.record.replicates.TIMED`) run in ``processes`` fresh processes
    per setting, the first of which runs every section and is the one stored in full
    (:func:`add_replicates`).
    """
    clock = timing.check_clock(clock)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive int, got {processes!r}")
    settings = isa_settings.available_settings()
    if isas:
        settings = [s for s in settings if s.label in isas]
    folder = records.RECORDS_DIR if directory is None else directory
    folder.mkdir(parents=True, exist_ok=True)
    slug = machine.machine_slug()
    print(f"records: {machine.cpu_model()} offers {', '.join(s.label for s in settings)}; "
          f"sections {', '.join(sections)}{' (quick)' if quick else ''}; "
          f"{clock} clock", flush=True)
    status = 0
    start = time.perf_counter()
    default_mkl_path = verbose_probes.mkl_probe()  # this process: no cap of this run's settings
    for setting in settings:
        target = records.record_path(setting.label, folder, slug)
        old, old_problem = _old_record(target, slug, setting.label)
        if old_problem:
            print(f"records: will not merge into {target.name}: {old_problem}", flush=True)
        env = {**os.environ, **setting.env, timing.CLOCK_ENV: clock}
        code, new = _run_child(setting.label, sections, quick, env)
        if code == SKIPPED and new is not None:
            path = records.note_skipped(slug, setting.label, new["skipped"], folder)
            print(f"records: {setting.label} skipped (reason in {path.name})", flush=True)
            continue
        if code or new is None:
            print(f"records: {setting.label} failed (exit {code}); no file written",
                  flush=True)
            status = 1
            continue
        timed = [n for n in sections if n in replicates.TIMED]
        others = []
        for k in range(2, processes + 1 if timed else 1):
            print(f"records: {setting.label}: fresh process {k} of {processes} "
                  f"({', '.join(timed)})", flush=True)
            code, again = _run_child(setting.label, timed, quick, env)
            if code or again is None or "sections" not in again:
                print(f"records: {setting.label}: process {k} failed (exit {code}); "
                      "its spread is left out", flush=True)
                continue
            others.append(again)
        add_replicates(new, others)
        new["mkl_cap"] = isa_settings.mkl_cap(setting, new["fingerprint"], default_mkl_path)
        written = _write_merged(target, old, old_problem, new)
        status = max(status, 0 if written == target else 1)
        records.note_skipped(slug, setting.label, None, folder)
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
    """``python -m convlab.lab.record.runner [--quick] [--sections "suite roofline"]
    [--isa ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m convlab.lab.record.runner",
        description="Run the measurement sections under every ISA setting this CPU offers, "
        "each in a fresh process, and write one record per ISA into book/data/records.")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and layers")
    parser.add_argument("--sections", default="", help=f"from {', '.join(SECTIONS)}")
    parser.add_argument("--isa", default="", help="only these ISA labels (comma-separated)")
    parser.add_argument("--dir", default=None, help="records folder (default book/data/records)")
    parser.add_argument("--clock", default="wall", choices=sorted(timing.CLOCKS),
                        help="time elapsed seconds (wall) or the process's CPU seconds "
                        "(cpu, for a busy machine); the roofline always times the wall")
    parser.add_argument("--processes", type=int, default=PROCESSES,
                        help="fresh processes per setting for the timed sections "
                        f"(default {PROCESSES}; the first runs every section)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        sections = parse_sections(args.sections)
        isas = [i for i in args.isa.replace(",", " ").split() if i]
        if args.processes < 1:
            raise ValueError(f"processes must be at least 1, got {args.processes}")
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
                   Path(args.dir) if args.dir else None, args.clock, args.processes)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
