"""Part 1, from scratch: convolution and its backward built from tensor ops and NumPy.

``params`` (hyper-parameters and shapes), ``im2col``, ``numpy_ref`` (the definition in
NumPy), ``reference`` (torch ops, N-d, double backward), ``thnn`` (the 2020 buffers) and
``per_sample``. Nothing here imports the other parts of convlab.
"""
