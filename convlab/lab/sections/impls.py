"""The ``impls`` section of a measurement record: which oneDNN implementation runs each
suite layer's backward passes under the record's ISA setting.

One forced-oneDNN full backward (``convlab.lab.paths`` ``mkldnn``, the call the suite
times) per layer and memory format, run once under ``ONEDNN_VERBOSE``
(:func:`convlab.lab.method.profiling.onednn_trace`); from its log, per pass (``backward_data``
for ``grad_input``, ``backward_weights`` for ``grad_weight`` and ``grad_bias``) the
implementation string oneDNN names: ``jit:avx512_core``, ``jit:avx2``, ``jit_dw:...``
(depthwise), ``brg_conv_bwd:...``/``brgconv_bwd_w:...`` (the BRGEMM kernels, e.g. for
``channels_last``), ``x64:gemm:jit`` (oneDNN's own im2col + GEMM), ``ref:any`` (its
reference loops). A transposed layer runs a ``deconvolution`` primitive, recorded the same
way. It also counts the reorders that change a layout (source and destination tags differ:
a copy of the bias into the same layout is not one).

No timing: one call per layer and format, so the section costs seconds. The suite's
float32 tensors; ``lowp`` records the bfloat16 and float16 implementations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from convlab.lab import paths
from convlab.lab.method import profiling
from convlab.lab.paths import Layer, NotApplicable

CONV_OPS = ("convolution", "deconvolution")
FORMATS = ("contiguous", "channels_last")
QUICK_LAYERS = ("cifar5", "depthwise", "conv1d")


def conv_impls(calls: Iterable[profiling.OneDNNCall]) -> dict[str, str]:
    """Pass (oneDNN's propagation kind) -> implementation of the (de)convolution
    primitives in ``calls``, the first of each pass.

    >>> line = ("onednn_verbose,v1,primitive,exec,cpu,"
    ...         "convolution,jit:avx2,backward_data,"
    ...         "src:f32:a:blocked:aBcd8b::f0,,,mb8,0.5")
    >>> conv_impls(profiling.parse_trace([line]))
    {'backward_data': 'jit:avx2'}
    """
    out: dict[str, str] = {}
    for call in calls:
        if call.op in CONV_OPS:
            out.setdefault(call.prop, call.impl)
    return out


def _tag(descriptor: str) -> str:
    """The format tag of one memory descriptor, ``src:f32::blocked:aBcd16b::f0`` ->
    ``aBcd16b`` (its fifth ``:``-field)."""
    fields = descriptor.split(":")
    return fields[4] if len(fields) > 4 else descriptor


def layout_reorders(calls: Iterable[profiling.OneDNNCall]) -> int:
    """Reorders in ``calls`` whose source and destination format tags differ."""
    count = 0
    for call in calls:
        if call.op != "reorder":
            continue
        src = next((d for d in call.layouts.split() if d.startswith("src:")), "")
        dst = next((d for d in call.layouts.split() if d.startswith("dst:")), "")
        count += _tag(src) != _tag(dst)
    return count


def _tensors(layer: Layer, fmt: str) -> paths.Tensors:
    x, w, b, go = layer.tensors()
    if fmt == "channels_last":
        if x.dim() != 4:
            raise NotApplicable("channels_last needs a 2-d layer")
        x, go = (t.contiguous(memory_format=torch.channels_last) for t in (x, go))
    return x, w, b, go


def layer_impls(layer: Layer, formats: Sequence[str] = FORMATS) -> dict[str, Any]:
    """One layer's row: ATen's backend under the forced oneDNN path, and per memory format
    the implementation per pass and the layout-changing reorders (or why not)."""
    path = paths.get_path("mkldnn")
    try:
        backend = path.check(layer, torch.device("cpu"), torch.float32)
    except NotApplicable as err:
        return {"layer": layer.name, "skipped": str(err)}
    row: dict[str, Any] = {"layer": layer.name, "backend": backend, "passes": {},
                           "reorders": {}, "skipped_formats": {}}
    for fmt in formats:
        try:
            fn = path.runners(layer, _tensors(layer, fmt), hold=False)["backward"]
        except NotApplicable as err:
            row["skipped_formats"][fmt] = str(err)
            continue
        with path.held():
            calls = profiling.onednn_trace(fn)
        row["passes"][fmt] = conv_impls(calls)
        row["reorders"][fmt] = layout_reorders(calls)
    return row


def record(quick: bool = False) -> dict[str, Any]:
    """The ``impls`` section (module docstring); ``quick``: three layers."""
    names = list(QUICK_LAYERS) if quick else [layer.name for layer in paths.SUITE]
    return {
        "method": "one forced-oneDNN full backward per layer and memory format under "
                  "ONEDNN_VERBOSE; the implementation of each (de)convolution pass; "
                  "reorders counted where source and destination format tags differ",
        "dtype": "float32", "formats": list(FORMATS),
        "layers": [layer_impls(layer) for layer in paths.suite_layers(names)],
    }
