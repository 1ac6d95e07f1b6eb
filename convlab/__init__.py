"""convlab: convolution backward in PyTorch, from scratch and through the native paths.

Three parts, as in the book, each a subpackage that imports only the ones before it:

* :mod:`convlab.scratch`: the maths built from tensor ops and NumPy (``params``,
  ``im2col``, ``numpy_ref``, ``reference``, ``thnn``, ``per_sample``);
* :mod:`convlab.aten`: PyTorch's own code, selected, called and traced (``backends``,
  ``native``, ``buffers``, ``extension``, ``dispatch``, ``kernels``, ``derivatives``);
* :mod:`convlab.lab`: measuring both (``timing``, ``profiling``, ``bench``, ``paths``,
  ``numerics``, ``doctor``, ``notebook``).

:mod:`convlab.autograd` (autograd ops on convlab's formulas), :mod:`convlab.opacus_sampler`
(convlab as Opacus's per-sample gradient sampler for DP-SGD) and :mod:`convlab.cli` (the
``convlab`` command) sit on top. Submodules are imported on demand (``from convlab.scratch
import reference``) so that importing the package stays cheap.
"""

from convlab.scratch.params import ConvParams

__all__ = ["ConvParams"]
__version__ = "0.1.0"
