"""A small C++ extension that calls ATen's convolution backward from C++.

:func:`load` compiles ``convlab/aten/csrc/*.cpp`` (the registration ``convlab_ext.cpp`` and
one file per kernel family of convlab's own loops) on first use with
``torch.utils.cpp_extension.load`` (ninja), caches the build in ``TORCH_EXTENSIONS_DIR``
(default: torch's own cache folder) and returns a :class:`NativeExtension` whose methods
validate their arguments with :class:`~convlab.scratch.params.ConvParams`, then call the C++ ops
``torch.ops.convlab_ext.convolution_backward`` and
``torch.ops.convlab_ext.slow_conv2d_backward_out``.

The C++ code only calls the dispatcher, so CUDA tensors work (through cuDNN or ATen's CUDA
kernels) whenever torch itself was built with CUDA; nothing is compiled with nvcc.

>>> ext = load()                                        # doctest: +SKIP
>>> gi, gw, gb = ext.convolution_backward(go, x, w, [8], 1, 0, 1, False, 0, 1,
...                                       [True, True, True])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from convlab.aten.buffers import check_out_buffers
from convlab.aten.native import aten_bias_sizes, backward_params, call_convolution_backward
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_output_mask,
    check_same,
    check_tensor,
    normalize,
)

NAME = "convlab_ext"
# The registration (convlab_ext.cpp) and convlab's own CPU loops, one kernel family per file
# (their shared header, cpu_loops.h, is found beside them; ninja tracks it).
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES: tuple[Path, ...] = tuple(CSRC / name for name in (
    "convlab_ext.cpp", "depthwise.cpp", "col2im.cpp", "per_sample.cpp"))
# Without fcntl (Windows) a torch `lock` file older than this is taken as left by a killed build.
STALE_LOCK_SECONDS = 600.0

_LOADED: NativeExtension | None = None
_THREAD_LOCK = threading.Lock()


class NativeExtension:
    """The loaded extension: validated Python front-ends of the two C++ ops.

    ``ops`` is the raw op namespace ``torch.ops.convlab_ext`` (no validation);
    ``library`` the path of the built shared library.
    """

    def __init__(self, library: str) -> None:
        self.library = library
        self.ops = torch.ops.convlab_ext
        self.sources = SOURCES

    def convolution_backward(
        self,
        grad_output: torch.Tensor,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias_sizes: Sequence[int] | None,
        stride: IntOrSeq,
        padding: IntOrSeq,
        dilation: IntOrSeq,
        transposed: bool,
        output_padding: IntOrSeq,
        groups: int,
        output_mask: Sequence[bool],
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``at::convolution_backward`` called from C++; ATen's signature and return tuple.

        Shapes: ``grad_output`` is the forward output's shape, ``input`` ``[N, C_in, *S]``,
        ``weight`` ``[C_out, C_in/groups, *K]`` (``[C_in, C_out/groups, *K]`` transposed).
        ``bias_sizes`` is ``None``, ``[C_out]`` or ``[0]`` (no bias), checked by
        :func:`convlab.scratch.params.check_bias_sizes`. Returns ``(grad_input, grad_weight,
        grad_bias)``, ``None`` where ``output_mask`` is off; ``grad_bias`` is ``[C_out]``
        (see :func:`convlab.aten.native.aten_bias_sizes`: ATen aborts the process on ``None``
        with an empty batch). The operands get the guards of
        :func:`convlab.aten.native.call_convolution_backward` (canonical strides; dense NCHW
        for the slow kernels), so this returns what :func:`convlab.aten.native.convolution_backward`
        does; the raw ``ops.convolution_backward`` gets the tensors as they are.

        >>> ext.convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 1,
        ...                          [True, True, False])  # doctest: +SKIP
        """
        p = backward_params(grad_output, input, weight, stride, padding, dilation, transposed,
                            output_padding, groups)
        mask = check_output_mask(output_mask)
        out_channels = p.output_shape(tuple(input.shape), tuple(weight.shape))[1]
        sizes = aten_bias_sizes(bias_sizes, out_channels, mask)
        return call_convolution_backward(  # the guards convlab.aten.native applies, too
            self.ops.convolution_backward, grad_output, input, weight, sizes, p, mask
        )

    def slow_conv2d_backward_out(
        self,
        grad_input: torch.Tensor,
        grad_weight: torch.Tensor,
        grad_bias: torch.Tensor,
        grad_output: torch.Tensor,
        input: torch.Tensor,
        weight: torch.Tensor,
        kernel_size: IntOrSeq,
        stride: IntOrSeq,
        padding: IntOrSeq,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``at::_slow_conv2d_backward_out``: the slow 2-d backward into the caller's buffers.

        The three buffers are written in place and resized only when their shape is wrong
        (``torch.empty(0)`` is fine), so a buffer that is already the right size keeps its
        storage. A buffer may not overlap an input or another buffer, and one of the wrong
        shape may not be a view (:func:`convlab.aten.buffers.check_out_buffers`); do not share
        buffers between threads. No dilation or groups: this is ATen's THNN-style im2col
        kernel.

        Not differentiable: like every ``out=`` op it has no derivative (ATen's own
        ``_slow_conv2d_backward.grad_input`` records a ``NotImplemented`` node), so with
        grad mode on a ``grad_output``, ``input`` or ``weight`` that requires grad is refused
        (``ValueError``) before any work. Use :meth:`convolution_backward` for a
        differentiable backward.
        Shapes: ``input`` ``[N, C_in, H, W]``, ``weight`` ``[C_out, C_in, kH, kW]``,
        ``grad_output`` ``[N, C_out, H_out, W_out]``. Returns the three buffers.

        >>> gi, gw, gb = torch.empty(0), torch.empty(0), torch.empty(0)   # doctest: +SKIP
        >>> ext.slow_conv2d_backward_out(gi, gw, gb, go, x, w, 3, 1, 1)  # doctest: +SKIP
        """
        p = ConvParams.for_tensors(input, weight, None, stride, padding)
        check_no_grad({"grad_output": grad_output, "input": input, "weight": weight})
        if p.dim != 2:
            raise ValueError(
                f"weight must be 4-d [C_out, C_in, kH, kW] for the slow 2-d path, "
                f"got shape {list(weight.shape)}"
            )
        kernel = normalize(kernel_size, 2, "kernel_size")
        if kernel != tuple(weight.shape[2:]):
            raise ValueError(
                f"kernel_size={list(kernel)} must equal weight's spatial shape "
                f"{list(weight.shape[2:])}"
            )
        p.check_grad_output(grad_output, input, weight)
        shapes = {"grad_input": tuple(input.shape), "grad_weight": tuple(weight.shape),
                  "grad_bias": (weight.shape[0],)}
        bufs = {"grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias}
        for name, buf in bufs.items():
            check_tensor(buf, name)
            check_same(input, buf, "input", name)
            if buf.numel() and not buf.is_contiguous():
                raise ValueError(f"{name} must be contiguous (or empty, to be resized)")
        check_out_buffers(
            {name: (buf, shapes[name]) for name, buf in bufs.items()},
            {"grad_output": grad_output, "input": input, "weight": weight},
        )
        return self.ops.slow_conv2d_backward_out(
            grad_input, grad_weight, grad_bias, grad_output, input, weight,
            list(kernel), list(p.stride), list(p.padding),
        )


def check_no_grad(tensors: dict[str, torch.Tensor]) -> None:
    """``ValueError`` naming the first tensor that requires grad while grad mode is on.

    Why: an ``out=`` op has no derivative; autograd would record a node that fails only
    at ``backward()``, far from the call.
    """
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(
                f"{name} requires grad, but slow_conv2d_backward_out (an out= op) is not "
                "differentiable: call it under torch.no_grad() or use convolution_backward"
            )


def load(verbose: bool = False) -> NativeExtension:
    """Build (first call only) and load the extension; later calls return the same object.

    Raises ``RuntimeError`` when ninja or a C++ compiler cannot be found.

    >>> ext = load()                                # doctest: +SKIP
    >>> ext is load()                               # doctest: +SKIP
    True
    """
    global _LOADED
    with _THREAD_LOCK:
        if _LOADED is None:
            _LOADED = _build(verbose)
        return _LOADED


def build_directory() -> Path:
    """Folder of the build: ``$TORCH_EXTENSIONS_DIR/convlab_ext``, or torch's default
    ``<cache>/torch_extensions/py3X_<cpu|cuXYZ>/convlab_ext``."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import get_default_build_root

        accel = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        if torch.version.hip:
            accel = f"rocm{torch.version.hip.replace('.', '')}"
        root = os.path.join(
            get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}_{accel}"
        )
    return Path(root) / NAME


def ensure_ninja() -> str:
    """Make sure ``ninja`` is on ``PATH`` (adding this interpreter's ``bin``); return its path."""
    found = shutil.which("ninja")
    if found:
        return found
    venv_bin = os.path.dirname(sys.executable)
    found = shutil.which("ninja", path=venv_bin)
    if not found:
        raise RuntimeError(
            "ninja is needed to build and load the C++ extension but was not found on PATH "
            f"or next to {sys.executable}: `pip install ninja` (or apt-get install ninja-build)"
        )
    os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    return found


def check_compiler() -> str:
    """Return the C++ compiler torch will use (``$CXX`` or ``c++``); ``RuntimeError`` if absent."""
    compiler = os.environ.get("CXX", "c++")
    found = shutil.which(compiler)
    if not found:
        raise RuntimeError(
            f"no C++ compiler found (looked for {compiler!r}, from $CXX or the default 'c++'): "
            "install g++ or clang++, or point CXX at one, to build convlab's C++ extension"
        )
    return found


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Serialise convlab builds across processes and clear a stale torch ``lock`` file.

    Older torch marks a build in progress with a plain ``lock`` file (``FileBaton``) that a
    killed build leaves behind, after which every load waits forever. Newer torch (PR
    #190543) holds an OS file lock on that file instead and leaves the file in place. An
    ``fcntl`` lock dies with its process, so while we hold ours no other convlab load is
    building; a ``lock`` file that nobody holds an OS lock on is then a leftover, stale
    for the old scheme and harmless to remove for the new one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    torch_lock = folder / "lock"
    try:
        import fcntl
    except ImportError:  # Windows: fall back to the lock file's age
        fcntl = None
    if fcntl is None:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - torch_lock.stat().st_mtime > STALE_LOCK_SECONDS:
                torch_lock.unlink()
        yield
        return
    with open(folder / "convlab.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            _remove_unheld(torch_lock, fcntl)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_unheld(path: Path, fcntl: object) -> None:
    """Delete ``path`` unless another process holds an OS lock on it (a live torch build)."""
    try:
        handle = open(path)  # noqa: SIM115 - closed below, after the unlink
    except FileNotFoundError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # torch's own lock: it waits for that build correctly
        path.unlink(missing_ok=True)


def _build(verbose: bool) -> NativeExtension:
    from torch.utils.cpp_extension import LIB_EXT
    from torch.utils.cpp_extension import load as cpp_load

    ensure_ninja()
    check_compiler()
    folder = build_directory()
    with _build_lock(folder):
        # The return value is the library path only on newer torch (None on 2.4), so the
        # path is the one cpp_extension builds: <build_directory>/<name><LIB_EXT>.
        cpp_load(
            NAME,
            [str(path) for path in SOURCES],
            build_directory=str(folder),
            is_python_module=False,
            # the depthwise loop: -O3 vectorises it; at::parallel_for splits it over
            # torch's threads only when compiled with OpenMP (else it runs serially)
            extra_cflags=["-O3", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=verbose,
        )
    library = folder / f"{NAME}{LIB_EXT}"
    if not library.is_file():
        raise RuntimeError(f"the C++ extension was built but {library} does not exist")
    return NativeExtension(str(library))
