"""The between-process spread of a record's timed sections.

A within-run confidence interval says how much one process's rounds scatter; it cannot see
what changes from one fresh process to the next (where the allocator put the arrays, which
core the scheduler picked, a neighbour's phase on a shared host). The records runner runs
each timed section (:data:`TIMED`) in several fresh processes and stores, per process, the
section's *headline numbers* (:func:`headline`): every ratio that carries a verdict, the
named ratios of the sections that have no verdict objects, and the roofline's GFLOP/s.
:func:`spread` compares them across processes.

>>> a = {"layers": [{"layer": "x", "r": {"median": 1.2, "verdict": "slower"}}]}
>>> b = {"layers": [{"layer": "x", "r": {"median": 1.5, "verdict": "slower"}}]}
>>> headline(a)
{'layers[x]/r': 1.2}
>>> round(spread([headline(a), headline(b)], "ratio")["max"], 2)
0.25
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: The sections whose numbers are timings, which the runner repeats in fresh processes.
#: ``dpsgd`` is not among them: it runs its own fresh processes for the ratio its verdict
#: needs (:func:`convlab.lab.sections.dpsgd.process_ratios`), and a whole repeat of it
#: would triple the longest section of a record.
TIMED: tuple[str, ...] = ("suite", "roofline", "peers", "reference_speed", "per_sample",
                          "per_sample_auto", "dp_crossover", "lowp", "lowp_ours")
#: Numbers that are ratios (or rates) of a timed comparison without a verdict object.
NAMED: tuple[str, ...] = ("auto_over_fastest", "ratio_vs_grouped", "ratio_vs_sgd", "over_float32",
                          "gflops")
#: Fields that name a list element (a layer, a grid point), joined into the key.
ID_KEYS: tuple[str, ...] = ("layer", "dtype", "pass", "channels_per_group", "n", "kernel",
                            "threads", "c_in")
#: Keys whose subtrees repeat what the headline already holds (per-round lists).
SKIP: tuple[str, ...] = ("per_round", "round_ratios", "rounds_s", "aa_round_ratios",
                         "aa_per_round", "process_ratios_vs_sgd",
                         "auto_over_fastest_per_round")


def _label(item: Any, index: int) -> str:
    if isinstance(item, Mapping):
        parts = [f"{k}={item[k]}" if k != "layer" else str(item[k])
                 for k in ID_KEYS if k in item and not isinstance(item[k], Mapping | list)]
        if parts:
            return ",".join(parts)
    return str(index)


def _walk(node: Any, path: str) -> Iterator[tuple[str, float]]:
    if isinstance(node, Mapping):
        if "verdict" in node and isinstance(node.get("median"), int | float):
            yield path, float(node["median"])
            return
        for key, value in node.items():
            if key in SKIP:
                continue
            sub = f"{path}/{key}" if path else str(key)
            if key in NAMED and isinstance(value, int | float) and not isinstance(value, bool):
                yield sub, float(value)
            else:
                yield from _walk(value, sub)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{_label(item, i)}]")


def headline(section: Mapping[str, Any]) -> dict[str, float]:
    """``key -> number`` for every headline number of one section's data (module
    docstring); finite positive numbers only (a ratio of 0 or NaN has no spread)."""
    if not isinstance(section, Mapping):
        raise TypeError(f"section must be a mapping, got {type(section).__name__}")
    return {k: v for k, v in _walk(section, "") if math.isfinite(v) and v > 0}


def is_rate(key: str) -> bool:
    """Whether a :func:`headline` key is a rate (GFLOP/s) rather than a ratio."""
    return key.endswith("gflops")


def spread(processes: Sequence[Mapping[str, float]], kind: str = "ratio") -> dict[str, Any]:
    """Across ``processes`` (one :func:`headline` each): per key of ``kind`` (``"ratio"``
    or ``"rate"``, :func:`is_rate`) present in all of them the relative spread
    ``max / min - 1``; summarised as ``median`` and ``max`` (with its ``max_key``) over the
    keys, ``keys`` and ``processes`` counted; a key that is exactly 1 in every process is
    left out (a candidate over itself). ``median`` and ``max`` are None with fewer than
    two processes or no shared key."""
    if isinstance(processes, Mapping) or not all(isinstance(p, Mapping) for p in processes):
        raise TypeError("processes must be a sequence of headline() mappings")
    if kind not in ("ratio", "rate"):
        raise ValueError(f"kind must be 'ratio' or 'rate', got {kind!r}")
    shared = {k for k in processes[0] if is_rate(k) == (kind == "rate")} if processes else set()
    for p in processes[1:]:
        shared &= set(p)
    # A ratio that is exactly 1 in every process is a candidate over itself (the baseline's
    # own row, or the auto route where it is the fastest): an identity, not a measurement.
    shared = {k for k in shared if any(p[k] != 1.0 for p in processes)}
    per_key = {k: max(p[k] for p in processes) / min(p[k] for p in processes) - 1
               for k in sorted(shared)} if len(processes) > 1 else {}
    if not per_key:
        return {"processes": len(processes), "keys": 0, "median": None, "max": None,
                "max_key": None, "per_key": {}}
    worst = max(per_key, key=per_key.__getitem__)
    return {"processes": len(processes), "keys": len(per_key),
            "median": statistics.median(per_key.values()), "max": per_key[worst],
            "max_key": worst, "per_key": per_key}
