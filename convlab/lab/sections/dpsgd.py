"""A DP-SGD step as users run it: forward, per-sample gradients, clipping, noise, update,
on a small CIFAR-sized ResNet, with each library's own training-loop API.

DP-SGD (Abadi et al., 2016, https://arxiv.org/abs/1607.00133) clips each sample's
gradient to norm ``max_grad_norm`` (factor ``min(1, C / (norm + 1e-6))``, Opacus's), sums
them, adds Gaussian noise of standard deviation ``noise_multiplier * C`` and divides by the
batch size. The steps of ``STEPS``:

* ``"SGD (no privacy)"``: the ordinary step, for scale;
* ``"Opacus hooks"``: ``GradSampleModule`` (forward and backward hooks, its own grad
  samplers) and ``DPOptimizer``;
* ``"Opacus hooks + convlab"``: the same with :func:`convlab.opacus_sampler.grad_sampler`
  as Opacus's conv grad sampler, registered for the step
  (:func:`convlab.opacus_sampler.registered`);
* ``"Opacus ghost clipping"``: ``GradSampleModuleFastGradientClipping`` with
  ``use_ghost_clipping=True``, ``DPOptimizerFastGradientClipping`` and
  ``DPLossFastGradientClipping`` (two backward passes; the per-sample norms of
  ``nn.Linear`` from Gram matrices, of convolutions from their per-sample gradients);
* ``"Opacus ghost + convlab"``: ghost clipping with convlab's conv sampler;
* ``"BackPACK BatchGrad"``: ``extend`` + ``backpack(BatchGrad())``, then clipping, noise and
  the update written out (BackPACK stops at the per-sample gradients);
* ``"convlab book-keeping"``: :class:`convlab.dp_step.BookKeeping`, one backward that
  computes no weight gradient, each layer's norms by the cheaper method.

:func:`record` is the ``dpsgd`` section of :mod:`convlab.lab.record.records`: time per step and
peak memory per step, batch size and thread count, each step's per-round ratios to the
SGD step and the A/A band of a second SGD step timed beside it; the book-keeping step's
ratio to SGD is also taken in fresh processes (:func:`process_ratios`), for the spread
between processes. Opacus and BackPACK are optional dependencies
(``pip install convlab[dp]``); without them their rows are ``{"skipped": ...}``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from convlab import dp_step, opacus_sampler
from convlab.lab.method import timing

__all__ = ["AA", "BATCHES", "STEPS", "TARGET", "ResNet8", "compare", "data", "make_step",
           "missing", "per_sample_grads", "process_ratios", "record", "target_verdict"]

STEPS: tuple[str, ...] = (
    "SGD (no privacy)", "Opacus hooks", "Opacus hooks + convlab", "Opacus ghost clipping",
    "Opacus ghost + convlab", "BackPACK BatchGrad", "convlab book-keeping",
)
#: The second SGD step, timed beside the first as the A/A pair of :func:`compare`.
AA = "SGD (no privacy) A/A"
#: The batch sizes of the record.
BATCHES: tuple[int, ...] = (16, 64, 256)
#: The cost a private step aims at, as a multiple of the SGD step's time.
TARGET = 1.3
NEEDS: dict[str, str] = {"Opacus": "opacus", "BackPACK": "backpack"}
# The releases whose APIs this module calls (Opacus 1.6: GradSampleHooks and its
# fast-gradient-clipping twin); an older one installs on an older torch and lacks them.
MIN_VERSIONS: dict[str, tuple[str, tuple[int, ...]]] = {
    "opacus": ("opacus", (1, 6)), "backpack": ("backpack-for-pytorch", (1, 7))}


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions, a 1x1 shortcut when the shape changes.
    GroupNorm without affine parameters (BatchNorm mixes the samples, which DP-SGD forbids)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(min(8, c_out), c_out, affine=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(min(8, c_out), c_out, affine=False)
        self.relu = nn.ReLU()
        self.short = (nn.Conv2d(c_in, c_out, 1, stride, bias=False)
                      if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.norm1(self.conv1(x)))
        return self.relu(self.norm2(self.conv2(y)) + self.short(x))


class ResNet8(nn.Module):
    """A CIFAR-sized ResNet-8: a 3x3 stem, three blocks (``width``, 2x, 4x channels, the
    last two at stride 2), global average pooling and a linear classifier."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, 1, 1, bias=True)
        self.relu = nn.ReLU()
        self.blocks = nn.Sequential(Block(width, width, 1), Block(width, 2 * width, 2),
                                    Block(2 * width, 4 * width, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flat(self.pool(self.blocks(self.relu(self.stem(x))))))


def data(n: int, size: int = 32, classes: int = 10, dtype: torch.dtype = torch.float32,
         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch ``x [n, 3, size, size]`` and labels ``y [n]`` (random, seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 3, size, size, generator=gen, dtype=dtype),
            torch.randint(0, classes, (n,), generator=gen))


def _convlab_registered() -> contextlib.AbstractContextManager[None]:
    """:func:`convlab.opacus_sampler.registered` without building the extension ahead
    (a measurement must print nothing; the first backward loads it)."""
    return opacus_sampler.registered(build_extension=False)


def _problem(module: str) -> str | None:
    """Why ``module`` cannot serve here (absent, or older than MIN_VERSIONS), or None."""
    if importlib.util.find_spec(module) is None:
        return f"{module} not installed"
    dist, least = MIN_VERSIONS[module]
    found = importlib.metadata.version(dist)
    parts = tuple(int(p) for p in re.findall(r"\d+", found)[:len(least)])
    if parts < least:
        return f"{dist} {found} is older than {'.'.join(map(str, least))}"
    return None


def missing() -> list[str]:
    """What of the optional packages (``pip install convlab[dp]``) cannot serve here: one
    line each, absent or too old."""
    return [why for m in NEEDS.values() if (why := _problem(m))]


def _missing(name: str) -> str | None:
    for library, module in NEEDS.items():
        if name.startswith(library):
            return _problem(module)
    return None


def _backpack_step(model: nn.Module, opt: torch.optim.Optimizer, sigma: float, clip: float,
                   gen: torch.Generator) -> Callable[[torch.Tensor, torch.Tensor], None]:
    from backpack import backpack, extend
    from backpack.extensions import BatchGrad

    model = extend(model)
    loss_fn = extend(nn.CrossEntropyLoss(reduction="sum"))
    params = [p for p in model.parameters() if p.requires_grad]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with backpack(BatchGrad()):
            loss_fn(model(x), y).backward()
        grads = [p.grad_batch for p in params]  # [N, *p.shape], per-sample loss gradients
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
        factor = (clip / (norms + 1e-6)).clamp(max=1.0)
        for p, g in zip(params, grads, strict=True):
            total = torch.einsum("n,n...->...", factor, g)
            noise = torch.normal(0.0, sigma * clip, p.shape, generator=gen, dtype=p.dtype)
            p.grad = (total + noise) / len(x)
        opt.step()

    return step


def make_step(name: str, model: nn.Module, n: int, sigma: float = 1.0, clip: float = 1.0,
              lr: float = 0.05, seed: int = 0
              ) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], nn.Module,
                         Callable[[], contextlib.AbstractContextManager[None]]]:
    """``(step, wrapped_model, around)`` for DP-SGD step ``name`` on a copy of ``model``
    (batch ``n``, noise multiplier ``sigma``, clipping norm ``clip``): ``step(x, y)`` runs
    one whole step; ``around()`` is the context it must run in (the convlab sampler)."""
    if name not in STEPS:
        raise ValueError(f"name must be one of {', '.join(STEPS)}, got {name!r}")
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    around = _convlab_registered if name.endswith("convlab") else contextlib.nullcontext
    kw = {"noise_multiplier": sigma, "max_grad_norm": clip, "expected_batch_size": n,
          "loss_reduction": "mean", "generator": gen}
    if name == "BackPACK BatchGrad":
        return _backpack_step(model, opt, sigma, clip, gen), model, around
    if name == "convlab book-keeping":
        dp = dp_step.BookKeeping(model, opt, **kw)
        loss_bk = nn.CrossEntropyLoss()

        def bk_step(x: torch.Tensor, y: torch.Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            dp.backward(loss_bk(model(x), y))
            opt.step()

        return bk_step, model, around
    if name.startswith("Opacus hooks"):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        model = GradSampleModule(model, loss_reduction="mean")
        opt = DPOptimizer(opt, **kw)
    elif name.startswith("Opacus ghost"):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        model = GradSampleModuleFastGradientClipping(
            model, max_grad_norm=clip, use_ghost_clipping=True, loss_reduction="mean")
        opt = DPOptimizerFastGradientClipping(opt, **kw)
        ghost_loss = DPLossFastGradientClipping(model, opt, nn.CrossEntropyLoss(), "mean")
    loss_fn = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = ghost_loss(out, y) if name.startswith("Opacus ghost") else loss_fn(out, y)
        loss.backward()
        opt.step()

    return step, model, around


def per_sample_grads(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """Every parameter's per-sample gradients of ``CrossEntropyLoss(reduction="sum")`` by
    ``name``: ``"Opacus"``, ``"Opacus + convlab"`` (GradSampleModule's ``grad_sample``) or
    ``"BackPACK"`` (``grad_batch``); parameter name -> ``[N, *shape]``."""
    model = copy.deepcopy(model)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    if name == "BackPACK":
        from backpack import backpack, extend
        from backpack.extensions import BatchGrad

        model, loss_fn = extend(model), extend(loss_fn)
        with backpack(BatchGrad()):
            loss_fn(model(x), y).backward()
        return {k: p.grad_batch for k, p in model.named_parameters()}
    if name not in ("Opacus", "Opacus + convlab"):
        raise ValueError(f"name must be Opacus, Opacus + convlab or BackPACK, got {name!r}")
    from opacus import GradSampleModule

    around = _convlab_registered if name.endswith("convlab") else contextlib.nullcontext
    with around():
        gsm = GradSampleModule(model, loss_reduction="sum")
        loss_fn(gsm(x), y).backward()
    return {k: p.grad_sample for k, p in model.named_parameters()}


def _peak_mb(fn: Callable[[], object], around: Callable[[], Any]) -> float:
    from convlab.lab.method.profiling import measure_memory

    with around():
        return measure_memory(fn, "cpu")[0] / 2**20


def compare(n: int, threads: int, quick: bool = False,
            steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
    """Every step of ``steps`` and the SGD A/A twin (:data:`AA`) on :class:`ResNet8` at
    batch ``n``, one interleaved run on ``threads`` threads (7 rounds; 3 if ``quick``):
    median seconds per step, ratios to ``"Opacus hooks"`` and to ``"SGD (no privacy)"``
    (medians of per-round ratios; the latter's per-round values too), the A/A band of the
    SGD pair, and the peak extra memory of one step (MiB, torch's allocator plus
    Python's)."""
    torch.manual_seed(0)
    model = ResNet8()
    x, y = data(n)
    rows: dict[str, dict[str, Any]] = {}
    fns: dict[str, Callable[[], object]] = {}
    arounds: dict[str, Callable[[], Any]] = {}
    for name in (*steps, AA):
        missing = _missing(name)
        if missing:
            rows[name] = {"skipped": missing}
            continue
        step, _, around = make_step(name if name != AA else STEPS[0], model, n)
        fns[name] = lambda step=step: step(x, y)
        arounds[name] = around
        rows[name] = {}
    t = timing.interleaved(fns, rounds=3 if quick else 7, min_run_time=0.01 if quick
                           else 0.2, threads=threads, around=arounds,
                           min_calls=1 if quick else 3)
    base, sgd = t.get("Opacus hooks"), t[STEPS[0]]
    for name, tt in t.items():
        per_round = timing.round_ratios(tt, sgd)
        rows[name].update({"median_s": tt.median, "min_s": min(tt.rounds),
                           "calls_per_round": tt.calls_per_round,
                           "ratio_vs_sgd": statistics.median(per_round),
                           "round_ratios_vs_sgd": per_round})
        if base is not None:
            rows[name]["ratio_vs_opacus"] = statistics.median(timing.round_ratios(tt, base))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, fn in fns.items():
            rows[name]["peak_mb"] = _peak_mb(fn, arounds[name])
    finally:
        torch.set_num_threads(before)
    return {"n": n, "threads": threads, "rounds": len(sgd.rounds),
            "aa_band": timing.noise_band(t[AA], sgd), "clock": timing.default_clock(),
            "steps": rows}


def target_verdict(ratio: float, band: float, spread: float = 0.0,
                   target: float = TARGET) -> str:
    """Whether a step's time ratio to SGD is within ``target``: ``"holds"`` when even
    ``ratio`` times the larger of the A/A ``band`` and the between-process ``spread``
    (both fractions) is within it, ``"does not hold"`` when even ``ratio`` divided by it
    is above, else ``"inconclusive"``."""
    noise = 1 + max(band, spread)
    if ratio * noise <= target:
        return "holds"
    if ratio / noise > target:
        return "does not hold"
    return "inconclusive"


def process_ratios(n: int, threads: int, processes: int = 2, quick: bool = False
                   ) -> list[float]:
    """The book-keeping step's ratio to SGD (and nothing else) in ``processes`` fresh
    Python processes, one after the other: the spread between processes."""
    code = ("import json, sys; from convlab.lab.sections import dpsgd; "
            f"r = dpsgd.compare({n}, {threads}, quick={quick}, "
            "steps=(dpsgd.STEPS[0], dpsgd.STEPS[-1])); "
            "print(json.dumps(r['steps'][dpsgd.STEPS[-1]]['ratio_vs_sgd']))")
    out = []
    for _ in range(processes):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=1800)
        out.append(float(json.loads(run.stdout.strip().splitlines()[-1])))
    return out


def record(quick: bool = False) -> dict[str, Any]:
    """The ``dpsgd`` record section: :func:`compare` at every batch of :data:`BATCHES` on
    1 and 2 threads (quick: batch 8, 1 thread), the book-keeping step's ratio to SGD in
    two more fresh processes at batch 64 (not when quick) with its verdict on
    :data:`TARGET`, the model's size and the peer packages' versions (None: not
    installed)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("opacus", "backpack-for-pytorch"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    params = sum(p.numel() for p in ResNet8().parameters())
    runs = ([compare(8, 1, quick=True)] if quick else
            [compare(n, t) for n in BATCHES for t in (1, 2)])
    for run in runs:
        bk = run["steps"][STEPS[-1]]
        others = [] if quick or run["n"] != 64 else process_ratios(run["n"], run["threads"])
        ratios = [bk["ratio_vs_sgd"], *others]
        spread = max(ratios) / min(ratios) - 1
        bk.update({"process_ratios_vs_sgd": ratios, "process_spread": spread,
                   "target_verdict": target_verdict(bk["ratio_vs_sgd"], run["aa_band"],
                                                    spread)})
    return {"peers": versions, "model": "ResNet8(width=16), 3x32x32 input",
            "parameters": params, "sigma": 1.0, "clip": 1.0, "target": TARGET,
            "runs": runs}
