"""Part 3, the lab: measuring and reporting on the other two parts.

``timing`` (the one measurement method), ``profiling``, ``bench``, ``paths`` (the registry of
layers and paths), ``numerics`` (errors against the float64 oracle), ``doctor`` and
``notebook`` (the chapters' helpers). May import :mod:`convlab.scratch` and
:mod:`convlab.aten`, never the reverse.
"""
