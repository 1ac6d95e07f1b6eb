"""convlab.aten.derivatives against the installed torch: entries, schemas, names, errors."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from convlab.aten import derivatives as d

CONV_ENTRIES = {
    # name: (inputs with a backward formula, the callee they use, forward-mode callee)
    "convolution": (("input", "weight", "bias"), "convolution_backward_symint", "convolution_jvp"),
    "_convolution": (
        ("input", "weight", "bias"),
        "convolution_backward_symint",
        "_convolution_jvp",
    ),
    "convolution_backward": (
        ("grad_output", "input", "weight"),
        "_convolution_double_backward_symint",
        "convolution_backward_jvp_grad_bias",
    ),
    "convolution_overrideable": (
        ("input", "weight", "bias"),
        "convolution_backward_overrideable_symint",
        None,
    ),
    "convolution_backward_overrideable": (
        ("grad_output", "input", "weight"),
        "_convolution_double_backward_symint",
        None,
    ),
    "_slow_conv2d_forward": (("self", "weight", "bias"), "_slow_conv2d_backward_symint", None),
    "_slow_conv2d_backward.output_mask": (
        ("grad_output", "self", "weight"),
        "_convolution_double_backward_symint",
        None,
    ),
    "cudnn_convolution": (("self", "weight"), "_cudnn_convolution_backward", None),
    "cudnn_convolution_transpose": (("self", "weight"), "_cudnn_convolution_backward", None),
    "mkldnn_convolution": (("self", "weight", "bias"), "convolution_backward_symint", None),
    "_conv_depthwise2d": (("self", "weight", "bias"), "convolution_backward_symint", None),
    "slow_conv_dilated2d": (("self", "weight", "bias"), "convolution_backward_symint", None),
}
ALL_ENTRY_NAMES = sorted(d._derivatives_index())
ALL_SCHEMA_NAMES = sorted(d._native_index())


def test_yaml_files_are_found_in_the_installed_torchgen() -> None:
    for which in ("derivatives", "native_functions"):
        path = d.yaml_path(which)
        assert path.is_file() and path.name == which + ".yaml"
        assert "torchgen" in path.parts
    with pytest.raises(ValueError, match="which must be one of"):
        d.yaml_path("tags")


def test_parsing_is_cached_and_uses_libyaml_when_present() -> None:
    assert d.load_derivatives() is d.load_derivatives()
    assert d.load_native_functions() is d.load_native_functions()
    assert len(d.load_derivatives()) == len(ALL_ENTRY_NAMES) > 500
    if hasattr(__import__("yaml"), "CSafeLoader"):
        assert d.LOADER.__name__ == "CSafeLoader"


@pytest.mark.parametrize("name", sorted(CONV_ENTRIES))
def test_conv_entries_have_formulas_calling_the_expected_callee(name: str) -> None:
    inputs, callee, forward_callee = CONV_ENTRIES[name]
    e = d.entry(name)
    assert tuple(e.formulas) == inputs
    assert list(e.groups) == [inputs], "one key lists all the inputs"
    for i in inputs:
        assert e.formulas[i] == e.groups[inputs]
        assert callee in e.callees(i)
    if forward_callee is None:
        assert e.forward == {}
    else:
        assert forward_callee in e.forward_callees()
    assert e.qualified_name == "aten::" + name
    assert e.schema.startswith(name + "(") or e.schema.startswith(name.split(".")[0] + ".")


def test_convolution_backward_has_one_forward_formula_per_output() -> None:
    e = d.entry("convolution_backward")
    assert sorted(e.forward) == ["result0", "result1", "result2"]
    # bilinearity: each tangent is a sum of two convolution_backward calls
    assert e.forward["result0"].count("convolution_backward_symint(") == 2
    assert e.forward["result1"].count("convolution_backward_symint(") == 2
    assert "grad_input_mask" in e.formulas["weight"]


def test_callees_ignore_methods_and_templates() -> None:
    assert d.entry("convolution").callees() == ("convolution_backward_symint",)
    assert d.entry("cudnn_convolution").callees() == ("_cudnn_convolution_backward",)
    with pytest.raises(KeyError, match="no backward formula for input 'bias'"):
        d.entry("cudnn_convolution").callees("bias")


def test_other_entry_fields() -> None:
    assert d.entry("any").output_differentiability == (False,)
    assert d.entry("convolution").output_differentiability is None
    assert "index" in d.entry("gather").non_differentiable
    assert "index" not in d.entry("gather").formulas
    multi = d.entry("_test_autograd_multiple_dispatch.fullcoverage")
    assert set(multi.dispatch) == {"AutogradNestedTensor", "AutogradCUDA"}
    assert multi.formulas["self"] != multi.dispatch["AutogradCUDA"]["self"]


@pytest.mark.parametrize(
    "form",
    [
        "convolution",
        "aten::convolution",
        "convolution.default",
        "aten::convolution.default",
        "  convolution(Tensor input, Tensor weight) -> Tensor",
        torch.ops.aten.convolution,
        torch.ops.aten.convolution.default,
    ],
    ids=str,
)
def test_name_forms_resolve_to_the_same_entry(form: object) -> None:
    assert d.entry(form) is d.entry("convolution")
    assert d.schema(form) is d.schema("convolution")


def test_overload_names_resolve() -> None:
    e = d.entry("_slow_conv2d_backward.output_mask")
    assert (e.name, e.overload) == ("_slow_conv2d_backward", "output_mask")
    assert d.entry(torch.ops.aten._slow_conv2d_backward.output_mask) is e
    # derivatives.yaml has only this overload, so the bare name is not ambiguous there
    assert d.entry("aten::_slow_conv2d_backward") is e
    s = d.schema("_slow_conv2d_backward.grad_input")
    assert s.arguments[-3:] == ("grad_input", "grad_weight", "grad_bias")
    with pytest.raises(KeyError, match="no default overload.*grad_input.*output_mask"):
        d.schema("_slow_conv2d_backward")
    assert d.entry("sum.dim_IntList").overload == "dim_IntList"
    assert d.entry("sum").overload == ""


@given(st.sampled_from(ALL_ENTRY_NAMES))
def test_every_entry_resolves_by_each_spelling(name: str) -> None:
    e = d.entry(name)
    assert d.entry("aten::" + name) is e
    assert e.qualified_name == "aten::" + name
    if "." not in name:
        assert d.entry(name + ".default") is e


def test_entry_schemas_are_native_function_signatures() -> None:
    autogen = {a for s in d._native_index().values() for a in s.autogen}
    for name in ALL_ENTRY_NAMES:
        if name in ALL_SCHEMA_NAMES:
            assert d.entry(name).schema == d.schema(name).func, name
        else:  # generated variants (e.g. *_functional) are not written in the yaml
            assert name in autogen, name


def test_native_schemas_match_the_live_operators() -> None:
    names = d.find("conv", where="native_functions")
    assert "convolution_backward" in names and "_slow_conv2d_backward.grad_input" in names
    for name in names:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        live = [(a.name, str(a.type)) for a in op._schema.arguments]
        ours = [(a.name, str(a.type)) for a in torch._C.parse_schema(d.schema(name).func).arguments]
        assert ours == live, name


def test_schema_dispatch_tags_and_autogen() -> None:
    s = d.schema("convolution_backward")
    assert s.dispatch == {
        "CompositeExplicitAutograd": "convolution_backward",
        "CUDA": "convolution_backward",
    }
    assert s.tags == ("core",) and s.autogen == ("convolution_backward.out",)
    assert torch.Tag.core in torch.ops.aten.convolution_backward.default.tags
    assert hasattr(torch.ops.aten.convolution_backward, "out")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::convolution_backward", "CompositeExplicitAutograd"
    )
    assert s.python_module is None and not s.composite_implicit
    slow = d.schema("_slow_conv2d_forward")
    assert set(slow.dispatch) == {"CPU", "CUDA"} and slow.python_module == "nn"
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_slow_conv2d_forward", "CPU")
    for implicit in ("conv2d", "_convolution_double_backward"):
        assert d.schema(implicit).composite_implicit, implicit
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            "aten::" + implicit, "CompositeImplicitAutograd"
        )
    assert d.schema("add.Tensor").structured_delegate == "add.out"
    assert not d.schema("add.Tensor").composite_implicit


def test_node_names_match_the_live_autograd_graph() -> None:
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    aten = torch.ops.aten
    y = F.conv2d(x, w, b)
    assert type(y.grad_fn).__name__ == d.entry("convolution").node == "ConvolutionBackward0"
    flags = (False, False, True, True)  # benchmark, deterministic, cudnn_enabled, allow_tf32
    y1 = aten._convolution(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, *flags)
    assert type(y1.grad_fn).__name__ == d.entry("_convolution").node == "ConvolutionBackward1"
    slow = aten._slow_conv2d_forward(x, w, [3, 3], b, [1, 1], [0, 0])
    assert type(slow.grad_fn).__name__ == d.entry("_slow_conv2d_forward").node
    (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert type(gx.grad_fn).__name__ == d.entry("convolution_backward").node
    (gs,) = torch.autograd.grad(slow.sum(), x, create_graph=True)
    assert type(gs.grad_fn).__name__ == d.entry("_slow_conv2d_backward.output_mask").node
    assert type((x + x).grad_fn).__name__ == d.entry("add.Tensor").node
    assert type(x.sum(dim=1).grad_fn).__name__ == d.entry("sum.dim_IntList").node == "SumBackward1"
    if torch.backends.mkldnn.is_available():
        m = aten.mkldnn_convolution(x.float(), w.float(), b.float(), [0, 0], [1, 1], [1, 1], 1)
        assert type(m.grad_fn).__name__ == d.entry("mkldnn_convolution").node


def test_find() -> None:
    conv = d.find("conv")
    assert conv == sorted(n for n in ALL_ENTRY_NAMES if "conv" in n)
    assert "convolution" in conv and "_slow_conv2d_forward" in conv and "add.Tensor" not in conv
    assert d.find("^convolution") == [
        "convolution",
        "convolution_backward",
        "convolution_backward_overrideable",
        "convolution_overrideable",
    ]
    assert d.find(r"_slow_conv2d_backward\.") == ["_slow_conv2d_backward.output_mask"]
    assert d.find("^thnn_conv2d", where="native_functions") == ["thnn_conv2d", "thnn_conv2d.out"]
    assert d.find("^thnn") == []  # thnn_conv2d has no formula of its own
    assert d.find("conv2d(") == []  # an invalid regex is a plain substring; no name has "("
    with pytest.raises(ValueError, match="where must be one of"):
        d.find("conv", where="tags")
    with pytest.raises(TypeError, match="pattern must be a str"):
        d.find(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("convolutoin", "convolution"),
        ("aten::convolution_backwrd", "convolution_backward"),
        ("_slow_conv2d_foward", "_slow_conv2d_forward"),
        ("_slow_conv2d_backward.outputmask", "_slow_conv2d_backward.output_mask"),
        ("cudnn_convolution_backward", "cudnn_convolution_transpose"),
    ],
)
def test_misspelt_names_raise_key_error_with_suggestions(typo: str, suggestion: str) -> None:
    with pytest.raises(KeyError, match="did you mean") as info:
        d.entry(typo)
    assert isinstance(info.value, d.UnknownOpError)
    assert suggestion in str(info.value).split("did you mean:")[1]


def test_ops_without_a_formula_say_why() -> None:
    with pytest.raises(KeyError, match="CompositeImplicitAutograd"):
        d.entry("conv2d")
    with pytest.raises(KeyError, match="is not in native_functions.yaml"):
        d.schema("thnn_conv2d_backward")  # removed in 2021


@pytest.mark.parametrize("name", ["convolution.bogus", "convolution_backward.nope",
                                  "_slow_conv2d_backward.bogus"])
def test_a_bad_overload_is_not_said_to_be_in_native_functions(name: str) -> None:
    """Regression (issue 21 D16): the base op's native entry was reported for the overload."""
    with pytest.raises(KeyError) as info:
        d.entry(name)
    text = str(info.value)
    assert "native_functions.yaml has it" not in text
    base, _, overload = name.partition(".")
    assert f"has no overload {overload!r}" in text


@given(base=st.sampled_from(["convolution", "convolution_backward", "_slow_conv2d_backward",
                             "add", "mul"]),
       overload=st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
def test_an_overload_said_to_exist_does_exist(base: str, overload: str) -> None:
    """Class of D16: whatever the error claims about native_functions.yaml is true."""
    name = f"{base}.{overload}"
    try:
        d.entry(name)
    except KeyError as err:
        if "native_functions.yaml has it" in str(err) or "CompositeImplicit" in str(err):
            d.schema(name if overload != "default" else base)  # must exist
        return


@given(st.text(max_size=30))
def test_any_string_gives_an_entry_or_a_clear_error(text: str) -> None:
    try:
        e = d.entry(text)
    except (KeyError, ValueError) as err:
        assert str(err)
    else:
        assert isinstance(e, d.Entry)


def test_bad_name_types_and_namespaces() -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        d.entry(3)
    with pytest.raises(ValueError, match="namespace 'prims'"):
        d.schema("prims::add")
    with pytest.raises(ValueError, match="name must look like"):
        d.entry("conv 2d")


@pytest.fixture
def fresh_cache():
    d.clear_cache()
    yield
    d.clear_cache()


def test_missing_torchgen_names_the_expected_path(monkeypatch, fresh_cache) -> None:
    monkeypatch.setattr(d, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="torchgen/packaged/autograd/derivatives.yaml"):
        d.entry("convolution")


def test_missing_or_broken_yaml_file(monkeypatch, fresh_cache, tmp_path: Path) -> None:
    spec = importlib.machinery.ModuleSpec("torchgen", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(d, "find_spec", lambda name: spec)
    expected = tmp_path / "packaged" / "ATen" / "native" / "native_functions.yaml"
    with pytest.raises(FileNotFoundError, match="no such file") as info:
        d.schema("convolution")
    assert str(expected) in str(info.value)
    expected.parent.mkdir(parents=True)
    expected.write_text("just: a mapping\n")
    with pytest.raises(RuntimeError, match="not a YAML list"):
        d.schema("convolution")


def test_docstring_examples_run() -> None:
    import doctest

    result = doctest.testmod(d, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0
