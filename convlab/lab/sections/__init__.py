"""The sections of a measurement record, one module each, registered in :data:`SECTIONS`.

A record (:mod:`convlab.lab.record.records`) holds one entry per section; ``make records
SECTIONS="suite roofline"`` (:mod:`convlab.lab.record.runner`) runs the named ones, each
in the fresh process of an ISA setting. A new section is one module here with
``record(quick: bool = False) -> dict`` (JSON-serialisable) and one line in
:data:`SECTIONS`; ``tests/test_layout.py`` checks that every module here is registered.
"""

from __future__ import annotations

#: name -> ``"module:function"``; each function is ``record(quick: bool = False) -> dict``.
SECTIONS: dict[str, str] = {
    "suite": "convlab.lab.sections.suite:record",
    "roofline": "convlab.lab.sections.roofline:record",
    "peers": "convlab.lab.sections.peers:record",
    # the from-scratch backward, simple and fast (optional in older records)
    "reference_speed": "convlab.lab.sections.reference_speed:record",
    "per_sample": "convlab.lab.sections.per_sample_timing:record",
    "per_sample_auto": "convlab.lab.sections.per_sample_auto:record",
    "dpsgd": "convlab.lab.sections.dpsgd:record",
    # optional: ghost norm against instantiated per-sample gradients, per conv layer
    "dp_crossover": "convlab.lab.sections.dp_crossover:record",
    "numerics": "convlab.lab.sections.numerics:record",
    # optional in older records: the book's claims checked here (the claims package is
    # its own part of the lab); oneDNN's implementation per suite layer and pass; the
    # bfloat16/float16 oneDNN backward against float32
    "claims": "convlab.lab.claims:record_outcomes",
    "impls": "convlab.lab.sections.impls:record",
    "lowp": "convlab.lab.sections.lowp:record",
    # optional: convlab's reference and per-sample routes in those dtypes
    "lowp_ours": "convlab.lab.sections.lowp_ours:record",
}
