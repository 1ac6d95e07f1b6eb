"""Part 3, the lab: measuring and reporting on the other two parts.

Four rooms, each a subpackage, around a few modules of its own:

* :mod:`convlab.lab.method`: how the lab measures (the interleaved timing method, effect
  sizes, errors against the float64 oracle, profiling, the machine fingerprint and the ISA
  settings);
* :mod:`convlab.lab.record`: the measurement record (its schema, reading and writing
  records, ``make records``, which records a chapter shows and sentences computed from
  them, the runs on other torch versions);
* :mod:`convlab.lab.sections`: a record's sections, one module each, registered in
  :data:`convlab.lab.sections.SECTIONS`;
* :mod:`convlab.lab.claims`: the book's machine-dependent sentences as checks that run here.

Beside them: :mod:`~convlab.lab.paths` (the registry of layers, doctor cases and paths),
:mod:`~convlab.lab.bench` and :mod:`~convlab.lab.bench_report` (``convlab bench``),
:mod:`~convlab.lab.doctor` (``convlab doctor``) and :mod:`~convlab.lab.notebook` (the
chapters' helpers). May import :mod:`convlab.scratch` and :mod:`convlab.aten`, never the
reverse.
"""
