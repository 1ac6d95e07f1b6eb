"""Chapter 9's memory claim: does a per-sample route's memory depend on the ISA?"""

from __future__ import annotations

from convlab.lab.claims.core import Claim, Outcome, verdict
from convlab.lab.claims.probe import LOW_ISA_ENV, facts_under, randn
from convlab.scratch.per_sample import per_sample_weight_grad

# Chapter 9's layer: N=8, 16->32, 32x32, 3x3.
LAYER = (8, 16, 32, 32, 3)


def per_sample_peaks() -> dict[str, float]:
    """route -> peak MiB allocated by one call of that per-sample route on ``LAYER``."""
    from convlab.lab.profiling import measure_memory

    n, c_in, c_out, size, k = LAYER
    x, go = randn(n, c_in, size, size), randn(n, c_out, size, size, seed=2)
    found = {}
    for method in ("grouped", "im2col"):
        def fn(m: str = method) -> object:
            return per_sample_weight_grad(x, (c_out, c_in, k, k), go, 1, k // 2, method=m)

        found[method] = round(measure_memory(fn, "cpu")[0] / 2**20, 3)
    return found


def _compare(routes: tuple[str, ...]) -> Outcome:
    here = per_sample_peaks()
    low = facts_under(LOW_ISA_ENV)["memory"]
    text = ", ".join(f"{r} {here[r]:.2f} vs {low[r]:.2f}" for r in routes)
    same = all(here[r] == low[r] for r in routes)
    return verdict(same, f"peak MiB here vs SSE4.1 cap: {text}", here=here, sse41=low)


def check_im2col_memory_independent_of_isa() -> Outcome:
    """The im2col route allocates the same peak here and under the SSE4.1 cap."""
    return _compare(("im2col",))


CLAIMS: tuple[Claim, ...] = (
    Claim("ch9_im2col_memory_independent_of_isa", 9,
          "The im2col route's memory does not depend on the ISA.",
          "ATen's im2col and the BLAS allocate through torch whatever the ISA",
          check_im2col_memory_independent_of_isa),
)
