"""Never silent at decoration, the cases a second adversarial review found (2026-12-06): hints beartype
cannot check escaped as beartype's own exceptions, options of the wrong kind escaped as TypeError,
AttributeError or ValueError from inside the engine (or were read letter by letter, or taken and
ignored); PEP 646/692 ``Unpack`` on ``*args``/``**kwargs`` escaped; a TypedDict's fields were never
checked (beartype checks only that the value is a mapping). Each is now an AnnotationError naming
the option or argument, or checked; messages pinned."""

# No `from __future__ import annotations`: each annotation is evaluated where its function is defined.
import re
from typing import Annotated, Any, ClassVar, Protocol

import pytest
import torch
import typing_extensions
from typing_extensions import NotRequired, TypedDict, TypeVarTuple, Unpack

import kda_contracts as kc
from kda_contracts import Float, Tensor


def _decorate(fn: Any, **options: Any) -> Any:
    return kc.contract(register=False, **options)(fn)


class _NotRuntime(Protocol):  # (not @runtime_checkable: isinstance cannot test it)
    def foo(self) -> int: ...


def _hint_3(x: Float[Tensor, "b"], y: 3) -> None: ...  # type: ignore[valid-type]
def _hint_ellipsis(x: Float[Tensor, "b"], y: ...) -> None: ...  # type: ignore[valid-type]
def _hint_list_literal(x: Float[Tensor, "b"], y: [int]) -> None: ...  # type: ignore[valid-type]
def _hint_classvar(x: Float[Tensor, "b"], y: ClassVar[int]) -> None: ...  # type: ignore[misc]
def _hint_protocol(x: Float[Tensor, "b"], y: _NotRuntime) -> None: ...
def _hint_never(x: Float[Tensor, "b"], y: typing_extensions.Never) -> None: ...


@pytest.mark.parametrize(("fn", "why"), [
    # (beartype's own exception names the cause; only its family is pinned, as a release may rename it)
    (_hint_3, "3 cannot be checked (Beartype"),
    (_hint_ellipsis, "Ellipsis cannot be checked (Beartype"),
    (_hint_list_literal, "[<class 'int'>] cannot be checked ("),
    (_hint_classvar, "ClassVar[int] cannot be checked (Beartype"),
    (_hint_protocol, "_NotRuntime cannot be checked (Beartype"),
    (_hint_never, "cannot be checked (Beartype"),
], ids=["int", "ellipsis", "list-literal", "classvar", "protocol", "never"])
def test_a_hint_beartype_cannot_check_is_an_annotation_error_naming_the_argument(fn: Any, why: str) -> None:
    with pytest.raises(kc.AnnotationError, match=re.escape(f"{fn.__name__}: argument 'y': ") + ".*"
                       + re.escape(why)) as err:
        _decorate(fn)
    assert str(err.value).endswith("annotate it with a checkable type, or leave it unannotated")


class _Opts(TypedDict):
    n: int
    tags: NotRequired[list[str]]
    note: Annotated[NotRequired[str], "a doc string"]  # (PEP 655: the mark may sit inside Annotated)


def test_a_typeddict_argument_has_its_keys_and_values_checked() -> None:
    def f(x: Float[Tensor, "b"], opts: _Opts) -> None: ...
    f = _decorate(f)
    x = torch.zeros(2)
    f(x, {"n": 1})
    f(x, {"n": 1, "tags": ["a"], "note": "b"})
    f(x, {"n": 1, "other": object()})  # (a key it does not declare: a TypedDict's subclass may add it)
    for bad, got in (({"n": "1"}, "dict (opts['n']: expected int, got str)"),
                     ({}, "dict (opts key 'n': missing (required by _Opts))"),
                     ({"n": 1, "tags": ["a", 2]}, "dict (opts['tags'][1]: expected str, got int)"),
                     ({"n": 1, "note": 3}, "dict (opts['note']: expected Annotated[str, 'a doc string'], got int)")):
        with pytest.raises(kc.ArgumentTypeError) as err:
            f(x, bad)
        assert str(err.value).splitlines()[1:4] == ["  [1] opts: ArgumentTypeError", "      expected _Opts",
                                                    f"      got      {got}"]


def test_unpack_a_typeddict_on_kwargs_checks_the_keywords_pep_692() -> None:
    def f(x: Float[Tensor, "b"], **kw: Unpack[_Opts]) -> None: ...
    f = _decorate(f)
    f(torch.zeros(2), n=1, tags=["a"])
    with pytest.raises(kc.ArgumentTypeError, match=re.escape("got      dict (kw['n']: expected int, got str)")):
        f(torch.zeros(2), n="1")
    with pytest.raises(kc.ArgumentTypeError, match=re.escape("got      dict (kw key 'n': missing (required by "
                                                             "_Opts))")):
        f(torch.zeros(2))



class _Plain(TypedDict):  # (fields types alone decide: a type tree, traced as isinstance tests)
    n: int
    tags: NotRequired[list[str]]


def test_a_typeddict_whose_fields_types_decide_is_read_into_a_type_tree() -> None:
    from kda_contracts._engine.reading.type_trees import TypedDictOf, read_types

    tree = read_types(_Plain)
    assert isinstance(tree, TypedDictOf) and tree.required == ("n",)
    assert tree.match({"n": 1, "tags": ["a"]}, {}, "o") is None
    assert tree.match({"tags": []}, {}, "o") == (kc.ArgumentTypeError, "o key 'n': missing (required by _Plain)")
    assert read_types(_Opts) is None  # (an Annotated field: beartype decides it, item by item)


@pytest.mark.parametrize("td", [_Plain, _Opts], ids=["type-tree", "beartype"])
@pytest.mark.parametrize("how", ["argument", "kwargs"])
def test_a_typeddict_is_checked_under_torch_compile_as_in_eager(how: str, td: Any) -> None:
    # (the traced type check: a good call first, then bad ones, each rejected; a body that computes)
    if how == "argument":
        def f(x: Float[Tensor, "b"], opts: td) -> Float[Tensor, "b"]:  # type: ignore[valid-type]
            return x * 2

        def call(fn: Any, **kw: Any) -> Any:
            return fn(torch.zeros(2), kw)
    else:
        def f(x: Float[Tensor, "b"], **opts: Unpack[td]) -> Float[Tensor, "b"]:  # type: ignore[misc, valid-type]
            return x * 2

        def call(fn: Any, **kw: Any) -> Any:
            return fn(torch.zeros(2), **kw)
    compiled = torch.compile(_decorate(f), backend="eager")
    assert call(compiled, n=1).shape == (2,)
    for bad in ({"n": "1"}, {}, {"n": 1, "tags": [2]}):
        with pytest.raises(kc.ArgumentTypeError, match=re.escape("[1] opts: ArgumentTypeError")):
            call(compiled, **bad)


_Ts = TypeVarTuple("_Ts")


def test_unpack_a_tuple_on_args_checks_the_items_pep_646() -> None:
    def f(x: Float[Tensor, "b"], *rest: Unpack[tuple[int, str]]) -> None: ...
    f = _decorate(f)
    f(torch.zeros(2), 1, "a")
    for bad in ((1,), ("a", 1), (1, "a", 2)):
        with pytest.raises(kc.ArgumentTypeError, match=re.escape("expected tuple[int, str]")):
            f(torch.zeros(2), *bad)

    def g(x: Float[Tensor, "b"], *rest: Unpack[_Ts]) -> None: ...  # (a TypeVarTuple: any items)
    _decorate(g)(torch.zeros(2), 1, "a", None)

    def h(x: Float[Tensor, "b"], **kw: Unpack[tuple[int]]) -> None: ...  # type: ignore[misc]
    with pytest.raises(kc.AnnotationError, match=re.escape("h: argument **kw: Unpack[tuple[int]] on this "
                                                           "parameter takes a TypedDict")):
        _decorate(h)


def _f(x: Float[Tensor, "B H"]) -> None: ...


class _RaisingDims:
    def contract_dims(self) -> dict[str, int]:
        raise KeyError("boom")


@pytest.mark.parametrize(("options", "message"), [
    (dict(config=5), "kc.contract: config=: int is not a config: pass an object with contract_dims(), a pydantic "
                     "model, a dataclass or a mapping of dims"),
    (dict(config=_RaisingDims()), "kc.contract: config=: _RaisingDims.contract_dims() raised KeyError: 'boom'"),
    (dict(config={"H": -1}), "kc.contract: config=: H = -1, and a dim is a size (>= 0)"),
    (dict(config_arg=3), "kc.contract: config_arg= takes the name of a parameter, got 3"),
    (dict(where="H > 0"), "kc.contract: where= takes a list of constraints, got the str 'H > 0' (write ['H > 0'])"),
    (dict(where=[1]), "kc.contract: where= takes a list of constraints; 1 (int) is not one"),
    (dict(bind_first="x"), "kc.contract: bind_first= takes a list of parameter names, got the str 'x' "
                           "(write ['x'])"),
    (dict(hints=5), "kc.contract: hints= takes a list of functions (violation, ctx) -> str | None, got int 5"),
    (dict(hints=["no"]), "kc.contract: hints= takes a list of functions (violation, ctx) -> str | None; 'no' (str) "
                         "is not one"),
    (dict(value_checks=1), "kc.contract: value_checks= takes a function (ctx -> [Violation]) or None, got int 1"),
    (dict(value_rules=[5]), "kc.contract: value_rules= takes a list of value rules (kc.InRange, kc.Finite, ...); "
                            "5 (int) is not one"),
    (dict(mode="bogus"), "kc.contract(mode='bogus'): unknown mode 'bogus'; expected one of 'off', 'check', "
                         "'strict', 'watch'"),
    (dict(name=5), "kc.contract: name= takes a non-empty str, got 5"),
    (dict(autograd="yes"), "kc.contract: autograd= takes True or False, got 'yes'"),
    (dict(doc=1), "kc.contract: doc= takes True, False or None, got 1"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else "")
def test_a_contract_option_of_the_wrong_kind_is_an_annotation_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        kc.contract(register=False, **options)(_f)
    assert str(err.value) == message


def _op_body(x: Float[Tensor, "B D"], out: Any) -> None: ...


@pytest.mark.parametrize(("options", "message"), [
    (dict(returns=5), "kc.op: returns= takes a list of parameter names, got int 5"),
    (dict(after=5), "kc.op: after= takes a function (ctx, backend -> [Violation]) or None, got int 5"),
    (dict(unchecked_dims=["Q"]), "kc.op: unchecked_dims= takes a function ((variant, *args) -> dims) or None, got "
                                 "list ['Q']"),
    (dict(written=1), "kc.op: written= takes a function (ctx -> {argument: None | rows}) or None, got int 1"),
    (dict(variant="v"), "kc.op: variant= takes a function (the op's parameters -> the call's variant) or None, "
                        "got str 'v'"),
    (dict(variants=[1]), "kc.op: variants= takes a mapping of variant name -> function, got list"),
    (dict(namespace="a b"), "kc.op: namespace= takes a Python identifier (torch.library's namespace), got 'a b'"),
    (dict(namespace=5), "kc.op: namespace= takes a Python identifier (torch.library's namespace), got 5"),
    (dict(value_rules=[5]), "kc.op: value_rules= takes a list of value rules (kc.InRange, kc.Finite, ...); 5 (int) "
                            "is not one"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else "")
def test_an_op_option_of_the_wrong_kind_is_an_annotation_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        kc.op(**options)(_op_body)
    assert str(err.value) == message


def test_registering_a_backend_name_twice_is_an_annotation_error() -> None:
    @kc.op(namespace="kc_test_decoration_edges")
    def twice(x: Float[Tensor, "B D"], out: Float[Tensor, "B D"]) -> None:
        out.copy_(x)

    twice.backend("b", devices=("cpu",))(lambda x, out: None)
    with pytest.raises(kc.AnnotationError, match=re.escape("twice: a backend named 'b' is already registered "
                                                           "(pass replace=True)")):
        twice.backend("b", devices=("cpu",))(lambda x, out: None)
    with pytest.raises(kc.AnnotationError, match=re.escape("twice: 'auto' is not a backend name")):
        twice.backend("auto", devices=("cpu",))(lambda x, out: None)


def _default_none_tensor(x: Float[Tensor, "b"], y: Float[Tensor, "b"] = None) -> None: ...  # type: ignore[assignment]
def _default_str_int(x: Float[Tensor, "b"], n: int = "oops") -> None: ...  # type: ignore[assignment]
def _default_none_float(x: Float[Tensor, "b"], s: float = None) -> None: ...  # type: ignore[assignment]  # noqa: RUF013
def _default_none_list(x: Float[Tensor, "b"], ys: list[Float[Tensor, "b"]] = None) -> None: ...  # type: ignore  # noqa: RUF013


@pytest.mark.parametrize(("fn", "arg", "default", "fix"), [
    (_default_none_tensor, "y", "None", "add | None to the annotation"),
    (_default_str_int, "n", "'oops'", "give a default of the annotated type"),
    (_default_none_float, "s", "None", "add | None to the annotation"),
    (_default_none_list, "ys", "None", "add | None to the annotation"),
], ids=["tensor", "int", "float", "list-of-tensors"])
def test_a_default_its_own_annotation_refuses_is_an_annotation_error(fn: Any, arg: str, default: str,
                                                                       fix: str) -> None:
    # (every call leaving the argument out would otherwise be refused, and blamed on the caller)
    with pytest.raises(kc.AnnotationError) as err:
        _decorate(fn)
    assert str(err.value) == (f"{fn.__name__}: argument {arg!r}: the default {default} does not fit the annotation, "
                              f"so every call that leaves it out would be refused; {fix}")


def test_defaults_that_fit_their_annotations_decorate() -> None:
    def f(x: Float[Tensor, "b"], y: Float[Tensor, "b"] | None = None, n: int = 2, s: float = 1,
          cfg: Any = None, w: Float[Tensor, "b"] = torch.zeros(2)) -> None: ...  # noqa: B008
    f = _decorate(f)
    f(torch.zeros(2))
    with pytest.raises(kc.ShapeError):  # (a tensor default is the call's: held to its dims)
        f(torch.zeros(3))


def test_same_dtype_as_between_annotations_with_no_dtype_in_common_is_an_annotation_error() -> None:
    from kda_contracts import Int

    def f(x: Int[Tensor, "b"], d: Annotated[Float[Tensor, "b"], kc.Spec(same_dtype_as="x")]) -> None: ...
    with pytest.raises(kc.AnnotationError, match=re.escape("f: argument 'd': same_dtype_as='x', but its dtypes (")
                       + r".*" + re.escape("have none in common: no call could pass")):
        _decorate(f)

    def g(x: Float[Tensor, "b"], d: Annotated[Float[Tensor, "b"], kc.Spec(same_dtype_as="x")]) -> None: ...
    _decorate(g)(torch.zeros(2), torch.zeros(2))


def test_paramspec_args_and_kwargs_pass_through_as_any_arguments() -> None:
    from typing import ParamSpec

    P = ParamSpec("P")

    def f(x: Float[Tensor, "b"], *args: P.args, **kwargs: P.kwargs) -> None: ...  # was a raw TypeError
    f = _decorate(f)
    f(torch.zeros(2), 1, "a", k=None)
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(2, 2))
