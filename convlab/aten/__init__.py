"""Part 2, PyTorch's own code: selecting, calling and tracing ATen's convolution backward.

``backends`` (which backend ATen selects, forcing one), ``native`` (calling
``aten::convolution_backward``), ``buffers`` (checks on caller ``out=`` buffers),
``extension`` (the C++ route), ``dispatch`` (the ops a backward runs), ``kernels`` (the C++
functions, traced with gdb) and ``derivatives`` (the installed yaml files). Imports only
:mod:`convlab.scratch`.
"""
