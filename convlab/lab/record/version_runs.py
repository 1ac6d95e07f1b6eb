"""The chapter-12 old calls and chapter-13 repros as they ran on other torch versions.

``scripts/old_torch_runs.py PYTHON --record`` runs each repro and old call in a child of an
interpreter that has another torch (``make compat`` keeps such venvs) and stores one entry
per torch version in ``book/data/versions/old_torch_runs.json`` (schema 1)::

    {"schema": 1, "runs": {"2.9.1": {"date": "2026-12-02", "machine": "...",
                                     "python": "3.11", "results": {"<name>": "<line>"}}}}

A result line is the repro's ``bug present: True/False`` verdict, the first line of the
exception an old call raises, or how the child ended (``exit -6: ...`` for an abort).
The file travels with the package (``convlab/lab/data/versions`` links to it), so the
chapters render it on Colab too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convlab.lab.record.record_schema import load_checked

VERSIONS_DIR = (Path(__file__).parents[1] / "data" / "versions").resolve()
RUNS_FILE = "old_torch_runs.json"
SCHEMA = 1
RUN_KEYS = ("date", "machine", "python", "results")
TEXT_KEYS = ("date", "machine", "python")  # the chapters join them into captions


def validate(data: object) -> list[str]:
    """What is wrong with the file's JSON data (empty: valid), each problem naming its key."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return [f"an object with schema {SCHEMA} expected"]
    runs = data.get("runs")
    if not isinstance(runs, dict):
        return ["'runs' must map torch versions to runs"]
    problems = []
    for version, run in runs.items():
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            problems.append(f"runs key {version!r} is not a version like 2.9.1")
        if not (isinstance(run, dict) and set(run) == set(RUN_KEYS)):
            problems.append(f"runs[{version!r}] must have exactly {', '.join(RUN_KEYS)}")
            continue
        problems += [f"runs[{version!r}].{key} must be a string, got {type(run[key]).__name__}"
                     for key in TEXT_KEYS if not isinstance(run[key], str)]
        if not (isinstance(run["results"], dict)
                and all(isinstance(v, str) for v in run["results"].values())):
            problems.append(f"runs[{version!r}].results must map names to result lines")
    return problems


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def load_runs(path: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{torch version: run}``, oldest first; ``{}`` when no file exists.

    Raises ValueError naming the file when it is not valid."""
    path = VERSIONS_DIR / RUNS_FILE if path is None else Path(path)
    if not path.exists():
        return {}
    data = load_checked(path, validate)
    return dict(sorted(data["runs"].items(), key=lambda kv: _version_key(kv[0])))


def store_run(version: str, run: Mapping[str, Any],
              path: str | os.PathLike[str] | None = None) -> Path:
    """Replace ``version``'s entry in the file (created if absent); returns its path."""
    path = VERSIONS_DIR / RUNS_FILE if path is None else Path(path)
    runs = load_runs(path)
    runs[version] = dict(run)
    data = {"schema": SCHEMA, "runs": dict(sorted(runs.items(),
                                                  key=lambda kv: _version_key(kv[0])))}
    problems = validate(data)
    if problems:
        raise ValueError(f"refusing to write {path}: {'; '.join(problems)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def short_result(line: str) -> str:
    """A result line as a table cell: ``present``/``absent`` for a repro's verdict, the
    exception's type for an old call, ``abort`` for a killed child, else the line."""
    if line.startswith("bug present:"):
        return "present" if line.split(":", 1)[1].strip() == "True" else "absent"
    if re.match(r"exit -\d+", line):
        return "abort"
    match = re.match(r"([A-Za-z_]\w*(Error|Exception)):", line)
    if match:
        return match.group(1)
    return "works" if line == "ran without error" else line


def spans(names: list[str], runs: Mapping[str, Mapping[str, Any]],
          installed: Mapping[str, str] | None = None) -> list[list[str]]:
    """Rows ``[name, result, versions]``: for each name, each distinct short result with
    the stored versions that gave it (``2.4.1-2.11.0`` for a run of consecutive stored
    versions) and ``installed`` for the live result of the running torch. A table this
    narrow fits a phone however many versions are stored."""
    versions = list(runs)
    rows = []
    for name in names:
        seen: dict[str, list[str]] = {}
        for v in versions:
            if name in runs[v]["results"]:
                seen.setdefault(short_result(runs[v]["results"][name]), []).append(v)
        if installed is not None and name in installed:
            seen.setdefault(short_result(installed[name]), []).append("installed")
        for result, where in seen.items():
            rows.append([name, result, _ranges(where, versions)])
    return rows


def _ranges(where: list[str], versions: list[str]) -> str:
    """``['2.4.1', '2.9.1', '2.13.0', 'installed']`` of stored ``versions`` as runs of
    consecutive stored versions: ``2.4.1-2.9.1, 2.13.0, installed``."""
    parts, run = [], []
    for v in where:
        if v != "installed" and run and versions.index(v) == versions.index(run[-1]) + 1:
            run.append(v)
            continue
        if run:
            parts.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [v] if v != "installed" else []
        if v == "installed":
            parts.append(v)
    if run:
        parts.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts)
