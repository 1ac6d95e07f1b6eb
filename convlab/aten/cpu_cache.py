"""The CPU's level-2 data cache size, read from Linux sysfs: what a column chunk should fit.

``/sys/devices/system/cpu/cpu0/cache/index*/`` has one folder per cache of CPU 0, each with
``level`` (1, 2, 3), ``type`` (``Data``, ``Instruction``, ``Unified``) and ``size``
(``2048K``). The L2 size is per core on current x86 and Arm server parts, and it is the
cache a GEMM that reads columns just written by an im2col hits when the columns fit.

Why not a constant: L2 differs by a factor of eight across the machines this book runs on
(256 KiB on older desktop cores, 1-2 MiB on server cores, 4 MiB on some), so a chunk sized
for one machine either spills or wastes GEMM size on another.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["FALLBACK_BYTES", "SYSFS_CACHE", "l2_cache_bytes", "parse_size"]

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# When sysfs has no L2 entry (macOS, Windows, some containers): 1 MiB, a common server L2.
FALLBACK_BYTES = 2**20
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """``"2048K"`` -> 2097152 bytes; sysfs writes K/M/G suffixes (powers of 1024).

    >>> parse_size("48K"), parse_size("2M"), parse_size("512")
    (49152, 2097152, 512)
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    s = text.strip().upper().removesuffix("B")
    unit = s[-1:] if s[-1:] in ("K", "M", "G") else ""
    number = s[: len(s) - len(unit)]
    if not number.isdigit():
        raise ValueError(f"text: not a cache size like '2048K', got {text!r}")
    return int(number) * _UNITS[unit]


@functools.lru_cache(maxsize=8)
def l2_cache_bytes(root: Path | str = SYSFS_CACHE, fallback: int = FALLBACK_BYTES) -> int:
    """Size in bytes of CPU 0's level-2 data (or unified) cache, from ``root/index*/``.

    Returns ``fallback`` when ``root`` does not exist or lists no readable level-2 data or
    unified cache (an instruction cache never counts). Read once per ``root`` and cached:
    a backward asks on every call, and a dozen sysfs reads cost about as much as a small
    layer's GEMM.
    """
    if not isinstance(fallback, int) or fallback <= 0:
        raise ValueError(f"fallback must be a positive int, got {fallback!r}")
    root = Path(root)
    if not root.is_dir():
        return fallback
    for entry in sorted(root.glob("index*")):
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = parse_size((entry / "size").read_text())
        except (OSError, ValueError):
            continue
        if level == "2" and kind in ("Data", "Unified") and size > 0:
            return size
    return fallback
