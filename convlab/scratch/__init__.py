"""Part 1, from scratch: convolution and its backward built from tensor ops and NumPy.

:mod:`~convlab.scratch.params` (hyper-parameters and shapes), :mod:`~convlab.scratch.im2col`,
:mod:`~convlab.scratch.numpy_ref` (the definition in NumPy),
:mod:`~convlab.scratch.reference` (torch ops, N-d), :mod:`~convlab.scratch.double_backward`
(second order: the double backward and the forward-mode derivative),
:mod:`~convlab.scratch.thnn` (the 2020 buffers), :mod:`~convlab.scratch.storage` (when a
caller's buffer may be resized in place) and :mod:`~convlab.scratch.per_sample`. Nothing
here imports the other parts of convlab.
"""
