"""Typed facts a violation carries, for hints and tests: what exactly broke, as data.

Hints (``hints=[...]`` on a contract) read these instead of searching message text or dim
strings. ``Violation.fact(kind)`` returns the first fact of a kind, or None.

Example::

    def hint_unflattened(v: Violation, ctx: CallContext) -> str | None:
        rank = v.fact(RankMismatch)
        if rank is not None and v.argument == "a" and len(rank.shape) == 3:
            return "pass a.flatten(1)"
        return None
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class Fact:
    """Base of every fact."""

    __slots__ = ()


@dataclass(frozen=True)
class RankMismatch(Fact):
    """A tensor has the wrong number of dims: ``shape`` is what it has, ``rank`` what was declared."""

    shape: tuple[int, ...]
    rank: int


@dataclass(frozen=True)
class AxisMismatch(Fact):
    """Axis ``axis`` of a tensor of ``shape`` is ``got`` where its dim ``dim`` evaluates to ``want``."""

    axis: int
    dim: str
    want: int
    got: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Unsolvable(Fact):
    """No whole ``symbol`` >= 0 solves ``coef*symbol + const == size`` for axis ``axis``
    (whose dim is ``dim``); ``coef`` and ``const`` are evaluated with the other bound dims."""

    symbol: str
    axis: int
    dim: str
    size: int
    coef: int
    const: int


@dataclass(frozen=True)
class DtypeMismatch(Fact):
    """The dtype ``got`` is not in ``allowed``; ``role`` is the config dtype role that pinned it,
    ``same_as`` the argument it must match."""

    allowed: frozenset[torch.dtype]
    got: torch.dtype
    role: str | None = None
    same_as: str | None = None


@dataclass(frozen=True)
class DeviceMismatch(Fact):
    """The tensor is on ``got``, not on ``want`` (the device of the call's first tensor)."""

    want: torch.device
    got: torch.device


@dataclass(frozen=True)
class LayoutBroken(Fact):
    """A stride rule broke: ``rule`` is ``"contiguous"``, ``"inner"`` (the last ``n`` dims are not
    one dense block), ``"dim_order"`` (the ``n`` dims are not dense in the declared order) or
    ``"disjoint"`` (blocks of the last ``n`` dims overlap)."""

    rule: str
    n: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class ConstraintFailed(Fact):
    """A ``where`` constraint is false for ``dims`` (its symbols' values)."""

    constraint: str
    dims: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ConfigMismatch(Fact):
    """A scalar disagrees with the config attribute ``attr`` (which is ``want``)."""

    attr: str
    want: object
