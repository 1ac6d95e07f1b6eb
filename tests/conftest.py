"""Shared pytest configuration: hypothesis profile, CUDA skipping, determinism."""

from __future__ import annotations

import os

import pytest
import torch

try:  # optional so that `make gpu-check` can run the non-hypothesis tests without it
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - the pinned environment always has it
    settings = None

if settings is not None:
    settings.register_profile(
        "convlab",
        deadline=None,
        max_examples=int(os.environ.get("CONVLAB_HYPOTHESIS_EXAMPLES", "40")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,
    )
    settings.load_profile("convlab")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``cuda`` when no CUDA device is present (CI has none)."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def devices() -> list[pytest.param]:
    """``cpu`` always, ``cuda`` as a param marked ``cuda`` (skipped without a GPU)."""
    return [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
