"""The measurement method: how the lab times, compares and describes what it measured.

:mod:`~convlab.lab.method.timing` (the interleaved method and its verdicts),
:mod:`~convlab.lab.method.effect` (a ratio's CI and the smallest resolvable ratio),
:mod:`~convlab.lab.method.float_errors` (errors against the float64 oracle),
:mod:`~convlab.lab.method.profiling` (memory, op times, oneDNN traces),
:mod:`~convlab.lab.method.machine` (the machine fingerprint), with
:mod:`~convlab.lab.method.verbose_probes` (what oneDNN and MKL announce), and
:mod:`~convlab.lab.method.isa_settings` (the ISA caps and their check).
"""
