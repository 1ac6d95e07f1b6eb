"""The machine behind a measurement: CPU, instruction sets, oneDNN, BLAS, threads, torch.

Every stored measurement carries :func:`fingerprint`; :func:`fingerprint_line` is its
one-line summary. oneDNN's and MKL's choices are read from their own verbose lines
(:mod:`convlab.lab.method.verbose_probes`). Both libraries fix their instruction set at start-up
(``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY`` cap it downwards), so a fresh process
is needed to see another one (the settings of :mod:`convlab.lab.method.isa_settings`, run by
:mod:`convlab.lab.record.runner`).

>>> fp = fingerprint()                                      # doctest: +SKIP
>>> fingerprint_line(fp)                                    # doctest: +SKIP
'AMD EPYC x2: ATen AVX2, oneDNN 3.12.0 jit:avx2 (Intel AVX2), MKL 2024.2 ...'
"""

from __future__ import annotations

import os
import platform
import re
import textwrap
from collections.abc import Mapping

import torch

from convlab.lab.method import verbose_probes

# /proc/cpuinfo flags that decide which kernels oneDNN, ATen and MKL can use.
ISA_FLAGS: tuple[str, ...] = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq",
    "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
    "amx_bf16", "amx_int8", "amx_fp16",
)
ISA_ENV_VARS: tuple[str, ...] = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                  "MKL_ENABLE_INSTRUCTIONS")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    text = _cpuinfo()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    if match:
        return " ".join(match.group(1).split())
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_family_model() -> str | None:
    """``"<family>-<model>"`` of the first CPU in ``/proc/cpuinfo`` (None elsewhere): the
    cpuid numbers that name the microarchitecture where a cloud VM masks the model name
    (``AMD EPYC`` is family 25, model 17 on a Zen 4 host)."""
    text = _cpuinfo()
    family = re.search(r"^cpu family\s*:\s*(\d+)\s*$", text, re.MULTILINE)
    model = re.search(r"^model\s*:\s*(\d+)\s*$", text, re.MULTILINE)
    return f"{family.group(1)}-{model.group(1)}" if family and model else None


def cpu_flags() -> set[str]:
    """All flags of the first CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    match = re.search(r"^flags\s*:\s*(.+)$", _cpuinfo(), re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


CACHE_ROOT = "/sys/devices/system/cpu/cpu0/cache"
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def cache_sizes(root: str | os.PathLike[str] = CACHE_ROOT) -> dict[str, int]:
    """The first CPU's caches in bytes from sysfs, e.g. ``{"L1d": 32768, "L1i": 32768,
    "L2": 1048576, "L3": 33554432}`` (empty where sysfs has none)."""
    found: dict[str, int] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith("index"):
            continue
        try:
            level, kind, size = (open(os.path.join(entry.path, name)).read().strip()
                                 for name in ("level", "type", "size"))
        except OSError:
            continue
        match = _SIZE.match(size)
        if not match or not level.isdigit():
            continue
        scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        found[f"L{level}{suffix}"] = int(match.group(1)) * scale
    return found


# A cache's name as :func:`cache_sizes` writes it: ``L<level>``, then ``d`` (data), ``i``
# (instruction) or nothing (unified). The record schema refuses any other name.
CACHE_NAME = re.compile(r"L([1-9][0-9]*)([di]?)")


def last_level(caches: Mapping[str, int]) -> tuple[str, int] | None:
    """The highest-level data or unified cache: its level name and bytes (None: none known).
    Names other than ``CACHE_NAME``'s are not caches :func:`cache_sizes` writes and
    are passed over (the record schema refuses them, naming the key).

    >>> last_level({"L1d": 2**15, "L1i": 2**15, "L2": 2**20, "L3": 2**25})
    ('L3', 33554432)
    """
    levels = {k: int(m.group(1)) for k in caches
              if (m := CACHE_NAME.fullmatch(k)) and m.group(2) != "i"}
    if not levels:
        return None
    key = max(levels, key=levels.__getitem__)
    return f"L{levels[key]}", caches[key]


def cache_size_text(size: int, sep: str = " ", suffix: str = "iB") -> str:
    """A cache size exactly, in the largest binary unit that holds it whole: ``480 MiB``,
    ``256 KiB``, ``1536 KiB`` (1.5 MiB), ``1000 B``; with ``sep=""`` and ``suffix=""``
    the file-name form (lower-cased by the caller), ``480M``, ``256K``, ``1000B``. Never
    rounded, so hosts whose caches differ never share a name.

    >>> cache_size_text(3 * 2**19), cache_size_text(2**18, "", "")
    ('1536 KiB', '256K')
    """
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if size % scale == 0:
            return f"{size // scale}{sep}{unit}{suffix}"
    return f"{size}{sep}B"


def last_level_cache(caches: Mapping[str, int]) -> int | None:
    """Bytes of the highest-level data or unified cache (None: none known)."""
    found = last_level(caches)
    return found[1] if found else None


def memory_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            match = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def machine_slug(model: str | None = None, cores: int | None = None,
                 caches: Mapping[str, int] | None = None,
                 family_model: str | None = None) -> str:
    """A file-name part for this machine: CPU model, logical cores, last-level cache and
    cpuid family and model, ``[a-z0-9-]``.

    A cloud VM reports one model name for different hosts (``Intel(R) Xeon(R) Processor``
    with 300 MiB or 480 MiB of L3; ``AMD EPYC`` for two hosts with 32 MiB each, one of
    them cpuid family 25, model 17), so the last-level cache (exactly:
    :func:`cache_size_text`, ``l2-256k`` where it is not a whole MiB) and
    :func:`cpu_family_model` are part of the name where known. ``caches={}`` and
    ``family_model=None`` leave them out (records written before fingerprints held them).
    With no arguments: this machine.

    >>> machine_slug("AMD EPYC 7B13 (R)", 2, {})
    'amd-epyc-7b13-x2'
    >>> machine_slug("Intel(R) Xeon(R) Processor", 2, {"L3": 480 * 2**20})
    'intel-xeon-processor-x2-l3-480m'
    >>> machine_slug("AMD EPYC", 2, {"L3": 32 * 2**20}, "25-17")
    'amd-epyc-x2-l3-32m-f25m17'
    >>> machine_slug("AMD EPYC", 2, {"L2": 512 * 2**10})
    'amd-epyc-x2-l2-512k'
    """
    if model is None and cores is None and caches is None:
        family_model = cpu_family_model()
    model = cpu_model() if model is None else model
    cores = (os.cpu_count() or 1) if cores is None else cores
    caches = cache_sizes() if caches is None else caches
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)", "", model.lower())).strip("-")
    slug = f"{slug or 'cpu'}-x{cores}"
    found = last_level(caches)
    if found:
        slug += f"-{found[0].lower()}-{cache_size_text(found[1], '', '').lower()}"
    if family_model:
        family, _, number = family_model.partition("-")
        slug += f"-f{family}m{number}"
    return slug


def slug_of(fp: Mapping[str, object]) -> str:
    """:func:`machine_slug` of a stored :func:`fingerprint`."""
    caches = fp.get("caches") or {}
    family_model = fp.get("cpu_family_model")
    return machine_slug(str(fp.get("cpu_model")), int(str(fp.get("cores") or 0)),
                        caches if isinstance(caches, Mapping) else {},
                        str(family_model) if family_model else None)


def display_name(fp: Mapping[str, object]) -> str:
    """A stored fingerprint's machine as the text names it: ``AMD EPYC x2``, with the
    last-level cache and the cpuid family and model where the fingerprint has them
    (``AMD EPYC x2 (L3 32 MiB, family 25 model 17)``), since those tell apart hosts that
    report one model name.

    >>> display_name({"cpu_model": "Intel(R) Xeon(R) Processor", "cores": 2,
    ...               "caches": {"L3": 480 * 2**20}})
    'Intel Xeon x2 (L3 480 MiB)'
    """
    name = f"{short_model(str(fp.get('cpu_model')))} x{fp.get('cores')}"
    caches = fp.get("caches") or {}
    found = last_level(caches if isinstance(caches, Mapping) else {})
    parts = [f"{found[0]} {cache_size_text(found[1])}"] if found else []
    if fp.get("cpu_family_model"):
        family, _, number = str(fp["cpu_family_model"]).partition("-")
        parts.append(f"family {family} model {number}")
    return f"{name} ({', '.join(parts)})" if parts else name


def _blas() -> dict[str, object]:
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    info = re.search(r"BLAS_INFO=(\w+)", config)
    out: dict[str, object] = {
        "torch_blas": info.group(1) if info else None,
        "mkl_version": mkl.group(1) if mkl else None,
        "mkl_path": verbose_probes.mkl_probe(),
    }
    try:
        from threadpoolctl import threadpool_info
        out["numpy_blas"] = [
            {k: lib.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for lib in threadpool_info() if lib.get("user_api") == "blas"
        ]
    except ImportError:
        out["numpy_blas"] = "threadpoolctl not installed"
    return out


def fingerprint() -> dict[str, object]:
    """This process's machine and settings, JSON-serialisable (see the module docstring).

    Keys: cpu_model, cores, caches (bytes per level, sysfs), cpu_family_model, isa_flags,
    aten_cpu_capability,
    onednn_version, onednn_isa
    (the ``jit:...`` implementation of the convolution backward), onednn_isa_info,
    onednn_implementations (float32), onednn_dtype_implementations (bfloat16/float16 where
    oneDNN takes them), mkldnn_bf16_supported, mkldnn_fp16_supported, blas,
    threads, interop_threads, torch_version, torch_build, python, platform, isa_env.
    """
    flags = cpu_flags()
    config = torch.__config__.show()
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v([\w.]+)", config)
    probe = verbose_probes.onednn_probe()
    impls: Mapping[str, str] = probe["implementations"]  # type: ignore[assignment]
    onednn_isa = impls.get("backward_weights") or impls.get("backward_data") or next(
        iter(impls.values()), None)
    cuda = torch.version.cuda
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "caches": cache_sizes(),
        "cpu_family_model": cpu_family_model(),
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_version": onednn.group(1) if onednn else None,
        "onednn_isa": onednn_isa,
        "onednn_isa_info": probe["isa_info"],
        "onednn_implementations": dict(impls),
        "onednn_dtype_implementations": dict(probe.get("dtype_implementations") or {}),
        "mkldnn_bf16_supported": verbose_probes.supported("_is_mkldnn_bf16_supported"),
        "mkldnn_fp16_supported": verbose_probes.supported("_is_mkldnn_fp16_supported"),
        "blas": _blas(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch_version": torch.__version__,
        "torch_build": f"cuda {cuda}" if cuda else "cpu",
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "isa_env": {k: os.environ[k] for k in ISA_ENV_VARS if k in os.environ},
    }


def short_model(model: str) -> str:
    """The CPU model without vendor marks and the trailing "N-Core Processor"/"CPU @ ..."."""
    model = re.sub(r"\((R|TM|tm|r)\)", "", model)
    model = re.sub(r"\s+(\d+-Core Processor|CPU\b.*|Processor)$", "", model.strip())
    return " ".join(model.split())


def identity_line(fp: Mapping[str, object]) -> str:
    """The machine a stored output came from, short enough to sit under it: the machine
    (:func:`display_name`), ATen's capability, oneDNN's implementation, torch.

    >>> identity_line({"cpu_model": "AMD EPYC", "cores": 2, "caches": {"L3": 32 * 2**20},
    ...                "cpu_family_model": "25-1", "aten_cpu_capability": "AVX2",
    ...                "onednn_isa": "jit:avx2", "torch_version": "2.13.0+cpu"})
    'AMD EPYC x2 (L3 32 MiB, family 25 model 1), ATen AVX2, oneDNN jit:avx2, torch 2.13.0+cpu'
    """
    return (f"{display_name(fp)}, ATen {fp.get('aten_cpu_capability')}, oneDNN "
            f"{fp.get('onednn_isa') or '(no jit line)'}, torch {fp.get('torch_version')}")


def stamp(device: torch.device | str | None = None, width: int = 78) -> str:
    """The first line of a stored live output: ``"this machine: "`` and this process's
    :func:`identity_line`, wrapped at ``width``; with a CUDA ``device``, the GPU, CUDA and
    cuDNN too. A reader comparing the stored output with their own run sees whose it was.

    >>> print(stamp(width=40))                              # doctest: +SKIP
    this machine: AMD EPYC x2 (L3 32 MiB,
      family 25 model 1), ATen AVX2, oneDNN
      jit:avx2, torch 2.13.0+cpu
    """
    if not isinstance(width, int) or isinstance(width, bool):
        raise TypeError(f"width must be an int, got {type(width).__name__}")
    if width < 20:
        raise ValueError(f"width must be at least 20, got {width}")
    text = "this machine: " + identity_line(fingerprint())
    if device is not None and torch.device(device).type == "cuda":
        text += (f"; GPU {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, "
                 f"cuDNN {torch.backends.cudnn.version()}")
    return textwrap.fill(text, width, subsequent_indent="  ", break_on_hyphens=False)


def fingerprint_line(fp: Mapping[str, object]) -> str:
    """One line: the machine (:func:`display_name`: CPU x logical cores, last-level cache,
    cpuid family and model), ATen's capability, oneDNN and its implementation, BLAS,
    threads, torch.

    >>> line = fingerprint_line({
    ...     "cpu_model": "AMD EPYC", "cores": 2, "caches": {"L3": 32 * 2**20},
    ...     "cpu_family_model": "25-1", "aten_cpu_capability": "AVX2",
    ...     "onednn_version": "3.12.0", "onednn_isa": "jit:avx2",
    ...     "onednn_isa_info": "Intel AVX2", "threads": 2,
    ...     "blas": {"torch_blas": "mkl", "mkl_version": "2024.2",
    ...              "mkl_path": "Intel(R) Architecture processors"},
    ...     "torch_version": "2.13.0+cpu"})
    >>> print(*line.split(", "), sep="\\n")
    AMD EPYC x2 (L3 32 MiB
    family 25 model 1): ATen AVX2
    oneDNN 3.12.0 jit:avx2 (Intel AVX2)
    MKL 2024.2 (Intel(R) Architecture processors)
    2 threads
    torch 2.13.0+cpu
    """
    blas = fp.get("blas") or {}
    assert isinstance(blas, Mapping)
    if blas.get("mkl_version"):
        blas_text = f"MKL {blas['mkl_version']}"
        if blas.get("mkl_path"):
            blas_text += f" ({blas['mkl_path']})"
    else:
        blas_text = f"BLAS {blas.get('torch_blas') or 'unknown'}"
    onednn = f"oneDNN {fp.get('onednn_version')} {fp.get('onednn_isa') or '(no jit line)'}"
    if fp.get("onednn_isa_info"):
        onednn += f" ({fp['onednn_isa_info']})"
    return (f"{display_name(fp)}: ATen "
            f"{fp.get('aten_cpu_capability')}, {onednn}, {blas_text}, {fp.get('threads')} "
            f"threads, torch {fp.get('torch_version')}")


def main() -> int:
    """``python -m convlab.lab.method.machine``: print the fingerprint."""
    import json

    fp = fingerprint()
    print(fingerprint_line(fp))
    print(json.dumps(fp, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
