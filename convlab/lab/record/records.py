"""Measurement records: one JSON file per machine and instruction set, read back.

:mod:`convlab.lab.record.runner` writes them (``make records``); the record and manifest
formats (schema 1) are in :mod:`convlab.lab.record.record_schema`. A setting the runner
offers but could not verify (its cap was not observed to take effect) is not measured;
the runner writes why into that machine's manifest, ``<machine-slug>.manifest.json``, so
a record set says why a setting is absent (:func:`load_manifests`).

The chapters read them with :func:`load_records` (``r.label``: ``AMD EPYC x2, AVX2``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convlab.lab.method import isa_settings, machine
from convlab.lab.record import record_schema

# In a checkout convlab/lab/data/records links to book/data/records; an installed package
# (a wheel, as on Colab) holds a copy of those files there (pyproject's package data).
RECORDS_DIR = (Path(__file__).parents[1] / "data" / "records").resolve()
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

    def section_method(self, name: str) -> int:
        """The measurement method section ``name`` was taken under
        (``convlab.lab.record.runner.METHOD``; 1 where the record says none)."""
        return int(self.section_meta.get(name, {}).get("method", 1))

    def section_load(self, name: str) -> Mapping[str, Any] | None:
        """The machine's load while section ``name`` ran
        (:func:`convlab.lab.method.cpu_load.between`; None in older records)."""
        return self.section_meta.get(name, {}).get("load")

    def section_spread(self, name: str) -> Mapping[str, Any] | None:
        """The between-process spread of section ``name``'s ratios and rates
        (``{"ratio": ..., "rate": ...}``, :func:`convlab.lab.record.replicates.spread`);
        None where it ran in one process."""
        return self.section_meta.get(name, {}).get("process_spread")

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
        """E.g. ``AMD EPYC x2`` (:func:`convlab.lab.method.machine.display_name`)."""
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
    ValueError naming them where the folder holds records
    :func:`~convlab.lab.record.runner.run_all` wrote beside one it could not merge into
    (``*.json.<time>.new``): resolved, not left unread."""
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
