"""The schema of a measurement record and of a machine's manifest (schema 1): what
:func:`validate` and :func:`validate_manifest` accept, each problem naming its key.

The files themselves are read and written by :mod:`convlab.lab.record.records`.

Record JSON::

    {"schema": 1, "isa": "avx2", "env": {...}, "created": "...Z", "quick": false,
     "load": {"before": [1m, 5m, 15m], "after": [...]},
     "fingerprint": {...}, "sections": {"<name>": {...} | {"error": "<one line>"}},
     "section_meta": {"<name>": {"created": "...Z", "seconds": 12.3, "quick": false,
                                 "clock": "wall", "method": 2, "load": {...},
                                 "processes": [...], "process_spread": {...}}},
     "mkl_cap": {"env": "AVX2", "path": "...", "default_path": "...", "changed": true},
     "clock": "wall"}

``section_meta``, ``mkl_cap`` and ``clock`` are optional (older records lack them; such a
record's setting did not cap MKL, and it timed on the wall clock). In ``section_meta``,
``method`` (absent: 1), ``load`` (:func:`convlab.lab.method.cpu_load.between`),
``processes`` and ``process_spread`` (:func:`convlab.lab.record.runner.add_replicates`) are
optional too.

Manifest JSON (``<machine-slug>.manifest.json``)::

    {"schema": 1, "machine": "<machine-slug>", "skipped_settings": {"<isa>": "<reason>"}}
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convlab.lab.method import isa_settings, machine
from convlab.lab.method.timing import CLOCKS

SCHEMA = 1
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "schema": int, "isa": str, "env": dict, "created": str, "quick": bool, "load": dict,
    "fingerprint": dict, "sections": dict,
}
MANIFEST_SUFFIX = ".manifest.json"
MKL_CAP_KEYS: tuple[str, ...] = ("env", "path", "default_path", "changed")
FINGERPRINT_KEYS: tuple[str, ...] = (
    "cpu_model", "cores", "isa_flags", "aten_cpu_capability", "onednn_version", "onednn_isa",
    "mkldnn_bf16_supported", "mkldnn_fp16_supported", "blas", "threads", "torch_version",
    "torch_build", "python",
)


# Types of the fingerprint keys the loader and the chapters read (None: not measured).
FINGERPRINT_TYPES: dict[str, type | tuple[type, ...]] = {
    "cpu_model": str, "cores": int, "isa_flags": list, "aten_cpu_capability": str,
    "onednn_version": (str, type(None)), "onednn_isa": (str, type(None)),
    "mkldnn_bf16_supported": (bool, type(None)), "mkldnn_fp16_supported": (bool, type(None)),
    "blas": dict, "threads": int, "torch_version": str, "torch_build": str, "python": str,
}


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False  # JSON true is not a core count
    return isinstance(value, kinds)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def _non_finite(value: Any, where: str) -> list[str]:
    """Key paths of NaN/inf numbers (``json.loads`` accepts them; the writer refuses)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [where]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{where}[{i}]")]
    return []


def validate(data: object) -> list[str]:
    """What is wrong with a record's JSON data (empty list: valid schema 1), each problem
    naming its key."""
    if not isinstance(data, dict):
        return [f"a record is a JSON object, got {type(data).__name__}"]
    problems = []
    for key, kind in REQUIRED.items():
        if key not in data:
            problems.append(f"missing key {key!r}")
        elif not _is(data[key], kind):
            problems.append(f"{key!r} must be {_kind_name(kind)}, "
                            f"got {type(data[key]).__name__}")
    if "section_meta" in data and not isinstance(data["section_meta"], dict):
        problems.append(f"'section_meta' must be dict, got "
                        f"{type(data['section_meta']).__name__}")
    if problems:
        return problems
    problems += [f"{p} is not a finite number" for p in _non_finite(data, "record")]
    if data["schema"] != SCHEMA:
        problems.append(f"schema {data['schema']} is not {SCHEMA}")
    if data["isa"] not in isa_settings.ISA_ORDER:
        problems.append(f"isa {data['isa']!r} is none of {', '.join(isa_settings.ISA_ORDER)}")
    fp = data["fingerprint"]
    missing = [k for k in FINGERPRINT_KEYS if k not in fp]
    if missing:
        problems.append(f"fingerprint lacks {', '.join(missing)}")
    for key, kind in FINGERPRINT_TYPES.items():
        if key in fp and not _is(fp[key], kind):
            problems.append(f"fingerprint.{key} must be {_kind_name(kind)}, "
                            f"got {type(fp[key]).__name__}")
    problems += _caches_problems(fp.get("caches", {}))
    family_model = fp.get("cpu_family_model")  # optional, like caches: it names the machine
    if family_model is not None and not (isinstance(family_model, str)
                                         and re.fullmatch(r"\d+-\d+", family_model)):
        problems.append("fingerprint.cpu_family_model must be '<family>-<model>' or null")
    for key in ("before", "after"):
        value = data["load"].get(key)
        if not (isinstance(value, list) and len(value) == 3
                and all(_is(v, (int, float)) for v in value)):
            problems.append(f"load[{key!r}] must be the three os.getloadavg() numbers")
    for name, section in data["sections"].items():
        if not isinstance(section, dict):
            problems.append(f"section {name!r} must be an object")
    for name, meta in data.get("section_meta", {}).items():
        if not isinstance(meta, dict):
            problems.append(f"section_meta[{name!r}] must be an object")
            continue
        if "method" in meta and not (_is(meta["method"], int) and meta["method"] >= 1):
            problems.append(f"section_meta[{name!r}].method must be a positive int")
        load = meta.get("load")
        if load is not None and not (isinstance(load, dict) and _is(load.get("quiet"), bool)):
            problems.append(f"section_meta[{name!r}].load must be an object with a "
                            "true/false 'quiet'")
        spread = meta.get("process_spread")
        if spread is not None and not (isinstance(spread, dict)
                                       and set(spread) == {"ratio", "rate"}):
            problems.append(f"section_meta[{name!r}].process_spread must be an object "
                            "with 'ratio' and 'rate'")
    cap = data.get("mkl_cap")
    if cap is not None and not (isinstance(cap, dict) and set(cap) == set(MKL_CAP_KEYS)
                                and _is(cap["changed"], (bool, type(None)))):
        problems.append(f"'mkl_cap' must be an object with {', '.join(MKL_CAP_KEYS)} "
                        "(changed: true, false or null)")
    for name, check in SECTION_CHECKS.items():
        section = data["sections"].get(name)
        if isinstance(section, dict) and "error" not in section:
            problems += check(section)
    clocks = [("clock", data.get("clock", "wall"))] + [
        (f"section_meta[{n!r}].clock", m.get("clock", "wall"))
        for n, m in data.get("section_meta", {}).items() if isinstance(m, dict)]
    problems += [f"{where} must be one of {', '.join(CLOCKS)}, got {clock!r}"
                 for where, clock in clocks if clock not in CLOCKS]
    try:
        dt.datetime.fromisoformat(data["created"].replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"created {data['created']!r} is not an ISO time")
    return problems


def _caches_problems(caches: object) -> list[str]:
    """The optional ``fingerprint.caches`` (older records lack it; it names the machine):
    names as ``convlab.lab.method.machine.CACHE_NAME`` reads them, positive byte counts."""
    if not isinstance(caches, dict):
        return [f"fingerprint.caches must map cache names to positive byte counts, got "
                f"{type(caches).__name__}"]
    problems = []
    for name, size in caches.items():
        if not (isinstance(name, str) and machine.CACHE_NAME.fullmatch(name)):
            problems.append(f"fingerprint.caches[{name!r}] is not a cache name like L1d, "
                            "L1i, L2 or L3")
        elif not (_is(size, int) and size > 0):
            problems.append(f"fingerprint.caches[{name!r}] must be a positive byte count, "
                            f"got {size!r}")
    return problems


def _claims_problems(claims: dict[str, Any]) -> list[str]:
    """The optional ``claims`` section: ``{claim id: {"status": ..., ...}}``."""
    return [f"sections.claims[{cid!r}] must be an object with a string status"
            for cid, outcome in claims.items()
            if not (isinstance(outcome, dict) and isinstance(outcome.get("status"), str))]


DPSGD_ROW_KEYS: tuple[str, ...] = ("median_s", "min_s", "calls_per_round", "peak_mb")


def _dpsgd_problems(section: dict[str, Any]) -> list[str]:
    """The optional ``dpsgd`` section (:func:`convlab.lab.sections.dpsgd.record`): ``runs``, each
    with ``n``, ``threads`` and ``steps``: step name -> its numbers or ``{"skipped": why}``."""
    runs = section.get("runs")
    if not isinstance(runs, list) or not runs:
        return ["sections.dpsgd.runs must be a non-empty list"]
    problems = []
    for i, run in enumerate(runs):
        where = f"sections.dpsgd.runs[{i}]"
        if not (isinstance(run, dict) and all(_is(run.get(k), int) for k in ("n", "threads"))
                and isinstance(run.get("steps"), dict)):
            problems.append(f"{where} must have int n and threads and a steps object")
            continue
        for name, row in run["steps"].items():
            if isinstance(row, dict) and isinstance(row.get("skipped"), str):
                continue
            if not (isinstance(row, dict)
                    and all(_is(row.get(k), (int, float)) for k in DPSGD_ROW_KEYS)):
                problems.append(f"{where}.steps[{name!r}] must have numbers "
                                f"{', '.join(DPSGD_ROW_KEYS)} or a skipped reason")
    return problems


def _is_impl_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _impls_problems(impls: dict[str, Any]) -> list[str]:
    """The optional ``impls`` section: per layer, per memory format, pass -> implementation."""
    layers = impls.get("layers")
    if not isinstance(layers, list):
        return ["sections.impls.layers must be a list"]
    problems = []
    for i, row in enumerate(layers):
        where = f"sections.impls.layers[{i}]"
        if not (isinstance(row, dict) and isinstance(row.get("layer"), str)):
            problems.append(f"{where} must be an object with a string layer")
        elif "skipped" not in row and not (
                isinstance(row.get("passes"), dict)
                and all(_is_impl_map(v) for v in row["passes"].values())):
            problems.append(f"{where}.passes must map formats to {{pass: implementation}}")
    return problems


def _lowp_problems(lowp: dict[str, Any]) -> list[str]:
    """The optional ``lowp`` section: support per dtype, and rows per layer and dtype."""
    problems = []
    support = lowp.get("support")
    if not (isinstance(support, dict) and all(
            isinstance(s, dict) and isinstance(s.get("supported"), bool)
            and (s["supported"] or isinstance(s.get("reason"), str))
            for s in support.values())):
        problems.append("sections.lowp.support must map dtypes to {supported, reason} "
                        "(a reason where not supported)")
    rows = lowp.get("rows")
    if not isinstance(rows, list):
        return [*problems, "sections.lowp.rows must be a list"]
    for i, row in enumerate(rows):
        where = f"sections.lowp.rows[{i}]"
        if not (isinstance(row, dict) and isinstance(row.get("layer"), str)
                and isinstance(row.get("dtype"), str)):
            problems.append(f"{where} must be an object with string layer and dtype")
        elif "skipped" not in row and not (
                _is_impl_map(row.get("impl")) and isinstance(row.get("max_rel_error"), dict)
                and ("times" in row or "single_call_s" in row)):
            problems.append(f"{where} needs impl, max_rel_error and times or single_call_s")
    return problems


SECTION_CHECKS = {"claims": _claims_problems, "impls": _impls_problems,
                  "lowp": _lowp_problems, "dpsgd": _dpsgd_problems}


def validate_manifest(data: object, slug: str | None = None) -> list[str]:
    """What is wrong with a manifest's JSON data (empty list: valid schema 1)."""
    if not isinstance(data, dict):
        return [f"a manifest is a JSON object, got {type(data).__name__}"]
    problems = []
    if data.get("schema") != SCHEMA or isinstance(data.get("schema"), bool):
        problems.append(f"schema must be {SCHEMA}, got {data.get('schema')!r}")
    if not isinstance(data.get("machine"), str) or (slug and data["machine"] != slug):
        problems.append(f"machine must be the file's slug {slug!r}, got "
                        f"{data.get('machine')!r}")
    skipped = data.get("skipped_settings")
    if not isinstance(skipped, dict):
        problems.append(f"skipped_settings must be an object, got {type(skipped).__name__}")
        return problems
    for label, reason in skipped.items():
        if label not in isa_settings.ISA_ORDER:
            problems.append(f"skipped_settings: {label!r} is none of "
                            f"{', '.join(isa_settings.ISA_ORDER)}")
        if not isinstance(reason, str) or not reason.strip():
            problems.append(f"skipped_settings[{label!r}] must be a non-empty reason")
    unknown = sorted(set(data) - {"schema", "machine", "skipped_settings"})
    if unknown:
        problems.append(f"unknown keys {', '.join(map(repr, unknown))}")
    return problems


def read_json(path: Path, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """The JSON data of a stored file, read as UTF-8. Raises ValueError naming the file
    where it is not UTF-8 or not JSON (``parse_constant``: as ``json.loads``'s, e.g.
    to refuse NaN), so no reader lets a decoding error escape without the file's name."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 ({err})") from None
    try:
        return json.loads(text, parse_constant=parse_constant)
    except ValueError as err:  # JSONDecodeError, or parse_constant's refusal
        raise ValueError(f"{path}: not JSON ({err})") from None


def load_checked(path: Path, validate: Callable[[Any], list[str]]) -> Any:
    """The JSON data of a stored file (a version run, a GPU run) once ``validate`` finds
    nothing wrong with it. Raises ValueError naming the file: not UTF-8, not JSON, or the
    validator's problems."""
    data = read_json(path)
    problems = validate(data)
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    return data
