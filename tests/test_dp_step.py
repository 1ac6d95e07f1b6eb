"""convlab.dp_step: DP-SGD from one backward (book-keeping with mixed ghost norms).

Per-sample norms against torch.func per-sample gradients in float64 for every layer kind
(Conv1d/2d/3d with every padding mode, string padding, groups, dilation and stride over
the kernel; Linear on 2-d and 3-d inputs; GroupNorm), by both methods; the unclipped sum
against the plain gradient; 30 DP-SGD steps against Opacus's hook-based step (seeded
noise, float64) on ResNet-8 and a grouped/dilated/strided net; refusals.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

# the layer grid, the tolerance, the Opacus skip and the one-thread fixture of the grad
# sampler's tests
from test_opacus_sampler import (  # noqa: F401 (an autouse fixture)
    CONV,
    GEOMETRY,
    SIZE,
    TIGHT,
    needs_opacus,
    quiet_and_one_thread,
)
from torch import nn
from torch.func import functional_call, grad, vmap

from convlab import dp_step
from convlab.lab.sections import dpsgd


def func_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every sample's gradient norm of ``sum((model(x_n) - y_n)^2)``, by torch.func."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}

    def loss(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return (functional_call(model, p, (xi[None],)) - yi[None]).pow(2).sum()

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()


def bk_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """BookKeeping's per-sample norms with no clipping and no noise, and the gradients it
    leaves (the plain sum, since nothing is clipped)."""
    with dp_step.BookKeeping(model, noise_multiplier=0.0, max_grad_norm=1e30,
                             loss_reduction="sum", method=method) as dp:
        norms = dp.backward((model(x) - y).pow(2).sum())
    return norms, {k: p.grad for k, p in model.named_parameters() if p.requires_grad}


def check(model: nn.Module, x: torch.Tensor, method: str) -> None:
    model = model.double()
    with torch.no_grad():
        y = torch.randn_like(model(x))
    want = func_norms(model, x, y)
    got, grads = bk_norms(copy.deepcopy(model), x, y, method)
    torch.testing.assert_close(got, want, **TIGHT)
    model = copy.deepcopy(model)
    (model(x) - y).pow(2).sum().backward()
    for k, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[k], p.grad, **TIGHT, msg=k)


@pytest.mark.parametrize("method", dp_step.METHODS)
@pytest.mark.parametrize("geometry", sorted(GEOMETRY))
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_conv_norms_match_torch_func(dim: int, mode: str, geometry: str, method: str) -> None:
    kw = dict(GEOMETRY[geometry])
    torch.manual_seed(dim)
    layer = CONV[dim](4, 6, padding_mode=mode, **kw)
    check(layer, torch.randn(3, 4, *SIZE[dim], dtype=torch.float64), method)


@pytest.mark.parametrize("method", dp_step.METHODS)
def test_conv_channels_last_input(method: str) -> None:
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(3, 4, 6, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    check(layer, x, method)


@pytest.mark.parametrize("method", dp_step.METHODS)
@pytest.mark.parametrize("shape", [(5, 7), (5, 3, 7), (5, 2, 3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_norms_match_torch_func(shape: tuple[int, ...], bias: bool, method: str
                                       ) -> None:
    torch.manual_seed(1)
    check(nn.Linear(7, 4, bias=bias), torch.randn(*shape, dtype=torch.float64), method)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_in_a_net_matches_torch_func(affine: bool) -> None:
    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8, affine=affine),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 25, 3))
    for method in dp_step.METHODS:
        check(net, torch.randn(4, 3, 5, 5, dtype=torch.float64), method)


def test_frozen_weight_trainable_bias() -> None:
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 9, 2))
    net[0].weight.requires_grad_(False)
    for method in dp_step.METHODS:
        check(net, torch.randn(3, 3, 5, 5, dtype=torch.float64), method)


def test_auto_takes_ghost_for_a_flat_linear_and_instantiates_the_resnet_stem() -> None:
    assert dp_step.choose_method(nn.Linear(64, 10), (64, 64), (64, 10)) == "ghost"
    stem = nn.Conv2d(3, 16, 3, padding=1)
    assert dp_step.choose_method(stem, (64, 3, 32, 32), (64, 16, 32, 32)) == "instantiate"
    assert dp_step.layer_sizes(nn.Conv2d(8, 12, 3, groups=4), (1, 8, 5, 5),
                               (1, 12, 3, 3)) == (9, 18, 3, 4)


# ------------------------------------------------------------ against Opacus, 30 steps

class Grouped(nn.Module):
    """Grouped, dilated and strided convolutions, a 1-d one and GroupNorm with affine."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, stride=2, padding=2, dilation=2)
        self.b = nn.Conv2d(8, 8, 3, groups=4, padding=1, padding_mode="zeros")
        self.norm = nn.GroupNorm(2, 8)
        self.c = nn.Conv1d(8, 6, 2, stride=3)
        self.fc = nn.Linear(6 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.b(torch.relu(self.a(x)))))
        h = self.c(h.flatten(2)[..., :10])
        return self.fc(h.flatten(1))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, route: str,
           steps: int = 30) -> nn.Module:
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(7)
    kw = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": len(x),
          "loss_reduction": "mean", "generator": gen}
    if route == "opacus":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        run, dpo = GradSampleModule(model, loss_reduction="mean"), DPOptimizer(opt, **kw)
        for _ in range(steps):
            dpo.zero_grad(set_to_none=True)
            F.cross_entropy(run(x), y).backward()
            dpo.step()
        return model
    with dp_step.BookKeeping(model, opt, method=route, **kw) as dp:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            dp.backward(F.cross_entropy(model(x), y))
            opt.step()
    return model


@needs_opacus
@pytest.mark.parametrize("net", ["resnet8", "grouped"])
def test_thirty_steps_equal_opacus_hooks(net: str) -> None:
    torch.manual_seed(0)
    if net == "resnet8":
        model = dpsgd.ResNet8().double()
        x, y = dpsgd.data(8, size=16, dtype=torch.float64)
    else:
        model = Grouped().double()
        x = torch.randn(6, 3, 11, 11, dtype=torch.float64)
        y = torch.randint(0, 10, (6,))
    want = _train(model, x, y, "opacus")
    for route in ("auto", *dp_step.METHODS):
        got = _train(model, x, y, route)
        for (k, p), q in zip(got.named_parameters(), want.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-10, msg=f"{route} {k}")
    moved = max((p - q).abs().max().item()
                for p, q in zip(want.parameters(), model.parameters(), strict=True))
    assert moved > 1e-3  # the runs trained: equality is not two untouched models


@needs_opacus  # secure mode: opacus before 1.6 sums the draws in float32
def test_noise_is_opacus_draws_in_the_optimizer_order() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 2).double()
    opt = torch.optim.SGD([net.bias, net.weight], lr=1.0)  # bias first
    for secure in (False, True):
        gen = torch.Generator().manual_seed(3)
        with dp_step.BookKeeping(net, opt, noise_multiplier=2.0, max_grad_norm=0.5,
                                 loss_reduction="sum", generator=gen,
                                 secure_mode=secure) as dp:
            x = torch.zeros(4, 3, dtype=torch.float64)
            dp.backward(net(x).sum() * 0)  # zero gradients: p.grad is the noise
        gen = torch.Generator().manual_seed(3)
        if secure:
            from opacus.optimizers.optimizer import _generate_noise
            want = [_generate_noise(1.0, p, gen, secure_mode=True)
                    for p in (net.bias, net.weight)]
        else:
            want = [torch.normal(0, 1.0, p.shape, generator=gen, dtype=p.dtype)
                    for p in (net.bias, net.weight)]
        torch.testing.assert_close(net.bias.grad, want[0], rtol=0, atol=0)
        torch.testing.assert_close(net.weight.grad, want[1], rtol=0, atol=0)


def test_per_sample_loss_vector_equals_the_summed_loss() -> None:
    torch.manual_seed(4)
    net = nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(), nn.Linear(9, 2)).double()
    x, y = torch.randn(5, 2, 5, dtype=torch.float64), torch.randint(0, 2, (5,))
    results = []
    for per_sample in (True, False):
        m = copy.deepcopy(net)
        with dp_step.BookKeeping(m, noise_multiplier=0.0, max_grad_norm=0.1,
                                 loss_reduction="sum") as dp:
            loss = F.cross_entropy(m(x), y, reduction="none" if per_sample else "sum")
            results.append((dp.backward(loss), [p.grad for p in m.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], **TIGHT)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def test_dp_sgd_step_function_removes_its_hooks() -> None:
    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(4, 1, 4, 4), torch.randint(0, 3, (4,))
    before = [p.detach().clone() for p in net.parameters()]
    norms = dp_step.dp_sgd_step(net, opt, F.cross_entropy, x, y, noise_multiplier=1.0,
                                max_grad_norm=1.0)
    assert norms.shape == (4,) and bool((norms > 0).all())
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert not any(m._forward_hooks for m in net.modules())


def test_empty_batch_gives_noise_only() -> None:
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4, 3)).double()
    with dp_step.BookKeeping(net, noise_multiplier=0.0, max_grad_norm=1.0,
                             expected_batch_size=4) as dp:
        norms = dp.backward(F.cross_entropy(net(torch.zeros(0, 1, 4, 4, dtype=torch.float64)),
                                            torch.zeros(0, dtype=torch.long), reduction="sum"))
    assert norms.shape == (0,)
    assert all(bool((p.grad == 0).all()) for p in net.parameters())


# ------------------------------------------------------------ refusals

def test_refuses_a_layer_it_does_not_compute_by_name() -> None:
    for layer, kind in [(nn.BatchNorm2d(3), "BatchNorm2d"),
                        (nn.ConvTranspose2d(3, 3, 3), "ConvTranspose2d")]:
        net = nn.Sequential(nn.Conv2d(3, 3, 3), layer)
        with pytest.raises(TypeError, match=rf"'1'.*{kind}"):
            dp_step.BookKeeping(net, noise_multiplier=1.0, max_grad_norm=1.0)
    net[1].requires_grad_(False)  # frozen: nothing to compute there
    dp_step.BookKeeping(net, noise_multiplier=1.0, max_grad_norm=1.0).close()


def test_refuses_a_parameter_shared_by_two_layers() -> None:
    net = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    net[1].weight = net[0].weight
    with pytest.raises(ValueError, match="shared by modules '0' and '1'"):
        dp_step.BookKeeping(net, noise_multiplier=1.0, max_grad_norm=1.0)
    same = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="shared by modules '0' and '1'"):
        dp_step.BookKeeping(nn.Sequential(same, same), noise_multiplier=1.0,
                            max_grad_norm=1.0)


def test_refuses_a_layer_whose_batch_is_not_the_batch() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.side = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.side(torch.ones(1, 3))  # one row for every sample

    net = Shared()
    with dp_step.BookKeeping(net, noise_multiplier=1.0, max_grad_norm=1.0) as dp:
        with pytest.raises(ValueError, match="'side'.*batch of 1.*4 samples"):
            dp.backward(net(torch.randn(4, 3)).sum())


def test_refuses_a_layer_run_twice_and_a_backward_without_forward() -> None:
    layer = nn.Linear(3, 3)
    dp = dp_step.BookKeeping(layer, noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="no layer's forward"):
        dp.backward(torch.zeros((), requires_grad=True))
    with pytest.raises(ValueError, match="ran 2 times"):
        dp.backward(layer(layer(torch.randn(2, 3))).sum())
    with torch.no_grad():
        layer(torch.randn(2, 3))  # not captured
    with pytest.raises(ValueError, match="no layer's forward"):
        dp.backward(torch.zeros((), requires_grad=True))
    with pytest.raises(ValueError, match="per-sample losses"):
        dp.backward(layer(torch.randn(2, 3)).sum(1).repeat(2))
    dp.close()


@pytest.mark.parametrize("kw, err, name", [
    ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier"),
    ({"noise_multiplier": "1"}, TypeError, "noise_multiplier"),
    ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm"),
    ({"max_grad_norm": float("inf")}, ValueError, "max_grad_norm"),
    ({"expected_batch_size": 0}, ValueError, "expected_batch_size"),
    ({"loss_reduction": "none"}, ValueError, "loss_reduction"),
    ({"method": "fast"}, ValueError, "method"),
])
def test_bad_arguments_name_themselves(kw: dict, err: type, name: str) -> None:
    args = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, **kw}
    with pytest.raises(err, match=name):
        dp_step.BookKeeping(nn.Linear(2, 2), **args)
    with pytest.raises(TypeError, match="model"):
        dp_step.BookKeeping(object(), noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="not model's"):
        dp_step.BookKeeping(nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(),
                                                             lr=1.0),
                            noise_multiplier=1.0, max_grad_norm=1.0)


class FromBuffer(nn.Module):
    """A linear layer fed by a buffer, repeated per sample (no model input upstream),
    and an in-place ReLU after a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(3 * 9, 4)
        self.side = nn.Linear(5, 4)
        self.register_buffer("code", torch.randn(1, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.conv(x)).flatten(1)
        return self.fc(h) * self.side(self.code.expand(len(x), 5))


def test_a_layer_fed_by_a_buffer_and_an_inplace_relu() -> None:
    torch.manual_seed(6)
    for method in dp_step.METHODS:
        check(FromBuffer(), torch.randn(3, 2, 5, 5, dtype=torch.float64), method)


def test_a_plain_backward_in_between_is_refused_then_forgotten() -> None:
    torch.manual_seed(7)
    net = nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(), nn.Linear(9, 2)).double()
    x = torch.randn(4, 2, 5, dtype=torch.float64)
    with dp_step.BookKeeping(net, noise_multiplier=0.0, max_grad_norm=1e30,
                             loss_reduction="sum") as dp:
        net(x).sum().backward()  # hooks fire outside dp.backward and must do nothing
        with pytest.raises(ValueError, match="ran 2 times since the last backward"):
            dp.backward(net(x).sum())
        net.zero_grad()
        norms, _ = bk_norms(net, x, torch.zeros(4, 2, dtype=torch.float64), "auto")
    torch.testing.assert_close(norms, func_norms(net, x, torch.zeros(4, 2,
                                                                     dtype=torch.float64)),
                               **TIGHT)


def test_memory_holds_no_activation_past_its_layer() -> None:
    """After the backward, only the ghost layers keep an activation (for their clipped
    sum); instantiated layers keep their per-sample gradients only."""
    torch.manual_seed(8)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(3 * 9, 2))
    with dp_step.BookKeeping(net, noise_multiplier=0.0, max_grad_norm=1.0) as dp:
        out = net(torch.randn(4, 2, 5, 5))
        assert all(len(s.inputs) == 1 for s in dp._seen.values())
        seen = dict(dp._seen)
        dp.backward(out.sum())
    assert all(not s.inputs for s in seen.values())
    conv_share = seen[net[0]].share
    assert conv_share.method == "instantiate" and conv_share.a is None
    assert conv_share.g is None


@pytest.mark.parametrize("mode", ["zeros", "circular"])
def test_a_wide_conv_keeps_norms_and_sums_by_one_weight_gradient(mode: str) -> None:
    """N weight-sized gradients larger than the activations: the norms are kept and the
    clipped sum is one weight gradient (the branch ResNet-8's last block takes)."""
    torch.manual_seed(9)
    layer = nn.Conv2d(16, 16, 3, padding=1, padding_mode=mode)
    x = torch.randn(3, 16, 2, 2, dtype=torch.float64)
    share = dp_step.LayerShare(layer.double(), x, torch.randn(3, 16, 2, 2,
                                                              dtype=torch.float64),
                               "instantiate")
    assert layer.weight not in share.samples  # the branch was taken
    check(layer, x, "instantiate")
