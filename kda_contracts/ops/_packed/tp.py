"""The one tensor-parallel mismatch hint: tensors sharded for one TP degree, a config for another.

:func:`find_tp_mismatch` decides, from the call's tensors and a :class:`KDAConfig`, whether every
misfit tensor fits the per-rank dims of another ``tp_size``; :func:`tp_mismatch_hint` turns that
into a hint for any contract whose config is (or holds) a ``KDAConfig``. Each contract words the
fix for its audience (the packed-decode contract and the Kimi-Linear layer's contracts do).

Example::

    hint = tp_mismatch_hint(config_of=lambda ctx: ctx.config, dims_at=KDAConfig.contract_dims,
                            render=lambda found, ctx: f"sharded for tp_size={found.tp_size}")
    spec = build_spec(fn, config_arg="config", hints=(hint,))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import Tensor

from ..._engine import CallContext, Expr, ShapeError, Sym, Violation
from .config import KDAConfig

DimsAt = Callable[[KDAConfig], Mapping[str, int]]
"""The per-rank dims a contract's config fixes, for a config (e.g. ``KDAConfig.contract_dims``)."""

_PER_RANK = ("H", "HV", "C")  # the dims a TP degree changes (C: a layer's conv channels)


@dataclass(frozen=True)
class TPMismatch:
    """Every misfit tensor of a call fits the per-rank dims of ``tp_size``, not the config's."""

    tp_size: int  # the degree the tensors were sharded for
    config: KDAConfig  # the config the call was checked against
    tensors: tuple[str, ...]  # the misfit tensors, in argument order
    differ: tuple[str, ...]  # the per-rank dims they use that differ between the two degrees
    here: Mapping[str, int]  # per-rank dims of the config
    there: Mapping[str, int]  # per-rank dims at tp_size

    def witness(self, ctx: CallContext, first: str) -> tuple[str, str, int] | None:
        """A misfit tensor (``first`` when it is one) with an axis that is exactly one of the
        differing dims: ``(tensor, dim, size)``."""
        for name in sorted(self.tensors, key=lambda n: n != first):
            for axis, d in enumerate(ctx.spec.tensors[name].dims):
                if isinstance(d, Sym) and d.name in self.differ:
                    return name, d.name, int(ctx.values[name].shape[axis])
        return None


def fits(ctx: CallContext, name: str, dims: Mapping[str, int]) -> bool:
    """Would tensor ``name`` meet its annotation with ``dims``? (Axes with unknown dims pass.)"""
    t, tparam = ctx.values.get(name), ctx.spec.tensors[name]
    if not isinstance(t, Tensor) or t.dim() != tparam.rank:
        return False
    for size, d in zip(t.shape, tparam.dims, strict=True):
        if not isinstance(d, Expr):
            continue
        try:
            if d.evaluate(dict(dims)) != size:
                return False
        except (KeyError, ZeroDivisionError):
            continue
    return True


def _misfits(ctx: CallContext) -> list[str]:
    """The tensors with a shape violation, in argument order."""
    bad = {x.argument for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors}
    return [name for name in ctx.spec.tensors if name in bad]


def find_tp_mismatch(ctx: CallContext, config: KDAConfig, dims_at: DimsAt) -> TPMismatch | None:
    """The other ``tp_size`` (smallest first) whose per-rank dims every misfit tensor fits, if any."""
    bad = _misfits(ctx)
    if not bad:  # e.g. only a `where` constraint failed
        return None
    here = dims_at(config)
    used = {s for name in bad for d in ctx.spec.tensors[name].dims if isinstance(d, Expr) for s in d.symbols()}
    for tp in config.tp_sizes():
        if tp == config.tp_size:
            continue
        there = dims_at(config.with_tp(tp))
        if not all(fits(ctx, name, {**ctx.dims, **there}) for name in bad):
            continue
        differ = tuple(s for s in _PER_RANK if s in used and s in there and there[s] != here[s])
        if differ:
            return TPMismatch(tp, config, tuple(bad), differ, here, there)
    return None


def tp_mismatch_hint(
    config_of: Callable[[CallContext], KDAConfig | None],
    dims_at: DimsAt,
    render: Callable[[TPMismatch, CallContext], str | None],
) -> Callable[[Violation, CallContext], str | None]:
    """A hint for the first shape violation of a call whose misfit tensors all fit another
    ``tp_size``; ``config_of`` finds the call's ``KDAConfig`` (None: no hint), ``render`` words it."""

    def hint_tp_mismatch(v: Violation, ctx: CallContext) -> str | None:
        if v.kind is not ShapeError:
            return None
        first = next((x for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors), None)
        config = config_of(ctx) if first is v else None
        found = find_tp_mismatch(ctx, config, dims_at) if config is not None else None
        return render(found, ctx) if found is not None else None

    return hint_tp_mismatch
