"""Contracts are code too: a malformed contract fails when it is decorated, with an
``AnnotationError`` that names the function, the argument and the problem (pinned here), never
at the first call and never as another exception type."""

# No `from __future__ import annotations`: the annotations are evaluated when each function is defined.
import re
from collections.abc import Callable
from typing import Annotated, Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Shaped, Tensor

CFG = kc.KDAConfig(num_heads=2, head_k_dim=4)


def _unknown_symbol_in_where() -> Any:
    def f(x: Float[Tensor, "B D"]) -> None: ...
    return kc.contract(where=["Q > 0"])(f)


def _unknown_symbol_in_return() -> Any:
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "B Q"]: ...
    return kc.contract(f)


def _two_unknowns_in_one_dim() -> Any:
    def f(x: Float[Tensor, "B Q*R"]) -> None: ...
    return kc.contract(f)


def _nonlinear_unknown() -> Any:
    def f(x: Float[Tensor, "B Q*Q"]) -> None: ...
    return kc.contract(f)


def _dim_only_in_an_optional_tensor() -> Any:
    def f(x: Float[Tensor, "B D"], y: Float[Tensor, "B E"] | None = None) -> None: ...
    return kc.contract(f)


def _floor_division_by_an_unknown() -> Any:
    def f(x: Float[Tensor, "B D//B"]) -> None: ...
    return kc.contract(f)


def _where_on_a_scalar() -> Any:
    def f(x: Float[Tensor, "B"], scale: float) -> None: ...
    return kc.contract(where=["scale > 0"])(f)


def _power() -> Any:
    def f(x: Float[Tensor, "B 2**H"]) -> None: ...
    return kc.contract(f)


def _trailing_operator() -> Any:
    def f(x: Float[Tensor, "B H+"]) -> None: ...
    return kc.contract(f)


def _unclosed_paren() -> Any:
    def f(x: Float[Tensor, "B (H"]) -> None: ...
    return kc.contract(f)


def _stray_character() -> Any:
    def f(x: Float[Tensor, "B H$"]) -> None: ...
    return kc.contract(f)


def _underscore_inside_an_expression() -> Any:
    def f(x: Float[Tensor, "B 2*_"]) -> None: ...
    return kc.contract(f)


def _constant_division_by_zero() -> Any:
    def f(x: Float[Tensor, "B 4//0"]) -> None: ...
    return kc.contract(f)


def _constraint_without_comparison() -> Any:
    def f(x: Float[Tensor, "B D"]) -> None: ...
    return kc.contract(where=["D % 2"])(f)


def _constraint_with_assignment() -> Any:
    def f(x: Float[Tensor, "B D"]) -> None: ...
    return kc.contract(where=["D = 2"])(f)


def _dangling_chained_comparison() -> Any:
    # "1 < D < 4" is valid (a chained comparison, as in Python); a chain missing its end is not
    def f(x: Float[Tensor, "B D"]) -> None: ...
    return kc.contract(where=["1 < D <"])(f)


def _tree_path_dim() -> Any:
    def f(x: Float[Tensor, "?B D"]) -> None: ...
    return kc.contract(f)


def _dense_block_into_variadic() -> Any:
    def f(x: Annotated[Float[Tensor, "*batch D"], kc.Spec(inner_contiguous=2)]) -> None: ...
    return kc.contract(f)


def _variadic_only_in_the_return() -> Any:
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "*batch D"]: ...
    return kc.contract(f)


def _range_on_a_tensor() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Range(gt=0)]) -> None: ...
    return kc.contract(f)


def _match_config_on_a_tensor() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.MatchConfig("scale")]) -> None: ...
    return kc.contract(f)


def _spec_on_a_scalar() -> Any:
    def f(x: Float[Tensor, "B"], s: Annotated[float, kc.Spec(contiguous=True)]) -> None: ...
    return kc.contract(f)


def _range_on_a_string() -> Any:
    def f(x: Float[Tensor, "B"], s: Annotated[str, kc.Range(gt=0)]) -> None: ...
    return kc.contract(f)


def _two_specs() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(), kc.Spec(contiguous=True)]) -> None: ...
    return kc.contract(f)


def _spec_dtypes_outside_the_category() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(dtypes=(torch.int32,))]) -> None: ...
    return kc.contract(f)


def _spec_allows_no_dtype() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(dtypes=())]) -> None: ...
    return kc.contract(f)


def _inner_contiguous_beyond_the_rank() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(inner_contiguous=2)]) -> None: ...
    return kc.contract(f)


def _empty_range() -> Any:
    def f(x: Float[Tensor, "B"], s: Annotated[float, kc.Range(gt=1, lt=0)]) -> None: ...
    return kc.contract(f)


def _range_closed_on_one_side_only() -> Any:
    def f(x: Float[Tensor, "B"], s: Annotated[float, kc.Range(gt=1, le=1)]) -> None: ...
    return kc.contract(f)


def _nan_range_bound() -> Any:
    def f(x: Float[Tensor, "B"], s: Annotated[float, kc.Range(gt=float("nan"))]) -> None: ...
    return kc.contract(f)


def _match_config_naming_no_config_attribute() -> Any:
    def f(x: Float[Tensor, "K"], s: Annotated[float, kc.MatchConfig("sclae")]) -> None: ...
    return kc.contract(config=CFG)(f)


def _same_dtype_as_a_scalar() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(same_dtype_as="s")], s: float) -> None: ...
    return kc.contract(f)


def _same_dtype_as_nothing() -> Any:
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(same_dtype_as="y")]) -> None: ...
    return kc.contract(f)


def _bind_first_a_scalar() -> Any:
    def f(x: Float[Tensor, "B"], s: float) -> None: ...
    return kc.contract(bind_first=["s"])(f)


def _bare_tensor() -> Any:
    def f(x: torch.Tensor) -> None: ...
    return kc.contract(f)


def _numpy_style_array_type() -> Any:
    def f(x: Float[list, "B"]) -> None: ...
    return kc.contract(f)


def _unresolvable_forward_reference() -> Any:
    def f(x: "Undefined") -> None: ...
    return kc.contract(f)


def _list_of_tensors_return() -> Any:
    def f(x: Float[Tensor, "B D"]) -> list[Float[Tensor, "B D"]]: ...
    return kc.contract(f)


def _dict_of_tensors_return() -> Any:
    def f(x: Float[Tensor, "B D"]) -> dict[str, Float[Tensor, "B"]] | None: ...
    return kc.contract(f)


def _tuple_of_tensor_lists_return() -> Any:
    def f(x: Float[Tensor, "B D"]) -> tuple[list[Float[Tensor, "B"]], list[Float[Tensor, "D"]]]: ...
    return kc.contract(f)


def _tuple_return_mixing_tensors_and_scalars() -> Any:
    def f(x: Float[Tensor, "B"]) -> tuple[Float[Tensor, "B"], int]: ...
    return kc.contract(f)


def _config_arg_that_is_no_parameter() -> Any:
    def f(x: Float[Tensor, "B"]) -> None: ...
    return kc.contract(config_arg="cfg")(f)


def _config_and_config_arg() -> Any:
    def f(x: Float[Tensor, "B"], cfg: object = None) -> None: ...
    return kc.contract(config=CFG, config_arg="cfg")(f)


UNBOUND = r"cannot bind dim {}.*no required tensor has it as a plain dim"
CASES: dict[str, tuple[Callable[[], Any], str]] = {
    # unknown symbols and unbindable dims
    "unknown symbol in where": (_unknown_symbol_in_where, r"\.f: " + UNBOUND.format("'Q' \\(in a constraint")),
    "unknown symbol in the return": (_unknown_symbol_in_return, UNBOUND.format("'Q'")),
    "two unknowns in one dim": (_two_unknowns_in_one_dim, UNBOUND.format(r"'Q' \(in x: 'B Q\*R'\), 'R'")),
    "an unknown that is not linear": (_nonlinear_unknown, UNBOUND.format(r"'Q' \(in x: 'B Q\*Q'\)")),
    "a dim only an optional tensor has": (_dim_only_in_an_optional_tensor, UNBOUND.format(r"'E' \(in y: 'B E'\)")),
    "floor division by the unknown": (_floor_division_by_an_unknown, UNBOUND.format(r"'D' \(in x: 'B D//B'\)")),
    "a constraint on a scalar": (_where_on_a_scalar, UNBOUND.format("'scale'")),
    # bad grammar
    "power operator": (_power, r"f: argument 'x': dim '2\*\*H': cannot parse '2\*\*H': unexpected '\*'"),
    "trailing operator": (_trailing_operator, r"argument 'x': dim 'H\+': cannot parse 'H\+': unexpected end"),
    "unclosed parenthesis": (_unclosed_paren, r"argument 'x': dim '\(H': cannot parse '\(H': unexpected end"),
    "stray character": (_stray_character, r"cannot parse 'H\$' at position 1 \('\$'\); a dim is an expression of "
                                          r"integers and names"),
    "'_' inside an expression": (_underscore_inside_an_expression,
                                 r"'_' \(any size\) must be a dim on its own, not part of an expression"),
    "constant division by zero": (_constant_division_by_zero,
                                  r"f: argument 'x': dim '4//0': cannot parse '4//0': 4//0 divides by zero"),
    "a constraint with no comparison": (_constraint_without_comparison,
                                        r"f: where 'D % 2': cannot parse 'D % 2': expected a comparison "
                                        r"\(== != < <= > >=\) or pow2\(\.\.\.\)"),
    "a constraint with '='": (_constraint_with_assignment, r"f: where 'D = 2': cannot parse 'D = 2' at position 1"),
    "a chained comparison missing its end": (_dangling_chained_comparison,
                                             r"f: where '1 < D <': cannot parse '1 < D <': unexpected end, "
                                             r"at position 7 \(the end\)$"),
    # jaxtyping's modifiers, used wrongly (jaxtyping itself refuses two variadics and #_)
    "a PyTree path dim": (_tree_path_dim, r"f: argument 'x': dim '\?B' in '\?B D': '\?' \(a dim that depends on a "
                                          r"PyTree path\) is not supported"),
    "a dense block reaching into *batch": (_dense_block_into_variadic, r"inner_contiguous=2 but the tensor has 1 "
                                                                       r"dims after its variadic dim"),
    "a variadic dim only the return has": (_variadic_only_in_the_return, r"cannot bind dim '\*batch'"),
    # Spec / Range / MatchConfig on the wrong kinds, conflicting or empty constraints
    "Range on a tensor": (_range_on_a_tensor, r"f: argument 'x': kc.Range and kc.MatchConfig apply to scalars"),
    "MatchConfig on a tensor": (_match_config_on_a_tensor, r"kc.Range and kc.MatchConfig apply to scalars"),
    "Spec on a scalar": (_spec_on_a_scalar, r"f: argument 's': kc.Spec applies to tensor annotations"),
    "Range on a str": (_range_on_a_string, r"f: argument 's': kc.Range needs an int or float annotation, got "
                                           r"<class 'str'>"),
    "two Specs on one argument": (_two_specs, r"at most one kc.Spec, one kc.Range and one kc.MatchConfig per "
                                              r"argument"),
    "Spec dtypes outside the category": (_spec_dtypes_outside_the_category,
                                         r"Spec\(dtypes=\.\.\.\) allows int32, outside the annotation's dtype "
                                         r"category Float"),
    "Spec allowing no dtype": (_spec_allows_no_dtype, r"no torch dtype is allowed by the annotation"),
    "inner_contiguous beyond the rank": (_inner_contiguous_beyond_the_rank,
                                         r"inner_contiguous=2 but the tensor has rank 1"),
    "a Range no number satisfies": (_empty_range, r"f: argument 's': kc.Range\(gt=1, lt=0\) can never hold: no "
                                                  r"number is > 1 and < 0"),
    "a Range open at its only point": (_range_closed_on_one_side_only, r"kc.Range\(gt=1, le=1\) can never hold"),
    "a NaN Range bound": (_nan_range_bound, r"kc.Range\(gt=nan\) can never hold: a bound is NaN"),
    "MatchConfig naming no config attribute": (_match_config_naming_no_config_attribute,
                                               r"argument 's': kc.MatchConfig\('sclae'\) names no attribute of the "
                                               r"config \(KDAConfig\)"),
    "same_dtype_as a scalar": (_same_dtype_as_a_scalar, r"f: argument 'x': same_dtype_as='s' is not a tensor "
                                                        r"argument"),
    "same_dtype_as no argument": (_same_dtype_as_nothing, r"same_dtype_as='y' is not a tensor argument"),
    "bind_first a scalar": (_bind_first_a_scalar, r"f: bind_first names 's', which is not a tensor argument"),
    # annotations that are not contracts
    "a bare torch.Tensor": (_bare_tensor, r"a bare torch.Tensor has no shape; annotate it as Float\[Tensor, 'dims'\]"),
    "an array type other than torch.Tensor": (_numpy_style_array_type,
                                              r"only torch.Tensor arrays are supported, got <class 'list'>"),
    "an unresolvable forward reference": (_unresolvable_forward_reference,
                                          r"f: cannot read the annotations: name 'Undefined' is not defined"),
    # (they used to pass unchecked: a return contract with tensors inside containers read as none)
    "a list of tensors returned": (_list_of_tensors_return, re.escape(
        "f: return: tensors inside a container (list[Float[Tensor, 'B D']]) are not checked in a return contract; "
        "annotate the return as a tensor or a tuple of tensors, or return the container unannotated (plain Tensor "
        "types) and check it with kc.check")),
    "an optional dict of tensors returned": (_dict_of_tensors_return, re.escape(
        "f: return: tensors inside a container (dict[str, Float[Tensor, 'B']] | None) are not checked")),
    "a tuple of tensor lists returned": (_tuple_of_tensor_lists_return, re.escape(
        "f: return: tensors inside a container (tuple[list[Float[Tensor, 'B']], list[Float[Tensor, 'D']]]) are "
        "not checked")),
    "a tuple return mixing tensors and ints": (_tuple_return_mixing_tensors_and_scalars,
                                               r"f: a tuple return contract must be all tensors"),
    "config_arg naming no parameter": (_config_arg_that_is_no_parameter, r"f: config_arg='cfg' is not a parameter"),
    "both config and config_arg": (_config_and_config_arg, r"f: give either config= or config_arg=, not both"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_contract_fails_at_decoration_naming_the_problem(case: str) -> None:
    decorate, message = CASES[case]
    with pytest.raises(kc.AnnotationError, match=message) as info:
        decorate()
    assert type(info.value) is kc.AnnotationError  # not a per-call error, not another exception type
    assert re.search(r"\bf\b", str(info.value)), "the message names the function"


# -- well-formed contracts that used to be refused or to fail at the first call -------------------------
def test_a_shaped_binder_of_any_dtype_decorates_and_binds_its_dim() -> None:
    # Shaped[...] is jaxtyping's any-dtype array; our own error messages recommend it.
    @kc.contract
    def f(heads: Shaped[Tensor, "H"], x: Float[Tensor, "B H*K"]) -> None: ...

    f(torch.zeros(3, dtype=torch.int8), torch.zeros(2, 12))
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(3, dtype=torch.bool), torch.zeros(2, 13))


def test_an_infinite_range_bound_is_checked_instead_of_failing_the_call() -> None:
    @kc.contract
    def f(x: Float[Tensor, "B"], scale: Annotated[float, kc.Range(gt=0, lt=float("inf"))]) -> None: ...

    f(torch.zeros(2), 0.5)
    with pytest.raises(kc.ValueRangeError, match=r"expected > 0 and < inf"):
        f(torch.zeros(2), float("inf"))


def test_a_match_config_attribute_a_dynamic_config_lacks_leaves_the_scalar_free() -> None:
    from pydantic import BaseModel

    class Dims(BaseModel):  # a plain pydantic model: its int fields bind dims, it has no `scale`
        K: int

    @kc.contract(config_arg="config")
    def f(x: Float[Tensor, "K"], scale: Annotated[float, kc.MatchConfig("scale")], config: Any = None) -> None: ...

    f(torch.zeros(4), 0.5, Dims(K=4))
    f(torch.zeros(4), 0.5, CFG.model_copy(update={"head_k_dim": 4}).revalidate())  # KDAConfig: scale is 0.5
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(5), 0.5, Dims(K=4))


def test_a_plain_pydantic_config_can_validate_a_packed_decode_call() -> None:
    from pydantic import BaseModel

    from kda_contracts.testing import make_decode_call

    class LayerDims(BaseModel):
        H: int
        HV: int
        K: int
        V: int

    call = make_decode_call(kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=4, head_v_dim=8), 2, 3)
    assert kc.validate_packed_decode(**call, config=LayerDims(H=2, HV=4, K=4, V=8)).V == 8
    with pytest.raises(kc.ShapeError):
        kc.validate_packed_decode(**call, config=LayerDims(H=2, HV=4, K=4, V=4))


def test_int_category_narrowed_by_spec_still_decorates() -> None:
    @kc.contract
    def f(idx: Annotated[Int[Tensor, "B"], kc.Spec(dtypes=(torch.int32,))]) -> None: ...

    f(torch.zeros(2, dtype=torch.int32))
    with pytest.raises(kc.DtypeError):
        f(torch.zeros(2, dtype=torch.int64))


class _MyTensor(torch.Tensor):
    pass


def _subclass_cases() -> dict[str, Callable[..., Any]]:
    def param(w: Float[torch.nn.Parameter, "D"], x: Float[Tensor, "D"]) -> None: ...
    def sub(w: Shaped[_MyTensor, "D"]) -> None: ...
    def optional(w: Float[_MyTensor, "D"] | None) -> None: ...
    def nested(ws: list[Float[_MyTensor, "D"]]) -> None: ...
    def result(x: Float[Tensor, "D"]) -> Float[_MyTensor, "D"]: return x

    return {"param": param, "sub": sub, "optional": optional, "nested": nested, "result": result}


@pytest.mark.parametrize("case", list(_subclass_cases()))
def test_a_tensor_subclass_array_is_refused_not_widened_to_any_tensor(case: str) -> None:
    # jaxtyping + beartype reject a plain tensor for Float[nn.Parameter, "D"]; the contract's checks
    # test torch.Tensor, so it refuses the annotation instead of accepting any tensor there
    fn = _subclass_cases()[case]
    name = "Parameter" if case == "param" else "_MyTensor"
    kind = "Shaped" if case == "sub" else "Float"
    with pytest.raises(kc.AnnotationError, match=re.escape(
            f"{name} is a subclass of torch.Tensor, which contracts do not check as such (any tensor would pass): "
            f"annotate {kind}[Tensor, 'D'] and test isinstance(..., {name}) in the body if it matters")):
        kc.contract(register=False)(fn)


def test_a_dim_an_expression_multiplies_by_zero_binds_nothing_and_is_refused() -> None:
    # "N+0*M" and "0*N" do not determine M / N: refused at decoration (before: every call was
    # rejected with "coefficient 0 is 0")
    def f(x: Float[Tensor, "N"], y: Float[Tensor, "N+0*M"]) -> None: ...
    def g(y: Float[Tensor, "0*N"]) -> None: ...

    for fn, dim, where in ((f, "M", "y: 'N+0*M'"), (g, "N", "y: '0*N'")):
        with pytest.raises(kc.AnnotationError, match=re.escape(
                f"{fn.__name__}: cannot bind dim '{dim}' (in {where}): no required tensor has it as a plain dim")):
            kc.contract(register=False)(fn)


def test_a_length_bound_on_an_annotation_without_len_is_refused() -> None:
    import collections.abc

    import annotated_types as at

    def f(n: Annotated[int, at.MinLen(1)], x: Float[Tensor, "B"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=re.escape(
            "f: argument 'n': MinLen/MaxLen/Len need a sized annotation (a str, list, tuple, ...), got int, which "
            "has no len()")):
        kc.contract(register=False)(f)
    for hint, empty in ((str, ""), (list[int], []), (tuple[int, ...], ()), (collections.abc.Sequence[int], [])):
        def g(n: Annotated[hint, at.MinLen(1)], x: Float[Tensor, "B"]) -> None: ...  # type: ignore[valid-type]

        checked = kc.contract(register=False)(g)  # sized: the bound is checked
        with pytest.raises(kc.ContractError):
            checked(empty, torch.zeros(2))


def test_a_dim_only_a_union_branch_carries_is_refused_naming_the_argument() -> None:
    def f(x: Float[Tensor, "B C"] | Float[Tensor, "B"], y: Float[Tensor, "B"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=re.escape("f: cannot bind dim 'C' (in x: Tensor[B C] | Tensor[B]):")):
        kc.contract(register=False)(f)  # (before: "in a constraint or the return")


def test_a_tensor_used_as_a_mapping_key_is_reported_without_its_values() -> None:
    @kc.contract(register=False)
    def f(x: dict[Float[Tensor, "B"], int], y: Float[Tensor, "B"]) -> None: ...

    secret = torch.tensor([3.14159, 2.71828, 1.41421])
    with pytest.raises(kc.ShapeError, match=re.escape("x key <tensor float32 [3]>: shape [3]: dim 0 (B): expected 4, "
                                                      "got 3")) as err:
        f({secret: 1}, torch.zeros(4))
    assert "3.14" not in str(err.value)
