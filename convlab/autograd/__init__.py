"""Convolution as a twice-differentiable autograd op whose derivatives are convlab's own.

Two ways to plug :mod:`convlab.scratch.reference` and
:mod:`convlab.scratch.double_backward` into autograd:

* :class:`Convolution` (a :class:`torch.autograd.Function`) and its functional form
  :func:`convolution`. Its backward is a second Function, :class:`ConvolutionBackward`, whose
  forward is ``reference.convolution_backward`` and whose backward is
  ``double_backward.convolution_double_backward``. So ``gradgradcheck`` exercises convlab's
  double-backward formulas, not autograd recorded through the ops of the first backward.
* The operators ``torch.ops.convlab.convolution`` and ``torch.ops.convlab.convolution_backward``
  (:mod:`torch.library`), with fake (meta) kernels for ``torch.compile`` and autograd kernels
  wired the same way; :func:`convolution_op` is the functional form. They pass
  ``torch.library.opcheck`` and appear as single nodes in AOTAutograd graphs.

Both mirror ATen: ``convolution`` has ``aten::convolution``'s arguments, the backward has
``aten::convolution_backward``'s and the double backward follows
``aten::_convolution_double_backward``. Both support forward mode (``jvp``, from the
``result:`` formulas of ``derivatives.yaml``) and the ``torch.func`` transforms (``grad``,
``vmap``, ``jvp``, ``hessian``): the Functions use the "new-style" form (``forward`` without
``ctx`` plus ``setup_context``), which is what ``torch.func`` requires.

``torch.compile``: the operators compile, also with ``fullgraph=True``; ``Convolution.apply``
does not under ``fullgraph=True`` (dynamo: "Unsupported custom jvp"), so :func:`convolution`
calls the operator route when compiled (see :mod:`convlab.autograd.function`).

The two routes live in :mod:`convlab.autograd.function` and
:mod:`convlab.autograd.library_op` (what they share: :mod:`convlab.autograd.common`); their
public names are importable from here.
"""

from __future__ import annotations

from convlab.autograd.function import Convolution, ConvolutionBackward, convolution
from convlab.autograd.library_op import (
    ConvolutionBackwardOpFunction,
    ConvolutionOpFunction,
    convolution_op,
)

__all__ = [
    "Convolution",
    "ConvolutionBackward",
    "ConvolutionBackwardOpFunction",
    "ConvolutionOpFunction",
    "convolution",
    "convolution_op",
]
