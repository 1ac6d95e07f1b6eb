"""Chapter 9's memory claims: does a per-sample route's memory depend on the ISA, and
does the C++ loop's grow with the batch?"""

from __future__ import annotations

from convlab.lab.claims.core import Claim, Outcome, cannot, verdict
from convlab.lab.claims.probe import LOW_ISA_ENV, at_level_of, facts_under, randn
from convlab.scratch.per_sample import per_sample_weight_grad

# Chapter 9's layer: N=8, 16->32, 32x32, 3x3.
LAYER = (8, 16, 32, 32, 3)


def per_sample_peaks() -> dict[str, float]:
    """route -> peak MiB allocated by one call of that per-sample route on ``LAYER``."""
    from convlab.lab.method.profiling import measure_memory

    n, c_in, c_out, size, k = LAYER
    x, go = randn(n, c_in, size, size), randn(n, c_out, size, size, seed=2)
    found = {}
    for method in ("grouped", "im2col"):
        def fn(m: str = method) -> object:
            return per_sample_weight_grad(x, (c_out, c_in, k, k), go, 1, k // 2, method=m)

        found[method] = round(measure_memory(fn, "cpu")[0] / 2**20, 3)
    return found


def _compare(routes: tuple[str, ...]) -> Outcome:
    same = at_level_of(LOW_ISA_ENV)
    if same:
        return cannot(same)
    here = per_sample_peaks()
    low = facts_under(LOW_ISA_ENV)["memory"]
    text = ", ".join(f"{r} {here[r]:.2f} vs {low[r]:.2f}" for r in routes)
    same = all(here[r] == low[r] for r in routes)
    return verdict(same, f"peak MiB here vs SSE4.1 cap: {text}", here=here, sse41=low)


def check_im2col_memory_independent_of_isa() -> Outcome:
    """The im2col route allocates the same peak here and under the SSE4.1 cap."""
    return _compare(("im2col",))


def check_loop_memory_is_its_result() -> Outcome:
    """The loop route's peak allocation is its result plus per-thread buffers whose size
    does not depend on the batch: the extra is the same at N and 4 N, N the larger of 8
    and the thread count (so that every thread has a sample to work on at both)."""
    import torch

    from convlab.aten.fast_per_sample import per_sample_weight_grad as fast
    from convlab.lab.method.profiling import measure_memory

    _, c_in, c_out, size, k = LAYER
    small = max(8, torch.get_num_threads())
    extra = {}
    for n in (small, 4 * small):
        x, go = randn(n, c_in, size, size), randn(n, c_out, size, size, seed=2)

        def fn(x: torch.Tensor = x, go: torch.Tensor = go) -> object:
            return fast(x, (c_out, c_in, k, k), go, 1, k // 2, method="loop")

        result = n * c_out * c_in * k * k * x.element_size()
        fn()  # the first call in a process also sets up the library (once)
        extra[n] = (measure_memory(fn, "cpu")[0] - result) / 2**20
    low, high = extra[small], extra[4 * small]
    # measure_memory adds Python's own peak (tracemalloc), which moves by a few hundred
    # bytes from call to call: "the same" is within 10 KiB
    return verdict(abs(low - high) < 10 / 1024 and low >= 0,
                   f"loop, {torch.get_num_threads()} thread(s): MiB beyond the result "
                   f"{low:.3f} at N = {small}, {high:.3f} at N = {4 * small}",
                   extra_mib={str(n): v for n, v in extra.items()})


CLAIMS: tuple[Claim, ...] = (
    Claim("ch9_im2col_memory_independent_of_isa", 9,
          "convlab's im2col route allocates the same peak under every instruction set.",
          "ATen's im2col and the BLAS allocate through torch whatever the ISA; a process "
          "above the SSE4.1 setting's level (at it, the setting would be compared with "
          "itself)", check_im2col_memory_independent_of_isa),
    Claim("ch9_loop_memory_is_its_result", 9,
          "Beyond its result the loop holds only its per-thread buffers, whose size does not "
          "grow with the batch.",
          "convlab's C++ loop allocates its buffers once per thread through torch",
          check_loop_memory_is_its_result),
)
