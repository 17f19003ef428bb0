"""The rules of scalar arguments (and of containers' lengths), one object each: ``kc.Range``,
``kc.MatchConfig``, and the ``annotated_types`` / pydantic ``Field`` constraints. Like the tensor
rules in ``rules``, each emits its fast-path test, decides the slow path with that same test and
describes itself for the docs.

Example::

    ScalarInRange("scale", kc.Range(gt=0), optional=False).broken(value=-1.0)   # -> True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ContractError, ShapeError, ValueRangeError, Violation
from ..facts import ConfigMismatch
from .tensor import CONFIG_ABSENT, Rule, Slots


# -- scalars -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalarInRange(Rule):
    """A scalar within its ``kc.Range`` (None skips it when the argument is optional)."""

    argument: str
    range: Any  # markers.Range
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"

    def test(self, n: Slots) -> str:
        cond = f"not ({self.range.render(n.value)})"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        return Violation(ValueRangeError, self.argument, self.range.describe(), repr(values["value"]))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"range": self.range.describe()}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"`{data['range']}`" + (" (None skips it)" if self.optional else "")


@dataclass(frozen=True)
class MatchesConfig(Rule):
    """A scalar equal to a config attribute (``kc.MatchConfig``) when the call has a config."""

    argument: str
    match: Any  # markers.MatchConfig
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value", "config_value"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"

    def config_source(self) -> tuple[str, str] | None:
        return "attr", self.match.attr

    def test(self, n: Slots) -> str:
        # equal values agree (the common case, no call); otherwise the tolerance and None rules
        return (f"({n.value} != {n.config_value} and "
                f"not {n.constants['match']}.agrees_value({n.value}, {n.config_value}))")

    def constants(self) -> dict[str, Any]:
        return {"match": self.match}

    def violation(self, **values: Any) -> Violation:
        want = values["config_value"]
        return Violation(ValueRangeError, self.argument, f"{want!r} (config {self.match.attr})",
                         repr(values["value"]), facts=(ConfigMismatch(self.match.attr, want),))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"match_config": {"attr": self.match.attr, "rel_tol": self.match.rel_tol,
                                 "config_value": repr(config_value) if config_value is not CONFIG_ABSENT else None}}

    def doc(self, data: Mapping[str, Any]) -> str:
        m = data["match_config"]
        return f"equals config `{m['attr']}`" + (f" (rel. tol {m['rel_tol']:g})" if m["rel_tol"] else "")


# -- annotated_types / pydantic Field constraints on scalars and containers ---------------------
@dataclass(frozen=True)
class MultipleOf(Rule):
    """``annotated_types.MultipleOf`` (or pydantic ``Field(multiple_of=...)``) on a number."""

    argument: str
    k: float
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"

    def test(self, n: Slots) -> str:
        cond = f"{n.value} % {self.k!r} != 0"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        return Violation(ValueRangeError, self.argument, f"a multiple of {self.k!r}", repr(values["value"]))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"multiple_of": self.k}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"a multiple of `{self.k!r}`"


@dataclass(frozen=True)
class LengthIn(Rule):
    """``annotated_types.MinLen/MaxLen/Len`` (or ``Field(min_length=..., max_length=...)``)."""

    argument: str
    least: int
    most: int | None
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"

    def test(self, n: Slots) -> str:
        cond = f"len({n.value}) < {self.least}"
        if self.most is not None:
            cond += f" or len({n.value}) > {self.most}"
        return f"{n.value} is not None and ({cond})" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        want = f"length >= {self.least}" + (f" and <= {self.most}" if self.most is not None else "")
        return Violation(ValueRangeError, self.argument, want, f"length {len(values['value'])}")

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"length": [self.least, self.most]}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"length ≥ {self.least}" + (f" and ≤ {self.most}" if self.most is not None else "")


@dataclass(frozen=True)
class Satisfies(Rule):
    """``annotated_types.Predicate(fn)``: ``fn(value)`` is true."""

    argument: str
    predicate: Callable[[Any], bool]
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"
    #: user code may read anything, so its verdict is not cached, unless the predicate is marked
    #: ``__kda_contracts_pure__ = True`` (:attr:`pure`): its verdict is a function of the value alone
    #: (a frozen config, which the check cache keys by identity; a plain scalar, by value)
    cacheable: ClassVar[bool] = False

    @property
    def pure(self) -> bool:
        return getattr(self.predicate, "__kda_contracts_pure__", False) is True

    def test(self, n: Slots) -> str:
        cond = f"not {n.constants['predicate']}({n.value})"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def constants(self) -> dict[str, Any]:
        return {"predicate": self.predicate}

    def violation(self, **values: Any) -> Violation:
        name = getattr(self.predicate, "__qualname__", repr(self.predicate))
        return Violation(ValueRangeError, self.argument, f"{name}(value) true", repr(values["value"]))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"predicate": getattr(self.predicate, "__qualname__", repr(self.predicate))}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"`{data['predicate']}(value)` is true"


@dataclass(frozen=True)
class EqualsDim(Rule):
    """An int argument named like a dim that does not bind it (it may be None, ``H: int | None``):
    when given, it equals the dim as the call bound it."""

    argument: str
    symbol: str
    kind: ClassVar[type[ContractError]] = ShapeError
    needs: ClassVar[frozenset[str]] = frozenset({"value", "bound"})
    family: ClassVar[str] = "scalar"
    order: ClassVar[int] = 50
    doc_section: ClassVar[str | None] = "scalar"

    def test(self, n: Slots) -> str:
        return f"{n.value} is not None and {n.bound} is not None and {n.value} != {n.bound}"

    def violation(self, **values: Any) -> Violation:
        return Violation(ShapeError, self.argument, f"{self.symbol}={values['bound']} (the dim it is named after)",
                         repr(values["value"]))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"equals_dim": self.symbol}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"equals dim `{self.symbol}` when given"


def scalar_param_rules(name: str, rng: Any, optional: bool, match: Any,
                       constraints: tuple[Rule, ...], dim: str | None = None) -> tuple[Rule, ...]:
    """A scalar's rules: its ``kc.Range``, then its ``kc.MatchConfig``, then its other constraints;
    ``dim``: the dim it is named after without binding it (checked against the call's)."""
    rules: list[Rule] = [EqualsDim(name, dim)] if dim is not None else []
    if rng is not None:
        rules.append(ScalarInRange(name, rng, optional))
    if match is not None:
        rules.append(MatchesConfig(name, match))
    return tuple(rules) + constraints
