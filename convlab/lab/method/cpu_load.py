"""How busy the machine was while a section ran: load average, steal time and the CPU time
other processes took, from Linux's ``/proc/stat`` and ``os.getloadavg``.

A timing taken while other jobs held the cores (or the hypervisor gave them to another
guest: *steal*) measures the contention as much as the kernels. :func:`between` turns two
:func:`snapshot` readings into the fractions a record stores per section, and flags the
section as not quiet when either fraction is above its limit, so that a chapter can say
so instead of rendering the numbers as a quiet result.

>>> a = snapshot()
>>> sum(range(10**5)) > 0
True
>>> sorted(between(a, snapshot()))
['load_after', 'load_before', 'others', 'quiet', 'seconds', 'steal', 'why']
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAT = Path("/proc/stat")
# Above these fractions a section is flagged as not taken on a quiet machine. Steal: the
# hypervisor ran another guest on our cores for more than 5 % of the section's core-seconds
# (a 2-core VM at rest shows well under 1 %). Others: processes other than this one (and
# its children) used more than 10 % of the machine's core-seconds; the records' own runner
# and a shell stay far below that, a compile or a second benchmark does not.
STEAL_LIMIT = 0.05
OTHERS_LIMIT = 0.10


@dataclass(frozen=True)
class Snapshot:
    """One reading: wall clock, the machine's busy and steal jiffies summed over every CPU
    (None off Linux), this process's CPU seconds (children included) and the load average."""

    wall: float
    busy_jiffies: int | None
    steal_jiffies: int | None
    own_cpu_s: float
    load: tuple[float, float, float] | None


def _stat_cpu(path: Path = STAT) -> tuple[int, int] | None:
    """(busy, steal) jiffies from the aggregate ``cpu`` line of ``/proc/stat``: busy is
    every field but idle and iowait; guest time is already counted in user and nice."""
    try:
        line = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = line.split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return user + nice + system + irq + softirq, steal


def snapshot(path: Path = STAT) -> Snapshot:
    """Read the machine's counters now (``path``: the ``/proc/stat`` to read)."""
    times = os.times()
    stat = _stat_cpu(path)
    try:
        load = tuple(round(v, 2) for v in os.getloadavg())
    except OSError:
        load = None
    return Snapshot(wall=time.perf_counter(), busy_jiffies=None if stat is None else stat[0],
                    steal_jiffies=None if stat is None else stat[1],
                    own_cpu_s=times.user + times.system + times.children_user
                    + times.children_system, load=load)  # type: ignore[arg-type]


def between(a: Snapshot, b: Snapshot, cores: int | None = None,
            hz: int | None = None) -> dict[str, Any]:
    """What happened between readings ``a`` and ``b``: ``steal`` and ``others`` as
    fractions of the machine's core-seconds (None where ``/proc/stat`` could not be read),
    the load averages, and ``quiet`` with ``why`` (empty when quiet). ``cores`` and ``hz``
    default to ``os.cpu_count()`` and the kernel's clock ticks per second."""
    if not isinstance(a, Snapshot) or not isinstance(b, Snapshot):
        raise TypeError("a and b must be Snapshot readings from snapshot()")
    cores = (os.cpu_count() or 1) if cores is None else cores
    hz = os.sysconf("SC_CLK_TCK") if hz is None else hz
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive int, got {cores!r}")
    if isinstance(hz, bool) or not isinstance(hz, int) or hz < 1:
        raise ValueError(f"hz must be a positive int, got {hz!r}")
    seconds = b.wall - a.wall
    capacity = seconds * cores
    steal = others = None
    if (a.busy_jiffies is not None and b.busy_jiffies is not None and capacity > 0
            and a.steal_jiffies is not None and b.steal_jiffies is not None):
        steal = max(0.0, (b.steal_jiffies - a.steal_jiffies) / hz / capacity)
        busy = (b.busy_jiffies - a.busy_jiffies) / hz
        others = max(0.0, (busy - (b.own_cpu_s - a.own_cpu_s)) / capacity)
    why = []
    if steal is not None and steal > STEAL_LIMIT:
        why.append(f"steal {steal:.0%} of the core-seconds (limit {STEAL_LIMIT:.0%})")
    if others is not None and others > OTHERS_LIMIT:
        why.append(f"other processes used {others:.0%} of the core-seconds "
                   f"(limit {OTHERS_LIMIT:.0%})")
    return {"seconds": round(seconds, 1),
            "steal": None if steal is None else round(steal, 4),
            "others": None if others is None else round(others, 4),
            "load_before": None if a.load is None else list(a.load),
            "load_after": None if b.load is None else list(b.load),
            "quiet": not why, "why": "; ".join(why)}
