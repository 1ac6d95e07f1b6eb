"""The one argument behaviour of every ``convlab`` command, and shared argument types.

A usage error (an unknown option, a missing or malformed value) and a value a command
refuses after parsing are both one line on stderr, ``convlab CMD: error: ...``, and exit
status 2. :func:`parse` gives any ``ArgumentParser`` that behaviour (the dispatcher parses
every command's arguments with it before the command runs); :class:`Parser` has it built
in; :func:`refuse` prints a refused value. The types turn a bad value into an
``argparse.ArgumentTypeError`` naming what was expected; shapes and hyper-parameters are
then validated by ``ConvParams``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

import torch

DTYPES = ("float32", "float64", "bfloat16", "float16")
USAGE_ERROR = 2


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    text = message.strip().splitlines()[0] if message.strip() else "bad arguments"
    parser.exit(USAGE_ERROR, f"{parser.prog}: error: {text}\n")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        _usage_error(self, message)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with one-line usage errors (SystemExit 2), whatever the
    parser's class: the behaviour does not depend on how a command built its parser."""
    parser.error = lambda message: _usage_error(parser, message)  # type: ignore[method-assign]
    return parser.parse_args(list(argv) if argv is not None else None)


def refuse(prog: str, error: BaseException | str) -> int:
    """Print a refused value as one line (``prog: error: ...``); return exit status 2."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    print(f"{prog}: error: {line}", file=sys.stderr)
    return USAGE_ERROR


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


def integer(text: str) -> int:
    """An int (range checks are the command's, with the option's name)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None


def number(text: str) -> float:
    """A float (``inf`` and ``nan`` parse; range checks are the command's)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def folder(text: str) -> str:
    """A folder to write into; the empty name (which would mean the current folder) is
    refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a folder name, got {text!r} (use . for the current folder)")
    return text


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
    ap.add_argument("--groups", type=integer, default=1)
    ap.add_argument("--transposed", action="store_true", help="a transposed convolution")
    ap.add_argument("--no-bias", action="store_true", help="no bias tensor")
    ap.add_argument("--dtype", type=dtype, default=torch.float32)
    ap.add_argument("--channels-last", action="store_true", help="channels_last memory format")
