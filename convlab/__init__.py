"""convlab: convolution backward in PyTorch, from scratch and through the native paths.

Modules (one concept each; see the book's API reference):

* :mod:`convlab.params`: :class:`~convlab.params.ConvParams`, argument normalisation and checks.
* :mod:`convlab.notebook`: the shared setup and check helpers of the book's notebooks.

Submodules are imported on demand (``import convlab.reference``) so that importing the
package stays cheap.
"""

from convlab.params import ConvParams

__all__ = ["ConvParams"]
__version__ = "0.1.0"
