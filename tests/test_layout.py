"""The package's layout is its architecture: three parts, each importing only those below it,
one name for each thing, and no import cycle.

``convlab.scratch`` (from scratch) < ``convlab.aten`` (PyTorch's own code) < ``convlab.lab``
(measuring), with ``convlab.autograd`` and ``convlab.cli`` on top. Every import of a convlab
module, also inside functions, is read from the source with :mod:`ast`; the sources are
found through ``convlab.__file__`` and :mod:`pkgutil`, so the checks read the convlab that
is imported (a checkout, or a non-editable install as on Colab and in ``make compat``).

One name for each thing: a module never re-exports a name it imported (lists it in
``__all__`` or imports it without using it) and has no module ``__getattr__``/``__dir__``
forwarding; callers import a name from the module that defines it. A package's
``__init__`` is the one exception: it may list, in ``__all__``, names of its own
subpackages (the package's public surface, e.g. ``convlab.autograd.convolution``).

The lab has rooms (issue 52): ``method`` (how it measures) < the lab's own modules
(``paths``, ``bench``, ``doctor``, ...) < ``sections`` (a record's sections, each in the one
table ``SECTIONS``) < ``record`` (the record: schema, reading, ``make records``) <
``claims``, each importing only the rooms before it; the old flat module paths are gone,
not forwarded; and the C++ extension is one file per kernel family, none over 500 lines.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

import convlab

# opacus_sampler and dp_step: one module each, not packages, for DP-SGD users (they import
# scratch and aten, dp_step also opacus_sampler; lab's sections import both), so between
# aten and lab
RANK = {"scratch": 0, "aten": 1, "opacus_sampler": 1.5, "dp_step": 1.6, "lab": 2, "autograd": 3,
        "cli": 4}
MAX_LINES = 500
# The lab's rooms, each importing only those before it; "lab" is the lab's own modules.
LAB_RANK = {"method": 0, "lab": 1, "sections": 2, "record": 3, "claims": 4}
LAB_OWN = {"bench", "bench_report", "doctor", "notebook", "paths"}
# Where the flat lab modules went (issue 52): no module may stand at the old path.
MOVED = ("timing", "effect", "machine", "isa_settings", "profiling", "numerics", "records",
         "record_schema", "record_pages", "record_sentences", "version_runs", "suite",
         "roofline", "peers", "reference_speed", "per_sample_timing", "per_sample_auto",
         "dpsgd", "impls", "lowp", "lowp_ours")


@dataclass(frozen=True)
class Module:
    name: str  # convlab.lab.method.timing
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def find_modules(package: str = "convlab") -> list[Module]:
    """Every module of the imported ``package`` (no C++ sources), found with pkgutil."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not importable"
    found = [Module(package, Path(spec.origin))]
    locations = list(spec.submodule_search_locations or [])
    for info in pkgutil.walk_packages(locations, prefix=f"{package}."):
        sub = importlib.util.find_spec(info.name)
        assert sub is not None and sub.origin is not None, info.name
        found.append(Module(info.name, Path(sub.origin)))
    return sorted(found, key=lambda m: m.name)


MODULES = find_modules()
BY_NAME = {m.name: m for m in MODULES}


def part_of(module: str) -> str | None:
    """``convlab.lab.method.timing`` -> ``lab``; the package root itself has no part."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[0] == "convlab" else None


def room_of(module: str) -> str | None:
    """``convlab.lab.method.timing`` -> ``method``; ``convlab.lab.paths`` -> ``lab``; None
    outside the lab (and for ``convlab.lab`` itself)."""
    pieces = module.split(".")
    if pieces[:2] != ["convlab", "lab"] or len(pieces) < 3:
        return None
    return pieces[2] if pieces[2] in LAB_RANK else "lab"


def section_modules(table: dict[str, str]) -> dict[str, str]:
    """The module of each entry of a ``SECTIONS`` table (``name -> "module:function"``)."""
    return {name: target.partition(":")[0] for name, target in table.items()}


def defines_a_section(path: Path) -> bool:
    """Whether ``path`` defines a module-level ``record(quick=...)``: a record section."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "record" and any(
                a.arg == "quick" for a in node.args.args + node.args.kwonlyargs):
            return True
    return False


def convlab_imports(path: Path, known: Iterable[str] = ()) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a convlab module in ``path``, also
    inside functions. ``from convlab.x import y`` counts as ``convlab.x.y`` when that is a
    module of ``known``, else as ``convlab.x``."""
    known = set(known)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("convlab")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: use absolute convlab imports")
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "convlab" or node.module.startswith("convlab.")):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if sub in known else node.module))
    return sorted(set(found))


def import_graph(modules: Iterable[Module]) -> dict[str, set[str]]:
    """module -> the convlab modules it imports (anywhere in its source)."""
    modules = list(modules)
    known = {m.name for m in modules}
    return {m.name: {name for _, name in convlab_imports(m.path, known)
                     if name in known and name != m.name} for m in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a closed
    path through it, e.g. ``[a, b, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, g) for g in groups]


def _closed_path(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A path from the group's first module back to it, inside the group (BFS)."""
    start, members = group[0], set(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:  # v -> start closes the cycle: walk back from v
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [*group, group[0]]


def _all_names(tree: ast.Module) -> set[str]:
    """The strings of a module-level ``__all__`` assignment."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
            return {e.value for e in ast.walk(node.value)
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def re_exports(module: Module) -> list[str]:
    """Names ``module`` imports only to pass on: listed in ``__all__`` (allowed in a
    package ``__init__`` for names of its own subpackages), or imported and never used;
    and module ``__getattr__``/``__dir__`` forwarding."""
    tree = ast.parse(module.path.read_text())
    exported = _all_names(tree)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    problems = [f"line {n.lineno}: module {n.name}() forwards names"
                for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                and n.name in ("__getattr__", "__dir__")]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        source = node.module if isinstance(node, ast.ImportFrom) else None
        for alias in node.names:
            if alias.name == "*":
                problems.append(f"line {node.lineno}: import * from {source}")
                continue
            bound = alias.asname or alias.name.split(".")[0]
            own = module.is_package and source is not None and source.startswith(
                module.name + ".")
            if bound in exported and not own:
                problems.append(f"line {node.lineno}: re-exports {bound} (from "
                                f"{source or alias.name}) in __all__")
            elif bound not in used and bound not in exported:
                problems.append(f"line {node.lineno}: imports {bound} and never uses it")
    return problems


def _bodies(path: Path) -> list[list[str]]:
    """The statements of every function in ``path`` (docstrings left out), as source text
    normalised by the AST (comments and layout do not count)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            out.append([ast.unparse(stmt) for stmt in body])
    return out


def copied_blocks(a: Path, b: Path, size: int = 2) -> list[str]:
    """Runs of ``size`` consecutive statements that a function of ``a`` and one of ``b``
    both contain, verbatim: code that one shared helper should hold."""
    runs = {tuple(body[i:i + size]) for body in _bodies(a) for i in range(len(body) - size + 1)}
    found = []
    for body in _bodies(b):
        for i in range(len(body) - size + 1):
            if tuple(body[i:i + size]) in runs:
                found.append(" / ".join(body[i:i + size]))
    return found


# ---------------------------------------------------------------------------------- tests


def test_modules_are_found_where_convlab_is_imported_from() -> None:
    """Regression (issue 34 E10): in a non-editable install the old path-based search
    found no module, and every check here passed vacuously."""
    root = Path(convlab.__file__).resolve().parent
    assert {m.path.resolve().parent for m in MODULES} >= {root, root / "scratch", root / "lab"}
    assert {"convlab.scratch.reference", "convlab.lab.method.timing", "convlab.cli",
            "convlab.autograd.common"} <= set(BY_NAME)
    on_disk = {p.resolve() for p in root.rglob("*.py") if "csrc" not in p.parts}
    assert on_disk == {m.path.resolve() for m in MODULES}


def test_every_module_belongs_to_a_part() -> None:
    loose = [m.name for m in MODULES if part_of(m.name) is None and m.name != "convlab"
             and m.name != "convlab.__main__"]
    assert not loose, f"modules outside the parts: {loose}"
    loose = [m.name for m in MODULES if len(m.name.split(".")) == 2 and not m.is_package
             and m.name != "convlab.__main__" and part_of(m.name) not in RANK]
    assert not loose, f"modules outside the parts: {loose}"
    parts = {part_of(m.name) for m in MODULES if part_of(m.name) and m.name != "convlab.__main__"}
    assert parts == set(RANK)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_no_module_imports_a_higher_part(module: Module) -> None:
    here = part_of(module.name)
    if here not in RANK:
        return
    upward = [f"line {line}: {name}" for line, name in convlab_imports(module.path, BY_NAME)
              if part_of(name) in RANK and RANK[part_of(name)] > RANK[here]]
    assert not upward, f"{here} must not import a higher part: {upward}"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_no_module_is_over_500_lines(module: Module) -> None:
    lines = len(module.path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it by concept"


def test_no_cpp_source_is_over_500_lines() -> None:
    """Regression (issue 52): convlab_ext.cpp was one 1,318-line file; it is now the
    registration plus one file per kernel family (and the headers they share)."""
    csrc = Path(convlab.__file__).resolve().parent / "aten" / "csrc"
    sources = sorted(csrc.glob("*.cpp")) + sorted(csrc.glob("*.h"))
    assert len(sources) > 1
    long = {p.name: n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split by kernel family: {long}"


def test_the_extension_builds_every_cpp_source() -> None:
    """Every .cpp beside convlab_ext.cpp is compiled into the extension (one list, in
    convlab.aten.extension), and the wheel carries the headers they include."""
    from convlab.aten import extension

    csrc = Path(convlab.__file__).resolve().parent / "aten" / "csrc"
    assert set(extension.SOURCES) == set(csrc.glob("*.cpp"))
    pyproject = Path(convlab.__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():  # a checkout (an installed wheel has no pyproject)
        assert '"csrc/*.h"' in pyproject.read_text()


def test_the_lab_has_rooms_and_its_modules_are_in_them() -> None:
    """Regression (issue 52): ``convlab/lab/`` was 24 flat modules beside ``claims/``. Its
    direct modules are now the rooms and the lab's own few; the old paths are gone (no
    forwarding module left behind)."""
    direct = {m.name.split(".")[2] for m in MODULES
              if m.name.startswith("convlab.lab.") and m.name.count(".") >= 2}
    assert direct == set(LAB_RANK) - {"lab"} | LAB_OWN, direct ^ (set(LAB_RANK) - {"lab"}
                                                                   | LAB_OWN)
    left = [f"convlab.lab.{n}" for n in MOVED if importlib.util.find_spec(f"convlab.lab.{n}")]
    assert not left, f"old module paths still importable: {left}"


@pytest.mark.parametrize("module", [m for m in MODULES if room_of(m.name)],
                         ids=lambda m: m.name)
def test_no_lab_module_imports_a_later_room(module: Module) -> None:
    here = room_of(module.name)
    later = [f"line {line}: {name}" for line, name in convlab_imports(module.path, BY_NAME)
             if room_of(name) and LAB_RANK[room_of(name)] > LAB_RANK[here]]
    assert not later, f"the lab's {here} must not import a later room: {later}"


def test_record_sections_live_in_one_package_registered_in_one_table() -> None:
    """A record section is a module of convlab.lab.sections with ``record(quick=...)`` and one
    line of ``SECTIONS`` (the claims' section is the claims package's own); no module
    elsewhere defines a section, and no section module is left out of the table."""
    from convlab.lab.sections import SECTIONS

    registered = section_modules(SECTIONS)
    package = {m.name for m in MODULES
               if m.name.startswith("convlab.lab.sections.") and not m.is_package}
    assert set(registered.values()) - package == {"convlab.lab.claims"}
    unregistered = package - set(registered.values())
    assert not unregistered, f"section modules missing from SECTIONS: {unregistered}"
    outside = [m.name for m in MODULES if room_of(m.name) in ("method", "lab", "record")
               and defines_a_section(m.path)]
    assert not outside, f"record sections outside convlab.lab.sections: {outside}"
    for name, target in SECTIONS.items():
        module, _, function = target.partition(":")
        assert BY_NAME[module].path.read_text().count(f"def {function}("), name


@pytest.mark.parametrize("room", ["method", "record", "sections"])
def test_a_room_package_imports_nothing_to_pass_on(room: str) -> None:
    """A room's ``__init__`` is its docstring (and, for sections, the table), never a
    re-export of its modules' names. (claims' ``__init__`` joins its tables' rows and uses
    them; test_no_module_re_exports_or_forwards checks it.)"""
    init = BY_NAME[f"convlab.lab.{room}"]
    tree = ast.parse(init.path.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert not imports and not _all_names(tree), \
        f"{init.name} passes names on: {[ast.unparse(n) for n in imports]}"


def test_no_import_cycle() -> None:
    """No two modules import each other, directly or through others, counting the imports
    inside functions (a lazy import hides a cycle, it does not remove it)."""
    found = cycles(import_graph(MODULES))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_no_module_re_exports_or_forwards(module: Module) -> None:
    problems = re_exports(module)
    assert not problems, f"{module.name}: one name per thing, import it from where it is " \
                         f"defined: {problems}"


def test_the_two_autograd_routes_share_code_instead_of_copying_it() -> None:
    """Regression (issue 34): function.py and library_op.py each saved the same context and
    ran the same backward, double backward and jvp steps; they now call autograd/common.py."""
    function, library_op = (BY_NAME[f"convlab.autograd.{n}"].path
                            for n in ("function", "library_op"))
    assert copied_blocks(function, library_op) == []


# ----------------------------------------------------------- the checks themselves can fail


def _fake_package(tmp_path: Path, files: dict[str, str]) -> list[Module]:
    modules = []
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = rel.removesuffix(".py").split("/")
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules.append(Module(name, path))
    return modules


def test_the_checks_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from convlab.lab import timing\n    from . import x\n")
    with pytest.raises(AssertionError, match="absolute"):
        convlab_imports(bad)
    bad.write_text("def f():\n    from convlab.lab import timing\n")
    assert convlab_imports(bad) == [(2, "convlab.lab")]
    assert convlab_imports(bad, {"convlab.lab.timing"}) == [(2, "convlab.lab.timing")]
    assert part_of("convlab.lab.timing") == "lab" and part_of("convlab") is None


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    """The two cycles of issue 34 in miniature: one module-level import one way, one
    function-local import back (reference <-> double_backward, bench <-> suite)."""
    modules = _fake_package(tmp_path, {
        "convlab/__init__.py": "",
        "convlab/lab/__init__.py": "",
        "convlab/lab/bench.py": "def record():\n    from convlab.lab import suite\n",
        "convlab/lab/suite.py": "from convlab.lab import bench\n",
        "convlab/lab/timing.py": "",
        "convlab/scratch/a.py": "import convlab.scratch.b\n",
        "convlab/scratch/b.py": "from convlab.scratch.c import f\n",
        "convlab/scratch/c.py": "def f():\n    from convlab.scratch import a\n",
    })
    found = cycles(import_graph(modules))
    assert ["convlab.lab.bench", "convlab.lab.suite", "convlab.lab.bench"] in found
    assert ["convlab.scratch.a", "convlab.scratch.b", "convlab.scratch.c",
            "convlab.scratch.a"] in found
    assert len(found) == 2
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_re_exports_and_forwarding_are_found(tmp_path: Path) -> None:
    bench, init, ok = _fake_package(tmp_path, {
        "convlab/lab/bench.py": (
            "from convlab.lab.paths import SUITE, Layer  # noqa: F401\n"
            "from convlab.lab.timing import interleaved\n"
            "__all__ = ['run', 'interleaved']\n"
            "def run():\n    return SUITE\n"
            "def __getattr__(name):\n    return name\n"),
        "convlab/autograd/__init__.py": (
            "from convlab.autograd.function import convolution\n"
            "from convlab.scratch import reference\n"
            "from convlab.scratch.params import ConvParams\n"
            "__all__ = ['convolution', 'ConvParams']\n"),
        "convlab/lab/ok.py": (
            "from __future__ import annotations\n"
            "import torch\n"
            "from convlab.lab.paths import Layer\n"
            "__all__ = ['f']\n"
            "def f(x: Layer) -> torch.Tensor:\n    return x\n"),
    })
    text = "\n".join(re_exports(bench))
    assert "imports Layer and never uses it" in text
    assert "re-exports interleaved" in text
    assert "__getattr__() forwards" in text
    assert "SUITE" not in text
    text = "\n".join(re_exports(init))
    assert "imports reference and never uses it" in text
    assert "re-exports ConvParams" in text and "convolution" not in text
    assert re_exports(ok) == []


def test_the_room_and_section_checks_can_fail(tmp_path: Path) -> None:
    assert room_of("convlab.lab.method.timing") == "method"
    assert room_of("convlab.lab.paths") == "lab" and room_of("convlab.lab") is None
    assert room_of("convlab.aten.native") is None
    flat = tmp_path / "suite.py"
    flat.write_text("def record(quick: bool = False) -> dict:\n    return {}\n")
    assert defines_a_section(flat)
    flat.write_text("def record(x):\n    return x\n")
    assert not defines_a_section(flat)
    assert section_modules({"a": "m.n:record"}) == {"a": "m.n"}


def test_copied_blocks_are_found(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text('def f(ctx, x):\n    """doc"""\n    ctx.save(x)\n    ctx.n = 1\n    return x\n')
    b.write_text("def g(ctx, x):\n    y = x\n    ctx.save(x)\n    ctx.n = 1\n")
    assert len(copied_blocks(a, b)) == 1
    b.write_text("def g(ctx, x):\n    ctx.save(x)\n    ctx.n = 2\n")
    assert copied_blocks(a, b) == []
