"""Which convolution backend ATen picks, and how to force one.

* :func:`select_backend`: the name ATen's ``select_conv_backend`` gives for a call;
* :func:`backend_memory_format`: the memory format that backend then runs in;
* :func:`use_backend`: a context manager that forces a backend (``"mkldnn"``, ``"slow"``,
  ``"nnpack"``, ``"cudnn"``, ...) through the ``torch.backends`` flags and checks that
  ATen's choice follows; :class:`BackendMismatch` when it does not;
* :func:`available_backends`, :func:`backend_name`.

Why a lock: the flags live in ATen's process-wide ``globalContext()``. Forcing is therefore
shared by every thread. :func:`use_backend` serialises it: threads that force the same
backend share one setting (a reference count; the last to leave restores the flags), a
thread that wants a different one waits until the others are done. Code that runs
convolutions without :func:`use_backend` while another thread forces a backend still sees
the forced flags.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from convlab.scratch.params import ConvParams, IntOrSeq, check_tensor

# ATen's ``enum class ConvBackend`` (aten/src/ATen/native/ConvUtils.h), in declaration order,
# so that index == enum value. The Python binding ``torch._C._ConvBackend`` cannot be trusted
# for names: it has no entry for value 9 (prints as ``_ConvBackend.???``) and spells value 22
# "MpsTranspose,". The tests compare this tuple with the installed header.
CONV_BACKENDS: tuple[str, ...] = (
    "CudaDepthwise2d",
    "CudaDepthwise3d",
    "Cudnn",
    "CudnnTranspose",
    "Empty",
    "Miopen",
    "MiopenDepthwise",
    "MiopenTranspose",
    "Mkldnn",
    "MkldnnTranspose",
    "MkldnnEmpty",
    "NnpackSpatial",
    "Overrideable",
    "Slow2d",
    "Slow3d",
    "SlowDilated2d",
    "SlowDilated3d",
    "SlowTranspose2d",
    "SlowTranspose3d",
    "Winograd3x3Depthwise",
    "Xnnpack2d",
    "Mps",
    "MpsTranspose",
)

# ATen's own im2col/vol2col kernels (no oneDNN, NNPACK, cuDNN or MIOpen).
SLOW_BACKENDS = frozenset(
    {"Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d", "SlowTranspose3d"}
)

# How long a thread waits for another thread's forcing of a different backend to end.
WAIT_SECONDS = 120.0


class BackendMismatch(ValueError):
    """ATen selects another backend than the one :func:`use_backend` forces.

    ``requested`` is the :func:`use_backend` name (``"mkldnn"``), ``chosen`` the ATen
    backend it selected instead (``"Slow2d"``), ``expected`` the ATen names that would
    have counted as success.
    """

    def __init__(self, requested: str, chosen: str, expected: frozenset[str], detail: str):
        self.requested = requested
        self.chosen = chosen
        self.expected = expected
        super().__init__(
            f"backend {requested!r} cannot serve these inputs: with its flags set ATen "
            f"selects {chosen} (expected one of {', '.join(sorted(expected))}); {detail}"
        )


def backend_name(backend: torch._C._ConvBackend | int) -> str:
    """Name of a ``torch._C._ConvBackend`` value (or its int), robust to the binding's quirks.

    >>> backend_name(9)
    'MkldnnTranspose'
    """
    if isinstance(backend, bool) or not isinstance(backend, int | torch._C._ConvBackend):
        hint = " (it is already a name)" if backend in CONV_BACKENDS else ""
        raise TypeError(
            f"backend must be a torch._C._ConvBackend or an int, got "
            f"{type(backend).__name__} {backend!r}{hint}"
        )
    value = int(backend)
    if not 0 <= value < len(CONV_BACKENDS):
        raise ValueError(
            f"backend: unknown ConvBackend value {value} (this torch may be newer than convlab)"
        )
    return CONV_BACKENDS[value]


def select_backend(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> str:
    """The backend ``aten::_convolution`` would run for these arguments, under the current flags.

    Arguments are those of ``aten::convolution`` (input ``[N, C, *spatial]``); ints are
    broadcast to every spatial dimension. Runs only ATen's selection (no convolution).
    ``need_backward`` follows grad mode and ``requires_grad`` as in the forward; it only
    matters for the inference-only Xnnpack2d / Winograd3x3Depthwise branches.

    Returns:
        A name from ``CONV_BACKENDS``, e.g. ``"Mkldnn"`` or ``"Slow2d"``.

    >>> x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    >>> w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    >>> select_backend(x, w, dilation=2)
    'SlowDilated2d'
    """
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    chosen = torch._C._select_conv_backend(input, weight, bias, *p.aten_args())
    return backend_name(chosen)


def backend_memory_format(
    input: torch.Tensor, weight: torch.Tensor, backend: str
) -> torch.memory_format:
    """The memory format ATen runs ``backend`` in for these tensors.

    Wraps ``torch._C._conv_determine_backend_memory_format`` (what ``_convolution`` calls
    right after selection); ``backend`` is a name from ``CONV_BACKENDS``.

    >>> x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    >>> backend_memory_format(x, torch.randn(4, 3, 3, 3), "Slow2d")
    torch.channels_last
    """
    check_tensor(input, "input")
    check_tensor(weight, "weight")
    if backend not in CONV_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; ATen's names: {', '.join(CONV_BACKENDS)}")
    enum = torch._C._ConvBackend(CONV_BACKENDS.index(backend))
    return torch._C._conv_determine_backend_memory_format(input, weight, enum)


# --- forcing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Forcing:
    """How one forcible backend is reached: flag values to set and the ATen names it yields."""

    flags: tuple[tuple[str, bool], ...]
    expect: frozenset[str]
    device: str
    doc: str


# "Empty" is accepted everywhere: a zero-size batch or channel dim is served without a kernel.
_FORCE: dict[str, _Forcing] = {
    "mkldnn": _Forcing(
        (("mkldnn", True),),
        frozenset({"Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "Empty"}),
        "cpu",
        "oneDNN (MKL-DNN) on CPU",
    ),
    "slow": _Forcing(
        (("mkldnn", False), ("nnpack", False), ("cudnn", False)),
        SLOW_BACKENDS | {"CudaDepthwise2d", "CudaDepthwise3d", "Empty"},
        "any",
        "ATen's own kernels: no oneDNN, NNPACK, cuDNN or MIOpen",
    ),
    "nnpack": _Forcing(
        (("mkldnn", False), ("nnpack", True)),
        frozenset({"NnpackSpatial", "Empty"}),
        "cpu",
        "NNPACK forward (its backward is the SlowDilated2d kernel)",
    ),
    "cudnn": _Forcing(
        (("cudnn", True), ("cudnn_deterministic", False)),
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN",
    ),
    "cudnn-deterministic": _Forcing(
        (("cudnn", True), ("cudnn_deterministic", True), ("cudnn_benchmark", False)),
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN with deterministic algorithms only",
    ),
    "cudnn-benchmark": _Forcing(
        (("cudnn", True), ("cudnn_benchmark", True)),
        frozenset({"Cudnn", "CudnnTranspose", "Empty"}),
        "cuda",
        "cuDNN, algorithm chosen by timing (benchmark mode)",
    ),
}
BACKEND_CHOICES: tuple[str, ...] = tuple(_FORCE)


def _get_flags() -> dict[str, bool]:
    return {
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "nnpack": bool(torch._C._get_nnpack_enabled()),
        "cudnn": bool(torch.backends.cudnn.enabled),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def _set_flags(flags: dict[str, bool]) -> None:
    # Plain attribute assignment: `torch.backends.mkldnn.flags()` also resets TF32 settings and
    # warns (with a local path) on CPU-only builds.
    for key, value in flags.items():
        if key == "mkldnn":
            torch.backends.mkldnn.enabled = value
        elif key == "nnpack":
            torch.backends.nnpack.set_flags(value)
        elif key == "cudnn":
            torch.backends.cudnn.enabled = value
        elif key == "cudnn_deterministic":
            torch.backends.cudnn.deterministic = value
        elif key == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = value
        else:  # pragma: no cover - _FORCE and this function are kept in step
            raise KeyError(key)


class _FlagHolder:
    """Process-wide owner of the backend flags while :func:`use_backend` blocks are open.

    ``users`` counts open blocks per thread. Threads entering with the flags already in
    force share them; a different setting waits until no other thread holds one. A thread
    that is the only holder may nest a different backend (its block restores the outer
    setting when it leaves). The flags seen before the first block are restored when the
    last block closes.

    A thread inside a block that asks for a different setting while other threads hold
    blocks waits for them; if they all wait for it in turn (each nesting a switch inside a
    shared block), the last to ask raises at once, naming the threads and backends, instead
    of all of them waiting ``WAIT_SECONDS``. A wait that times out says which threads hold
    which backend.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.users: dict[int, int] = {}
        self.active: tuple[tuple[str, bool], ...] | None = None
        self.active_name: str | None = None
        self.saved: dict[str, bool] = {}
        self.nested = 0  # open blocks that switched the setting inside an outer one
        self.names: dict[int, str] = {}  # thread names of the holders, for messages
        self.waiting: set[int] = set()  # holders waiting to switch to another setting

    def _holders(self, me: int) -> str:
        others = [self.names.get(t, str(t)) for t in self.users if t != me]
        return ", ".join(repr(n) for n in others) or "none"

    def enter(self, name: str, flags: tuple[tuple[str, bool], ...]) -> tuple | None:
        """Hold ``flags``; returns the setting to restore on exit for a nested switch."""
        me = threading.get_ident()
        with self.cond:
            while True:
                if not self.users:
                    self.saved = _get_flags()
                    _set_flags(dict(flags))
                    self.active, self.active_name = flags, name
                    self.users[me] = 1
                    self.names[me] = threading.current_thread().name
                    return None
                if self.active == flags and self.nested == 0:
                    self.users[me] = self.users.get(me, 0) + 1
                    self.names[me] = threading.current_thread().name
                    return None
                if set(self.users) == {me}:
                    previous = (self.active, self.active_name, _get_flags())
                    _set_flags(dict(flags))
                    self.active, self.active_name = flags, name
                    self.users[me] += 1
                    self.nested += 1
                    return previous
                holding = me in self.users
                if holding and all(t in self.waiting for t in self.users if t != me):
                    raise RuntimeError(
                        f"use_backend({name!r}) would deadlock: this thread "
                        f"({threading.current_thread().name!r}) is inside "
                        f"use_backend({self.active_name!r}), and so are threads "
                        f"{self._holders(me)}, which wait for this thread to leave it so that "
                        "they can switch too. The flags are process-wide: a nested switch to "
                        "another backend needs every other thread out of its blocks"
                    )
                if holding:
                    self.waiting.add(me)
                try:
                    if not self.cond.wait(timeout=WAIT_SECONDS):
                        raise RuntimeError(
                            f"use_backend({name!r}) in thread "
                            f"{threading.current_thread().name!r} waited {WAIT_SECONDS:.0f} s "
                            f"for threads {self._holders(me)} to leave "
                            f"use_backend({self.active_name!r})"
                            + (" (this thread is inside it too, so it cannot switch before "
                               "they leave)" if holding else "")
                            + ": the backend flags are process-wide, one setting at a time"
                        )
                finally:
                    self.waiting.discard(me)

    def exit(self, previous: tuple | None) -> None:
        me = threading.get_ident()
        with self.cond:
            if previous is not None:
                self.active, self.active_name, flags = previous
                _set_flags(flags)
                self.nested -= 1
            self.users[me] -= 1
            if self.users[me] == 0:
                del self.users[me]
                self.names.pop(me, None)
            if not self.users:
                _set_flags(self.saved)
                self.active = self.active_name = None
            self.cond.notify_all()


_HOLDER = _FlagHolder()


def _unavailable_reason(name: str, device: torch.device | None) -> str | None:
    """Why backend ``name`` cannot serve tensors on ``device`` (any device when None)."""
    spec = _FORCE[name]
    if spec.device == "cpu":
        if name == "mkldnn" and not torch.backends.mkldnn.is_available():
            return "this torch was built without oneDNN (torch.backends.mkldnn.is_available())"
        if name == "nnpack" and not torch.backends.nnpack.is_available():
            return "this torch was built without NNPACK (torch.backends.nnpack.is_available())"
        if device is not None and device.type != "cpu":
            return f"it serves CPU tensors only, got tensors on {device}"
    if spec.device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device is available"
        if not torch.backends.cudnn.is_available() or torch.version.hip is not None:
            return "this torch was built without cuDNN (torch.backends.cudnn.is_available())"
        if device is not None and device.type != "cuda":
            return f"it serves CUDA tensors only, got tensors on {device}"
    return None


def available_backends(device: str | torch.device = "cpu") -> list[str]:
    """Names :func:`use_backend` accepts for tensors on ``device`` in this build.

    >>> "slow" in available_backends("cpu")
    True
    """
    dev = torch.device(device)
    if dev.type not in {"cpu", "cuda"}:
        return []
    return [name for name in _FORCE if _unavailable_reason(name, dev) is None]


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    if name not in _FORCE:
        raise ValueError(f"unknown backend {name!r}; valid names: {', '.join(_FORCE)}")
    return name


@contextmanager
def use_backend(
    name: str,
    input: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> Iterator[str | None]:
    """Force convolution backend ``name`` inside the block by setting ``torch.backends`` flags.

    ``name`` is one of ``BACKEND_CHOICES``: ``"mkldnn"``, ``"slow"`` (oneDNN, NNPACK and
    cuDNN off), ``"nnpack"``, ``"cudnn"``, ``"cudnn-deterministic"``, ``"cudnn-benchmark"``.
    With ``input`` and ``weight`` (and the other ``aten::convolution`` arguments, checked
    as :func:`select_backend` checks them) the block is entered only if ATen then selects
    that backend for them; it yields the ATen name (``None`` without tensors).

    The flags are process-wide: blocks in several threads that force the same backend run
    together, a different backend waits for them (see the module docstring). The flags in
    place before the first block are restored when the last one exits, also on errors.

    Raises:
        TypeError: ``name`` is not a str, or an argument has the wrong type.
        ValueError: unknown name, or the backend is not available here.
        BackendMismatch: ATen selects another backend for the given tensors (e.g.
            ``"mkldnn"`` with float64); a ``ValueError``.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> with use_backend("slow", x, w) as chosen:
    ...     y = torch.nn.functional.conv2d(x, w)
    >>> chosen
    'Slow2d'
    """
    name = _check_name(name)
    if (input is None) != (weight is None):
        raise ValueError("use_backend needs both input and weight, or neither")
    if input is not None:
        ConvParams.for_tensors(
            input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
    spec = _FORCE[name]
    reason = _unavailable_reason(name, None if input is None else input.device)
    if reason is not None:
        raise ValueError(f"backend {name!r} is not available: {reason}")
    previous = _HOLDER.enter(name, spec.flags)
    try:
        chosen = None
        if input is not None and weight is not None:
            chosen = select_backend(
                input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
            )
            if chosen not in spec.expect:
                raise BackendMismatch(
                    name, chosen, spec.expect,
                    f"input {list(input.shape)} {input.dtype} on {input.device}, "
                    f"weight {list(weight.shape)}",
                )
        yield chosen
    finally:
        _HOLDER.exit(previous)
