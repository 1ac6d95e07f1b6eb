"""convlab.opacus_sampler: convlab as Opacus's grad sampler of nn.Conv1d/2d/3d.

Per-sample gradients against torch.func (functional_call + vmap(grad)) in float64 for every
padding mode and string padding, 1-3 spatial dims, groups, dilation, stride > kernel,
channels_last and bias off; refusals; a registration that lasts and one scoped to a block;
the pure-PyTorch fallback; Opacus's GradSampleModule against a per-sample loop of plain
backward passes (what Opacus's own conv grad-sample tests check); and 30 DP-SGD steps.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import devices
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, grad, vmap

from convlab import opacus_sampler
from convlab.aten import extension, fast_per_sample
from convlab.lab.sections import dpsgd

# Opacus is pinned in requirements.txt with this torch; make compat runs other torch
# versions, where it may not install (as in tests/test_dpsgd.py): only there the tests
# that need it are skipped.
PIN = next(line.split("==")[1] for line in
           (Path(__file__).parents[1] / "requirements.txt").read_text().splitlines()
           if line.startswith("torch=="))
needs_opacus = pytest.mark.skipif(
    torch.__version__.split("+")[0] != PIN and bool(dpsgd.missing()),
    reason="Opacus is pinned with the pinned torch only")

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
SIZE = {1: (7,), 2: (6, 5), 3: (4, 5, 4)}
# name -> layer keywords (4 input and 6 output channels); reflect needs padding < size
GEOMETRY = {
    "pad1": {"kernel_size": 3, "padding": 1},
    "same_uneven": {"kernel_size": 2, "padding": "same"},  # one more on the right
    "same_dilated": {"kernel_size": 3, "padding": "same", "dilation": 2},
    "valid": {"kernel_size": 3, "padding": "valid"},
    "stride_over_kernel_grouped": {"kernel_size": 2, "stride": 3, "padding": 1,
                                   "dilation": 2, "groups": 2},
    "no_bias_pad2": {"kernel_size": 3, "padding": 2, "bias": False},
    "grouped": {"kernel_size": 3, "padding": 1, "groups": 2},
}
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture(autouse=True)
def quiet_and_one_thread():
    """Tiny shapes: one thread is faster on a busy machine (and restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            # torch warns on padding='same' with an even kernel; Opacus on its secure RNG
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.set_num_threads(before)


def func_reference(layer: nn.Module, x: torch.Tensor, g: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """Every sample's gradient of ``sum(layer(x_n) * g_n)`` by torch.func."""
    params = {k: v.detach() for k, v in layer.named_parameters()}

    def loss(p, xi, gi):
        return (functional_call(layer, p, (xi[None],)) * gi[None]).sum()

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, g)


def case(dim: int, mode: str, geometry: dict, n: int = 3, seed: int = 0,
         channels_last: bool = False) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A float64 layer, its input and a gradient of its output."""
    torch.manual_seed(seed)
    layer = CONV[dim](4, 6, padding_mode=mode, **geometry).double()
    x = torch.randn(n, 4, *SIZE[dim], dtype=torch.float64)
    g = torch.randn_like(layer(x))
    if channels_last:
        fmt = torch.channels_last if dim == 2 else torch.channels_last_3d
        x, g = x.to(memory_format=fmt), g.to(memory_format=fmt)
    return layer, x, g


def assert_matches(got: dict, layer: nn.Module, want: dict[str, torch.Tensor]) -> None:
    assert set(got) == {p for p in layer.parameters()}
    for name, p in layer.named_parameters():
        torch.testing.assert_close(got[p], want[name], **TIGHT, msg=name)


def max_error(got: dict, layer: nn.Module, want: dict[str, torch.Tensor]) -> float:
    return max((got[p] - want[k]).abs().max().item() for k, p in layer.named_parameters())


# ------------------------------------------------------------ against torch.func


@pytest.mark.parametrize("geometry", GEOMETRY)
@pytest.mark.parametrize("mode", opacus_sampler.PADDING_MODES)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_per_sample_gradients_match_torch_func(dim, mode, geometry) -> None:
    layer, x, g = case(dim, mode, GEOMETRY[geometry])
    assert_matches(opacus_sampler.grad_sampler(layer, [x], g), layer,
                   func_reference(layer, x, g))


@pytest.mark.parametrize("mode", opacus_sampler.PADDING_MODES)
@pytest.mark.parametrize("dim", [2, 3])
def test_channels_last_input(dim, mode) -> None:
    layer, x, g = case(dim, mode, GEOMETRY["pad1"], channels_last=True)
    assert x.is_contiguous(memory_format=torch.channels_last if dim == 2
                           else torch.channels_last_3d) and not x.is_contiguous()
    assert_matches(opacus_sampler.grad_sampler(layer, [x], g), layer,
                   func_reference(layer, x, g))


@pytest.mark.parametrize("device", devices())
def test_every_mode_on_device(device) -> None:
    """On CUDA no C++ loop serves: the scratch routes do, with the same padding."""
    for mode in opacus_sampler.PADDING_MODES:
        layer, x, g = case(3, mode, GEOMETRY["same_uneven"], channels_last=True)
        layer, x, g = layer.to(device), x.to(device), g.to(device)
        got = opacus_sampler.grad_sampler(layer, [x], g)
        assert all(v.device == x.device for v in got.values())
        assert_matches(got, layer, func_reference(layer, x, g))


def test_frozen_parameters_are_left_out() -> None:
    layer, x, g = case(2, "reflect", GEOMETRY["pad1"])
    layer.weight.requires_grad_(False)
    got = opacus_sampler.grad_sampler(layer, [x], g)
    assert list(got) == [layer.bias]
    torch.testing.assert_close(got[layer.bias], func_reference(layer, x, g)["bias"], **TIGHT)


@pytest.mark.parametrize("mode", opacus_sampler.PADDING_MODES)
def test_empty_batch(mode) -> None:
    layer, x, g = case(2, mode, GEOMETRY["pad1"], n=0)
    got = opacus_sampler.grad_sampler(layer, [x], g)
    assert got[layer.weight].shape == (0, 6, 4, 3, 3) and got[layer.bias].shape == (0, 6)


@settings(max_examples=12)
@given(dim=st.sampled_from([1, 2, 3]), mode=st.sampled_from(opacus_sampler.PADDING_MODES),
       k=st.integers(1, 3), stride=st.integers(1, 4), padding=st.integers(0, 2),
       dilation=st.integers(1, 2), groups=st.sampled_from([1, 2]), bias=st.booleans(),
       n=st.integers(1, 3))
def test_hypothesis_geometries(dim, mode, k, stride, padding, dilation, groups, bias,
                               n) -> None:
    geometry = {"kernel_size": k, "stride": stride, "padding": padding,
                "dilation": dilation, "groups": groups, "bias": bias}
    # a geometry the layer itself takes: some output, reflect's padding under the size
    assume(all(s + 2 * padding > dilation * (k - 1) and padding < s for s in SIZE[dim]))
    layer, x, g = case(dim, mode, geometry, n=n)
    assert_matches(opacus_sampler.grad_sampler(layer, [x], g), layer,
                   func_reference(layer, x, g))


@needs_opacus
@pytest.mark.parametrize("mode, channels_last", [("reflect", False), ("circular", False),
                                                 ("zeros", True)])
def test_opacus_own_sampler_is_wrong_here(mode, channels_last) -> None:
    """The comparison above tells right from wrong: Opacus 1.6's conv sampler ignores
    ``padding_mode`` and misreads a channels_last input, off by more than 1 here."""
    from opacus.grad_sample.conv import compute_conv_grad_sample

    layer, x, g = case(2, mode, GEOMETRY["pad1"], channels_last=channels_last)
    want = func_reference(layer, x, g)
    assert max_error(compute_conv_grad_sample(layer, [x], g), layer, want) > 1.0
    assert max_error(opacus_sampler.grad_sampler(layer, [x], g), layer, want) < 1e-12


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("layer", [nn.ConvTranspose1d(2, 2, 3), nn.ConvTranspose2d(2, 2, 3),
                                   nn.ConvTranspose3d(2, 2, 3), nn.Linear(2, 2)],
                         ids=lambda m: type(m).__name__)
def test_refuses_layers_it_does_not_compute(layer) -> None:
    with pytest.raises(TypeError, match=f"got layer of type {type(layer).__name__}"):
        opacus_sampler.grad_sampler(layer, [torch.randn(2, 2, 5, 5)], torch.randn(2, 2, 7, 7))


def test_refuses_a_subclass_and_bad_arguments() -> None:
    class MyConv(nn.Conv2d):
        pass

    with pytest.raises(TypeError, match="MyConv .*subclass"):
        opacus_sampler.grad_sampler(MyConv(2, 2, 3), [torch.randn(1, 2, 5, 5)],
                                    torch.randn(1, 2, 3, 3))
    layer, x, g = case(2, "zeros", GEOMETRY["pad1"])
    with pytest.raises(TypeError, match="activations must be a list"):
        opacus_sampler.grad_sampler(layer, x, g)
    with pytest.raises(TypeError, match="backprops must be torch.Tensor"):
        opacus_sampler.grad_sampler(layer, [x], g.numpy())
    layer.padding_mode = "mirror"
    with pytest.raises(ValueError, match="padding_mode must be one of .*'mirror'"):
        opacus_sampler.grad_sampler(layer, [x], g)
    with pytest.raises(TypeError, match="progress must be a bool"):
        opacus_sampler.build(progress="yes")


@needs_opacus
def test_registering_a_type_it_does_not_compute_is_refused() -> None:
    table = table_now()
    for bad in (nn.ConvTranspose2d, [nn.Conv2d, nn.ConvTranspose1d], nn.Linear):
        with pytest.raises(TypeError, match="layer_types: .*got (ConvTranspose|Linear)"):
            opacus_sampler.register(bad, build_extension=False)
        with pytest.raises(TypeError, match="layer_types"), \
                opacus_sampler.registered(bad, build_extension=False):
            pass
    assert same_table(table_now(), table)


@needs_opacus
def test_registered_by_hand_for_conv_transpose_raises_in_backward() -> None:
    """Registered with Opacus's own decorator for a type it does not compute, the first
    backward raises instead of returning gradients ~21 off."""
    from opacus import GradSampleModule
    from opacus.grad_sample import register_grad_sampler

    table = table_now()
    model = nn.Sequential(nn.ConvTranspose2d(2, 3, 3), nn.Flatten())
    try:
        register_grad_sampler(nn.ConvTranspose2d)(opacus_sampler.grad_sampler)
        gsm = GradSampleModule(model)
        with pytest.raises(TypeError, match="got layer of type ConvTranspose2d"):
            gsm(torch.randn(2, 2, 4, 4)).sum().backward()
    finally:
        restore(table)


# --------------------------------------------------------------------- registration


def tables() -> list[dict]:
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping

    return [GradSampleModule.GRAD_SAMPLERS, GradSampleModuleFastGradientClipping.GRAD_SAMPLERS]


def table_now() -> list[dict]:
    return [dict(t) for t in tables()]


def same_table(a: list[dict], b: list[dict]) -> bool:
    return all(x.keys() == y.keys() and all(x[k] is y[k] for k in x)
               for x, y in zip(a, b, strict=True))


def restore(saved: list[dict]) -> None:
    for table, before in zip(tables(), saved, strict=True):
        table.clear()
        table.update(before)


@needs_opacus
def test_register_is_idempotent_and_unregister_restores_the_table() -> None:
    from opacus.grad_sample.conv import compute_conv_grad_sample

    before = table_now()
    try:
        replaced = opacus_sampler.register(build_extension=False)
        assert replaced == dict.fromkeys(opacus_sampler.SUPPORTED, compute_conv_grad_sample)
        assert opacus_sampler.register(build_extension=False) == replaced
        assert all(opacus_sampler.registrations().values())
        for table in tables():
            assert all(table[t] is opacus_sampler.grad_sampler
                       for t in opacus_sampler.SUPPORTED)
        with opacus_sampler.registered(build_extension=False):
            pass  # a scoped block inside a lasting registration leaves it on
        assert all(opacus_sampler.registrations().values())
        assert opacus_sampler.unregister() == replaced
        assert same_table(table_now(), before)
        assert opacus_sampler.unregister() == {}
        assert same_table(table_now(), before)
    finally:
        restore(before)


@needs_opacus
def test_unregister_leaves_a_later_registration() -> None:
    def theirs(layer, activations, backprops):
        return {}

    before = table_now()
    try:
        opacus_sampler.register([nn.Conv1d, nn.Conv3d], build_extension=False)
        assert opacus_sampler.registrations() == {nn.Conv1d: True, nn.Conv2d: False,
                                                  nn.Conv3d: True}
        for table in tables():
            table[nn.Conv3d] = theirs
        assert opacus_sampler.unregister() == {nn.Conv1d: before[0][nn.Conv1d]}
        assert all(t[nn.Conv3d] is theirs for t in tables())
        assert tables()[0][nn.Conv1d] is before[0][nn.Conv1d]
    finally:
        restore(before)


@needs_opacus
def test_registered_restores_an_absent_entry() -> None:
    before = table_now()
    try:
        for table in tables():
            table.pop(nn.Conv1d, None)  # one dict in Opacus 1.6
        with opacus_sampler.registered([nn.Conv1d], build_extension=False):
            assert tables()[0][nn.Conv1d] is opacus_sampler.grad_sampler
        assert all(nn.Conv1d not in t for t in tables())
    finally:
        restore(before)


def spy_on_sampler(monkeypatch) -> list[str]:
    """Count the calls of convlab's sampler (a registration installs the spy)."""
    calls: list[str] = []
    real = opacus_sampler.grad_sampler

    def spy(layer, activations, backprops):
        calls.append(type(layer).__name__)
        return real(layer, activations, backprops)

    monkeypatch.setattr(opacus_sampler, "grad_sampler", spy)
    return calls


@needs_opacus
def test_the_sampler_is_looked_up_at_backward_time(monkeypatch) -> None:
    """What the docstrings say: a model wrapped before :func:`register` uses convlab; a
    model wrapped inside :func:`registered` whose backward runs after the block does not."""
    from opacus import GradSampleModule

    calls = spy_on_sampler(monkeypatch)
    model, x, y = dp_model("zeros"), *batches(1)
    before = table_now()
    try:
        gsm = GradSampleModule(model)
        opacus_sampler.register(build_extension=False)
        F.cross_entropy(gsm(x[0]), y[0]).backward()
        assert sorted(calls) == ["Conv1d", "Conv2d", "Conv2d"]
        opacus_sampler.unregister()
        gsm._close()
        with opacus_sampler.registered(build_extension=False):
            gsm = GradSampleModule(model)
        F.cross_entropy(gsm(x[0]), y[0]).backward()
        assert len(calls) == 3  # Opacus's own sampler ran
    finally:
        restore(before)


# ------------------------------------------------------------------------- fallback


def test_build_reports_progress_and_loads(monkeypatch, capsys) -> None:
    monkeypatch.setattr(opacus_sampler._Extension, "usable", None)
    assert opacus_sampler.build() is True
    err = capsys.readouterr().err
    assert "building or loading the C++ extension" in err and "ready (" in err
    assert opacus_sampler.build() is True
    assert capsys.readouterr().err == ""  # loaded: nothing to report


def test_without_the_extension_one_warning_then_pure_pytorch(monkeypatch, capsys) -> None:
    def no_compiler(verbose: bool = False):
        raise RuntimeError("no C++ compiler found (test)")

    monkeypatch.setattr(extension, "load", no_compiler)
    monkeypatch.setattr(opacus_sampler._Extension, "usable", None)
    monkeypatch.setattr(opacus_sampler._Extension, "warned", False)
    layer, x, g = case(2, "reflect", GEOMETRY["pad1"])
    # the C++ loop is the route "auto" picks here, so the fallback is what serves
    assert fast_per_sample.choose_method(3, 4, (3, 3), torch.float64) == "loop"
    want = func_reference(layer, x, g)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_matches(opacus_sampler.grad_sampler(layer, [x], g), layer, want)
        assert opacus_sampler.build() is False
    assert "not available (no C++ compiler found (test))" in capsys.readouterr().err
    ours = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(ours) == 1
    assert "pure-PyTorch routes" in str(ours[0].message) and "no C++ compiler" in str(
        ours[0].message)


# -------------------------------------------- Opacus's GradSampleModule, per-sample loop


@needs_opacus
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dim, mode, geometry", [
    (1, "zeros", "same_uneven"), (1, "circular", "pad1"), (2, "zeros", "pad1"),
    (2, "reflect", "stride_over_kernel_grouped"), (2, "replicate", "valid"),
    (3, "zeros", "stride_over_kernel_grouped"), (3, "reflect", "same_dilated")])
def test_grad_sample_module_matches_a_per_sample_loop(dim, mode, geometry,
                                                      reduction) -> None:
    """Opacus's own conv grad-sample tests in small: GradSampleModule's ``grad_sample``
    with convlab registered against one plain backward per sample."""
    from opacus import GradSampleModule

    layer, x, _ = case(dim, mode, GEOMETRY[geometry], n=4)
    model = nn.Sequential(layer, nn.Flatten())
    weights = torch.randn_like(model(x))

    def losses(out, w):
        per = (out * w).sum(1)
        return per.sum() if reduction == "sum" else per.mean()

    loop = {name: torch.stack([torch.autograd.grad(losses(model(x[i:i + 1]),
                                                          weights[i:i + 1]), p)[0]
                               for i in range(len(x))])
            for name, p in model.named_parameters()}
    with opacus_sampler.registered(build_extension=False):
        gsm = GradSampleModule(model, loss_reduction=reduction)
        losses(gsm(x), weights).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, loop[name], **TIGHT, msg=name)
    gsm._close()


# ----------------------------------------------------------------- 30 DP-SGD steps


class DPModel(nn.Module):
    """Two 2-d convolutions (the second strided and grouped, no bias), a 1-d one over the
    flattened rows, a linear classifier: every conv type but 3-d, small."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1, padding_mode=mode)
        self.c2 = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2, bias=False,
                            padding_mode=mode)
        self.c3 = nn.Conv1d(4, 2, 3, padding=1, padding_mode=mode)
        self.fc = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.c2(torch.tanh(self.c1(x))))
        return self.fc(torch.tanh(self.c3(y.flatten(2))).flatten(1))


def dp_model(mode: str) -> nn.Module:
    torch.manual_seed(0)
    return DPModel(mode).double()


def batches(steps: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(steps, n, 3, 8, 8, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (steps, n), generator=gen))


STEPS, SIGMA, CLIP, LR, SEED = 30, 1.0, 0.5, 0.1, 7


def opacus_run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, convlab: bool
               ) -> torch.Tensor:
    """The parameters after DP-SGD with Opacus's GradSampleModule and DPOptimizer
    (seeded noise), with convlab's sampler registered or Opacus's own."""
    import contextlib

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(model, loss_reduction="mean")
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=x.shape[1],
                      loss_reduction="mean",
                      generator=torch.Generator().manual_seed(SEED))
    around = opacus_sampler.registered(build_extension=False) if convlab \
        else contextlib.nullcontext()
    with around:
        for xs, ys in zip(x, y, strict=True):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(gsm(xs), ys).backward()
            opt.step()
    gsm._close()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def func_run(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The same DP-SGD written out on torch.func's per-sample gradients: Opacus's clip
    factor ``min(1, C / (norm + 1e-6))``, its noise (one ``torch.normal`` per parameter,
    in order, from the same seeded generator), the sum over samples divided by N."""
    gen = torch.Generator().manual_seed(SEED)

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    params = dict(model.named_parameters())
    for xs, ys in zip(x, y, strict=True):
        per = vmap(grad(loss), in_dims=(None, 0, 0))(
            {k: v.detach() for k, v in params.items()}, xs, ys)
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in per.values()], 1).norm(dim=1)
        factor = (CLIP / (norms + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for name, p in params.items():
                summed = torch.einsum("i,i...", factor, per[name])
                noise = torch.normal(0, SIGMA * CLIP, p.shape, generator=gen,
                                     dtype=p.dtype)
                p.add_((summed + noise) / len(xs), alpha=-LR)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@needs_opacus
def test_dpsgd_zeros_padding_equals_opacus_own_sampler(monkeypatch) -> None:
    x, y = batches(STEPS)
    theirs = opacus_run(dp_model("zeros"), x, y, convlab=False)
    calls = spy_on_sampler(monkeypatch)
    ours = opacus_run(dp_model("zeros"), x, y, convlab=True)
    assert len(calls) == 3 * STEPS  # convlab computed every conv layer of every step
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours, func_run(dp_model("zeros"), x, y), rtol=1e-10,
                               atol=1e-12)
    assert (ours - torch.cat([p.detach().flatten() for p in dp_model("zeros").parameters()])
            ).abs().max() > 0.1  # the run moved the parameters


@needs_opacus
def test_dpsgd_reflect_padding_equals_torch_func() -> None:
    x, y = batches(STEPS)
    want = func_run(dp_model("reflect"), x, y)
    ours = opacus_run(dp_model("reflect"), x, y, convlab=True)
    torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)
    # Opacus's own sampler ignores the mode: the same run ends elsewhere
    theirs = opacus_run(dp_model("reflect"), x, y, convlab=False)
    assert (theirs - want).abs().max() > 1e-3
