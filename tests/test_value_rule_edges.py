"""Never silent, never raw: value rules (``kc.InRange``, ``kc.Distinct``, ``kc.Finite``,
``kc.FiniteRows``, ``kc.StartsAt``, ``kc.EndsAt``, ``kc.NonDecreasing``, ``kc.ValueRule``) and
``kc.Violation`` given values of the wrong kind. Before (2026-12-06, an adversarial review),
``kc.Distinct("x", ignore_negative="no")`` was taken as True, ``kc.StartsAt("x", 1.5)`` rejected every
int tensor, ``kc.StartsAt("x", None)`` raised AttributeError at every call, ``kc.FiniteRows`` over an
int pool checked nothing and over float indices raised RuntimeError, a ``kc.ValueRule`` subclass
without ``_probe`` raised AttributeError (IndexError in watch mode), and ``kc.Violation(int, ...)``
from a ``value_checks=`` hook raised AttributeError when the report was written. Messages pinned."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor


@pytest.mark.parametrize(("kind", "words"), [
    (int, "<class 'int'>"), (ValueError, "<class 'ValueError'>"), ("ShapeError", "'ShapeError'"),
    (kc.AnnotationError, "<class 'kda_contracts._engine.errors.AnnotationError'>"),
])
def test_a_violation_of_a_kind_that_is_no_contract_error_is_refused_when_made(kind: Any, words: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        kc.Violation(kind, "x", "> 0", "<= 0")
    assert str(err.value) == (f"kc.Violation(kind={words}): kind must be a kc.ContractError subclass (kc.ShapeError, "
                              "kc.DtypeError, kc.ValueRangeError, ...)")


@pytest.mark.parametrize(("fields", "message"), [
    ({"details": 5}, "kc.Violation(details=5): details must be a tuple (or list) of str"),
    ({"details": "one line"}, "kc.Violation(details='one line'): details must be a tuple (or list) of str"),
    ({"details": ("a", 5)}, "kc.Violation(details=('a', 5)): details must be a tuple (or list) of str"),
    ({"hint": 3}, "kc.Violation(hint=3): hint must be a str or None"),
    ({"facts": 3}, "kc.Violation(facts=3): facts must be a tuple (or list) of objects"),
    ({"argument": None}, "kc.Violation(argument=None): argument must be a str"),
])
def test_a_violation_with_fields_of_the_wrong_kind_is_refused_when_made(fields: Any, message: str) -> None:
    base = {"kind": kc.ValueRangeError, "argument": "x", "expected": "> 0", "got": "<= 0"}
    with pytest.raises(kc.AnnotationError) as err:
        kc.Violation(**{**base, **fields})
    assert str(err.value) == message


def test_a_violation_keeps_lists_as_tuples_and_stays_hashable() -> None:
    v = kc.Violation(kc.ShapeError, "x", "[B]", "[3, 2]", details=["rank 1"], facts=[1])
    assert v.details == ("rank 1",) and v.facts == (1,)
    assert hash(v) == hash(kc.Violation(kc.ShapeError, "x", "[B]", "[3, 2]", details=("rank 1",)))


@pytest.mark.parametrize("kind", [int, ValueError, "ShapeError", kc.AnnotationError])
def test_a_value_checks_hook_making_a_violation_of_the_wrong_kind_is_refused_not_a_raw_error(kind: Any) -> None:
    @kc.contract(value_checks=lambda ctx: [kc.Violation(kind, "x", "> 0", "<= 0")], register=False)
    def f(x: Float[Tensor, "B"]) -> None: ...

    with kc.mode("strict"), pytest.raises(kc.AnnotationError, match=r"kind must be a kc.ContractError subclass"):
        f(torch.ones(2))  # (before: AttributeError "no attribute 'kind_name'" while the report was written)


def test_a_value_checks_hook_returning_no_list_of_violations_is_refused_naming_it() -> None:
    @kc.contract(value_checks=lambda ctx: (5,), register=False, name="g")
    def g(x: Float[Tensor, "B"]) -> None: ...

    with kc.mode("strict"), pytest.raises(kc.AnnotationError, match=r"^g: value_checks returned a tuple holding "
                                                                    r"int; it must return a list of kc.Violation"):
        g(torch.ones(2))
