"""Never silent at construction: the markers users write next to an annotation (``kc.Spec``,
``kc.Range``, ``kc.MatchConfig``, ``kc.Where``, ``kc.InRange``) and ``kc.op`` itself, given values of
the wrong kind. Before (2026-12-06, third review), ``kc.Range(ge="a")`` and ``kc.Spec(dtypes=5)``
escaped as TypeError at decoration, ``kc.Where(5)`` as AttributeError, ``kc.op(5)`` as
AttributeError; ``kc.Spec(mutated="x")``, ``kc.Range(finite="yes")`` and ``kc.InRange("x")`` (no bound)
were taken, and ``kc.op`` of a function with no annotation checked nothing. Messages pinned."""

from typing import Annotated, Any

import numpy as np
import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor


@pytest.mark.parametrize(("make", "message"), [
    (lambda: kc.Spec(dtypes=5), "kc.Spec(dtypes=5): give a tuple of torch dtypes, e.g. dtypes=(torch.float32, "
                                "torch.bfloat16)"),
    (lambda: kc.Spec(dtypes=("float32",)), "kc.Spec(dtypes=('float32',)): give a tuple of torch dtypes"),
    (lambda: kc.Spec(mutated="x"), "kc.Spec(mutated='x'): mutated must be True or False, got a str"),
    (lambda: kc.Spec(contiguous=1), "kc.Spec(contiguous=1): contiguous must be True or False, got a int"),
    (lambda: kc.Spec(disjoint=None), "kc.Spec(disjoint=None): disjoint must be True or False, got a NoneType"),
    (lambda: kc.Spec(inner_contiguous="x"), "kc.Spec(inner_contiguous='x'): give the number of trailing dims "
                                            "that must be dense, an int >= 0"),
    (lambda: kc.Spec(inner_contiguous=True), "kc.Spec(inner_contiguous=True): give the number of trailing dims"),
    (lambda: kc.Spec(inner_contiguous=-1), "kc.Spec(inner_contiguous=-1): give the number of trailing dims"),
    (lambda: kc.Spec(same_dtype_as=5), "kc.Spec(same_dtype_as=5): same_dtype_as must be a name (str) or None, "
                                       "got a int"),
    (lambda: kc.Range(ge="a"), "kc.Range(ge='a'): ge must be a number or None, got a str"),
    (lambda: kc.Range(lt=True), "kc.Range(lt=True): lt must be a number or None, got a bool"),
    (lambda: kc.Range(finite="yes"), "kc.Range(finite='yes'): finite must be True or False, got a str"),
    (lambda: kc.MatchConfig(5), "kc.MatchConfig(attr=5): attr must be the config attribute's name (str), got a int"),
    (lambda: kc.MatchConfig("scale", rel_tol="1e-6"), "kc.MatchConfig(rel_tol='1e-6'): rel_tol must be a number"),
    (lambda: kc.MatchConfig("scale", rel_tol=-1e-6), "kc.MatchConfig(rel_tol=-1e-06): rel_tol must be a number >= 0"),
    (lambda: kc.Where(5), "kc.Where(expr=5): expr must be a constraint over dims (str), e.g. 'HV % H == 0', got a int"),
    (lambda: kc.Where("H > 0", hint=3), "kc.Where(hint=3): hint must be a str or None, got a int"),
    (lambda: kc.Where("H > 0", kind=ValueError), "kc.Where(kind=<class 'ValueError'>): kind must be a "
                                                 "kc.ContractError subclass (ShapeError, DtypeError, ...)"),
    (lambda: kc.InRange("idx"), "kc.InRange('idx') has no bound, so it checks nothing: give low=, high= or both"),
    (lambda: kc.InRange("idx", 0.5), "kc.InRange('idx', low=0.5): a bound is an int or a dim's name, got 0.5"),
    (lambda: kc.InRange("idx", high=True), "kc.InRange('idx', high=True): a bound is an int or a dim's name, got True"),
], ids=["dtypes-int", "dtypes-str", "mutated", "contiguous", "disjoint", "inner-str", "inner-bool",
        "inner-negative", "same-dtype-as", "range-str", "range-bool", "range-finite", "match-attr", "match-tol-str",
        "match-tol-negative", "where-expr", "where-hint", "where-kind", "inrange-unbounded", "inrange-float",
        "inrange-bool"])
def test_a_marker_of_the_wrong_kind_is_an_annotation_error_when_made(make: Any, message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        make()
    assert str(err.value).startswith(message)


def test_markers_of_the_right_kind_are_taken_as_given() -> None:
    assert kc.Spec(dtypes=[torch.float32]).dtypes == (torch.float32,)  # a list, kept hashable as a tuple
    assert hash(kc.Spec(dtypes=[torch.float32], dim_order=[1, 0]))
    assert kc.MatchConfig("scale", rel_tol=0).rel_tol == 0
    assert kc.InRange("idx", high="N").bounds() == ("N",)


def test_numpy_bounds_of_a_range_are_python_numbers_and_checked() -> None:
    rng = kc.Range(ge=np.float32(0.5), lt=np.int64(3))
    assert (rng.ge, rng.lt) == (0.5, 3) and type(rng.ge) is float and type(rng.lt) is int

    @kc.contract(register=False)
    def f(x: Float[Tensor, "b"], w: Annotated[float, rng]) -> None: ...

    f(torch.zeros(2), 1.0)
    with pytest.raises(kc.ContractError,
                       match=r"w: ValueRangeError\n      expected >= 0.5 and < 3\n      got      3.0"):
        f(torch.zeros(2), 3.0)


def test_kc_op_of_something_not_a_function_is_an_annotation_error() -> None:
    for target in (5, print):
        with pytest.raises(kc.AnnotationError, match=r"^kc.op takes a function or a method, got a "
                                                     r"(int|builtin_function_or_method) instance: contract the "
                                                     r"function itself"):
            kc.op(name="not_a_function")(target)


def test_kc_op_with_nothing_to_check_is_an_annotation_error_and_registers_nothing() -> None:
    before = set(kc.registered_contracts())

    def bare(x, out):  # type: ignore[no-untyped-def]
        out.copy_(x)

    with pytest.raises(kc.AnnotationError, match=r"\.bare: kc.op found nothing to check: no parameter or return "
                                                 r"annotation\. Annotate its tensors \(x: Float\[Tensor, 'B D'\]\) and "
                                                 r"scalars, the contract every backend's call is checked against "
                                                 r"\(kc.check in the body checks the torch reference only\)$"):
        kc.op(bare)

    def f(x, i):  # type: ignore[no-untyped-def]
        ...

    def v1(x: Float[Tensor, "b"], i: Int[Tensor, "b"]) -> None: ...
    def v2(x: Float[Tensor, "b c"], i: Int[Tensor, "b"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match="every variant must bind the same dims"):
        kc.op(name="two_variants_refused", variants={"a": v1, "b": v2}, variant=lambda x: "a")(f)
    assert set(kc.registered_contracts()) == before  # a refused op leaves no contract behind


def _scaler(m: float) -> Any:
    def scale(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x * m
    return scale


def test_two_ops_of_one_name_from_different_functions_have_torch_ops_of_their_own() -> None:
    # before: the second replaced the first's torch.library op, so the first's torch_op ran the second's body
    first = kc.op(name="edge_dup")(_scaler(2.0))

    def scale(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x * 3

    second = kc.op(name="edge_dup")(scale)  # (two tests' local ops of one name, say)
    assert kc.ops()["edge_dup"] is second  # the latest is listed
    ones = torch.ones(1, 2)
    assert torch.equal(first.torch_op(ones), torch.full((1, 2), 2.0))
    assert torch.equal(second.torch_op(ones), torch.full((1, 2), 3.0))
    assert torch.equal(first.torch_op(ones), torch.full((1, 2), 2.0))
    assert second.torch_op._qualname.endswith("::edge_dup_2")


def test_a_shipped_ops_name_is_refused_for_another_function() -> None:
    def packed_decode(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x

    with pytest.raises(kc.AnnotationError, match=r"^packed_decode: the name of a kda_contracts op \(kda_contracts\."
                                                 r".*\); an op of this name would take its place in kc.ops\(\) and "
                                                 r"its plug-in backends\. Give this one a name of its own: "
                                                 r"kc.op\(name=\.\.\.\)$"):
        kc.op(packed_decode)
    assert kc.ops()["packed_decode"] is kc.packed_decode


def test_the_same_function_defined_again_takes_its_name_over() -> None:
    # a module reloaded or a notebook cell run twice defines the same function again
    kc.op(name="edge_redefined")(_scaler(2.0))
    again = kc.op(name="edge_redefined")(_scaler(5.0))
    assert kc.ops()["edge_redefined"] is again
    assert torch.equal(again(torch.ones(1, 2)), torch.full((1, 2), 5.0))
    assert torch.equal(again.torch_op(torch.ones(1, 2)), torch.full((1, 2), 5.0))
    assert again.torch_op._qualname.endswith("::edge_redefined")  # the same function keeps its library name


def test_a_refused_op_is_not_listed() -> None:
    def orphan(x: Float[Tensor, "B D"], backend: int) -> None: ...

    with pytest.raises(kc.AnnotationError, match="an op parameter cannot be named 'backend'"):
        kc.op(orphan)

    def nothing(x, out):  # type: ignore[no-untyped-def]
        ...

    with pytest.raises(kc.AnnotationError, match="found nothing to check"):
        kc.op(nothing)
    assert "orphan" not in kc.ops() and "nothing" not in kc.ops()
