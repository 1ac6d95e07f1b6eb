"""The CUDA claims as a GPU checked them: stored runs, shown where no GPU is.

On a CUDA machine ``make gpu-check`` (``scripts/gpu_check.py --store DIR``) runs the
claims of :mod:`convlab.lab.claims.cuda` and writes one file per device,
``book/data/gpu/<device>.json`` (schema 1)::

    {"schema": 1, "date": "2026-12-04 14:09 UTC", "gpu": "NVIDIA H200",
     "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900,
     "cpu_model": "...", "cores": 16,
     "outcomes": {"<claim id>": {"status": ..., "evidence": ..., "detail": {...}}},
     "checks": {"pytest -m cuda tests/": "PASS: 118 passed, 2 skipped, ...", ...}}

``checks`` (optional) is the rest of that ``make gpu-check``: each step (the CUDA tests,
each chapter run as a script) and how it ended.

The files travel with the package (``convlab/lab/data/gpu`` links to the folder).
:func:`report` gives a chapter's stored outcomes, which
:func:`convlab.lab.claims.report` adds below the live ones on a machine without CUDA.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from convlab.lab.claims.core import STATUSES, WIDTH, fresh, run, select
from convlab.lab.claims.cuda import CLAIMS as CUDA_CLAIMS
from convlab.lab.method.machine import cpu_model
from convlab.lab.record.record_schema import load_checked

GPU_DIR = (Path(__file__).resolve().parent.parent / "data" / "gpu").resolve()
SCHEMA = 1
INFO_KEYS: dict[str, type | tuple[type, ...]] = {
    "date": str, "gpu": str, "torch": str, "cuda": str, "cudnn": (int, type(None)),
    "cpu_model": str, "cores": int,
}


def validate(data: object) -> list[str]:
    """What is wrong with one stored run's JSON data (empty: valid), each problem naming
    its key: every key of ``INFO_KEYS`` present (``cudnn`` may be null, not absent) and of
    its type; an outcome of a claim that is not one of the CUDA claims is a problem."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return [f"an object with schema {SCHEMA} expected"]
    problems = [f"'{key}' is missing" if key not in data else
                f"'{key}' must be {kind.__name__ if isinstance(kind, type) else 'int or null'}"
                for key, kind in INFO_KEYS.items()
                if key not in data or not isinstance(data[key], kind)]
    outcomes = data.get("outcomes")
    if not isinstance(outcomes, dict) or not outcomes:
        return [*problems, "'outcomes' must map claim ids to outcomes"]
    checks = data.get("checks", {})
    if not (isinstance(checks, dict)
            and all(isinstance(v, str) and v.startswith(("PASS", "FAIL"))
                    for v in checks.values())):
        problems.append("'checks' must map step names to 'PASS...' or 'FAIL...' lines")
    known = {c.id for c in CUDA_CLAIMS}
    for claim_id, out in outcomes.items():
        if claim_id not in known:
            problems.append(f"outcomes[{claim_id!r}]: not a CUDA claim")
        elif not (isinstance(out, dict) and out.get("status") in STATUSES
                  and isinstance(out.get("evidence"), str)):
            problems.append(f"outcomes[{claim_id!r}] needs a status of {STATUSES} "
                            "and an evidence line")
    return problems


def load_runs(directory: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every stored run in ``directory`` (default ``book/data/gpu``), sorted by device
    name; ``[]`` where the folder does not exist. Raises ValueError naming a bad file."""
    folder = GPU_DIR if directory is None else Path(directory)
    if not folder.is_dir():
        return []
    runs = [load_checked(path, validate) for path in sorted(folder.glob("*.json"))]
    return sorted(runs, key=lambda r: r["gpu"])


def run_here(checks: dict[str, str] | None = None) -> dict[str, Any]:
    """The CUDA claims run on this machine, as one stored run (see the module docstring),
    with the ``checks`` of the same gpu-check. Raises RuntimeError without a CUDA device:
    a stored run is a GPU's."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device here: a stored GPU run needs one")
    fresh()
    try:
        outcomes = [run(c) for c in select(CUDA_CLAIMS, None, None)]
    finally:
        fresh()
    return {"schema": SCHEMA, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "cudnn": torch.backends.cudnn.version(),
            "cpu_model": cpu_model(), "cores": os.cpu_count() or 0,
            "outcomes": {o.claim_id: {"status": o.status, "evidence": o.evidence,
                                      "detail": o.detail} for o in outcomes},
            **({"checks": dict(checks)} if checks else {})}


def store(data: dict[str, Any], directory: str | os.PathLike[str] | None = None) -> Path:
    """Write one run as ``<device>.json`` (``nvidia-h200.json``) after validating it."""
    problems = validate(data)
    if problems:
        raise ValueError("; ".join(problems))
    folder = GPU_DIR if directory is None else Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^a-z0-9]+', '-', data['gpu'].lower()).strip('-')}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def report(chapter: int | str, runs: list[dict[str, Any]] | None = None) -> str:
    """The stored outcomes of ``chapter``'s CUDA claims, one block per device (its name,
    torch, CUDA and cuDNN versions and date first); ``""`` when none is stored."""
    ids = [c.id for c in CUDA_CLAIMS if c.chapter == chapter]
    blocks = []
    for data in load_runs() if runs is None else runs:
        found = [i for i in ids if i in data["outcomes"]]
        if not found:
            continue
        head = (f"Stored on a GPU: {data['gpu']}, torch {data['torch']}, CUDA "
                f"{data['cuda']}, cuDNN {data['cudnn']}, {data['date'][:10]}:")
        lines = textwrap.wrap(head, WIDTH, subsequent_indent="  ")
        for i in found:
            lines.append(f"{i}: {data['outcomes'][i]['status']}")
            lines += textwrap.wrap(data["outcomes"][i]["evidence"], WIDTH,
                                   initial_indent="  ", subsequent_indent="  ")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)

