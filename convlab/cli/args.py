"""Argument types shared by the commands that describe one convolution (trace, explain).

Each turns a bad value into an ``argparse.ArgumentTypeError`` (argparse prints one line and
exits 2); shapes and hyper-parameters are then validated by ``ConvParams``.
"""

from __future__ import annotations

import argparse

import torch

DTYPES = ("float32", "float64", "bfloat16", "float16")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_list(text: str) -> list[int]:
    """``"8,3,224,224"`` as ``[8, 3, 224, 224]``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints such as 8,64,56,56, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def dtype(text: str) -> torch.dtype:
    """A floating dtype by name (``float32``, ``bfloat16``, ...)."""
    value = getattr(torch, text, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise argparse.ArgumentTypeError(
            f"expected a floating dtype such as {', '.join(DTYPES)}, got {text!r}")
    return value


def check_device(text: str, allowed: tuple[str, ...] = ("cpu", "cuda")) -> str:
    """A device this process can run (``cuda`` only when ``torch.cuda.is_available()``).

    Raises ValueError with one clear line otherwise.
    """
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device: unknown device {text!r}") from None
    if device.type not in allowed:
        raise ValueError(f"--device must be one of {', '.join(allowed)}, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this torch build has no CUDA device available "
                         f"(torch {torch.__version__})")
    return str(device)


def add_conv_arguments(ap: argparse.ArgumentParser, defaults: dict[str, str]) -> None:
    """The options that describe one convolution layer."""
    ap.add_argument("--input", type=int_list, default=int_list(defaults["input"]),
                    help=f"input shape N,C,*spatial (default {defaults['input']})")
    ap.add_argument("--weight", type=int_list, default=int_list(defaults["weight"]),
                    help=f"weight shape (default {defaults['weight']})")
    ap.add_argument("--stride", type=int_list, default=[1])
    ap.add_argument("--padding", type=int_list, default=[int(defaults.get("padding", 0))])
    ap.add_argument("--dilation", type=int_list, default=[1])
    ap.add_argument("--output-padding", type=int_list, default=[0])
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--transposed", action="store_true", help="a transposed convolution")
    ap.add_argument("--no-bias", action="store_true", help="no bias tensor")
    ap.add_argument("--dtype", type=dtype, default=torch.float32)
    ap.add_argument("--channels-last", action="store_true", help="channels_last memory format")
