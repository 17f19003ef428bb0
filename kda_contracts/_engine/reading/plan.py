"""The binding plan: which argument binds each dim, in what order, and which dims are solved.

Binding is order-independent: a fixed config binds first, then int
scalars named like a dim, then tensor axes whose dim is a plain name (``bind_first`` tensors
first, then argument order); a dim that is a linear expression with one unknown
(``2*H*K+HV*V``) solves that unknown with a divisibility check. Everything else is a check
against what is bound. An unconditional equality constraint ``x == expr`` binds ``x`` when
nothing above does and ``expr`` is known (``x == 16 // itemsize(key_cache)``); solvers and such
equalities run to a fixpoint, each step using what earlier ones bound, so the order of the
arguments and of the constraints does not matter. A dim nothing can bind is an AnnotationError
naming it. Argument facts (``itemsize(t)`` of a required tensor, ``t is None``) are known from the
start.

Example::

    plan = plan_binding("f", tensors, scalars, constraints, returns, options)
    plan.solvers[0]      # Solver(symbol='H', param='mixed_qkv', axis=1, ...)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..errors import AnnotationError
from ..grammar.constraints import Constraint
from ..grammar.dims import ArgFact, Broadcast, Const, Expr, Sym, arg_fact, dim_symbols, linear_form
from ..model.markers import Where, config_dims
from ..model.spec import AxisSource, BindingPlan, Derived, Solver, VariadicSource
from .arrays import int_hint

if TYPE_CHECKING:
    from ..model.nodes import Node
    from ..model.spec import ContractOptions, ScalarParam, TensorNode


def _symbols(tensors: Mapping[str, TensorNode], constraints: Iterable[tuple[Constraint, Where]],
             returns: Iterable[TensorNode], static_cfg: set[str], int_args: set[str]) -> list[str]:
    """Every symbol, in first-appearance order (tensors, then config dims and int arguments that
    constraints or the return use: ``def mask(T: int) -> Float[Tensor, "T T"]`` binds T from T)."""
    symbols: list[str] = []
    for tp in tensors.values():
        for d in tp.dims:
            symbols += [s for s in sorted(dim_symbols(d)) if s not in symbols and arg_fact(s) is None]
    used = {s for c, _ in constraints for s in c.symbols()}
    used |= {s for tp in returns for d in tp.dims for s in dim_symbols(d)}
    symbols += [s for s in sorted(static_cfg | int_args) if s not in symbols and s in used]
    symbols += [s for c, _ in constraints for s in c.dims() if s not in symbols]  # bound by an equality
    return symbols


def _solvers(tensors: Mapping[str, TensorNode], order: list[str], known: set[str]) -> list[Solver]:
    """Repeatedly find a dim of a required tensor that is linear in exactly one unknown."""
    solvers: list[Solver] = []
    progress = True
    while progress:
        progress = False
        for n in order:
            tp = tensors[n]
            if tp.optional:
                continue
            for axis, d in tp.fixed_axes():
                if not isinstance(d, Expr):
                    continue
                unknown = d.symbols() - known
                if len(unknown) != 1:
                    continue
                (x,) = unknown
                lin = linear_form(d, x)
                if lin is None or (isinstance(lin[0], Const) and lin[0].value == 0):
                    continue  # (not linear in x, or x drops out: "N+0*M" binds no M)
                solvers.append(Solver(x, n, axis, d, lin[0], lin[1]))
                known.add(x)
                progress = True
    return solvers


def _steps(tensors: Mapping[str, TensorNode], order: list[str], constraints: Iterable[tuple[Constraint, Where]],
           known: set[str]) -> list[Solver | Derived]:
    """Solvers to exhaustion, then the first equality that binds a new dim, until neither binds
    one: the fixpoint, whatever the order of arguments and constraints."""
    steps: list[Solver | Derived] = []
    while True:
        steps += _solvers(tensors, order, known)
        new = next((Derived(x, e, c.text) for c, _ in constraints for x, e in c.equalities()
                    if x not in known and e.symbols() <= known), None)
        if new is None:
            return steps
        steps.append(new)
        known.add(new.symbol)


def _facts(qualname: str, tensors: Mapping[str, TensorNode], scalars: Mapping[str, ScalarParam],
           constraints: Iterable[tuple[Constraint, Where]], returns: Iterable[TensorNode]) -> list[ArgFact]:
    """The argument facts the contract reads; AnnotationError for one it cannot know."""
    used = {s for c, _ in constraints for s in c.symbols()}
    used |= {s for tp in tensors.values() for d in tp.dims for s in dim_symbols(d)}
    facts = [f for s in sorted(used) if (f := arg_fact(s)) is not None]
    for f in facts:
        if f.kind == "itemsize" and (f.arg not in tensors or tensors[f.arg].optional):
            why = "an optional tensor (it may be None)" if f.arg in tensors else "not a tensor argument"
            raise AnnotationError(f"{qualname}: {f.key}: {f.arg!r} is {why}; itemsize() takes a required "
                                  "tensor argument")
        if f.kind == "none" and not ((f.arg in tensors and tensors[f.arg].optional)
                                     or (f.arg in scalars and scalars[f.arg].optional)):
            raise AnnotationError(f"{qualname}: where {f.key!r}: {f.arg!r} is not an argument that may be None "
                                  "(annotate it `... | None`)")
    for tp in returns:
        if any(arg_fact(s) for d in tp.dims for s in dim_symbols(d)):
            raise AnnotationError(f"{qualname}: {tp.name}: itemsize() cannot be used in the return annotation; "
                                  "bind a dim with a constraint (where=['x == 16 // itemsize(k)']) and use it")
    return facts


def plan_binding(qualname: str, tensors: Mapping[str, TensorNode], scalars: Mapping[str, ScalarParam],
                 constraints: tuple[tuple[Constraint, Where], ...], returns: tuple[TensorNode, ...] | None,
                 options: ContractOptions, nested: Mapping[str, Node] | None = None) -> BindingPlan:
    """Plan how every dim of a contract is bound; raise AnnotationError for a dim nothing binds."""
    static_cfg = set(config_dims(options.config)) if options.config is not None else set()
    int_args = {sp.name for sp in scalars.values() if int_hint(sp.hint) and not sp.optional}
    symbols = _symbols(tensors, constraints, returns or (), static_cfg, int_args)
    order = list(options.bind_first) + [n for n in tensors if n not in options.bind_first]
    sources: dict[str, list[AxisSource]] = {}
    bsources: dict[str, list[AxisSource]] = {}
    vsources: dict[str, list[VariadicSource]] = {}
    for n in order:
        tp = tensors[n]
        if tp.optional:
            continue  # an argument that may be None cannot be what a dim hangs on
        for axis, d in tp.fixed_axes():
            if isinstance(d, Sym):
                sources.setdefault(d.name, []).append(AxisSource(n, axis))
            elif isinstance(d, Broadcast) and isinstance(d.dim, Sym):
                bsources.setdefault(d.dim.name, []).append(AxisSource(n, axis))
        v, vi = tp.variadic, tp.variadic_index
        if v is not None and v.name is not None and vi is not None:
            vsources.setdefault(v.key, []).append(VariadicSource(n, vi, len(tp.dims) - 1 - vi, v.broadcast))
    for n in order:  # a variadic dim binds from every occurrence given, optional ones too (when not None)
        tp = tensors[n]
        v, vi = tp.variadic, tp.variadic_index
        if tp.optional and v is not None and v.name is not None and vi is not None:
            vsources.setdefault(v.key, []).append(VariadicSource(n, vi, len(tp.dims) - 1 - vi, v.broadcast, True))
    scalar_sources = {sp.name: sp.name for sp in scalars.values()
                      if int_hint(sp.hint) and sp.name in symbols and not sp.optional}
    direct = set(sources) | set(scalar_sources) | static_cfg
    config_only = [s for s in symbols if s in static_cfg and s not in sources and s not in scalar_sources]
    facts = _facts(qualname, tensors, scalars, constraints, returns or ())
    # a dim an expression solves exactly ("2*N") is bound by the solver, not by the broadcastable
    # axes that also carry it ("#N"): those may all be 1, which binds nothing
    base = direct | set(vsources) | {f.key for f in facts}
    solved = {s.symbol for s in _steps(tensors, order, constraints, set(base))}
    bsources = {k: v for k, v in bsources.items() if k not in direct and k not in solved}
    steps = _steps(tensors, order, constraints, base | set(bsources))
    solvers = [s for s in steps if isinstance(s, Solver)]
    known = base | set(bsources) | {s.symbol for s in steps}
    nested = nested or {}
    nested_only = sorted({s for node in nested.values() for s in node.plain_symbols()} - known)
    symbols += [s for s in nested_only if s not in symbols]
    symbols += [s for node in nested.values() for s in sorted(node.symbols()) if s not in symbols]
    known |= set(nested_only)
    unbound = [s for s in symbols if s not in known]
    for c, _w in constraints:
        unbound += [s for s in sorted(c.symbols()) if s not in known and s not in unbound]
    for r in returns or ():
        for d in r.dims:
            unbound += [s for s in sorted(dim_symbols(d)) if s not in known and s not in unbound]
    if unbound:
        where_used = []
        for s in unbound:
            users = [f"{tp.name}: {tp.dim_str!r}" for tp in tensors.values()
                     if any(s in dim_symbols(d) for d in tp.dims)]
            users += [f"{name}: {node}" for name, node in nested.items() if s in node.symbols()]
            where_used.append(f"{s!r} (in {', '.join(users) or 'a constraint or the return'})")
        raise AnnotationError(
            f"{qualname}: cannot bind dim {', '.join(where_used)}: no required tensor has it as a plain dim, "
            "no config or int argument provides it, no dim is linear in it alone, and no constraint "
            "equates it to known dims. Add an argument "
            "that carries it, pass a config that fixes it, or rewrite the expression."
        )
    return BindingPlan(tuple(symbols), {k: tuple(v) for k, v in sources.items()}, scalar_sources,
                       tuple(solvers), tuple(config_only), {k: tuple(v) for k, v in bsources.items()},
                       tuple(nested_only),
                       {k: tuple(v) for k, v in vsources.items()}, tuple(steps), tuple(facts))


