"""Value rules (``value_rules=[...]`` on ``kc.contract`` and ``kc.op``): what a call's tensor
*contents* must hold, declared once and used by both schedules that read values. Each rule has
one device-side probe, built from torch ops with no host sync, and one wording of its violation:

- the probe, :meth:`ValueRule.probe`: a float64 tensor ``[4]`` on the tensor's device,
  ``(flat index of the first bad element or -1, its value, how many elements are bad, a rule's
  own extra)`` (the first index comes from ``argmax`` over a mask, never ``.nonzero()``);
- the wording, :meth:`ValueRule.violation`: a :class:`~kda_contracts._engine.errors.Violation`
  (ValueRangeError) naming the argument, the element, its value and a fix.

Strict mode reads every probe of a call back at once
(:func:`~kda_contracts._engine.rules.reading.read_rules`: one read, before the function runs);
watch mode folds them into a per-device flag without reading
(:mod:`kda_contracts._engine.contract.watch`).

Example::

    @kc.op(value_rules=[kc.InRange("idx", high="N", ignore_negative=True), kc.Distinct("idx"),
                        kc.Finite("x")])
    def gather_rows(x: Float[Tensor, "N D"], idx: Int[Tensor, "B"]) -> Float[Tensor, "B D"]: ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import AnnotationError, ValueRangeError, Violation
from .declared import BASE_RULE, BOOL, FLOAT, INT, as_bound, check_declared, check_whole, refuse_options
from .memory import FINITE_CHUNK, distinct_elements

_F64 = torch.float64
HOST_COPY_MAX = 1 << 16  # an index argument read back as a list up to this many values, else as a CPU tensor
Found = Sequence[float]  # a probe, read back: (index or -1, value, count, extra)
HostCopy = list[int] | Tensor  # an index argument read back: a list, or a CPU tensor past HOST_COPY_MAX values


def _none(device: torch.device) -> Tensor:
    """The probe of a rule nothing broke: ``(-1, 0, 0, 0)``."""
    z = torch.zeros(4, dtype=_F64, device=device)
    z.narrow(0, 0, 1).fill_(-1.0)  # (a fill kernel: nothing crosses from the host, capturable)
    return z


def _real(t: Tensor) -> Tensor:
    return t.abs() if t.dtype.is_complex else t


def _row_norms(rows: Tensor) -> Tensor:
    """Each row's largest magnitude (NaN or Inf exactly when the row holds one)."""
    return torch.linalg.vector_norm(_real(rows).reshape(rows.shape[0], -1), ord=math.inf, dim=1)


def first_bad(mask: Tensor, vals: Tensor, extra: Tensor | None = None, offset: Any = 0) -> Tensor:
    """The probe of a flat ``mask`` (true where an element is bad) over the flat ``vals``: the first
    bad position (``argmax`` on the mask: no sync) plus ``offset``, or -1; its value; the count; ``extra``."""
    if mask.numel() == 0:
        return _none(mask.device)
    bad = mask.any()
    i = mask.to(torch.uint8).argmax()
    value = _real(vals.index_select(0, i.reshape(1))).reshape(()).to(_F64)
    index = torch.where(bad, (i + offset).to(_F64), -1.0)
    ex = torch.zeros((), dtype=_F64, device=mask.device) if extra is None else extra.reshape(()).to(_F64)
    return torch.stack([index, value, mask.sum().to(_F64), ex])


def element(name: str, flat: int, shape: Sequence[int] | None) -> str:
    """``name[i, j]`` for the flat index ``flat`` of a tensor shaped ``shape`` (flat when unknown)."""
    if not shape:
        return f"{name}[{flat}]" if shape is None or flat else name
    at = []
    for size in reversed(shape):
        at.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return f"{name}[{', '.join(str(i) for i in reversed(at))}]"


def number(v: float) -> str:
    """A probe's value as a report says it: an integer without ``.0``, else as Python prints it."""
    return str(int(v)) if math.isfinite(v) and v == int(v) and abs(v) < 2 ** 53 else repr(v)


class ValueRule:
    """One declared rule over tensor contents (see the module docstring). Subclasses set ``args``
    (the arguments it reads, the first is the one it reports), ``index_args`` (integer arguments
    strict mode brings back whole, for the call's other checks), optionally ``kinds`` (per
    argument, the dtypes it must allow: ``"float"``, ``"int"``, ``"bool"`` or None), and define
    ``_probe`` and ``words``; what is missing or of the wrong kind is an AnnotationError when a
    contract takes the rule, and a ``_probe`` or ``words`` that raises during a call a
    BackendError naming it (:mod:`kda_contracts._engine.rules.declared`)."""

    args: tuple[str, ...] = ()
    index_args: tuple[str, ...] = ()
    kinds: tuple[str | None, ...] = ()
    hint: str | None = None
    default_hint = ""

    def __init__(self) -> None:
        if type(self) is ValueRule:
            raise AnnotationError(BASE_RULE.replace("kc.ValueRule", "kc.ValueRule()", 1))

    def bounds(self) -> tuple[Any, ...]:
        """The ints or dim names the rule compares against (dim names are checked at decoration)."""
        return ()

    def resolve(self, bound: Any, dims: Mapping[str, Any]) -> Any:
        return dims[bound] if isinstance(bound, str) else bound

    def check_declaration(self, where: str, tensors: Mapping[str, Any] | Sequence[str],
                          symbols: Sequence[str]) -> None:
        """AnnotationError at decoration when the rule is not whole (a subclass without ``_probe``),
        names no tensor argument or an unknown dim, or an argument of a dtype it cannot read
        (``tensors``: each tensor argument's annotation, its ``dtypes`` and ``dim_str``)."""
        check_whole(self, where, ValueRule)
        check_declared(self, where, tensors, symbols)

    def probe(self, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Tensor | None:
        """The probe of one call (None when an argument it reads is None: nothing to check)."""
        ts = [values.get(a) for a in self.args]
        if not all(isinstance(t, Tensor) for t in ts):
            return None
        if any(isinstance(b, str) and dims.get(b) is None for b in self.bounds()):
            return None  # a bound dim the call left unbound (only an empty container carries it): nothing to hold to
        return self._probe(*ts, dims=dims)

    _probe: Callable[..., Tensor]  # (the rule's tensors, in ``args`` order, and ``dims=``)

    def violation(self, found: Found, shapes: Mapping[str, Sequence[int]] | None, dims: Mapping[str, Any],
                  host: Mapping[str, HostCopy] | None = None) -> Violation:
        """The wording of a probe that found a bad element (``shapes``: the arguments' shapes, to
        name the element by its position; None names it by its flat index; ``host``: exact host
        copies of index arguments, whose values past 2**53 a float64 probe rounds)."""
        vals = host.get(self.args[0]) if host else None
        if vals is not None and 0 <= int(found[0]) < len(vals):  # (a list, or a CPU tensor when large)
            found = self.exact(found, vals, dims)
        expected, got = self.words(found, shapes, dims)
        return Violation(ValueRangeError, self.args[0], expected, got, hint=self.hint or self.default_hint)

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        raise NotImplementedError

    def exact(self, found: Found, vals: HostCopy, dims: Mapping[str, Any]) -> Found:
        """``found`` with the bad element's value read from the exact host copy ``vals``."""
        return [found[0], int(vals[int(found[0])]), *found[2:]]

    def at(self, found: Found, shapes: Mapping[str, Sequence[int]] | None, arg: str | None = None) -> str:
        name = arg or self.args[0]
        return f"{element(name, int(found[0]), None if shapes is None else shapes.get(name))} = {number(found[1])}"

    def _bound_words(self, bound: Any, dims: Mapping[str, Any]) -> str:
        return f"{bound}={dims[bound]}" if isinstance(bound, str) and bound in dims else str(bound)

    def __repr__(self) -> str:
        return f"kc.{type(self).__name__}({', '.join(self._repr_parts())})"

    def _repr_parts(self) -> list[str]:
        return [repr(a) for a in self.args]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and repr(other) == repr(self)

    def __hash__(self) -> int:
        return hash(repr(self))


class InRange(ValueRule):
    """Every value of ``arg`` in ``[low, high)`` (ints or dim names; either may be None);
    ``ignore_negative=True`` leaves negative values alone (padding). Extra: the largest bad value.

    Example::

        kc.InRange("ssm_state_indices", high="N", ignore_negative=True)   # slots < N, -1 is padding
    """

    default_hint = "a value out of range indexes memory the call does not own; check what produced it"

    def __init__(self, arg: str, low: int | str | None = None, high: int | str | None = None, *,
                 ignore_negative: bool = False, hint: str | None = None) -> None:
        low, high = as_bound(low), as_bound(high)
        self.args, self.low, self.high, self.ignore_negative, self.hint = (arg,), low, high, ignore_negative, hint
        self.index_args = (arg,)
        if low is None and high is None:
            raise AnnotationError(f"{self!r} has no bound, so it checks nothing: give low=, high= or both")
        refuse_options(self, flags={"ignore_negative": ignore_negative},
                       bounds=[b for b in (low, high) if b is not None])

    def bounds(self) -> tuple[Any, ...]:
        return tuple(b for b in (self.low, self.high) if b is not None)

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        flat = x.reshape(-1)
        mask = torch.zeros_like(flat, dtype=torch.bool)
        if self.high is not None:
            mask = mask | (flat >= self.resolve(self.high, dims))
        if self.low is not None:
            mask = mask | (flat < self.resolve(self.low, dims))
        if self.ignore_negative:
            mask = mask & (flat >= 0)
        if flat.numel() == 0:
            return _none(x.device)
        worst = torch.where(mask, flat, flat.min()).max()
        return first_bad(mask, flat, worst)

    def exact(self, found: Found, vals: HostCopy, dims: Mapping[str, Any]) -> Found:
        low, high = (None if b is None else self.resolve(b, dims) for b in (self.low, self.high))
        if isinstance(vals, list):  # (plain Python: a small host copy)
            bad = [v for v in vals if ((high is not None and v >= high) or (low is not None and v < low))
                   and not (self.ignore_negative and v < 0)]
            return [found[0], vals[int(found[0])], found[2], max(bad, default=found[3])]
        mask = torch.zeros_like(vals, dtype=torch.bool)
        if high is not None:
            mask |= vals >= high
        if low is not None:
            mask |= vals < low
        if self.ignore_negative:
            mask &= vals >= 0
        worst = int(vals[mask].max()) if bool(mask.any()) else found[3]
        return [found[0], int(vals[int(found[0])]), found[2], worst]

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        parts = ([f">= {self._bound_words(self.low, dims)}"] if self.low is not None else []) + \
            ([f"< {self._bound_words(self.high, dims)}"] if self.high is not None else [])
        expected = " and ".join(parts) + (" (negatives are padding)" if self.ignore_negative else "")
        count = int(found[2])
        if self.high is not None and self.low is None:
            what = f"{count} value(s) >= {self._bound_words(self.high, dims)} (max {number(found[3])})"
        else:
            what = f"{count} value(s) out of range"
        return expected, f"{what}; the first: {self.at(found, shapes)}"

    def _repr_parts(self) -> list[str]:
        return [repr(self.args[0])] + [f"{k}={v!r}" for k, v in (("low", self.low), ("high", self.high))
                                       if v is not None] + (["ignore_negative=True"] if self.ignore_negative else [])


class Distinct(ValueRule):
    """No value of ``arg`` twice (``ignore_negative``, the default: negative values, padding, may
    repeat). Found with a stable sort and an adjacent compare, mapped back through the sort's
    permutation: the first repeat by position. Extra: where its value first occurs.

    Example::

        kc.Distinct("ssm_state_indices")   # two requests on one slot would race
    """

    default_hint = "two elements with one value would race on what it names; make each one distinct"

    def __init__(self, arg: str, *, ignore_negative: bool = True, hint: str | None = None) -> None:
        self.args, self.ignore_negative, self.hint = (arg,), ignore_negative, hint
        self.index_args = (arg,)
        refuse_options(self, flags={"ignore_negative": ignore_negative})

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        flat = x.reshape(-1)
        if flat.numel() < 2:
            return _none(x.device)
        s, perm = torch.sort(flat, stable=True)
        dup = s[1:] == s[:-1]
        if self.ignore_negative:
            dup = dup & (s[1:] >= 0)
        later = perm[1:]
        first = torch.where(dup, later, flat.numel()).min().clamp(max=flat.numel() - 1)
        mask = torch.zeros_like(flat, dtype=torch.bool).index_fill(0, first.reshape(1), True) & dup.any()
        value = flat.index_select(0, first.reshape(1))
        earlier = (flat == value).to(torch.uint8).argmax()
        probe = first_bad(mask, flat, earlier)
        return torch.stack([probe[0], probe[1], dup.sum().to(_F64), probe[3]])

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        shape = None if shapes is None else shapes.get(self.args[0])
        also = element(self.args[0], int(found[3]), shape)
        return ("distinct values" + (" (negatives are padding)" if self.ignore_negative else ""),
                f"{int(found[2])} duplicate value(s); the first: {self.at(found, shapes)}, also at {also}")

    def _repr_parts(self) -> list[str]:
        return [repr(self.args[0])] + ([] if self.ignore_negative else ["ignore_negative=False"])


class Finite(ValueRule):
    """Every value of ``arg`` finite (no NaN, no infinity; integer tensors always are).

    Example::

        kc.Finite("mixed_qkv")
    """

    default_hint = ("find the op that produced it (torch.autograd.detect_anomaly, or check the previous layer's "
                    "output)")

    kinds = (FLOAT,)

    def __init__(self, arg: str, *, hint: str | None = None) -> None:
        self.args, self.hint = (arg,), hint
        refuse_options(self)

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            return _none(x.device)
        v = x if torch.compiler.is_compiling() else distinct_elements(x)  # a broadcast value read once
        flat = v.reshape(-1)
        probe = first_bad(~torch.isfinite(flat), flat)
        if v.shape == x.shape:
            return probe
        # the first bad element of the narrowed view, as a flat index of x (index 0 along each
        # broadcast dim is an element of x too)
        rest, at, step = probe[0].clamp(min=0).to(torch.int64), torch.zeros((), dtype=torch.int64, device=x.device), 1
        for k in reversed(range(x.dim())):
            at = at + (rest % max(v.shape[k], 1)) * step
            rest = rest // max(v.shape[k], 1)
            step *= x.shape[k]
        return torch.stack([torch.where(probe[0] >= 0, at.to(_F64), -1.0), *probe[1:]])

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        return "finite values", f"NaN or Inf in {int(found[2])} element(s); the first: {self.at(found, shapes)}"


class FiniteRows(ValueRule):
    """The rows of ``pool`` (its dim 0) that the valid values of ``indices`` (``0 <= i <
    pool.shape[0]``; the rest are padding or another rule's business) name hold finite values.
    Reported by the position in ``indices``; the value is the row's largest magnitude (NaN or
    Inf); extra: the row. ``only``: a boolean tensor argument beside ``indices``; only the rows
    where it is True are read by the call (a slot a new sequence starts in is overwritten, not read).

    Example::

        kc.FiniteRows("initial_state", "ssm_state_indices")   # the state slots a call reads
        kc.FiniteRows("initial_state", "ssm_state_indices", only="has_initial_state")
    """

    default_hint = "that row is already corrupt (an earlier step overflowed, or it was never initialised); reset it"

    kinds = (FLOAT, INT, BOOL)

    def __init__(self, pool: str, indices: str, *, only: str | None = None, hint: str | None = None) -> None:
        self.args, self.hint = (pool, indices, *(() if only is None else (only,))), hint
        self.index_args = (indices,)
        refuse_options(self)

    def _repr_parts(self) -> list[str]:
        return [repr(a) for a in self.args[:2]] + ([f"only={self.args[2]!r}"] if len(self.args) > 2 else [])

    def _probe(self, pool: Tensor, idx: Tensor, only: Tensor | None = None, *, dims: Mapping[str, Any]) -> Tensor:
        flat = idx.reshape(-1)
        n = pool.shape[0]
        if flat.numel() == 0 or n == 0 or pool[0].numel() == 0 or not (pool.dtype.is_floating_point or
                                                                         pool.dtype.is_complex):
            return _none(idx.device)
        slots = flat.clamp(0, n - 1)
        if slots.dtype not in (torch.int32, torch.int64):  # (index_select's index: int8, int16, uint8 widened)
            slots = slots.long()
        if torch.compiler.is_compiling():  # one gather (a loop over a symbolic size would specialise it)
            norms = _row_norms(pool.index_select(0, slots))
        else:  # eager: a bounded number of rows at a time; the whole pool once when the call names as many
            step = max(1, FINITE_CHUNK // max(1, pool[0].numel()))
            if flat.numel() >= n:
                norms = torch.cat([_row_norms(pool[i:i + step]) for i in range(0, n, step)]).index_select(0, slots)
            else:
                norms = torch.cat([_row_norms(pool.index_select(0, slots[i:i + step]))
                                   for i in range(0, flat.numel(), step)])
        mask = (flat >= 0) & (flat < n) & ~torch.isfinite(norms)
        if only is not None:  # (the rows the call reads: e.g. only where has_initial_state)
            mask = mask & only.reshape(-1).to(torch.bool)
        probe = first_bad(mask, norms.to(_F64))
        return torch.stack([probe[0], probe[1], probe[2], _real(first_bad(mask, flat)[1])])

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        pool, idx = self.args[:2]
        shape = None if shapes is None else shapes.get(idx)
        which = f" where {self.args[2]}" if len(self.args) > 2 else ""
        return (f"finite values in the rows of {pool} that {idx} names{which}",
                f"NaN or Inf in a used row: {int(found[2])} row(s); the first: {pool}[{number(found[3])}] holds "
                f"{number(found[1])} ({element(idx, int(found[0]), shape)} = {number(found[3])})")



class StartsAt(ValueRule):
    """``arg``'s first element equals ``value`` (an int or a dim name), e.g. offsets starting at 0.

    Example::

        kc.StartsAt("cu_seqlens", 0)
    """

    default_hint = "offsets start at the first element; build them with a leading 0"

    def __init__(self, arg: str, value: int | str, *, hint: str | None = None) -> None:
        self.args, self.value, self.hint = (arg,), as_bound(value), hint
        refuse_options(self, bounds=(self.value,), what="the value")

    def bounds(self) -> tuple[Any, ...]:
        return (self.value,)

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        head = x.reshape(-1)[:1]
        return first_bad(head != self.resolve(self.value, dims), head)

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        return f"{self.args[0]}[0] == {self._bound_words(self.value, dims)} (its first element)", self.at(found, shapes)

    def _repr_parts(self) -> list[str]:
        return [repr(self.args[0]), repr(self.value)]


class EndsAt(StartsAt):
    """``arg``'s last element equals ``value`` (an int or a dim name), e.g. offsets ending at the
    total length.

    Example::

        kc.EndsAt("cu_seqlens", "T")
    """

    default_hint = "offsets end at the total length; the last element must be the sum of the lengths"

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        flat = x.reshape(-1)
        tail = flat[-1:]
        return first_bad(tail != self.resolve(self.value, dims), tail, offset=flat.numel() - 1)

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        return f"{self.args[0]}[-1] == {self._bound_words(self.value, dims)} (its last element)", self.at(found, shapes)


class NonDecreasing(ValueRule):
    """No element of ``arg`` (flattened) smaller than the one before it. Extra: that one.

    Example::

        kc.NonDecreasing("cu_seqlens")
    """

    default_hint = "offsets are cumulative sums of non-negative lengths; a decrease means a negative length"

    def __init__(self, arg: str, *, hint: str | None = None) -> None:
        self.args, self.hint = (arg,), hint
        refuse_options(self)

    def _probe(self, x: Tensor, *, dims: Mapping[str, Any]) -> Tensor:
        flat = x.reshape(-1)
        if flat.numel() < 2:
            return _none(x.device)
        mask = flat[1:] < flat[:-1]
        probe = first_bad(mask, flat[1:], offset=1)
        before = first_bad(mask, flat[:-1])[1]
        return torch.stack([probe[0], probe[1], probe[2], before])

    def words(self, found: Found, shapes: Mapping[str, Sequence[int]] | None,
              dims: Mapping[str, Any]) -> tuple[str, str]:
        return ("non-decreasing values",
                f"{int(found[2])} decrease(s); the first: {self.at(found, shapes)} after {number(found[3])}")
