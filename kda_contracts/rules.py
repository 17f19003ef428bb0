"""The check families of a contract, one object per rule: each emits its fast-path test, decides
the slow path with that same test, and describes itself for the docs.

A rule's ``test`` is Python source that is true when the rule is *broken*, over a few named
values (the tensor's dtype, shape, strides, ...; see :class:`Slots`). The code generator inlines
that source into the straight-line checker; the explainer compiles the very same source into a
small function and calls it on the call it explains. So the fast and the slow path cannot
disagree on a verdict: only the wording of the message lives on the slow path.

Example::

    rule = InnerDense("initial_state", n=3)
    rule.test(Slots(shape="s", strides="st"))        # -> "(s[-1] != 1 and st[-1] != 1) or ..."
    rule.broken(shape=(8, 4, 16, 16), strides=(1024, 256, 16, 1))  # -> False
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .errors import ContractError, DeviceError, DtypeError, LayoutError, ValueRangeError, Violation
from .facts import ConfigMismatch, DeviceMismatch, DtypeMismatch, LayoutBroken

__all__ = [
    "Contiguous",
    "Disjoint",
    "DtypeIn",
    "InnerDense",
    "MatchesConfig",
    "Rule",
    "SameDevice",
    "SameDtype",
    "ScalarInRange",
    "Slots",
    "blocks_disjoint",
    "dense_strides",
]


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def fmt_ints(xs: Sequence[Any]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def dense_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides of a dense tensor of ``shape`` (a size-0 dim counts as 1)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def blocks_disjoint(shape: Sequence[int], strides: Sequence[int], n: int) -> bool:
    """True when no two blocks of the last ``n`` dims share memory: taken by increasing stride,
    each outer axis of size > 1 steps over everything the axes below it span (so an expanded
    axis, stride 0, fails). Sufficient for no overlap; exact for a single outer axis."""
    span = 1
    for a in range(len(shape) - n, len(shape)):
        span *= max(shape[a], 1)
    for a in sorted((a for a in range(len(shape) - n) if shape[a] > 1), key=lambda a: strides[a]):
        if strides[a] < span:
            return False
        span += strides[a] * (shape[a] - 1)
    return True


@dataclass(frozen=True)
class Slots:
    """The names a rule's test may use, as the generated code calls them. The explainer compiles
    each test with the default names below as the parameters of a small function."""

    value: str = "value"  # the argument itself (a tensor or a scalar)
    shape: str = "shape"
    strides: str = "strides"
    dtype: str = "dtype"
    device: str = "device"  # the device of the call's first tensor
    config_value: str = "config_value"  # what the config fixes for this rule (None: nothing)
    other_dtype: str = "other_dtype"  # the dtype of the argument named by same_dtype_as
    constants: Mapping[str, str] = field(default_factory=dict)  # constant object id -> name


_PARAMS = Slots()
_COMPILED: dict[tuple[str, str], Callable[..., bool]] = {}


class Rule:
    """One rule of one argument. Subclasses set ``kind`` and ``needs`` and define ``test``,
    ``violation`` and ``describe``."""

    kind: ClassVar[type[ContractError]] = ContractError
    needs: ClassVar[frozenset[str]] = frozenset()  # which Slots fields the test reads
    argument: str

    def test(self, n: Slots) -> str:
        """Python source, true when the rule is broken, over the names in ``n``."""
        raise NotImplementedError

    def constants(self) -> dict[str, Any]:
        """Objects the test refers to by name (``n.constants[key]``), by key."""
        return {}

    def broken(self, **values: Any) -> bool:
        """The slow path's verdict: the same source as the fast path, compiled once."""
        consts = self.constants()
        names = Slots(constants={k: f"_c_{k}" for k in consts})
        src = self.test(names)
        key = (type(self).__name__, src)
        fn = _COMPILED.get(key)
        if fn is None:
            params = ", ".join(getattr(_PARAMS, f) for f in sorted(self.needs))
            cparams = "".join(f", _c_{k}" for k in consts)
            code = f"def broken({params}{cparams}):\n    return bool({src})\n"
            ns: dict[str, Any] = {}
            exec(compile(code, f"<kda_contracts rule {type(self).__name__}>", "exec"), ns)
            fn = _COMPILED[key] = ns["broken"]
        args = {getattr(_PARAMS, f): values[getattr(_PARAMS, f)] for f in self.needs}
        return fn(**args, **{f"_c_{k}": v for k, v in consts.items()})

    def violation(self, **values: Any) -> Violation:
        """The message for a call that broke this rule (slow path only)."""
        raise NotImplementedError

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        """What the docs show of this rule, concrete where ``env`` binds the dims."""
        raise NotImplementedError


# -- dtype and device ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DtypeIn(Rule):
    """The dtype is one the annotation (narrowed by ``Spec(dtypes=...)``) allows, and the one the
    config pins for the argument's role, if any."""

    argument: str
    allowed: frozenset[torch.dtype]
    role: str | None = None
    kind: ClassVar[type[ContractError]] = DtypeError
    needs: ClassVar[frozenset[str]] = frozenset({"dtype", "config_value"})

    def test(self, n: Slots) -> str:
        base = f"{n.dtype} not in {n.constants['allowed']}"
        if self.role is None:
            return base
        return f"{base} or ({n.config_value} is not None and {n.dtype} != {n.config_value})"

    def constants(self) -> dict[str, Any]:
        return {"allowed": self.allowed}

    def violation(self, **values: Any) -> Violation:
        dt, pinned = values["dtype"], values["config_value"]
        allowed, why = self.allowed, ""
        if self.role is not None and pinned is not None:
            allowed, why = frozenset((pinned,)), f" (config {self.role} dtype)"
        names = " or ".join(sorted(dtype_name(d) for d in allowed))
        return Violation(DtypeError, self.argument, names + why, dtype_name(dt),
                         facts=(DtypeMismatch(allowed, dt, self.role if why else None),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"dtypes": sorted(dtype_name(d) for d in self.allowed), "config_dtype": self.role}



@dataclass(frozen=True)
class SameDtype(Rule):
    """The dtype equals that of another tensor argument (skipped when that one is None)."""

    argument: str
    other: str
    kind: ClassVar[type[ContractError]] = DtypeError
    needs: ClassVar[frozenset[str]] = frozenset({"dtype", "other_dtype"})

    def test(self, n: Slots) -> str:
        return f"{n.other_dtype} is not None and {n.dtype} != {n.other_dtype}"

    def violation(self, **values: Any) -> Violation:
        dt, od = values["dtype"], values["other_dtype"]
        return Violation(DtypeError, self.argument, f"{dtype_name(od)} (same as {self.other})", dtype_name(dt),
                         facts=(DtypeMismatch(frozenset((od,)), dt, same_as=self.other),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"same_dtype_as": self.other}


@dataclass(frozen=True)
class SameDevice(Rule):
    """On the device of the call's first tensor."""

    argument: str
    first: str
    kind: ClassVar[type[ContractError]] = DeviceError
    needs: ClassVar[frozenset[str]] = frozenset({"value", "device"})

    def test(self, n: Slots) -> str:
        return f"{n.value}.device != {n.device}"

    def violation(self, **values: Any) -> Violation:
        dev, got = values["device"], values["value"].device
        return Violation(DeviceError, self.argument, f"{dev} (device of {self.first})", str(got),
                         facts=(DeviceMismatch(dev, got),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"same_device_as": self.first}


# -- strides -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contiguous(Rule):
    """The whole tensor is contiguous."""

    argument: str
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})

    def test(self, n: Slots) -> str:
        return f"not {n.value}.is_contiguous()"

    def violation(self, **values: Any) -> Violation:
        t = values["value"]
        shape, strides = tuple(t.shape), tuple(t.stride())
        return Violation(LayoutError, self.argument, f"contiguous (strides {fmt_ints(dense_strides(shape))})",
                         f"strides {fmt_ints(strides)}", facts=(LayoutBroken("contiguous", len(shape), strides),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"rule": "contiguous"}


@dataclass(frozen=True)
class InnerDense(Rule):
    """The last ``n`` dims form one dense row-major block (size-1 dims may have any stride; a
    size-0 dim counts as 1). Axes are counted from the back, so any rank works."""

    argument: str
    n: int
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"shape", "strides"})

    def test(self, n: Slots) -> str:
        s, st = n.shape, n.strides
        terms = [f"({s}[-1] != 1 and {st}[-1] != 1)"]
        expected = ""
        for axis in range(-2, -1 - self.n, -1):
            expected = f"{expected}*" if expected else ""
            expected += f"({s}[{axis + 1}] or 1)"
            terms.append(f"({s}[{axis}] != 1 and {st}[{axis}] != {expected})")
        return " or ".join(terms)

    def violation(self, **values: Any) -> Violation:
        shape, strides = values["shape"], values["strides"]
        dense = dense_strides(shape)
        want = ["*"] * (len(shape) - self.n) + [str(s) for s in dense[len(shape) - self.n:]]
        what = "last dim stride 1" if self.n == 1 else f"last {self.n} dims dense"
        return Violation(LayoutError, self.argument, f"{what} (strides [{', '.join(want)}])",
                         f"strides {fmt_ints(strides)}", facts=(LayoutBroken("inner", self.n, tuple(strides)),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"rule": "inner", "dense_inner_dims": self.n}


@dataclass(frozen=True)
class Disjoint(Rule):
    """A tensor written in place: no two blocks of its last ``n`` dims share memory. ``rank`` is
    None when the rank varies (a variadic dim): then the general test runs."""

    argument: str
    rank: int | None
    n: int
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"shape", "strides"})

    def test(self, n: Slots) -> str:
        s, st, r = n.shape, n.strides, self.rank
        if r is None:
            return f"not {n.constants['disjoint']}({s}, {st}, {self.n})"
        if r - self.n == 1:  # one outer axis (a pool of slots): its stride steps over a whole block
            block = "*".join(f"({s}[{axis}] or 1)" for axis in range(1, r)) or "1"
            return f"{s}[0] > 1 and {st}[0] < {block}"
        if r - self.n > 1:
            return f"not {n.constants['disjoint']}({s}, {st}, {self.n})"
        return "False"

    def constants(self) -> dict[str, Any]:
        return {"disjoint": blocks_disjoint} if self.rank is None or self.rank - self.n > 1 else {}

    def violation(self, **values: Any) -> Violation:
        shape, strides = values["shape"], values["strides"]
        block = math.prod(max(s, 1) for s in shape[len(shape) - self.n:])
        expected = (f"blocks of the last {self.n} dims that do not overlap (stride[0] >= {block})"
                    if len(shape) - self.n == 1 else f"blocks of the last {self.n} dims that do not overlap")
        return Violation(LayoutError, self.argument, expected, f"strides {fmt_ints(strides)}",
                         facts=(LayoutBroken("disjoint", self.n, tuple(strides)),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"disjoint": True}


# -- scalars -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalarInRange(Rule):
    """A scalar within its ``kc.Range`` (None skips it when the argument is optional)."""

    argument: str
    range: Any  # markers.Range
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})

    def test(self, n: Slots) -> str:
        cond = f"not ({self.range.render(n.value)})"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        return Violation(ValueRangeError, self.argument, self.range.describe(), repr(values["value"]))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"range": self.range.describe()}


@dataclass(frozen=True)
class MatchesConfig(Rule):
    """A scalar equal to a config attribute (``kc.MatchConfig``) when the call has a config."""

    argument: str
    match: Any  # markers.MatchConfig
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value", "config_value"})

    def test(self, n: Slots) -> str:
        return f"not {n.constants['match']}.agrees_value({n.value}, {n.config_value})"

    def constants(self) -> dict[str, Any]:
        return {"match": self.match}

    def violation(self, **values: Any) -> Violation:
        want = values["config_value"]
        return Violation(ValueRangeError, self.argument, f"{want!r} (config {self.match.attr})",
                         repr(values["value"]), facts=(ConfigMismatch(self.match.attr, want),))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"match_config": self.match.attr}


# -- variadic dims -------------------------------------------------------------------------------
def broadcast_sizes(*occurrences: tuple[Sequence[int], bool]) -> tuple[int, ...] | None:
    """The sizes a variadic dim stands for, from every ``(sizes, broadcastable)`` occurrence: the
    broadcast of all of them (numpy's rule: aligned on the right, each axis equal or 1), which
    each non-broadcastable occurrence must equal. None when they do not agree. Order-independent."""
    out: list[int] = []
    for sizes, _ in occurrences:
        sizes = tuple(sizes)
        if len(sizes) > len(out):
            out = [1] * (len(sizes) - len(out)) + out
        for i in range(1, len(sizes) + 1):
            a, b = out[-i], sizes[-i]
            if a == 1:
                out[-i] = b
            elif b != 1 and b != a:
                return None
    result = tuple(out)
    if any(not bc and tuple(sizes) != result for sizes, bc in occurrences):
        return None
    return result


def fits_variadic(sizes: Sequence[int], broadcastable: bool, bound: Sequence[int]) -> bool:
    """Whether one occurrence of a variadic dim agrees with the sizes it is bound to."""
    return broadcast_sizes((bound, True), (sizes, broadcastable)) == tuple(bound) if broadcastable \
        else tuple(sizes) == tuple(bound)


# -- annotated_types / pydantic Field constraints on scalars and containers ---------------------
@dataclass(frozen=True)
class MultipleOf(Rule):
    """``annotated_types.MultipleOf`` (or pydantic ``Field(multiple_of=...)``) on a number."""

    argument: str
    k: float
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})

    def test(self, n: Slots) -> str:
        cond = f"{n.value} % {self.k!r} != 0"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        return Violation(ValueRangeError, self.argument, f"a multiple of {self.k!r}", repr(values["value"]))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"multiple_of": self.k}


@dataclass(frozen=True)
class LengthIn(Rule):
    """``annotated_types.MinLen/MaxLen/Len`` (or ``Field(min_length=..., max_length=...)``)."""

    argument: str
    least: int
    most: int | None
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})

    def test(self, n: Slots) -> str:
        cond = f"len({n.value}) < {self.least}"
        if self.most is not None:
            cond += f" or len({n.value}) > {self.most}"
        return f"{n.value} is not None and ({cond})" if self.optional else cond

    def violation(self, **values: Any) -> Violation:
        want = f"length >= {self.least}" + (f" and <= {self.most}" if self.most is not None else "")
        return Violation(ValueRangeError, self.argument, want, f"length {len(values['value'])}")

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"length": [self.least, self.most]}


@dataclass(frozen=True)
class Satisfies(Rule):
    """``annotated_types.Predicate(fn)``: ``fn(value)`` is true."""

    argument: str
    predicate: Callable[[Any], bool]
    optional: bool
    kind: ClassVar[type[ContractError]] = ValueRangeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})

    def test(self, n: Slots) -> str:
        cond = f"not {n.constants['predicate']}({n.value})"
        return f"{n.value} is not None and {cond}" if self.optional else cond

    def constants(self) -> dict[str, Any]:
        return {"predicate": self.predicate}

    def violation(self, **values: Any) -> Violation:
        name = getattr(self.predicate, "__qualname__", repr(self.predicate))
        return Violation(ValueRangeError, self.argument, f"{name}(value) true", repr(values["value"]))

    def describe(self, env: Mapping[str, int]) -> dict[str, Any]:
        return {"predicate": getattr(self.predicate, "__qualname__", repr(self.predicate))}
