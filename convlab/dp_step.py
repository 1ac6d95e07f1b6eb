"""DP-SGD at the cost of SGD: every sample's gradient norm and the clipped, noised sum
from one backward pass that computes no weight gradient.

DP-SGD (Abadi et al., 2016) needs, per step, each sample's gradient norm ``||g_i||``
over all parameters, the clipped sum ``sum_i c_i g_i`` with
``c_i = min(1, C / (||g_i|| + 1e-6))``, and Gaussian noise of standard deviation
``noise_multiplier * C``. Opacus's hooks take the ordinary backward (grad_input *and*
grad_weight of every layer), then every sample's gradient, then the clipped sum. The
book-keeping method (Bu, Wang, Zha and Karypis, ICML 2023) needs less:

1. One backward that asks autograd for the gradient of the model's *inputs* only
   (``torch.autograd.grad(loss, inputs)``; a forward pre-hook makes the inputs leaves
   that require grad). Autograd then runs every ``ConvolutionBackward0`` with
   ``output_mask = [True, False, False]``: no weight gradient is computed by the
   backward. A hook on each layer's output takes the layer's share (step 2) the moment
   its gradient arrives and lets go of the layer's input, so the step holds little
   more than SGD's backward does.
2. Per layer, from the activation ``a`` its forward saw and that output gradient ``g``,
   each sample's squared gradient norm, the cheaper of two ways (mixed ghost norm, Bu et
   al. 2022): *ghost*, ``<a_i a_i^T, g_i g_i^T>`` over the ``L`` output positions (cost
   ``L^2 (D + p)`` per sample), or *instantiate* the per-sample gradients
   ``g_i^T a_i`` (``L D p`` per sample, ``N`` weight-sized tensors), chosen by
   :func:`choose_method`.
3. The clipped sum from what step 2 holds: ``sum_i c_i G_i`` from instantiated
   gradients, or one weight gradient of the batch with ``g`` scaled by ``c``
   (``aten::convolution_backward`` with ``output_mask = [False, True, bias]``) for a
   ghost layer. No second backward through the network.

Layers: ``nn.Conv1d/2d/3d`` (every ``padding_mode``, string padding, groups, dilation),
``nn.Linear`` (any number of leading dimensions) and ``nn.GroupNorm``; every trainable
parameter of the model must belong to one of them (``TypeError`` names the one that does
not), and each such layer must run once per step (``ValueError`` otherwise). A layer that
mixes samples (``BatchNorm``) has no per-sample gradient and is refused as any other.

The noise and the update are Opacus's ``DPOptimizer`` (same generator draws, same
order: the optimizer's parameters), so in float64 with a seeded generator the parameters
equal Opacus's hook-based step's. Usage::

    dp = BookKeeping(model, optimizer, noise_multiplier=1.0, max_grad_norm=1.0,
                     expected_batch_size=64)
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        dp.backward(F.cross_entropy(model(x), y))   # instead of loss.backward()
        optimizer.step()

or, as one call, :func:`dp_sgd_step`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from convlab import opacus_sampler
from convlab.scratch import im2col

__all__ = ["GHOST_FACTOR", "METHODS", "SUPPORTED", "BookKeeping", "LayerShare",
           "choose_method", "dp_sgd_step", "layer_sizes"]

#: The two ways of taking a layer's per-sample norms.
METHODS: tuple[str, ...] = ("ghost", "instantiate")
#: The layer types whose per-sample gradients :class:`BookKeeping` computes.
SUPPORTED: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear,
                                          nn.GroupNorm)
#: :func:`choose_method` takes the ghost norm when ``L * (D + p) < GHOST_FACTOR * D * p``.
GHOST_FACTOR: float = 0.75
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def layer_sizes(layer: nn.Module, input_shape: Sequence[int], output_shape: Sequence[int]
                ) -> tuple[int, int, int, int]:
    """``(L, D, p, groups)`` of a conv or linear layer at these shapes: output positions
    per sample ``L``, the per-group contraction size ``D`` (``C_in / groups * prod(kernel)``
    or ``in_features``) and the per-group output channels ``p``."""
    if isinstance(layer, _CONVS):
        groups = layer.groups
        return (math.prod(output_shape[2:]),
                layer.in_channels // groups * math.prod(layer.kernel_size),
                layer.out_channels // groups, groups)
    if isinstance(layer, nn.Linear):
        return math.prod(output_shape[1:-1]), layer.in_features, layer.out_features, 1
    raise TypeError(f"layer must be a conv or linear layer, got {type(layer).__name__}")


def choose_method(layer: nn.Module, input_shape: Sequence[int],
                  output_shape: Sequence[int]) -> str:
    """``"ghost"`` or ``"instantiate"`` for the weight of ``layer`` at these shapes.

    The ghost norm costs ``L^2 (D + p)`` multiply-adds per sample and group, then one
    batched weight gradient for the clipped sum; instantiating costs ``L D p`` in small
    per-sample products and ``N * D * p`` memory. The rule: ghost iff
    ``L (D + p) < GHOST_FACTOR * D * p``, i.e. ``r = L (D + p) / (D p)`` below
    :data:`GHOST_FACTOR`. Fitted on the ``dp_crossover`` sections
    (:mod:`convlab.lab.sections.dp_crossover`: 17 conv layers, batch 32, one thread, CPU
    clock) of the committed AMD EPYC (cpuid family 25 model 1) records at AVX2 and
    SSE4.1: the ghost norm was faster at every ``r`` up to 0.56 (x0.68 and x0.89 there),
    even from 1.04 to 1.22 (x0.95 to x1.06, inside the rounds' range) and slower from 2
    on (x1.1 to x240, ResNet-8's stem at ``L = 1024`` the slowest). No layer lies between
    0.56 and 1.04, so any threshold there decides every layer alike; 0.75 is their
    geometric mean. A linear layer on ``[N, features]`` (``L = 1``) takes the ghost norm,
    ``||a_i|| ||g_i||``, whenever ``1/D + 1/p < 0.75``."""
    length, d, p, _ = layer_sizes(layer, input_shape, output_shape)
    return "ghost" if length * (d + p) < GHOST_FACTOR * d * p else "instantiate"


@dataclass
class _Seen:
    """One layer in one step: the input its forward saw (until its output's gradient
    arrives), how many times it ran, and its share once the backward reached it."""

    layer: nn.Module
    inputs: list[torch.Tensor] = field(default_factory=list)
    runs: int = 0
    share: LayerShare | None = None


def _trainable(layer: nn.Module) -> list[nn.Parameter]:
    return [p for p in layer.parameters(recurse=False) if p.requires_grad]


def _check_number(value: object, name: str, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    bad = value <= minimum if strict else value < minimum
    if bad or not math.isfinite(value):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum} and finite, "
                         f"got {value!r}")
    return float(value)


class BookKeeping:
    """Per-sample clipping and noise for ``model`` from one backward (see the module).

    ``optimizer`` (optional) fixes the parameter order of the noise draws, as Opacus's
    ``DPOptimizer`` does; without it the order is ``model.parameters()``. Arguments as
    Opacus's ``DPOptimizer``: ``noise_multiplier``, ``max_grad_norm``,
    ``expected_batch_size`` (``None``: the batch's size), ``loss_reduction`` ("mean" or
    "sum"), ``generator``, ``secure_mode``. ``method`` is ``"auto"``
    (:func:`choose_method`) or one of :data:`METHODS` for every conv and linear layer.
    Forward hooks are registered now; :meth:`close` (or leaving a ``with`` block) removes
    them.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 noise_multiplier: float, max_grad_norm: float,
                 expected_batch_size: int | None = None, loss_reduction: str = "mean",
                 generator: torch.Generator | None = None, secure_mode: bool = False,
                 method: str = "auto") -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.noise_multiplier = _check_number(noise_multiplier, "noise_multiplier", 0, False)
        self.max_grad_norm = _check_number(max_grad_norm, "max_grad_norm", 0, True)
        if expected_batch_size is not None and (
                isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, int)
                or expected_batch_size < 1):
            raise ValueError(f"expected_batch_size must be None or an int >= 1, got "
                             f"{expected_batch_size!r}")
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        if method != "auto" and method not in METHODS:
            raise ValueError(f"method must be 'auto' or one of {', '.join(METHODS)}, got "
                             f"{method!r}")
        self.expected_batch_size = expected_batch_size
        self.loss_reduction = loss_reduction
        self.generator = generator
        self.secure_mode = bool(secure_mode)
        self.method = method
        self.params = self._param_order(model, optimizer)
        self._seen: dict[nn.Module, _Seen] = {}
        self._leaves: list[torch.Tensor] = []
        self._active = False
        self._handles = [m.register_forward_hook(self._hook)
                         for m in self._layers(model)]
        self._handles.append(model.register_forward_pre_hook(self._inputs, with_kwargs=True))
        #: ``{layer name: method}`` of the last :meth:`backward` (conv and linear layers).
        self.last_methods: dict[str, str] = {}
        self._names = {m: name for name, m in model.named_modules()}

    @staticmethod
    def _layers(model: nn.Module) -> list[nn.Module]:
        """The modules with trainable parameters; ``TypeError`` for one not supported."""
        layers, owner = [], {}
        for name, module in model.named_modules(remove_duplicate=False):
            for p in _trainable(module):
                if owner.setdefault(id(p), name) != name:
                    raise ValueError(f"a parameter is shared by modules {owner[id(p)]!r} and "
                                     f"{name!r}; book-keeping takes each parameter's "
                                     f"per-sample gradient from one layer")
        for name, module in model.named_modules():
            if not _trainable(module):
                continue
            if type(module) not in SUPPORTED:
                raise TypeError(
                    f"BookKeeping computes per-sample gradients of nn.Conv1d/2d/3d, nn.Linear "
                    f"and nn.GroupNorm only; module {name or '(the model)'!r} of type "
                    f"{type(module).__name__} has trainable parameters (freeze them or use "
                    f"Opacus's hooks)")
            layers.append(module)
        return layers

    @staticmethod
    def _param_order(model: nn.Module, optimizer: torch.optim.Optimizer | None
                     ) -> list[nn.Parameter]:
        owned = {id(p) for p in model.parameters()}
        if optimizer is None:
            return [p for p in model.parameters() if p.requires_grad]
        order = [p for group in optimizer.param_groups for p in group["params"]
                 if p.requires_grad]
        for p in order:
            if id(p) not in owned:
                raise ValueError("optimizer holds a parameter that is not model's; "
                                 "BookKeeping computes gradients of model's parameters only")
        return order

    def _inputs(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The model's floating-point tensor arguments as the leaves the backward asks
        for (a detached copy that requires grad, or the tensor itself where it already
        does): every layer's input gradient is then computed, no weight gradient."""
        if not torch.is_grad_enabled():
            return None

        def leaf(value: Any) -> Any:
            if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
                return value
            value = value if value.requires_grad else value.detach().requires_grad_()
            self._leaves.append(value)
            return value

        return tuple(leaf(v) for v in args), {k: leaf(v) for k, v in kwargs.items()}

    def _hook(self, layer: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            return  # under torch.no_grad: nothing to differentiate
        seen = self._seen.setdefault(layer, _Seen(layer))
        seen.runs += 1
        seen.inputs.append(args[0].detach())
        output.register_hook(functools.partial(self._on_grad, seen))
        if not (isinstance(args[0], torch.Tensor) and args[0].requires_grad):
            self._leaves.append(output)  # fed by no input (a buffer): ask for its output

    def _on_grad(self, seen: _Seen, grad: torch.Tensor) -> None:
        """The layer's output gradient has arrived: take its share, drop its input."""
        if not self._active or not seen.inputs:
            return  # a plain loss.backward(), or a layer refused before the backward
        seen.share = LayerShare(seen.layer, seen.inputs.pop(), grad, self.method)

    def close(self) -> None:
        """Remove the forward hooks and forget any captured activations."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._seen, self._leaves = {}, []

    def __enter__(self) -> BookKeeping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        """Set every parameter's ``.grad`` to the clipped, noised and scaled sum, as
        Opacus's ``DPOptimizer.pre_step`` leaves it; returns the per-sample norms ``[N]``.

        ``loss`` is the batch's loss: 0-d, reduced as ``loss_reduction`` says (a mean is
        multiplied back by ``N`` before clipping, as Opacus does), or the per-sample
        losses ``[N]``. Replaces ``loss.backward()``; the forward's activations are
        released."""
        seen, self._seen = self._seen, {}
        leaves, self._leaves = self._leaves, []
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        if not seen:
            raise ValueError("no layer's forward ran with gradients since the last backward; "
                             "call the model between BookKeeping(...) and backward")
        for s in seen.values():
            if s.runs != 1:
                raise ValueError(f"layer {self._names.get(s.layer, '?')!r} ran "
                                 f"{s.runs} times since the last backward (used twice in "
                                 f"the model, or a forward whose loss went elsewhere); "
                                 f"book-keeping needs one activation per layer and step")
        layers = list(seen.values())
        n = max(s.inputs[0].shape[0] if s.inputs[0].dim() else 0 for s in layers)
        device = layers[0].inputs[0].device
        for s in layers:
            if not s.inputs[0].dim() or s.inputs[0].shape[0] != n:
                raise ValueError(
                    f"layer {self._names.get(s.layer, '?')!r} saw a batch of "
                    f"{s.inputs[0].shape[0] if s.inputs[0].dim() else 0} where others saw "
                    f"{n} samples; a per-sample gradient needs the batch as dimension 0 of "
                    f"every layer's input")
        if loss.dim() == 1:
            if loss.shape[0] != n:
                raise ValueError(f"loss holds {loss.shape[0]} per-sample losses for a batch "
                                 f"of {n}")
            loss, scale = loss.sum(), 1.0
        elif loss.dim() == 0:
            scale = float(n) if self.loss_reduction == "mean" else 1.0
        else:
            raise ValueError(f"loss must be 0-d or [N], got shape {tuple(loss.shape)}")
        if not leaves:
            raise ValueError("the model's forward took no floating-point tensor argument; "
                             "book-keeping asks autograd for the inputs' gradient")
        self._active = True
        try:
            torch.autograd.grad(loss, leaves, allow_unused=True)
        finally:
            self._active = False
        parts = [s.share for s in layers if s.share is not None]
        self.last_methods = {self._names.get(p.layer, "?"): p.method
                             for p in parts if p.method}
        dtype = self.params[0].dtype if self.params else torch.float32
        norms2 = torch.zeros(n, dtype=dtype, device=device)
        for part in parts:
            norms2 += part.norms2().to(dtype)
        norms = norms2.sqrt() * scale  # a mean loss's gradients times N, as Opacus's
        clip = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        summed = {}
        for part in parts:
            summed.update(part.clipped_sums(clip * scale))
        divisor = float(self.expected_batch_size or n) if self.loss_reduction == "mean" else 1.0
        for p in self.params:
            total = summed.get(p)
            total = torch.zeros_like(p) if total is None else total.to(p.dtype)
            grad = total + self._noise(total)
            p.grad = (grad / divisor if self.loss_reduction == "mean" else grad).view_as(p)
        return norms

    def _noise(self, reference: torch.Tensor) -> torch.Tensor:
        """Opacus's draws: ``normal(0, sigma * C)`` of the reference's shape and dtype
        (secure mode: one discarded draw, then the mean of four, times two)."""
        std = self.noise_multiplier * self.max_grad_norm
        if std == 0:
            return torch.zeros_like(reference)
        if not self.secure_mode:
            return torch.normal(mean=0, std=std, size=reference.shape, device=reference.device,
                                generator=self.generator, dtype=reference.dtype)
        torch.normal(mean=0, std=std, size=(1, 1), device=reference.device,
                     generator=self.generator)
        total = torch.zeros_like(reference)
        for _ in range(4):
            total += torch.normal(mean=0, std=std, size=reference.shape,
                                  device=reference.device, generator=self.generator)
        return total / 2


class LayerShare:
    """One layer's share of a step, from its input ``a [N, ...]`` and its output's
    gradient ``g [N, ...]``: :meth:`norms2` (each sample's squared gradient norm over the
    layer's trainable parameters, ``[N]``) and :meth:`clipped_sums` (each parameter's
    ``sum_i c_i g_i``). ``method`` is ``"auto"`` or one of :data:`METHODS` (conv and
    linear weights; GroupNorm's and the biases' per-sample gradients are always
    instantiated: they are ``[N, C]``). An instantiated conv weight whose ``N`` gradients
    hold more numbers than the layer's input and output gradient keeps only its norms;
    its clipped sum is then one weight gradient with the scaled output gradient, as a
    ghost layer's."""

    def __init__(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, method: str
                 ) -> None:
        self.layer = layer
        self.g = g
        self.a = a.to(self.g.dtype)
        self.method = ""
        self.samples: dict[nn.Parameter, torch.Tensor] = {}  # instantiated [N, *shape]
        self._norms2: torch.Tensor | None = None
        if isinstance(layer, nn.GroupNorm):
            self._group_norm()
        elif isinstance(layer, (*_CONVS, nn.Linear)):
            self.method = (choose_method(layer, a.shape, g.shape) if method == "auto"
                           else method)
            if isinstance(layer, nn.Linear):
                self._linear()
            else:
                self._conv()
        self.a = self.g = None  # a ghost layer's clipped sum keeps its own in _ghost/_padded

    def norms2(self) -> torch.Tensor:
        """Each sample's squared gradient norm over this layer's parameters, ``[N]``."""
        total = self._norms2 if self._norms2 is not None else 0
        for s in self.samples.values():
            total = total + torch.linalg.vector_norm(s.flatten(1), dim=1).square()
        return total

    def clipped_sums(self, clip: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        """``{parameter: sum_i clip[i] * g_i}``, ``clip [N]``."""
        out = {p: torch.einsum("n,n...->...", clip.to(s.dtype), s)
               for p, s in self.samples.items()}
        if self._norms2 is not None:
            out.update(self._ghost_sums(clip))
        return out

    # GroupNorm: per-sample gradients of weight and bias are [N, C]; always instantiated.
    def _group_norm(self) -> None:
        layer = self.layer
        x_hat = F.group_norm(self.a, layer.num_groups, None, None, layer.eps)
        dims = tuple(range(2, self.g.dim()))
        if layer.weight is not None and layer.weight.requires_grad:
            self.samples[layer.weight] = (self.g * x_hat).sum(dims)
        if layer.bias is not None and layer.bias.requires_grad:
            self.samples[layer.bias] = self.g.sum(dims)

    def _linear(self) -> None:
        layer = self.layer
        n = self.a.shape[0]
        length = math.prod(self.a.shape[1:-1])
        a = self.a.reshape(n, length, layer.in_features)
        g = self.g.reshape(n, length, layer.out_features)
        if layer.weight.requires_grad:
            if self.method == "ghost":
                self._norms2 = _ghost_norms2(a.unsqueeze(1), g.unsqueeze(1))
                self._ghost = (a, g)
            else:
                self.samples[layer.weight] = torch.einsum("ntp,ntd->npd", g, a)
        if layer.bias is not None and layer.bias.requires_grad:
            self.samples[layer.bias] = g.sum(1)

    def _conv(self) -> None:
        layer = self.layer
        if self.method == "instantiate":
            self.samples.update(opacus_sampler.grad_sampler(layer, [self.a], self.g))
            weight = self.samples.get(layer.weight)
            if weight is not None and weight.numel() > self.a.numel() + self.g.numel():
                # N weight-sized gradients outweigh the activations: keep the norms and
                # the activations, and take the clipped sum as one weight gradient
                del self.samples[layer.weight]
                self._norms2 = torch.linalg.vector_norm(weight.flatten(1), dim=1).square()
                self._padded = (*opacus_sampler.pad_as_forward(layer, self.a), self.g)
            return
        x, padding = opacus_sampler.pad_as_forward(layer, self.a)
        self._padded = (x, padding, self.g)
        if layer.weight.requires_grad:
            d = len(layer.kernel_size)
            pads = (padding,) * d if isinstance(padding, int) else padding
            out_size = self.g.shape[2:]
            cols = im2col.im2col(x, layer.kernel_size, out_size, layer.stride, pads,
                                 layer.dilation, layer.groups)  # [G, Dg, N * L]
            n, groups = x.shape[0], layer.groups
            length, p = math.prod(out_size), layer.out_channels // groups
            cols = cols.reshape(groups, cols.shape[1], n, length).permute(2, 0, 3, 1)
            g = self.g.reshape(n, groups, p, length).transpose(2, 3)
            self._norms2 = _ghost_norms2(cols, g)  # [N, G, L, Dg] and [N, G, L, p]
        if layer.bias is not None and layer.bias.requires_grad:
            self.samples[layer.bias] = self.g.flatten(2).sum(2)

    def _ghost_sums(self, clip: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        layer = self.layer
        if isinstance(layer, nn.Linear):
            a, g = self._ghost
            return {layer.weight: torch.einsum("ntp,ntd->pd", g * clip.to(g.dtype)[:, None, None],
                                               a)}
        x, padding, g = self._padded
        d = len(layer.kernel_size)
        pads = [padding] * d if isinstance(padding, int) else list(padding)
        g = g * clip.to(g.dtype).reshape(-1, *([1] * (g.dim() - 1)))
        _, grad_weight, _ = torch.ops.aten.convolution_backward(
            g, x, layer.weight.to(g.dtype), None, list(layer.stride), pads,
            list(layer.dilation), False, [0] * d, layer.groups, [False, True, False])
        return {layer.weight: grad_weight}


def _ghost_norms2(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``sum over groups of ||g_i^T a_i||_F^2`` without forming it: ``a [N, G, L, D]``,
    ``g [N, G, L, p]`` -> ``[N]``, as ``<a a^T, g g^T>`` (``[N, G, L, L]`` each), or
    directly when ``L = 1``."""
    if a.shape[2] == 1:
        return (a.pow(2).sum(-1) * g.pow(2).sum(-1)).sum((1, 2))
    aa = a @ a.transpose(-1, -2)
    gg = g @ g.transpose(-1, -2)
    return (aa * gg).sum((1, 2, 3))


def dp_sgd_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                x: torch.Tensor, y: torch.Tensor, *, noise_multiplier: float,
                max_grad_norm: float, generator: torch.Generator | None = None,
                expected_batch_size: int | None = None, method: str = "auto"
                ) -> torch.Tensor:
    """One DP-SGD step as a plain function: forward ``model(x)``, ``loss_fn(out, y)``
    (a mean over the batch), :meth:`BookKeeping.backward`, ``optimizer.step()``.
    Returns the per-sample gradient norms ``[N]``. Hooks live only for the call."""
    optimizer.zero_grad(set_to_none=True)
    with BookKeeping(model, optimizer, noise_multiplier=noise_multiplier,
                     max_grad_norm=max_grad_norm, expected_batch_size=expected_batch_size,
                     generator=generator, method=method) as dp:
        norms = dp.backward(loss_fn(model(x), y))
    optimizer.step()
    return norms
