"""Part 2, PyTorch's own code: selecting, calling and tracing ATen's convolution backward.

:mod:`~convlab.aten.backends` (which backend ATen selects, forcing one),
:mod:`~convlab.aten.selection` (the selection as a rule table) and
:mod:`~convlab.aten.conv_query` (what it reads and returns), :mod:`~convlab.aten.explain`
(which backend and kernel a layer's backward uses, and what flips it),
:mod:`~convlab.aten.native` (calling ``aten::convolution_backward``),
:mod:`~convlab.aten.buffers` (checks on caller ``out=`` buffers),
:mod:`~convlab.aten.extension` (the C++ route), :mod:`~convlab.aten.dispatch` (the ops a
backward runs), :mod:`~convlab.aten.kernels` (the C++ functions, traced with gdb),
:mod:`~convlab.aten.derivatives` (the installed yaml files) and
:mod:`~convlab.aten.capture` (the process-wide profiler lock and C-level output
redirection). Imports only :mod:`convlab.scratch`.
"""
