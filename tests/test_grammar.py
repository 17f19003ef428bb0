"""jaxtyping's whole dim grammar for torch, enforced: variadic dims bound across arguments and the
return, ``...``, broadcastable dims, anonymous dims, scalars, and arithmetic solved for one
unknown with any sign of coefficient."""

from __future__ import annotations

import warnings

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Shaped, Tensor


@kc.contract
def project(x: Float[Tensor, "*batch D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "*batch E"]:
    return x @ w


@pytest.mark.parametrize("batch", [(), (3,), (2, 5), (1, 2, 3)])
def test_a_variadic_dim_binds_any_number_of_axes(batch) -> None:
    assert project(torch.zeros(*batch, 4), torch.zeros(4, 6)).shape == (*batch, 6)


def test_a_variadic_dim_must_agree_across_arguments() -> None:
    @kc.contract
    def add(x: Float[Tensor, "*batch D"], y: Float[Tensor, "*batch D"]) -> Float[Tensor, "*batch D"]:
        return x + y

    add(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(kc.ShapeError) as info:
        add(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4))
    assert "dims 0:2 (*batch): expected [2, 3] (*batch from x.shape[0:2]), got [2, 5]" in str(info.value)


def test_the_return_must_carry_the_bound_variadic_dim() -> None:
    @kc.contract
    def squash(x: Float[Tensor, "*batch D"]) -> Float[Tensor, "*batch D"]:
        return x.flatten(0, -2)

    squash(torch.zeros(3, 4))
    with pytest.raises(kc.ShapeError, match="the function returned a tensor of the wrong shape"):
        squash(torch.zeros(2, 3, 4))


def test_too_few_axes_for_the_fixed_dims_is_a_rank_error() -> None:
    with pytest.raises(kc.ShapeError, match=r"expected \[\*batch, D\] \(rank ≥ 1\)"):
        project(torch.zeros(()), torch.zeros(4, 6))


def test_an_ellipsis_matches_any_axes_and_binds_nothing() -> None:
    @kc.contract
    def last(x: Float[Tensor, "... D"], y: Float[Tensor, "... D"]) -> None:
        return None

    last(torch.zeros(2, 3, 4), torch.zeros(7, 4))
    with pytest.raises(kc.ShapeError, match=r"dim 1 \(D\): expected 4"):
        last(torch.zeros(2, 3, 4), torch.zeros(7, 5))


def test_a_broadcastable_dim_accepts_one_or_the_bound_size() -> None:
    @kc.contract
    def scale(x: Float[Tensor, "B D"], s: Float[Tensor, "#B #D"]) -> None:
        return None

    for s in [(1, 1), (3, 1), (1, 4), (3, 4)]:
        scale(torch.zeros(3, 4), torch.zeros(*s))
    with pytest.raises(kc.ShapeError, match=r"dim 0 \(#B\): expected 3 or 1"):
        scale(torch.zeros(3, 4), torch.zeros(2, 4))


def test_a_dim_only_broadcastable_axes_carry_is_the_largest() -> None:
    @kc.contract
    def add(x: Float[Tensor, "#N"], y: Float[Tensor, "#N"]) -> Float[Tensor, "N"]:
        return x + y

    assert add(torch.zeros(1), torch.zeros(5)).shape == (5,)
    assert add(torch.zeros(5), torch.zeros(1)).shape == (5,)
    with pytest.raises(kc.ShapeError):
        add(torch.zeros(3), torch.zeros(5))


def test_a_dim_an_expression_solves_is_bound_by_it_not_by_a_broadcastable_axis() -> None:
    # "#N" alone binds nothing when its size is 1: N comes from "2*N", and the fast checker agrees
    # with the full check (before: every call with a size-1 bias warned and took the slow path)
    @kc.contract(register=False)
    def f(x: Float[Tensor, "2*N"], y: Float[Tensor, "#N"]) -> None: ...

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fast/slow disagreement warning would raise here
        for xs, ys in [(4, 1), (4, 2), (2, 1), (6, 3)]:
            f(torch.zeros(xs), torch.zeros(ys))
        solved = r"dim 0 \(#N\): expected 2 or 1 \(N solved from x.shape\[0\] = 2\*N\), got 3"
        with pytest.raises(kc.ShapeError, match=solved):
            f(torch.zeros(4), torch.zeros(3))
        with pytest.raises(kc.ShapeError):
            f(torch.zeros(3), torch.zeros(1))


def test_a_broadcastable_variadic_dim_follows_numpys_rule() -> None:
    @kc.contract
    def add(x: Float[Tensor, "#*batch"], y: Float[Tensor, "#*batch"]) -> Float[Tensor, "*batch"]:
        return x + y

    assert add(torch.zeros(3, 1), torch.zeros(1, 4)).shape == (3, 4)
    assert add(torch.zeros(4), torch.zeros(2, 1)).shape == (2, 4)
    with pytest.raises(kc.ShapeError, match="broadcast"):
        add(torch.zeros(3), torch.zeros(4))


def test_anonymous_dims_match_anything() -> None:
    @kc.contract
    def f(x: Float[Tensor, "_ _heads D"], y: Float[Tensor, "D"]) -> None:
        return None

    f(torch.zeros(2, 3, 4), torch.zeros(4))
    f(torch.zeros(9, 1, 4), torch.zeros(4))


def test_a_scalar_tensor_has_rank_zero() -> None:
    @kc.contract
    def f(x: Shaped[Tensor, ""]) -> None:
        return None

    f(torch.tensor(1.0))
    with pytest.raises(kc.ShapeError, match=r"rank 0"):
        f(torch.zeros(1))


@pytest.mark.parametrize("width", [1, 2, 5, 9])
def test_a_negative_coefficient_is_solved(width) -> None:
    @kc.contract
    def trim(x: Float[Tensor, "D"], y: Float[Tensor, "D-H"]) -> Float[Tensor, "H"]:
        return x[: x.shape[0] - y.shape[0]]

    assert trim(torch.zeros(10), torch.zeros(10 - width)).shape == (width,)


def test_a_negative_coefficient_that_gives_a_negative_dim_is_a_shape_error() -> None:
    @kc.contract
    def trim(x: Float[Tensor, "D"], y: Float[Tensor, "D-H"]) -> None:
        return None

    with pytest.raises(kc.ShapeError, match=r"gives no whole H >= 0"):
        trim(torch.zeros(4), torch.zeros(5))
    trim(torch.zeros(4), torch.zeros(4))  # H = 0: an empty dim is a dim


def test_labels_name_a_dim_for_the_reader() -> None:
    @kc.contract
    def f(x: Float[Tensor, "rows=3 cols=C"], y: Int[Tensor, "C"]) -> None:
        return None

    f(torch.zeros(3, 5), torch.zeros(5, dtype=torch.int64))
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(4, 5), torch.zeros(5, dtype=torch.int64))


def test_variadic_contracts_stay_fast_on_repeat_calls() -> None:
    x, w = torch.zeros(2, 3, 4), torch.zeros(4, 6)
    c = project.__kda_contract__
    calls, rejections = c.calls, c.rejections
    for _ in range(200):
        project(x, w)
    assert c.calls == calls + 200 and c.rejections == rejections


def test_dims_only_containers_carry_bind_whatever_the_order_of_the_arguments() -> None:
    # a container whose items hold N in an expression is walked again once a later container has
    # bound N (before: rejected with "cannot be evaluated with the bound dims" in one order only)
    def a_first(a: tuple[Float[Tensor, "N+1"], ...], b: tuple[Float[Tensor, "*b N"], ...]) -> None: ...
    def b_first(b: tuple[Float[Tensor, "*b N"], ...], a: tuple[Float[Tensor, "N+1"], ...]) -> None: ...
    def solved(a: list[Float[Tensor, "2*N"]], b: dict[str, Float[Tensor, "N M"]]) -> None: ...

    f, g, h = (kc.contract(register=False)(fn) for fn in (a_first, b_first, solved))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fast checker agrees
        f((torch.zeros(4),), (torch.zeros(3),))
        g((torch.zeros(3),), (torch.zeros(4),))
        h([torch.zeros(4)], {"k": torch.zeros(2, 2)})
        for call in (lambda: f((torch.zeros(5),), (torch.zeros(3),)), lambda: g((torch.zeros(3),), (torch.zeros(5),))):
            with pytest.raises(kc.ShapeError, match=r"a\[0\]: shape \[5\]: dim 0 \(N\+1\): expected 4, got 5"):
                call()
        with pytest.raises(kc.ShapeError, match=r"a\[0\]: shape \[6\]: dim 0 \(2\*N\): expected 4, got 6"):
            h([torch.zeros(6)], {"k": torch.zeros(2, 2)})


def test_optional_tensors_agree_with_each_other_when_only_they_carry_a_dim() -> None:
    # N is otherwise only in an empty list: the optional tensors given bind it (before: the full
    # check skipped them, so [2] and [3] passed, with a "please report" warning)
    @kc.contract(register=False)
    def plain(xs: list[Float[Tensor, "N"]], a: Float[Tensor, "N"] | None, b: Float[Tensor, "N"] | None) -> None: ...

    @kc.contract(register=False)
    def broadcast(xs: list[Float[Tensor, "N"]], a: Float[Tensor, "#N"] | None, b: Float[Tensor, "#N"] | None) -> None:
        ...

    z = torch.zeros
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn, ok, bad in ((plain, [(z(2), z(2)), (None, z(3))], [(z(2), z(3)), (z(2), z(1))]),
                            (broadcast, [(z(2), z(2)), (z(2), z(1)), (None, z(3))], [(z(2), z(3))])):
            for a, b in ok:
                fn([], a, b)
            for a, b in bad:
                with pytest.raises(kc.ShapeError, match=r"b: ShapeError"):
                    fn([], a, b)
