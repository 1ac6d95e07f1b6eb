"""``convlab trace``: the ATen ops (and conv backend) of one convolution's forward+backward.

The recording is :mod:`convlab.aten.dispatch`; ``--kernels`` traces the C++ functions the
backward entered under gdb (:mod:`convlab.aten.kernels`).
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence

import torch

from convlab.cli.args import Parser, add_conv_arguments, check_device, parse, refuse


def build_parser() -> argparse.ArgumentParser:
    """The ``convlab trace`` argument parser."""
    from convlab.aten.backends import BACKEND_CHOICES

    ap = Parser(
        prog="convlab trace",
        description="Trace the ATen ops (and the conv backend ATen selects) of one "
        "convolution's forward and backward.",
    )
    add_conv_arguments(ap, {"input": "8,64,56,56", "weight": "64,64,3,3", "padding": "1"})
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", choices=BACKEND_CHOICES, help="force a backend (use_backend)")
    ap.add_argument("--profile", action="store_true",
                    help="also print the profiler's nested op names")
    ap.add_argument("--kernels", action="store_true",
                    help="trace the C++ functions the backward ran, under gdb "
                    "(convlab.aten.kernels)")
    return ap


def case_from_args(args: argparse.Namespace):  # -> kernels.ConvCase
    """A ``kernels.ConvCase`` from parsed arguments (one value per hyper-parameter), with
    every option of the layer (output padding and channels_last included)."""
    from convlab.aten.kernels import ConvCase

    def one(values: Sequence[int], name: str) -> int:
        if len(set(values)) != 1:
            raise ValueError(f"--kernels takes one value for --{name}, got {list(values)}")
        return int(values[0])

    backend = getattr(args, "backend", None)
    disable = {None: (), "mkldnn": (), "slow": ("mkldnn", "nnpack"), "nnpack": ("mkldnn",)}
    if backend not in disable:
        raise ValueError(f"--kernels traces CPU backends only, got --backend {backend}")
    if getattr(args, "device", "cpu") != "cpu":
        raise ValueError("--kernels traces CPU tensors only")
    return ConvCase(
        label="trace", input_shape=tuple(args.input), weight_shape=tuple(args.weight),
        dtype=str(args.dtype).removeprefix("torch."), stride=one(args.stride, "stride"),
        padding=one(args.padding, "padding"), dilation=one(args.dilation, "dilation"),
        transposed=bool(args.transposed),
        output_padding=one(getattr(args, "output_padding", [0]), "output-padding"),
        groups=int(args.groups), bias=not args.no_bias,
        channels_last=bool(getattr(args, "channels_last", False)), disable=disable[backend],
    )


def kernels_main(args: argparse.Namespace) -> int:
    """``convlab trace --kernels``: print the backend and the backward's call path."""
    from convlab.aten.kernels import trace_kernels

    try:
        case = case_from_args(args)
        (trace,) = trace_kernels([case])
    except (TypeError, ValueError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return refuse("convlab trace --kernels", exc)
    print(f"backend: {trace.backend}")
    print(f"backward ran: {trace.path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab trace [options]``: print the op trace of one conv's forward and backward."""
    args = parse(build_parser(), argv)
    if args.kernels:
        return kernels_main(args)
    from convlab.aten.dispatch import format_tree, make_conv, profile_conv, trace_conv

    try:
        device = check_device(args.device)
        conv = make_conv(
            args.input, args.weight, not args.no_bias, args.stride, args.padding, args.dilation,
            args.transposed, args.output_padding, args.groups, args.dtype, device,
            args.channels_last,
        )
        rec = trace_conv(conv, args.backend)
        trees = profile_conv(conv, args.backend) if args.profile else None
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        return refuse("convlab trace", exc)
    kind = "conv_transpose" if args.transposed else "conv"
    print(f"{kind}{conv.params.dim}d  input {list(conv.input.shape)}  weight "
          f"{list(conv.weight.shape)}  bias {conv.bias is not None}  {args.dtype}  "
          f"{conv.input.device}")
    print(f"params: {conv.params}")
    print(f"flags: mkldnn={torch.backends.mkldnn.enabled} "
          f"nnpack={torch._C._get_nnpack_enabled()} cudnn={torch.backends.cudnn.enabled} "
          f"threads={torch.get_num_threads()}"
          + (f"  forced backend: {args.backend}" if args.backend else ""))
    print()
    print(rec.table())
    if trees is not None:
        for phase, rows in trees.items():
            print(f"\nprofiler, {phase}:")
            print(format_tree(rows))
    return 0
