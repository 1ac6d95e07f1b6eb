"""What oneDNN and MKL say they run: their verbose lines, captured and parsed.

The way a user would check by hand (``ONEDNN_VERBOSE=1``, ``MKL_VERBOSE=1``): one small
convolution forward and backward and one small ``torch.mm`` run with verbose output on,
and the lines they print are parsed. Both libraries print their header once per process,
so where it was printed already the probe runs in a fresh process. The fingerprint of
:mod:`convlab.lab.method.machine` holds what these probes found.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable

import torch


def capture_stdout(fn: Callable[[], object]) -> str:
    """What ``fn`` writes to file descriptor 1 (C libraries' printf included)."""
    sys.stdout.flush()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            fn()
            sys.stdout.flush()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


def parse_onednn_verbose(text: str) -> dict[str, object]:
    """oneDNN's ISA description and the implementation of each convolution primitive.

    >>> log = ("onednn_verbose,v1,info,cpu,isa:Intel AVX2\\n"
    ...        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,"
    ...        "backward_data,x")
    >>> parse_onednn_verbose(log)
    {'isa_info': 'Intel AVX2', 'implementations': {'backward_data': 'jit:avx2'}}
    """
    isa = re.search(r"onednn_verbose,(?:v\d+,)?info,cpu,isa:([^\n]+)", text)
    impls: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if "convolution" in fields and "exec" in fields:
            at = fields.index("convolution")
            if at + 2 < len(fields):
                impls.setdefault(fields[at + 2], fields[at + 1])
    return {"isa_info": isa.group(1).strip() if isa else None, "implementations": impls}


def parse_mkl_verbose(text: str) -> str | None:
    """The code path MKL announces in its verbose header (e.g. "Intel(R) AVX2 enabled
    processors", or "Intel(R) Architecture processors" for its generic path), whole: it
    runs up to the operating-system field (``, Lnx ...``) and may itself hold commas
    ("... with support for INT8, BF16, FP16 ...").

    >>> header = ("MKL_VERBOSE oneMKL 2024.0 Product build 20240605 for"
    ...           " Intel(R) 64 architecture Intel(R) Architecture"
    ...           " processors, Lnx 2.45GHz lp64")
    >>> parse_mkl_verbose(header)
    'Intel(R) Architecture processors'
    """
    match = re.search(r"MKL_VERBOSE .*? 64 architecture (.+?)"
                      r"(?:,\s*(?:Lnx|Win|Mac|OSX)\b[^\n]*)?$", text, re.MULTILINE)
    return match.group(1).strip().rstrip(",") if match else None


@functools.lru_cache(maxsize=1)
def onednn_probe() -> dict[str, object]:
    """Run one small conv forward+backward with oneDNN verbose on; parse what it printed.

    Cached. oneDNN prints its ``isa:`` line once per process: if verbose output was already
    on earlier in this process, the line comes from a fresh process (same environment).
    Leaves verbose off.
    """
    found = _onednn_probe_here()
    if found["isa_info"] is None and torch.backends.mkldnn.is_available():
        found["isa_info"] = _fresh_probes()[0].get("isa_info")
    return found


def _fresh_probes() -> tuple[dict[str, object], str | None]:
    """:func:`onednn_probe` and :func:`mkl_probe` run in a new Python process."""
    import json
    import subprocess

    if os.environ.get(_NO_SUBPROCESS):
        return {}, None
    code = ("import json; from convlab.lab.method import verbose_probes as m; "
            "print(json.dumps([m._onednn_probe_here(), m._mkl_probe_here()]))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=120, env={**os.environ, _NO_SUBPROCESS: "1"})
        onednn, mkl = json.loads(out.stdout.strip().splitlines()[-1])
        return onednn, mkl
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {}, None


_NO_SUBPROCESS = "CONVLAB_MACHINE_PROBE_CHILD"


def _onednn_probe_here() -> dict[str, object]:
    if not torch.backends.mkldnn.is_available():
        return {"isa_info": None, "implementations": {}, "dtype_implementations": {}}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 12, 12, generator=gen)
    w = torch.randn(16, 16, 3, 3, generator=gen)

    def conv(dtype: torch.dtype) -> Callable[[], None]:
        def run() -> None:
            xx, ww = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch.nn.functional.conv2d(xx, ww, padding=1).sum().backward()
        return run

    found = parse_onednn_verbose(capture_stdout(conv(torch.float32)))
    # The reduced-precision kernels are where the bf16/fp16/AMX caps show: ATen routes
    # these dtypes to oneDNN only where it reports support for them.
    by_dtype: dict[str, dict[str, str]] = {}
    for name, dtype, query in (("bfloat16", torch.bfloat16, "_is_mkldnn_bf16_supported"),
                               ("float16", torch.float16, "_is_mkldnn_fp16_supported")):
        if supported(query):
            impls = parse_onednn_verbose(capture_stdout(conv(dtype)))["implementations"]
            if impls:
                by_dtype[name] = impls  # type: ignore[assignment]
    found["dtype_implementations"] = by_dtype
    return found


@functools.lru_cache(maxsize=1)
def mkl_probe() -> str | None:
    """MKL's announced code path (from one small verbose ``torch.mm``), or None.

    Cached; like oneDNN, MKL prints its header once per process (else: a fresh process).
    """
    found = _mkl_probe_here()
    if found is None and torch.backends.mkl.is_available():
        found = _fresh_probes()[1]
    return found


def _mkl_probe_here() -> str | None:
    if not torch.backends.mkl.is_available():
        return None
    a = torch.ones(32, 32)

    def run() -> None:
        with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
            torch.mm(a, a)

    return parse_mkl_verbose(capture_stdout(run))


def supported(name: str) -> bool | None:
    """``torch.ops.mkldnn.<name>()`` (e.g. ``_is_mkldnn_bf16_supported``), None where this
    torch has no such query or it fails."""
    fn = getattr(torch.ops.mkldnn, name, None)
    try:
        return bool(fn()) if fn is not None else None
    except (RuntimeError, AttributeError):
        return None
