"""Read the installed torch's ``derivatives.yaml`` and ``native_functions.yaml``.

PyTorch ships both codegen inputs inside its wheel (under ``torchgen/packaged/``), so the
autograd formula of an op and its native schema can be read from the torch you run, not
from a copy of the source that may have drifted:

>>> from convlab.aten import derivatives
>>> derivatives.entry("convolution").callees("weight")
('convolution_backward_symint',)
>>> derivatives.schema("convolution_backward").dispatch["CUDA"]
'convolution_backward'

Names may be written ``"convolution"``, ``"aten::convolution"``, ``"convolution.default"``
or ``"_slow_conv2d_backward.output_mask"``; an ``OpOverload`` such as
``torch.ops.aten.convolution.default`` works too. Both files are parsed once (with
libyaml's ``CSafeLoader`` when available) and cached; :func:`clear_cache` forgets them.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
import yaml

__all__ = [
    "Entry",
    "Schema",
    "UnknownOpError",
    "clear_cache",
    "entry",
    "find",
    "load_derivatives",
    "load_native_functions",
    "schema",
    "yaml_path",
]

#: Where the two files sit inside the ``torchgen`` package.
FILES = {
    "derivatives": ("packaged", "autograd", "derivatives.yaml"),
    "native_functions": ("packaged", "ATen", "native", "native_functions.yaml"),
}
#: The YAML loader in use: libyaml's C loader is about 10x faster than the pure-Python one.
LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Keys of a derivatives.yaml entry that are not formulas.
_META_KEYS = ("name", "dispatch", "output_differentiability")
# A function call, not a method call (``grad.defined()``, ``bias->sym_sizes()``); template
# arguments such as ``std::get<0>(`` are skipped over.
_CALL = re.compile(r"(?<![\w.:>])([A-Za-z_][\w:]*)\s*(?:<[^<>()]*>)?\s*\(")
_CXX_WORDS = {"std::get", "std::tuple", "std::vector", "c10::SymInt", "if", "return", "sizeof"}


class UnknownOpError(KeyError):
    """A name that is in neither file (or is ambiguous); the message suggests close names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


def yaml_path(which: str) -> Path:
    """Path of ``"derivatives"`` or ``"native_functions"`` YAML inside the installed torchgen.

    Raises ``FileNotFoundError`` naming the expected path when torchgen or the file is absent.

    >>> yaml_path("derivatives").name
    'derivatives.yaml'
    """
    if which not in FILES:
        raise ValueError(f"which must be one of {sorted(FILES)}, got {which!r}")
    relative = Path(*FILES[which])
    spec = find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"cannot find the torchgen package that ships with torch, so "
            f"<site-packages>/torchgen/{relative.as_posix()} is missing; "
            f"reinstall torch (it ships torchgen)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"expected {which}.yaml at {path}, but there is no such file; this torch "
            f"({torch.__version__}) does not ship it"
        )
    return path


@cache
def _load(which: str) -> tuple[dict[str, Any], ...]:
    with yaml_path(which).open(encoding="utf-8") as f:
        data = yaml.load(f, Loader=LOADER)
    if not isinstance(data, list):
        raise RuntimeError(f"{yaml_path(which)} is not a YAML list of entries")
    return tuple(data)


def load_derivatives() -> tuple[dict[str, Any], ...]:
    """Raw entries of ``derivatives.yaml`` (cached; treat them as read-only)."""
    return _load("derivatives")


def load_native_functions() -> tuple[dict[str, Any], ...]:
    """Raw entries of ``native_functions.yaml`` (cached; treat them as read-only)."""
    return _load("native_functions")


def clear_cache() -> None:
    """Forget the parsed files (e.g. after reinstalling torch in a running kernel)."""
    for fn in (_load, _derivatives_index, _native_index):
        fn.cache_clear()


@dataclass(frozen=True)
class Entry:
    """One parsed ``derivatives.yaml`` entry.

    Attributes:
        name: base op name, e.g. ``"convolution"``.
        overload: overload name, ``""`` for the default overload.
        schema: the full signature written in the entry.
        formulas: backward formula per differentiable input; a key that lists several inputs
            (``"input, weight, bias"``) gives each of them the same formula (which then
            returns a tuple, in that order).
        groups: the formulas as written, keyed by the tuple of inputs of each key.
        forward: forward-mode (JVP) formulas keyed by output (``"result"``, ``"result0"``...).
        output_differentiability: the entry's list, or ``None`` (every output differentiable).
        non_differentiable: inputs marked ``non_differentiable``.
        dispatch: formulas for autograd keys other than ``Default``, when the entry has any.
        node: name of the autograd node class codegen makes from it (``ConvolutionBackward0``),
            or ``None`` when the entry has no backward formula.

    >>> e = entry("convolution")
    >>> e.groups[("input", "weight", "bias")] == e.formulas["bias"]
    True
    >>> e.node
    'ConvolutionBackward0'
    """

    name: str
    overload: str
    schema: str
    formulas: dict[str, str]
    groups: dict[tuple[str, ...], str]
    forward: dict[str, str]
    output_differentiability: tuple[bool | str, ...] | None
    non_differentiable: tuple[str, ...]
    dispatch: dict[str, dict[str, str]]
    node: str | None

    @property
    def qualified_name(self) -> str:
        """``aten::name`` or ``aten::name.overload``."""
        return "aten::" + _join(self.name, self.overload)

    def callees(self, input: str | None = None) -> tuple[str, ...]:
        """Functions called by the backward formula of ``input`` (all inputs when ``None``).

        >>> entry("_slow_conv2d_forward").callees("self")
        ('_slow_conv2d_backward_symint',)
        """
        if input is None:
            texts = list(self.groups.values())
        elif input in self.formulas:
            texts = [self.formulas[input]]
        else:
            raise KeyError(
                f"{self.qualified_name} has no backward formula for input {input!r}; "
                f"it has formulas for {sorted(self.formulas)}"
            )
        return _calls(texts)

    def forward_callees(self) -> tuple[str, ...]:
        """Functions called by the forward-mode formulas.

        >>> entry("convolution").forward_callees()
        ('convolution_jvp',)
        """
        return _calls(self.forward.values())


@dataclass(frozen=True)
class Schema:
    """One parsed ``native_functions.yaml`` entry.

    Attributes:
        name: base op name; ``overload`` is ``""`` for the default overload.
        func: the signature, e.g. ``"convolution(Tensor input, ...) -> Tensor"``.
        dispatch: kernel per dispatch key (a line ``"CPU, CUDA: k"`` gives both keys ``k``);
            empty when the yaml has no ``dispatch:``, which means CompositeImplicitAutograd
            (unless ``structured_delegate`` names the op that holds the kernels).
        tags, autogen, variants: the yaml fields split into tuples (empty when absent).
        python_module: ``"nn"``, ``"linalg"``... or ``None`` (where its Python binding lives).
        structured_delegate: the ``.out`` op this one forwards to, if any.

    >>> s = schema("aten::convolution_backward")
    >>> s.tags, s.autogen
    (('core',), ('convolution_backward.out',))
    """

    name: str
    overload: str
    func: str
    dispatch: dict[str, str]
    tags: tuple[str, ...]
    autogen: tuple[str, ...]
    variants: tuple[str, ...]
    python_module: str | None
    structured_delegate: str | None

    @property
    def qualified_name(self) -> str:
        """``aten::name`` or ``aten::name.overload``."""
        return "aten::" + _join(self.name, self.overload)

    @property
    def arguments(self) -> tuple[str, ...]:
        """Argument names in order (keyword-only ones included).

        >>> schema("_slow_conv2d_backward.output_mask").arguments[-1]
        'output_mask'
        """
        return tuple(a.name for a in torch._C.parse_schema(self.func).arguments)

    @property
    def composite_implicit(self) -> bool:
        """True when autograd differentiates through the ops this one calls."""
        if not self.dispatch:
            return self.structured_delegate is None
        return any(k.startswith("CompositeImplicitAutograd") for k in self.dispatch)


def entry(name: object) -> Entry:
    """The ``derivatives.yaml`` entry of an op.

    Args:
        name: ``"convolution"``, ``"aten::convolution"``, ``"convolution.default"``,
            ``"_slow_conv2d_backward.output_mask"`` or an ``OpOverload``. Without an overload
            the default one is used, or the only one the file has.

    Raises:
        UnknownOpError: (a ``KeyError``) for a name with no entry, with close matches, or
            the reason (e.g. the op exists but is differentiated through what it calls).

    >>> entry("aten::convolution_backward").callees()
    ('_convolution_double_backward_symint',)
    """
    base, overload = _parse_name(name)
    key = _resolve(base, overload, _derivatives_index(), "derivatives.yaml")
    return _derivatives_index()[key]


def schema(name: object) -> Schema:
    """The ``native_functions.yaml`` entry (signature, dispatch keys, tags) of an op.

    Accepts the same names as :func:`entry`; raises :class:`UnknownOpError` when unknown.

    >>> schema("_slow_conv2d_forward").dispatch
    {'CPU': 'slow_conv2d_forward_cpu', 'CUDA': 'slow_conv2d_forward_cuda'}
    """
    base, overload = _parse_name(name)
    key = _resolve(base, overload, _native_index(), "native_functions.yaml")
    return _native_index()[key]


def find(pattern: str, where: str = "derivatives") -> list[str]:
    """Sorted names (``name`` or ``name.overload``) matching ``pattern``.

    ``pattern`` is a regular expression searched anywhere in the name; a string that is
    not a valid regex is matched as a plain substring. ``where`` is ``"derivatives"`` or
    ``"native_functions"``.

    >>> find("^_?slow_conv2d")
    ['_slow_conv2d_backward.output_mask', '_slow_conv2d_forward']
    >>> find("slow_conv2d_back", where="native_functions")
    ['_slow_conv2d_backward.grad_input', '_slow_conv2d_backward.output_mask']
    """
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    indexes = {"derivatives": _derivatives_index, "native_functions": _native_index}
    if where not in indexes:
        raise ValueError(f"where must be one of {sorted(indexes)}, got {where!r}")
    try:
        regex = re.compile(pattern)
    except re.error:  # e.g. "conv2d(" : treat it as plain text
        regex = re.compile(re.escape(pattern))
    return sorted(n for n in indexes[where]() if regex.search(n))


# ---------------------------------------------------------------------------------------
# Indexes and name handling


@cache
def _derivatives_index() -> dict[str, Entry]:
    index: dict[str, Entry] = {}
    counter: Counter[str] = Counter()
    for raw in load_derivatives():
        parsed = _parse_entry(raw, counter)
        index[_join(parsed.name, parsed.overload)] = parsed
    return index


@cache
def _native_index() -> dict[str, Schema]:
    index: dict[str, Schema] = {}
    for raw in load_native_functions():
        s = torch._C.parse_schema(raw["func"])
        dispatch: dict[str, str] = {}
        for keys, kernel in (raw.get("dispatch") or {}).items():
            for key in keys.split(","):
                dispatch[key.strip()] = kernel
        parsed = Schema(
            name=s.name,
            overload=s.overload_name,
            func=raw["func"],
            dispatch=dispatch,
            tags=_split_field(raw.get("tags")),
            autogen=_split_field(raw.get("autogen")),
            variants=_split_field(raw.get("variants")),
            python_module=raw.get("python_module"),
            structured_delegate=raw.get("structured_delegate"),
        )
        index[_join(parsed.name, parsed.overload)] = parsed
    return index


def _parse_entry(raw: dict[str, Any], counter: Counter[str]) -> Entry:
    s = torch._C.parse_schema(raw["name"])
    arguments = {a.name for a in s.arguments}
    per_key = raw.get("dispatch", {})
    default = per_key.get("Default", {}) if per_key else raw
    groups: dict[tuple[str, ...], str] = {}
    forward: dict[str, str] = {}
    non_differentiable: list[str] = []
    for key, formula in default.items():
        if key in _META_KEYS:
            continue
        names = tuple(n.strip() for n in key.split(","))
        # codegen's rule: a key naming no argument is a forward-mode (output) formula
        if names[0] not in arguments:
            forward.update(dict.fromkeys(names, formula))
        elif formula.strip().lower() == "non_differentiable":
            non_differentiable.extend(names)
        else:
            groups[names] = formula
    formulas = {n: f for names, f in groups.items() for n in names}
    node = None
    if groups:  # codegen names a node only for entries with a backward formula
        prefix = _node_prefix(s.name)
        node = f"{prefix}{counter[prefix]}"
        counter[prefix] += 1
    od = raw.get("output_differentiability")
    return Entry(
        name=s.name,
        overload=s.overload_name,
        schema=raw["name"],
        formulas=formulas,
        groups=groups,
        forward=forward,
        output_differentiability=None if od is None else tuple(od),
        non_differentiable=tuple(non_differentiable),
        dispatch={k: dict(v) for k, v in per_key.items() if k != "Default"},
        node=node,
    )


def _node_prefix(name: str) -> str:
    # torchgen: title-case the parts, "_slow_conv2d_forward" -> "SlowConv2DBackward"
    camel = "".join(part.title() for part in name.split("_"))
    return (camel + "Backward").replace("ForwardBackward", "Backward")


def _parse_name(name: object) -> tuple[str, str | None]:
    """``(base, overload)``; ``overload`` is ``None`` when the name gives none."""
    if isinstance(name, torch._ops.OpOverload):
        overload = name._overloadname
        return _parse_name(name._schema.name)[0], "" if overload == "default" else overload
    if isinstance(name, torch._ops.OpOverloadPacket):
        return _parse_name(name._qualified_op_name)[0], None
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or a torch.ops OpOverload, got {type(name).__name__}")
    text = name.strip().split("(", 1)[0].strip()
    if "::" in text:
        namespace, text = text.split("::", 1)
        if namespace != "aten":
            raise ValueError(f"name must be an aten op, got namespace {namespace!r} in {name!r}")
    if not re.fullmatch(r"\w+(\.\w+)?", text):
        raise ValueError(f"name must look like 'op' or 'op.overload', got {name!r}")
    base, _, overload = text.partition(".")
    if not _:
        return base, None
    return base, "" if overload == "default" else overload


def _resolve(base: str, overload: str | None, index: dict[str, Any], where: str) -> str:
    if overload is not None:
        key = _join(base, overload)
        if key in index:
            return key
    else:
        if base in index:
            return base
        overloads = sorted(k for k in index if k.startswith(base + "."))
        if len(overloads) == 1:
            return overloads[0]
        if overloads:
            raise UnknownOpError(
                f"{base!r} has no default overload in {where}; name one of: " + ", ".join(overloads)
            )
    wanted = _join(base, overload or "")
    message = f"{wanted!r} is not in {where}"
    native = _native_index().get(wanted)  # the exact op: never the base of a bad overload
    if native is None and overload:
        known = sorted({"default" if k == base else k.partition(".")[2]
                        for k in (*index, *_native_index())
                        if k == base or k.startswith(base + ".")})
        if known:
            message += (f" (op {base} has no overload {overload!r}; its overloads in the "
                        f"installed yaml files: {', '.join(known)})")
    if where == "derivatives.yaml" and native is not None:
        if native.composite_implicit:
            message += (
                " (it is CompositeImplicitAutograd in native_functions.yaml: autograd "
                "records the ops it calls instead)"
            )
        else:
            message += (
                " (native_functions.yaml has it, without a formula of its own: an in-place "
                "or out= variant, a hand-written autograd kernel, or not differentiable)"
            )
    close = difflib.get_close_matches(wanted, list(index), n=5, cutoff=0.6)
    message += "; did you mean: " + ", ".join(close) + "?" if close else "; see find()"
    raise UnknownOpError(message)


def _join(base: str, overload: str) -> str:
    return f"{base}.{overload}" if overload else base


def _split_field(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(v).strip() for v in value)
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


def _calls(texts: Any) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for text in texts:
        for match in _CALL.finditer(text):
            callee = match.group(1)
            if callee not in _CXX_WORDS:
                seen.setdefault(callee.removeprefix("at::"), None)
    return tuple(seen)
