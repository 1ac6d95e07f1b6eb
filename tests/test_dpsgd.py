"""DP-SGD as users run it (convlab.lab.sections.dpsgd): per-sample gradients of Opacus, Opacus with
convlab's conv grad sampler and BackPACK agree in float64, and so do their whole steps."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from convlab import opacus_sampler
from convlab.lab.sections import dpsgd

# Opacus and BackPACK are pinned in requirements.txt with this torch: with the pinned torch
# (make test) a missing one fails here. make compat runs other torch versions, where they
# may not install (Opacus 1.6 needs torch >= 2.6): there this file is skipped.
PIN = next(line.split("==")[1] for line in
           (Path(__file__).parents[1] / "requirements.txt").read_text().splitlines()
           if line.startswith("torch=="))
if torch.__version__.split("+")[0] != PIN and dpsgd.missing():
    pytest.skip(f"Opacus and BackPACK are pinned with torch {PIN} only; here "
                f"{'; '.join(dpsgd.missing())}", allow_module_level=True)
from opacus.grad_sample.grad_sample_module import GradSampleHooks  # noqa: E402

SOURCES = ("Opacus", "Opacus + convlab", "BackPACK")


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure RNG and old hooks
        yield


def small(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = dpsgd.ResNet8(width=4).double()
    x, y = dpsgd.data(5, size=12, dtype=torch.float64, seed=seed)
    return model, x, y


@pytest.mark.parametrize("seed", [0, 1])
def test_per_sample_gradients_agree(seed) -> None:
    model, x, y = small(seed)
    grads = {s: dpsgd.per_sample_grads(s, model, x, y) for s in SOURCES}
    names = [k for k, _ in model.named_parameters()]
    loss = nn.CrossEntropyLoss(reduction="sum")(model(x), y)
    total = dict(zip(names, torch.autograd.grad(loss, list(model.parameters())), strict=True))
    for source, got in grads.items():
        assert sorted(got) == sorted(names), source
        for name in names:
            assert got[name].shape == (len(x), *total[name].shape), (source, name)
            torch.testing.assert_close(got[name], grads["Opacus"][name], rtol=1e-10,
                                       atol=1e-12, msg=f"{source} {name}")
            torch.testing.assert_close(got[name].sum(0), total[name], rtol=1e-10,
                                       atol=1e-12, msg=f"{source} {name} summed")


def test_convlab_sampler_is_used_and_restored(monkeypatch) -> None:
    model, x, y = small()
    before = dict(GradSampleHooks.GRAD_SAMPLERS)
    calls = []
    real = opacus_sampler.grad_sampler

    def spy(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(opacus_sampler, "grad_sampler", spy)
    dpsgd.per_sample_grads("Opacus + convlab", model, x, y)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(calls) == len(convs) == 9
    assert GradSampleHooks.GRAD_SAMPLERS == before  # every conv type's entry back


def test_dp_steps_agree_without_noise() -> None:
    model, x, y = small()
    after = {}
    for name in dpsgd.STEPS:
        # clip 0.05: small, so clipping changes the update (the last assert checks it)
        step, wrapped, around = dpsgd.make_step(name, model, len(x), sigma=0.0, clip=0.05)
        with around():
            step(x, y)
        after[name] = torch.cat([p.detach().flatten() for p in wrapped.parameters()])
    for name in dpsgd.STEPS[1:]:
        torch.testing.assert_close(after[name], after["Opacus hooks"], rtol=1e-10,
                                   atol=1e-12, msg=name)
    assert not torch.allclose(after["SGD (no privacy)"], after["Opacus hooks"])


def test_noise_has_the_set_scale() -> None:
    model, x, y = small()
    moved = {}
    for sigma in (0.0, 1.0):
        step, wrapped, around = dpsgd.make_step("BackPACK BatchGrad", model, len(x),
                                                sigma=sigma, clip=0.05, lr=1.0)
        step(x, y)
        moved[sigma] = torch.cat([p.detach().flatten() for p in wrapped.parameters()])
    # lr 1: the difference is the noise / N, standard deviation sigma * clip / N = 0.01.
    std = (moved[1.0] - moved[0.0]).std().item()
    assert 0.008 < std < 0.012


def test_bad_names() -> None:
    model, x, y = small()
    with pytest.raises(ValueError, match="name must be one of .*got 'Opacus'"):
        dpsgd.make_step("Opacus", model, 4)
    with pytest.raises(ValueError, match="name must be Opacus, Opacus \\+ convlab or BackPACK"):
        dpsgd.per_sample_grads("vmap", model, x, y)


def test_record_quick_structure(monkeypatch) -> None:
    from convlab.lab.record import record_schema

    before = torch.get_num_threads()
    rec = dpsgd.record(quick=True)
    assert torch.get_num_threads() == before
    assert rec["peers"]["opacus"] == "1.6.0" and rec["peers"]["backpack-for-pytorch"]
    (run,) = rec["runs"]
    assert list(run["steps"]) == [*dpsgd.STEPS, dpsgd.AA]
    assert run["steps"]["Opacus hooks"]["ratio_vs_opacus"] == 1.0
    assert run["steps"]["SGD (no privacy)"]["ratio_vs_sgd"] == 1.0
    assert run["aa_band"] >= 0 and len(run["steps"][dpsgd.AA]["round_ratios_vs_sgd"]) == 3
    bk = run["steps"]["convlab book-keeping"]
    assert bk["target_verdict"] in ("holds", "does not hold", "inconclusive")
    assert bk["process_ratios_vs_sgd"] == [bk["ratio_vs_sgd"]]
    assert all(row["peak_mb"] > 0 for row in run["steps"].values())
    assert record_schema._dpsgd_problems(rec) == []
    monkeypatch.setattr(dpsgd, "NEEDS", {"BackPACK": "no_such_module_here"})
    row = dpsgd.compare(2, 1, quick=True)["steps"]["BackPACK BatchGrad"]
    assert row == {"skipped": "no_such_module_here not installed"}


def test_an_old_opacus_counts_as_missing(monkeypatch) -> None:
    """Opacus 1.5 installs on torch 2.4 but lacks GradSampleHooks: not usable here."""
    real = dpsgd.importlib.metadata.version
    monkeypatch.setattr(dpsgd.importlib.metadata, "version",
                        lambda dist: "1.5.2" if dist == "opacus" else real(dist))
    assert dpsgd.missing() == ["opacus 1.5.2 is older than 1.6"]


def test_target_verdict_needs_the_noise_to_clear_the_target() -> None:
    assert dpsgd.target_verdict(1.1, 0.1) == "holds"  # 1.21 <= 1.3
    assert dpsgd.target_verdict(1.1, 0.1, spread=0.25) == "inconclusive"
    assert dpsgd.target_verdict(1.5, 0.1) == "does not hold"  # 1.36 > 1.3
    assert dpsgd.target_verdict(1.35, 0.1) == "inconclusive"
    assert dpsgd.target_verdict(1.2, 0.0, target=1.1) == "does not hold"


def test_process_ratios_run_in_fresh_processes() -> None:
    ratios = dpsgd.process_ratios(4, 1, processes=1, quick=True)
    assert len(ratios) == 1 and 0 < ratios[0] < 100
