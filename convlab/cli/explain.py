"""``convlab explain``: which backend and C++ kernel one layer's backward uses, and why.

The answer is :func:`convlab.aten.explain.explain`; this module parses and checks the
options (a bad one: one line on stderr, exit 2) and prints. Imports are lazy so that the
command answers in well under a second.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from convlab.aten.conv_query import DEVICE_TYPES
from convlab.cli.args import Parser, add_conv_arguments, integer, parse, refuse


def build_parser() -> argparse.ArgumentParser:
    """The ``convlab explain`` argument parser."""
    ap = Parser(
        prog="convlab explain",
        description="Explain which convolution backend ATen selects for one layer's forward "
        "and backward, the terms that decided it, the smallest change that flips it, the "
        "backward kernel, its buffers and the autograd node. A device that is not here is "
        "answered from the rule (from source, not run).",
    )
    add_conv_arguments(ap, {"input": "8,64,56,56", "weight": "64,64,3,3", "padding": "1"})
    ap.add_argument("--device", default="cpu", choices=DEVICE_TYPES,
                    help="device type (default cpu); others are answered from the rule")
    ap.add_argument("--threads", type=integer, default=None,
                    help="intra-op threads to assume (default: torch's current count)")
    ap.add_argument("--no-mkldnn", action="store_true", help="torch.backends.mkldnn off")
    ap.add_argument("--no-nnpack", action="store_true", help="torch.backends.nnpack off")
    ap.add_argument("--no-cudnn", action="store_true", help="torch.backends.cudnn off")
    ap.add_argument("--kernels", action="store_true",
                    help="also trace the backward's C++ functions under gdb (CPU, seconds)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab explain [options]``: print the explanation; 2 on a bad argument."""
    args = parse(build_parser(), argv)
    from dataclasses import replace

    from convlab.aten.conv_query import ConvQuery, Environment
    from convlab.aten.explain import explain, format_explanation

    try:
        query = ConvQuery.create(
            args.input, args.weight, args.stride, args.padding, args.dilation,
            args.transposed, args.output_padding, args.groups, args.dtype, args.device,
            args.channels_last, not args.no_bias)
        env = Environment.current() if args.device == "cpu" else Environment.typical(
            args.device)
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be a positive int, got {args.threads}")
            env = replace(env, threads=args.threads)
        env = replace(env, mkldnn_enabled=env.mkldnn_enabled and not args.no_mkldnn,
                      nnpack_enabled=env.nnpack_enabled and not args.no_nnpack,
                      cudnn_enabled=env.cudnn_enabled and not args.no_cudnn)
        if args.kernels:
            return _with_kernels(query, env, args)
        result = explain(query, env)
    except (TypeError, ValueError, OverflowError) as exc:
        return refuse("convlab explain", exc)
    except RuntimeError as exc:  # torch failed on a valid layer: not a usage error
        refuse("convlab explain", exc)
        return 1
    print(format_explanation(result))
    return 0


def _with_kernels(query, env, args: argparse.Namespace) -> int:  # noqa: ANN001
    """``--kernels``: run the process with the asked flags, then trace under gdb."""
    import torch

    from convlab.aten.conv_query import Environment
    from convlab.aten.explain import explain, format_explanation

    if query.device != "cpu":
        raise ValueError("--kernels traces CPU layers only")
    saved = (torch._C._get_mkldnn_enabled(), torch._C._get_nnpack_enabled(),
             torch.get_num_threads())
    try:
        torch._C._set_mkldnn_enabled(env.mkldnn_enabled)
        torch._C._set_nnpack_enabled(env.nnpack_enabled)
        if env.threads != saved[2]:
            raise ValueError("--kernels traces with one thread; leave --threads out")
        result = explain(query, Environment.current(), kernels=True)
    finally:
        torch._C._set_mkldnn_enabled(saved[0])
        torch._C._set_nnpack_enabled(saved[1])
    print(format_explanation(result))
    return 0
