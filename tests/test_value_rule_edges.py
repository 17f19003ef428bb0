"""Never silent, never raw: value rules (``kc.InRange``, ``kc.Distinct``, ``kc.Finite``,
``kc.FiniteRows``, ``kc.StartsAt``, ``kc.EndsAt``, ``kc.NonDecreasing``, ``kc.ValueRule``) and
``kc.Violation`` given values of the wrong kind. Before (2026-12-06, an adversarial review),
``kc.Distinct("x", ignore_negative="no")`` was taken as True, ``kc.StartsAt("x", 1.5)`` rejected every
int tensor, ``kc.StartsAt("x", None)`` raised AttributeError at every call, ``kc.FiniteRows`` over an
int pool checked nothing and over float indices raised RuntimeError, a ``kc.ValueRule`` subclass
without ``_probe`` raised AttributeError (IndexError in watch mode), and ``kc.Violation(int, ...)``
from a ``value_checks=`` hook raised AttributeError when the report was written. Messages pinned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Bool, Float, Int, Tensor


@pytest.mark.parametrize(("make", "message"), [
    (lambda: kc.Distinct("x", ignore_negative="no"), "kc.Distinct('x'): ignore_negative must be True or False, "
                                                     "got 'no'"),
    (lambda: kc.InRange("x", high=3, ignore_negative=1), "kc.InRange('x', high=3, ignore_negative=True): "
                                                         "ignore_negative must be True or False, got 1"),
    (lambda: kc.StartsAt("x", 1.5), "kc.StartsAt('x', 1.5): the value is an int or a dim's name, got 1.5"),
    (lambda: kc.StartsAt("x", True), "kc.StartsAt('x', True): the value is an int or a dim's name, got True"),
    (lambda: kc.StartsAt("x", None), "kc.StartsAt('x', None): the value is an int or a dim's name, got None"),
    (lambda: kc.StartsAt("x", [0]), "kc.StartsAt('x', [0]): the value is an int or a dim's name, got [0]"),
    (lambda: kc.EndsAt("x", 2.0), "kc.EndsAt('x', 2.0): the value is an int or a dim's name, got 2.0"),
    (lambda: kc.Finite("x", hint=5), "kc.Finite('x'): hint must be a str or None, got 5"),
    (lambda: kc.NonDecreasing("x", hint=["a"]), "kc.NonDecreasing('x'): hint must be a str or None, got ['a']"),
    (lambda: kc.InRange("x", high=3, hint=5), "kc.InRange('x', high=3): hint must be a str or None, got 5"),
    (lambda: kc.Finite(5), "kc.Finite(5): an argument is named by a non-empty str, got 5"),
    (lambda: kc.NonDecreasing(""), "kc.NonDecreasing(''): an argument is named by a non-empty str, got ''"),
    (lambda: kc.FiniteRows("x", "x"), "kc.FiniteRows('x', 'x'): names one argument twice; each of its arguments "
                                      "is another tensor"),
    (lambda: kc.FiniteRows("p", "i", only="i"), "kc.FiniteRows('p', 'i', only='i'): names one argument twice"),
    (lambda: kc.FiniteRows("p", "i", only=5), "kc.FiniteRows('p', 'i', only=5): an argument is named by a "
                                              "non-empty str, got 5"),
    (lambda: kc.ValueRule(), "kc.ValueRule() is the base of the value rules; use kc.InRange, kc.Distinct, "
                             "kc.Finite, ... or a subclass that sets args and defines _probe and words"),
], ids=["distinct-flag", "inrange-flag", "starts-float", "starts-bool", "starts-none", "starts-list", "ends-float",
        "hint-int", "hint-list", "inrange-hint", "arg-int", "arg-empty", "rows-same", "rows-only-same",
        "rows-only-int", "bare-base"])
def test_a_value_rule_of_the_wrong_kind_is_an_annotation_error_when_made(make: Any, message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        make()
    assert str(err.value).startswith(message)


def test_value_rules_of_the_right_kind_are_taken_as_given() -> None:
    assert kc.StartsAt("x", "T").bounds() == ("T",)
    assert repr(kc.Distinct("x", ignore_negative=False)) == "kc.Distinct('x', ignore_negative=False)"
    assert kc.FiniteRows("p", "i", only="m").args == ("p", "i", "m")
    assert kc.Finite("x", hint="look upstream").hint == "look upstream"


class Twice(kc.ValueRule):
    """A rule of one's own: no value of ``x`` above 2 (whatever ``mode`` says it does)."""

    def __init__(self, arg: str, mode: str = "fine") -> None:
        self.args, self.mode = (arg,), mode

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Any:
        if self.mode == "raises":
            raise ValueError("boom")
        if self.mode == "number":
            return 5
        if self.mode == "shape":
            return torch.zeros(3)
        flat = x.reshape(-1).to(torch.float64)
        bad = flat > 2
        first = torch.where(bad.any(), bad.to(torch.uint8).argmax().to(torch.float64), -1.0)
        probe = torch.stack([first, flat.max(), bad.sum().to(torch.float64), torch.zeros((), dtype=torch.float64)])
        return probe.to(torch.float32) if self.mode == "float32" else probe

    def words(self, found: Any, shapes: Any, dims: Any) -> tuple[str, str]:
        if self.mode == "words":
            raise KeyError("oops")
        if self.mode == "not-str":
            return 5, 6  # type: ignore[return-value]
        return "values <= 2", self.at(found, shapes)

    def _repr_parts(self) -> list[str]:
        return [repr(self.args[0]), repr(self.mode)]


def _contract(rule: Any, **annotations: Any) -> Any:
    """``f`` over exactly these tensor arguments (default ``x: Float[Tensor, "N"]``), with ``rule``."""
    anns = annotations or {"x": Float[Tensor, "N"]}
    ns: dict[str, Any] = {f"A_{a}": ann for a, ann in anns.items()}
    exec(f"def f({', '.join(f'{a}: A_{a}' for a in anns)}) -> None: ...", ns)
    return kc.contract(value_rules=[rule], register=False)(ns["f"])


class NoProbe(kc.ValueRule):
    args = ("x",)

    def words(self, found: Any, shapes: Any, dims: Any) -> tuple[str, str]:
        return "", ""


class NoWords(kc.ValueRule):
    args = ("x",)

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        return torch.tensor([-1.0, 0, 0, 0], dtype=torch.float64)


class NoArgs(NoWords):
    args = ()


class IntHint(NoWords):
    hint = 5  # type: ignore[assignment]
    words = NoProbe.words


@pytest.mark.parametrize(("rule", "anns", "message"), [
    (kc.FiniteRows("p", "i"), {"p": Int[Tensor, "N D"], "i": Int[Tensor, "B"]},
     "value_rules: kc.FiniteRows('p', 'i') reads 'p' for NaN and Inf, so its annotation must allow a float or "
     "complex dtype; it allows int16, int2, int32, int4, ...: annotate it Float[Tensor, ...] (an integer or bool "
     "tensor is always finite: the rule would check nothing)"),
    (kc.FiniteRows("p", "i"), {"p": Float[Tensor, "N D"], "i": Float[Tensor, "B"]},
     "value_rules: kc.FiniteRows('p', 'i') reads 'i' as row indices, so its annotation must allow integer dtypes "
     "only; it allows bfloat16, float16, float32, float64, ...: annotate it Int[Tensor, ...] (a row is named by an "
     "integer)"),
    (kc.FiniteRows("p", "i", only="m"), {"p": Float[Tensor, "N D"], "i": Int[Tensor, "B"], "m": Int[Tensor, "B"]},
     "value_rules: kc.FiniteRows('p', 'i', only='m') reads 'm' as a mask (the rows read where it is True), so its "
     "annotation must allow bool only; it allows int16, int2, int32, int4, ...: annotate it Bool[Tensor, ...] "
     "(pass mask.bool())"),
    (kc.FiniteRows("p", "i", only="m"), {"p": Float[Tensor, "N D"], "i": Int[Tensor, "B"], "m": Bool[Tensor, "C"]},
     "value_rules: kc.FiniteRows('p', 'i', only='m'): 'm' holds one flag per index, so it is annotated as 'i' is "
     "('B'), got 'C'"),
    (kc.Finite("x"), {"x": Int[Tensor, "N"]}, "value_rules: kc.Finite('x') reads 'x' for NaN and Inf"),
    (NoProbe(), {}, "value_rules: NoProbe defines no _probe(self, *tensors, dims): the probe of one call, a float64 "
                    "tensor [4] (first bad flat index or -1, its value, the count, an extra) or None"),
    (NoWords(), {}, "value_rules: NoWords defines no words(self, found, shapes, dims): what a violation says, as "
                    "(expected, got)"),
    (NoArgs(), {}, "value_rules: NoArgs: args must be a non-empty tuple of the tensor arguments it reads (the first "
                   "is the one it reports), got ()"),
    (IntHint(), {}, "value_rules: kc.IntHint('x'): hint must be a str or None, got 5"),
], ids=["rows-int-pool", "rows-float-indices", "rows-int-mask", "rows-mask-shape", "finite-int", "no-probe",
        "no-words", "no-args", "class-hint"])
def test_a_rule_a_contract_cannot_use_is_an_annotation_error_at_decoration(rule: Any, anns: Any,
                                                                             message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        _contract(rule, **anns)
    assert message in str(err.value)


def test_a_bare_value_rule_put_in_a_contract_is_refused_at_decoration() -> None:
    rule = object.__new__(kc.ValueRule)  # (made around its refusing __init__)
    with pytest.raises(kc.AnnotationError, match=r"kc.ValueRule is the base of the value rules"):
        _contract(rule)


@pytest.mark.parametrize("mode", ["strict", "watch"])
def test_finite_rows_over_narrow_int_indices_reads_them(mode: str) -> None:
    f = _contract(kc.FiniteRows("p", "i"), p=Float[Tensor, "N D"], i=Int[Tensor, "B"])
    pool = torch.zeros(4, 2)
    with kc.mode(mode):
        f(pool, torch.tensor([0, 3], dtype=torch.int8))  # (was RuntimeError from index_select)
        pool[3, 1] = float("nan")
        with pytest.raises(kc.ValueRangeError, match=r"the first: p\[3\] holds nan \(i\[1\] = 3\)"):
            f(pool, torch.tensor([0, 3], dtype=torch.int16))


@pytest.mark.parametrize("mode", ["strict", "watch"])
def test_a_rule_of_ones_own_is_checked_and_worded(mode: str) -> None:
    for how in ("fine", "float32"):
        f = _contract(Twice("x", how))
        with kc.mode(mode):
            f(torch.ones(3))
            with pytest.raises(kc.ValueRangeError, match=r"expected values <= 2\n      got      x\[1\] = 5"):
                f(torch.tensor([1.0, 5.0, 0.0]))


@pytest.mark.parametrize("mode", ["strict", "watch"])
@pytest.mark.parametrize(("how", "got"), [
    ("raises", "it raised ValueError: boom"),
    ("number", "it returned a int"),
    ("shape", "it returned a torch.float32 tensor of shape [3]"),
    ("words", "they raised KeyError: 'oops'"),
    ("not-str", "they raised AnnotationError: kc.Violation(expected=5): expected must be a str"),
])
def test_a_rule_of_ones_own_that_misbehaves_during_a_call_is_a_backend_error_naming_it(mode: str, how: str,
                                                                                       got: str) -> None:
    f = _contract(Twice("x", how))
    with kc.mode(mode), pytest.raises(kc.BackendError) as err:
        f(torch.tensor([1.0, 5.0]))
    assert f"value_rules: kc.Twice('x', '{how}'): BackendError" in str(err.value)
    assert got in str(err.value)
    assert str(err.value).startswith("f(): 1 contract violation")


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
