"""convlab as Opacus's per-sample gradient engine for ``nn.Conv1d``, ``nn.Conv2d`` and
``nn.Conv3d``: a grad sampler, a lasting and a scoped registration, and the C++ loop
built ahead.

DP-SGD clips each sample's gradient, so Opacus's ``GradSampleModule`` (and
``PrivacyEngine.make_private``, which wraps a model in it) asks a *grad sampler* per layer
type for every sample's gradient. :func:`grad_sampler` is one with Opacus's signature,
computed by :func:`convlab.aten.fast_per_sample.per_sample_weight_grad`. Every layer is
computed as its forward runs: with ``padding_mode`` reflect, replicate or circular the
activations are padded with ``F.pad`` exactly as the layer's forward pads them, then the
gradient is taken with no padding; ``padding='same'`` is ATen's split (an uneven one padded
ahead with zeros), ``'valid'`` no padding. Channels-last inputs are read as any other layout.
Any other layer type (a transposed convolution, a subclass of a conv layer) is refused
with a ``TypeError``: nothing is returned that convlab did not compute.

Usage, registered for good (the C++ extension is built first, with a progress line)::

    from convlab import opacus_sampler
    opacus_sampler.register()        # nn.Conv1d/2d/3d now use convlab
    model, opt, loader = PrivacyEngine().make_private(module=model, ...)
    for x, y in loader: ...          # train as usual
    opacus_sampler.unregister()      # Opacus's own samplers back

**When registration must happen.** Opacus 1.6 keeps one table,
``GradSampleModule.GRAD_SAMPLERS`` (the same dict object for the fast-gradient-clipping
modules), and reads it twice: when a model is wrapped, only to decide per layer whether
a sampler exists at all (else the layer goes to Opacus's ``torch.func`` route); and at
every backward, in the backward hook, to fetch the function it calls. Opacus registers
its own conv sampler at import, so wrapping time never matters for these three layers:
convlab computes a layer's per-sample gradients exactly when it is registered while that
layer's backward runs. A :func:`registered` block must therefore hold the training
steps (the ``loss.backward()`` calls); one around ``make_private`` alone does nothing.
``GradSampleModule(force_functorch=True)`` and ``GradSampleModuleExpandedWeights`` never
call a registered grad sampler.

Where the C++ extension cannot be built or loaded (no compiler, no ninja), the
pure-PyTorch routes of :mod:`convlab.scratch.per_sample` compute the same gradients,
after one ``RuntimeWarning`` per process; nothing raises during training.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from convlab.aten import extension, fast_per_sample
from convlab.scratch import per_sample

__all__ = ["PADDING_MODES", "SUPPORTED", "build", "grad_sampler", "pad_as_forward", "register",
           "registered", "registrations", "unregister"]

#: The layer types :func:`grad_sampler` computes (exactly these, not their subclasses).
SUPPORTED: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: The ``padding_mode`` values of ``nn.Conv*d``, each computed as the layer pads.
PADDING_MODES: tuple[str, ...] = ("zeros", "reflect", "replicate", "circular")

class _Extension:
    """Whether the C++ loop serves in this process (None: not tried yet), and whether
    the one fallback warning was given."""

    lock = threading.Lock()
    usable: bool | None = None
    warned: bool = False


# What register() replaced: layer type -> Opacus's previous sampler (None: there was none).
_REPLACED: dict[type[nn.Module], Callable[..., Any] | None] = {}


def build(progress: bool = True) -> bool:
    """Build (first time: about a minute, cached in
    :func:`convlab.aten.extension.build_directory`) and load convlab's C++ extension now,
    so no training step waits for the compiler.

    ``progress`` prints one line to stderr before and one after. Returns True when the
    C++ loop serves; False where it cannot be built or loaded, after one
    ``RuntimeWarning`` per process (the pure-PyTorch routes then compute the same
    gradients). Never raises for a failed build.
    """
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    with _Extension.lock:
        if _Extension.usable:
            return True
        if progress:
            print(f"convlab.opacus_sampler: building or loading the C++ extension in "
                  f"{extension.build_directory()} (the first build takes about a "
                  "minute) ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            extension.load()
        except Exception as error:  # noqa: BLE001 - any failed build means the fallback
            _Extension.usable = False
            if progress:
                print(f"convlab.opacus_sampler: the C++ extension is not available "
                      f"({error}); using the pure-PyTorch routes", file=sys.stderr,
                      flush=True)
            _warn_fallback(error)
            return False
        _Extension.usable = True
        if progress:
            print(f"convlab.opacus_sampler: ready ({time.perf_counter() - start:.1f} s)",
                  file=sys.stderr, flush=True)
        return True


def _warn_fallback(error: BaseException) -> None:
    """The one warning per process that the pure-PyTorch routes serve."""
    if _Extension.warned:
        return
    _Extension.warned = True
    warnings.warn(f"convlab's C++ extension could not be built or loaded "
                  f"({type(error).__name__}: {error}); per-sample weight gradients use "
                  "the pure-PyTorch routes of convlab.scratch.per_sample (same results, "
                  "slower)", RuntimeWarning, stacklevel=3)


def _loop_usable() -> bool:
    """Whether the C++ loop may be asked for; tries the build once per process, quietly."""
    if _Extension.usable is None:
        build(progress=False)
    return bool(_Extension.usable)


def grad_sampler(layer: nn.Module, activations: list[torch.Tensor],
                 backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Opacus's grad-sampler signature, computed by convlab: every sample's gradient of
    an ``nn.Conv1d``/``nn.Conv2d``/``nn.Conv3d`` layer.

    ``activations`` is ``[input]``, the layer's input ``[N, C_in, *S]`` as Opacus's
    forward hook stored it; ``backprops`` the gradient of its output ``[N, C_out, *O]``.
    Returns ``{layer.weight: [N, *weight.shape], layer.bias: [N, C_out]}`` for the
    parameters that require grad. ``TypeError`` for any other layer type (a transposed
    convolution computes a different contraction; a subclass may change the forward);
    ``ValueError`` for an unknown ``padding_mode``.
    """
    _check_layer(layer)
    if not isinstance(activations, list | tuple) or len(activations) != 1:
        raise TypeError("activations must be a list holding the layer's input tensor, "
                        f"got {type(activations).__name__}")
    x = activations[0]
    if not isinstance(x, torch.Tensor) or not isinstance(backprops, torch.Tensor):
        raise TypeError("activations[0] and backprops must be torch.Tensor, got "
                        f"{type(x).__name__} and {type(backprops).__name__}")
    x, padding = pad_as_forward(layer, x.to(backprops.dtype))
    out = {}
    if layer.weight.requires_grad:
        args = (x, layer.weight.shape, backprops, layer.stride, padding, layer.dilation,
                layer.groups)
        loop_may_serve = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
        out[layer.weight] = (fast_per_sample.per_sample_weight_grad(*args)
                             if loop_may_serve and _loop_usable()
                             else per_sample.per_sample_weight_grad(*args))
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = per_sample.per_sample_bias_grad(backprops)
    return out


def _check_layer(layer: object) -> None:
    """``TypeError`` unless ``layer`` is exactly one of :data:`SUPPORTED`."""
    if type(layer) in SUPPORTED:
        return
    name = type(layer).__name__
    why = ("a transposed convolution's per-sample gradient is another contraction"
           if isinstance(layer, nn.modules.conv._ConvTransposeNd) else
           "a subclass may change the forward" if isinstance(layer, SUPPORTED) else
           "not a convolution convlab computes")
    raise TypeError(f"convlab's grad sampler computes nn.Conv1d, nn.Conv2d and nn.Conv3d "
                    f"only, got layer of type {name} ({why})")


def pad_as_forward(layer: nn.Module, x: torch.Tensor
                    ) -> tuple[torch.Tensor, tuple[int, ...] | int]:
    """The input and the zero padding that give the layer's forward: ``F.pad`` with the
    layer's ``_reversed_padding_repeated_twice`` and mode (as ``_conv_forward`` does) for a
    non-zeros mode, ATen's split of ``'same'`` (the odd one on the right), ``'valid'`` as
    0, else the layer's own padding."""
    mode = layer.padding_mode
    if mode not in PADDING_MODES:
        raise ValueError(f"layer.padding_mode must be one of {', '.join(PADDING_MODES)}, "
                         f"got {mode!r}")
    if mode != "zeros":
        pads = list(layer._reversed_padding_repeated_twice)
        return (F.pad(x, pads, mode=mode) if any(pads) else x), 0
    if layer.padding == "valid":
        return x, 0
    if layer.padding == "same":
        total = [d * (k - 1) for d, k in zip(layer.dilation, layer.kernel_size, strict=True)]
        left = tuple(t // 2 for t in total)
        if all(2 * lo == t for lo, t in zip(left, total, strict=True)):
            return x, left
        pads = [p for lo, t in zip(reversed(left), reversed(total), strict=True)
                for p in (lo, t - lo)]
        return F.pad(x, pads), 0
    return x, tuple(layer.padding)


def _tables() -> list[dict[type[nn.Module], Any]]:
    """Opacus's grad-sampler tables (in 1.6 one dict shared by the hook classes)."""
    try:
        from opacus.grad_sample.grad_sample_module import GradSampleHooks
        from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import (
            GradSampleHooksFastGradientClipping,
        )
    except ImportError as error:
        raise ImportError("convlab.opacus_sampler registers with Opacus (>= 1.6), which "
                          "is not installed: pip install convlab[dp]") from error
    found: list[dict[type[nn.Module], Any]] = []
    for table in (GradSampleHooks.GRAD_SAMPLERS,
                  GradSampleHooksFastGradientClipping.GRAD_SAMPLERS):
        if not any(table is t for t in found):
            found.append(table)
    return found


def _layer_types(layer_types: Iterable[type[nn.Module]]) -> tuple[type[nn.Module], ...]:
    """``layer_types`` checked: each one of :data:`SUPPORTED` (``TypeError`` naming it)."""
    if isinstance(layer_types, type):
        layer_types = (layer_types,)
    types = tuple(layer_types)
    for t in types:
        if t not in SUPPORTED:
            name = getattr(t, "__name__", repr(t))
            raise TypeError(f"layer_types: convlab's grad sampler computes nn.Conv1d, "
                            f"nn.Conv2d and nn.Conv3d only, got {name}")
    return types


def register(layer_types: Iterable[type[nn.Module]] = SUPPORTED,
             build_extension: bool = True) -> dict[type[nn.Module], Callable[..., Any] | None]:
    """Make :func:`grad_sampler` Opacus's grad sampler of ``layer_types`` (default: all
    three conv types) until :func:`unregister`, for every ``GradSampleModule`` and
    ``GradSampleModuleFastGradientClipping``, wrapped before or after.

    ``build_extension`` first runs :func:`build` (progress on stderr). Idempotent.
    Returns what the registrations replaced, ``{layer type: Opacus's previous sampler or
    None}`` (also what :func:`unregister` puts back). ``TypeError`` for a type it does not
    compute, before anything is registered.
    """
    types = _layer_types(layer_types)
    if build_extension:
        build()
    tables = _tables()
    for t in types:
        current = tables[0].get(t)
        if current is not grad_sampler and t not in _REPLACED:
            _REPLACED[t] = current
        for table in tables:
            table[t] = grad_sampler
    return {t: _REPLACED[t] for t in types if t in _REPLACED}


def unregister() -> dict[type[nn.Module], Callable[..., Any] | None]:
    """Undo :func:`register`: each layer type gets back the sampler it had before (or none).
    A type whose entry someone replaced since is left as it is. Returns what was put back."""
    tables = _tables()
    restored = {}
    for t, before in list(_REPLACED.items()):
        if tables[0].get(t) is grad_sampler:
            for table in tables:
                _put(table, t, before)
            restored[t] = before
        del _REPLACED[t]
    return restored


def registrations() -> dict[type[nn.Module], bool]:
    """For each of :data:`SUPPORTED`: whether Opacus now calls :func:`grad_sampler`."""
    table = _tables()[0]
    return {t: table.get(t) is grad_sampler for t in SUPPORTED}


@contextlib.contextmanager
def registered(layer_types: Iterable[type[nn.Module]] = SUPPORTED,
               build_extension: bool = True) -> Iterator[None]:
    """Scoped: inside the block :func:`grad_sampler` is Opacus's grad sampler of
    ``layer_types``; on exit each entry is what it was on entry (a lasting
    :func:`register` stays). Opacus looks the sampler up at each backward, so the block
    must hold the backward passes; wrapping ``make_private`` alone in it does nothing.
    ``build_extension`` runs :func:`build` first (progress on stderr)."""
    types = _layer_types(layer_types)
    if build_extension:
        build()
    tables = _tables()
    before = [{t: table.get(t) for t in types} for table in tables]
    for table in tables:
        for t in types:
            table[t] = grad_sampler
    try:
        yield
    finally:
        for table, saved in zip(tables, before, strict=True):
            for t, fn in saved.items():
                _put(table, t, fn)


def _put(table: dict[type[nn.Module], Any], t: type[nn.Module], fn: Any) -> None:
    """``table[t] = fn``, or no entry for ``t`` when ``fn`` is None."""
    if fn is None:
        table.pop(t, None)
    else:
        table[t] = fn
