"""Part 3, the lab: measuring and reporting on the other two parts.

:mod:`~convlab.lab.timing` (the one measurement method), :mod:`~convlab.lab.numerics`
(errors against the float64 oracle), :mod:`~convlab.lab.profiling`,
:mod:`~convlab.lab.bench` and :mod:`~convlab.lab.bench_report` (``convlab bench`` and its
results), :mod:`~convlab.lab.paths` (the registry of layers and paths),
:mod:`~convlab.lab.records` (one measurement record per machine and instruction set) with
its sections :mod:`~convlab.lab.suite`, :mod:`~convlab.lab.peers` and
:mod:`~convlab.lab.roofline`, :mod:`~convlab.lab.machine` (the machine behind a
measurement), :mod:`~convlab.lab.per_sample_timing`, :mod:`~convlab.lab.doctor` and
:mod:`~convlab.lab.notebook` (the chapters' helpers), :mod:`~convlab.lab.version_runs`
(chapters 12 and 13 on other torch versions), and :mod:`~convlab.lab.claims` (the book's
machine-dependent sentences as checks that run here). May import :mod:`convlab.scratch`
and :mod:`convlab.aten`, never the reverse.
"""
