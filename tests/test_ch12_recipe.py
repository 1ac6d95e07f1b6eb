"""Chapter 12's ``conv2d_gradfix`` drop-in, beyond the page.

The drop-in (three module-level ``autograd.Function``s built on ``convolution_backward``)
is read from its cell in ``book/12_migration_cookbook.ipynb`` (id ``c12-dropin``), so the
page and these tests check the same code. The page runs ``gradcheck``/``gradgradcheck``
and ``torch.compile(backend="aot_eager")``; here the same, plus the Inductor backend,
which takes too long for the page (a C++ compile), and StyleGAN3's pattern of building the
``Function`` class inside the call, which breaks ``fullgraph=True`` while its cache is
empty.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "book" / "12_migration_cookbook.ipynb"
F64 = torch.float64
aten = torch.ops.aten


def _dropin() -> dict[str, Any]:
    cell = next(c for c in nbformat.read(CHAPTER, as_version=4).cells
                if c.get("id") == "c12-dropin")
    namespace: dict[str, Any] = {"torch": torch, "aten": aten}
    exec(compile(cell.source, f"{CHAPTER.name}:c12-dropin", "exec"), namespace)
    return namespace


DROPIN = _dropin()
Conv = DROPIN["Conv"]


def cfg2d(stride: int = 1, padding: int = 0, dilation: int = 1, transposed: bool = False,
          output_padding: int = 0, groups: int = 1) -> tuple:
    return ([stride] * 2, [padding] * 2, [dilation] * 2, transposed, [output_padding] * 2,
            groups)


# The page's cases: input shape, weight shape, (stride, padding, dilation, transposed,
# output_padding, groups).
CASES = {
    "plain": ((1, 2, 5, 5), (3, 2, 3, 3), cfg2d()),
    "grouped-strided-dilated": ((1, 4, 7, 7), (4, 2, 3, 3), cfg2d(2, 1, 2, groups=2)),
    "1x1": ((1, 4, 3, 3), (2, 4, 1, 1), cfg2d()),
    "transposed-op1": ((1, 2, 3, 3), (2, 3, 3, 3), cfg2d(2, 1, 1, True, 1)),
    "transposed-op1-groups2": ((1, 4, 3, 3), (4, 1, 3, 3), cfg2d(2, 1, 1, True, 1, 2)),
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny float64 convolutions: with more threads, start-up costs dominate."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tensors(xs: tuple, ws: tuple, cfg: tuple, dtype: torch.dtype = F64
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    c_out = ws[1] * cfg[5] if cfg[3] else ws[0]
    return tuple(torch.randn(s, generator=g, dtype=dtype).requires_grad_()
                 for s in (xs, ws, (c_out,)))


@pytest.mark.parametrize("case", list(CASES))
def test_dropin_passes_gradcheck_and_gradgradcheck(case: str) -> None:
    xs, ws, cfg = CASES[case]
    x, w, b = _tensors(xs, ws, cfg)

    def layer(a: torch.Tensor, w_: torch.Tensor, b_: torch.Tensor) -> torch.Tensor:
        return Conv.apply(a, w_, b_, cfg)

    assert torch.equal(layer(x, w, b), aten.convolution(x, w, b, *cfg))
    assert gradcheck(layer, (x, w, b))
    assert gradgradcheck(layer, (x, w, b))


def test_dropin_double_backward_matches_native() -> None:
    """An R1-style penalty, |d loss / d input|^2 with loss = |out|^2, differentiated with
    respect to input, weight and bias, through the drop-in and through ``F.conv2d``'s native
    double backward."""
    xs, ws, cfg = CASES["grouped-strided-dilated"]
    x, w, b = _tensors(xs, ws, cfg)
    got, want = [], []
    for fn, out in ((lambda: Conv.apply(x, w, b, cfg), got),
                    (lambda: F.conv2d(x, w, b, *cfg[:3], groups=cfg[5]), want)):
        gx, = torch.autograd.grad(fn().square().sum(), x, create_graph=True)
        out.extend(torch.autograd.grad(gx.square().sum(), (x, w, b)))
    for a, r in zip(got, want, strict=True):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


def _compiled_matches(backend: str) -> None:
    xs, ws, cfg = (2, 4, 7, 7), (4, 2, 3, 3), cfg2d(2, 1, 2, groups=2)
    x, w, b = _tensors(xs, ws, cfg)

    def layer(a: torch.Tensor, w_: torch.Tensor, b_: torch.Tensor) -> torch.Tensor:
        return Conv.apply(a, w_, b_, cfg)

    torch._dynamo.reset()
    y = torch.compile(layer, fullgraph=True, backend=backend)(x, w, b)
    go = torch.randn_like(y)
    want = F.conv2d(x, w, b, *cfg[:3], groups=cfg[5])
    torch.testing.assert_close(y, want, rtol=0, atol=1e-10)
    for a, r in zip(torch.autograd.grad(y, (x, w, b), go),
                    torch.autograd.grad(want, (x, w, b), go), strict=True):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


def test_dropin_compiles_fullgraph_with_aot_eager() -> None:
    _compiled_matches("aot_eager")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU backend needs a C++ compiler")
def test_dropin_compiles_fullgraph_with_inductor(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache of its own: Inductor's on-disk cache (/tmp/torchinductor_$USER) does not key
    # on ATEN_CPU_CAPABILITY, so a kernel and precompiled header built under AVX2 were
    # reused under `make test`'s low ISA setting and did not compile ("at::vec has not
    # been declared").
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from convlab.lab.claims.core import kept_flags

    # Inductor in torch 2.4 and 2.5 builds its kernels with -ffast-math: loading one turns
    # on flush-to-zero in this thread (make compat on 2.5.1: a later ULP test in the same
    # worker got 2**1023 for an infinite error). kept_flags puts that flag back, and every
    # other process flag a compiled kernel might change.
    with kept_flags():
        _compiled_matches("inductor")


def test_a_class_built_per_call_breaks_fullgraph_until_cached() -> None:
    """StyleGAN3's ``_conv2d_gradfix`` builds its ``Conv2d`` class on the first call with
    each set of arguments and caches it: Dynamo cannot trace the ``class`` statement."""
    cfg = cfg2d()
    classes: dict[str, type] = {}

    def build(cfg: tuple) -> type:
        key = repr(cfg)
        if key not in classes:
            class Conv2d(torch.autograd.Function):
                @staticmethod
                def forward(ctx: Any, a: torch.Tensor, w_: torch.Tensor) -> torch.Tensor:
                    return aten.convolution(a, w_, None, *cfg)

                @staticmethod
                def backward(ctx: Any, go: torch.Tensor) -> tuple[None, None]:
                    return None, None

            classes[key] = Conv2d
        return classes[key]

    def layer(a: torch.Tensor, w_: torch.Tensor) -> torch.Tensor:
        return build(cfg).apply(a, w_)

    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    torch._dynamo.reset()
    # Dynamo names the class statement by its builtin (older releases: by its bytecode)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="__build_class__|LOAD_BUILD_CLASS"):
        torch.compile(layer, fullgraph=True, backend="aot_eager")(x, w)
    torch._dynamo.reset()
    layer(x, w)  # an eager call fills the cache
    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, w)
    torch.testing.assert_close(got, F.conv2d(x, w))
