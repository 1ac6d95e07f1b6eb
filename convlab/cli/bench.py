"""``convlab bench``: options, argument checks and the printed report.

The measuring is :mod:`convlab.lab.bench`; this module only parses, checks every argument
before any work (a bad one: one line, exit 2), runs and prints. An interrupted run (Ctrl-C)
writes the layers it finished and exits with status 130.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence

from convlab.cli.args import Parser, folder, integer, number, parse, refuse

INTERRUPTED = 130
# The verdicts are sign tests over rounds: 20 rounds on one side already give p < 2e-6, and
# past that the A/A band, not the number of rounds, limits what a run can resolve. 100 rounds
# of the whole suite (11 layers x 5 passes x up to 8 paths) at the default 0.1 s blocks are
# up to 73 minutes of timed blocks; more rounds only cost time (a huge value never returns).
MAX_ROUNDS = 100
# A block's minimum time (torch.utils.benchmark's blocked_autorange); one minute is far more
# than any layer of the suite needs for a stable median.
MAX_MIN_RUN_TIME = 60.0


def names(text: str) -> list[str]:
    """A comma-separated option as a list of names (``""`` gives an empty list)."""
    return [item.strip() for item in text.split(",") if item.strip()]


# ---------------------------------------------------------------------------------- bench


def build_parser() -> argparse.ArgumentParser:
    """The options of ``convlab bench``, each value checked by its type where it can be."""
    from convlab.lab import bench, paths

    parser = Parser(
        prog="convlab bench",
        description="Time every convolution path (native, forced backends, convlab's own) "
        "side by side in interleaved rounds, with an A/A pair for the noise band; write CSV "
        "and JSON.",
        epilog=paths.FLOP_FORMULA + ". " + bench.MEMORY_METHOD + ".",
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"layers {','.join(paths.QUICK_LAYERS)}, passes backward and "
                        "forward_backward, no memory")
    parser.add_argument("--layers", type=names, help="comma-separated layer names (see --list)")
    parser.add_argument("--paths", type=names,
                        help=f"comma-separated, from {','.join(paths.PATH_NAMES)}")
    parser.add_argument("--passes", type=names,
                        help=f"comma-separated, from {','.join(paths.PASSES)}")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--threads", type=integer, default=None,
                        help="torch and NumPy BLAS threads (default: torch's current count)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    # 7 rounds: the sign test behind every verdict needs at least timing.MIN_ROUNDS (6).
    parser.add_argument("--rounds", type=integer, default=7,
                        help=f"interleaved rounds (7; at most {MAX_ROUNDS})")
    parser.add_argument("--min-run-time", type=number, default=0.1,
                        help="seconds per blocked_autorange block (0.1; at most "
                        f"{MAX_MIN_RUN_TIME:g})")
    parser.add_argument("--no-memory", action="store_true", help="skip memory measurements")
    parser.add_argument("--out", type=folder, default="bench-results",
                        help="output folder for CSV and JSON (created)")
    parser.add_argument("--list", action="store_true", help="list the suite's layers and exit")
    return parser


def _progress_printer(stream: object) -> Callable[[str], None]:
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [""]

    def show(message: str) -> None:
        if tty:
            print(f"\r{message:<78.78}", end="", file=stream, flush=True)
        elif message.split(" | ")[0] != last[0]:  # one line per layer in logs
            last[0] = message.split(" | ")[0]
            print(last[0], file=stream, flush=True)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab bench``: check the options, run, print tables and ratios, write files."""
    import torch

    from convlab.lab import bench, bench_report, paths

    args = parse(build_parser(), argv)
    if args.list:
        for layer in paths.SUITE:
            print(f"{layer.name:<11} {layer.describe():<44} {layer.note}")
        return 0
    layers = args.layers if args.layers is not None else (
        list(paths.QUICK_LAYERS) if args.quick else None)
    passes = args.passes if args.passes is not None else (
        ["backward", "forward_backward"] if args.quick else None)
    memory = not (args.no_memory or args.quick)
    try:  # every argument, before any work
        bench._resolve_layers(layers)
        bench._check_choice(args.paths, paths.PATH_NAMES, "paths")
        bench._check_choice(passes, paths.PASSES, "passes")
        device = bench.check_device(args.device)
        threads = bench.check_threads(torch.get_num_threads() if args.threads is None
                                      else args.threads)
        if not 1 <= args.rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds must be a positive int no larger than {MAX_ROUNDS}, "
                             f"got {args.rounds}")
        if not (math.isfinite(args.min_run_time) and 0 < args.min_run_time <= MAX_MIN_RUN_TIME):
            raise ValueError(f"min-run-time must be a finite number of seconds in (0, "
                             f"{MAX_MIN_RUN_TIME:g}], got {args.min_run_time}")
        bench_report.check_out_dir(args.out)
    except (ValueError, TypeError) as err:
        return refuse("convlab bench", err)
    report = bench_report.Report()
    start = time.perf_counter()
    status = 0
    try:
        bench.benchmark(layers, args.paths, passes, device, getattr(torch, args.dtype), threads,
                        args.rounds, args.min_run_time, memory=memory,
                        progress=_progress_printer(sys.stderr), report=report)
    except KeyboardInterrupt:
        status = INTERRUPTED
        report.meta["interrupted"] = True
    if sys.stderr.isatty():
        print(file=sys.stderr)
    _print_report(report, args.rounds, args.min_run_time, time.perf_counter() - start)
    csv_path, json_path = bench_report.write(report, args.out)
    if status:
        print(f"\ninterrupted: wrote the {len(report.results)} results finished so far to "
              f"{csv_path} and {json_path}")
    else:
        print(f"\nwrote {csv_path} and {json_path}")
    return status


def _print_report(report: object, rounds: int, min_run_time: float, seconds: float) -> None:
    from convlab.lab import bench_report

    meta = report.meta  # type: ignore[attr-defined]
    results = report.results  # type: ignore[attr-defined]
    print(f"convlab bench: torch {meta.get('torch')}, device {meta.get('device')}, "
          f"torch threads {meta.get('threads')}, {meta.get('numpy_blas_threads')}, "
          f"{meta.get('dtype')}; median of {rounds} interleaved rounds x "
          f"blocked_autorange({min_run_time:g} s), range = min-max over rounds "
          f"({seconds:.0f} s)")
    print(bench_report.format_table(results))
    for skip in report.skipped:  # type: ignore[attr-defined]
        print(f"skipped {skip.layer}/{skip.path}: {skip.reason}")
    rows = bench_report.comparisons(results)
    if rows:
        print("\nmeasured ratios (median of per-round ratios, min-max over rounds); A/A band "
              "= largest gap between the medians of native and its forced twin (same kernel) "
              "over the run's layers; slower/faster only outside it:")
        for pass_ in dict.fromkeys(r.pass_ for r in results):
            band = bench_report.run_band(results, pass_)
            if not math.isnan(band):
                print(f"  A/A band for {pass_}: {band:.0%}")
        for c in rows:
            print("  " + c.line())
    for line in bench_report.noise_warnings(results):
        print(line)
