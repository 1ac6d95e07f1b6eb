"""Shared setup and checks for the book's notebooks.

Every chapter calls :func:`setup` once so that printed outputs are the same on every
machine (nbval compares them): fixed seeds, print options, thread count and plot style,
and no library warnings that would print local paths into stderr.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import torch

THREADS = 2


def setup(seed: int = 0, threads: int = THREADS) -> None:
    """Seed every RNG, fix torch's print options and thread count, set the plot style.

    The thread count is fixed because oneDNN's reduction order (and so the last bits of
    grad_weight) depends on it.
    """
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds the legacy global RNG notebooks may use
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional outside the book
        return
    plt.rcParams.update(
        {
            "figure.figsize": (6.0, 3.2),
            "figure.dpi": 100,
            "axes.grid": False,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "font.size": 10,
            "image.cmap": "viridis",
        }
    )


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute element-wise difference (``0.0`` for empty tensors)."""
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected).to(actual.dtype)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {list(actual.shape)} vs {list(expected.shape)}")
    if actual.numel() == 0:
        return 0.0
    return (actual - expected).abs().max().item()


def check(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-10) -> None:
    """Assert ``actual`` matches ``expected`` within ``tol`` and print a stable one-line verdict.

    The printed line does not contain the (machine-dependent) difference itself, only the
    bound it satisfied, so stored notebook outputs stay reproducible.
    """
    diff = max_abs_diff(actual, expected)
    if not diff <= tol:
        raise AssertionError(f"{name}: max abs diff {diff:.3e} exceeds {tol:.0e}")
    print(f"{name}: match (max abs diff < {tol:.0e})")
