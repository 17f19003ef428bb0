"""The slow path: interpret a contract on one call that the generated checker rejected, and
collect every violation with where each dim came from and a fix for known mistakes.

This is the specification the generated fast checker (``codegen``) must agree with.

Example::

    dims, provenance, violations = Explainer(spec, values, config).run()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..codegen.config_views import dim_type_violations
from ..errors import ArgumentTypeError, DeviceError, DtypeError, LayoutError, ShapeError, Violation
from ..facts import (
    AxisMismatch,
    ConstraintFailed,
    DeviceMismatch,
    DtypeMismatch,
    Fact,
    LayoutBroken,
    RankMismatch,
    Unsolvable,
)
from ..grammar.constraints import Constraint
from ..grammar.dims import Broadcast, Expr, Sym, Variadic, bind_variadic, broadcast_dim, fits_variadic
from ..model.markers import CONFIG_LACKS, ConfigKindError, config_dim_source, config_dims, config_dtypes, is_int_dim
from ..model.nodes import DEVICE, REPORT, walk_containers
from ..model.spec import (
    CallContext,
    ContractSpec,
    Derived,
    TensorNode,
    bound_dims,
    derived_provenance,
)
from ..rules.tensor import Rule, dtype_name, fmt_ints


class Explainer:
    def __init__(self, spec: ContractSpec, values: Mapping[str, Any], config: Any) -> None:
        self.spec = spec
        self.values = values
        self.config = config
        self.dims: dict[str, int] = {}
        self.prov: dict[str, str] = {}
        self.violations: list[Violation] = []
        self.usable: dict[str, tuple[int, ...]] = {}
        # Per tensor: mismatching axes and notes, merged into one violation per argument.
        self.bad_axes: dict[str, dict[int, tuple[str, Fact | None]]] = {}
        self.leaf_of: dict[int, Violation] = {}  # a container's violation -> its tensor's own (named by path)

    def run(self) -> tuple[dict[str, int], dict[str, str], list[Violation]]:
        spec = self.spec
        self._ranks()
        self._bind()
        self._nested()
        self._bind_from_optionals()
        self._check_dims()
        self._shape_violations()
        self._where()
        for _, family in sorted({(r.order, r.family) for tp in spec.tensors.values() for r in tp.rules}):
            self._tensor_rules(family)
        self._scalars()
        dims = {s: self.dims[s] for s in spec.symbols if s in self.dims}
        ctx = CallContext(spec, self.values, self.config, dims, self.prov, self.violations)
        self.violations = [self._hinted(v, ctx) for v in self.violations]
        return dims, {s: self.prov[s] for s in dims}, self.violations

    def _hinted(self, v: Violation, ctx: CallContext) -> Violation:
        for h in self.spec.hints:
            text = h(v, ctx)
            if text:
                return v.with_hint(text)
        # a tensor inside a container: the fix names the item (ys[0].to('cpu'), not ys.to(...))
        return v.with_hint(_generic_hint(self.leaf_of.get(id(v), v), ctx))

    def _ranks(self) -> None:
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            shape = tuple(int(s) for s in t.shape)
            if len(shape) < tp.rank if tp.variadic is not None else len(shape) != tp.rank:
                self.violations.append(Violation(
                    ShapeError, name,
                    f"{tp.symbolic()} (rank {'≥ ' if tp.variadic is not None else ''}{tp.rank})",
                    f"{fmt_ints(shape)} (rank {len(shape)})",
                    facts=(RankMismatch(shape, tp.rank),),
                ))
                continue
            self.usable[name] = shape

    def _bind(self) -> None:
        spec = self.spec
        try:
            cfg_dims = config_dims(self.config)
        except ConfigKindError as exc:
            self.violations.append(Violation(
                ArgumentTypeError, spec.config_arg or "config",
                "a config (an object with contract_dims(), a pydantic model, a dataclass or a mapping of dims)",
                type(self.config).__name__, hint=f"{exc}"))
            self.config = None
            cfg_dims = {}
        self.violations += dim_type_violations(spec, self.config, cfg_dims)
        for sym in spec.symbols:
            if sym in cfg_dims and is_int_dim(cfg_dims[sym]):
                self.dims[sym] = int(cfg_dims[sym])
                self.prov[sym] = f"from config ({config_dim_source(self.config, sym)})"
        self._facts()
        for sym, pname in spec.scalar_sources.items():
            value = self.values.get(pname)
            if sym in self.dims:
                if value != self.dims[sym]:
                    self.violations.append(Violation(
                        ShapeError, pname, f"{sym}={self.dims[sym]} ({self.prov[sym]})", f"{value}"))
                continue
            self.dims[sym] = int(value)  # type: ignore[arg-type]  # beartype checked it is an int
            self.prov[sym] = f"from {pname}"
        for sym, srcs in spec.sources.items():
            if sym in self.dims:
                continue
            # When the binders disagree, bind the value most of them carry (ties: priority order),
            # so the odd one out is the argument blamed.
            usable = [src for src in srcs if src.param in self.usable]
            if not usable:
                continue
            sizes = [self.usable[src.param][src.axis] for src in usable]
            best = max(sizes, key=sizes.count)
            src = usable[sizes.index(best)]
            self.dims[sym] = best
            self.prov[sym] = f"from {src.param}.shape[{src.axis}]"
        self._bind_broadcast_and_variadic()
        for s in spec.steps:
            if isinstance(s, Derived):
                self._derive(s)
                continue
            if s.symbol in self.dims or s.param not in self.usable:
                continue
            if not (s.coef.symbols() | s.const.symbols()) <= self.dims.keys():
                continue
            size = self.usable[s.param][s.axis]
            try:
                coef, const = s.coef.evaluate(self.dims), s.const.evaluate(self.dims)
            except ZeroDivisionError:
                continue
            rest = size - const
            if coef != 0 and rest % coef == 0 and rest // coef >= 0:
                self.dims[s.symbol] = rest // coef
                self.prov[s.symbol] = derived_provenance(s)
                continue
            known = ", ".join(f"{k}={self.dims[k]}" for k in sorted(s.dim.symbols() - {s.symbol}))
            frac = f"({size} - {const}) / {coef} = {rest / coef:g}" if coef else f"coefficient {s.coef} is 0"
            axis = self._real_axis(s.param, s.axis)
            given = f" with {known}" if known else ""
            text = (f"dim {axis} ({s.dim}) = {size} leaves {s.symbol} undetermined{given}: every {s.symbol} fits, "
                    "and no other argument binds it" if coef == 0 and rest == 0 else
                    f"dim {axis} ({s.dim}) = {size} gives no whole {s.symbol} >= 0{given}: {s.symbol} = {frac}")
            self.bad_axes.setdefault(s.param, {})[axis] = (text, Unsolvable(s.symbol, axis, str(s.dim), size, coef,
                                                                            const))

    def _nested(self) -> None:
        """Walk the tensors inside containers with the dims bound so far; the walk binds the dims
        only they carry, and its verdict is the fast path's."""
        env: dict[str, Any] = bound_dims(tuple(self.dims), tuple(self.dims.values()))
        first = self.values.get(self.spec.first_tensor) if self.spec.first_tensor is not None else None
        if isinstance(first, torch.Tensor):
            env[DEVICE] = first.device
        report: dict[str, list[tuple[Any, Violation]]] = {}
        env[REPORT] = report
        problems = walk_containers(tuple((name, param.node, self.values.get(name))
                                         for name, param in self.spec.nested.items()), env)
        del env[REPORT]
        for name, param in self.spec.nested.items():
            value = self.values.get(name)
            if name in problems:
                first = problems[name]
                # every rule the tensor inside breaks, as a top-level argument's report says them
                for (kind, text), leaf in report.get(first[1], [(first, None)]):
                    v = Violation(kind, name, str(param.node), text, facts=leaf.facts if leaf else ())
                    if leaf is not None:
                        self.leaf_of[id(v)] = leaf
                    self.violations.append(v)
                continue
            for rule in param.rules:
                if rule.broken(value=value):
                    self.violations.append(rule.violation(value=value))
        for sym in self.spec.variadic_sources:
            walked = env.get(sym, env.get("#" + sym))
            if sym in self.dims and walked is not None:  # a widenable variadic dim: what the walk made of it
                self.dims[sym] = walked
        for sym in (*self.spec.nested_only, *self.spec.broadcast_sources):
            value = env.get(sym, env.get("#" + sym))
            if value is not None and sym not in self.dims:
                self.dims[sym] = value
                self.prov[sym] = "from the first tensor inside " + next(
                    (n for n, p in self.spec.nested.items() if sym in p.node.plain_symbols()), "a container")

    def _bind_from_optionals(self) -> None:
        """A dim nothing else bound (its required carriers absent: only optional tensors and empty
        containers have it) is bound by the optional tensors given, so they still agree with each
        other: the first plain occurrence's size, else the largest of the broadcastable ones (as
        the generated checker, which rejects two given sizes that disagree)."""
        plain: dict[str, tuple[str, int]] = {}
        broad: dict[str, list[tuple[str, int]]] = {}
        for name, tp in self.spec.tensors.items():
            if not tp.optional or name not in self.usable:
                continue
            for axis, d in tp.fixed_axes():
                if isinstance(d, Sym) and d.name not in self.dims:
                    plain.setdefault(d.name, (name, axis))
                elif isinstance(d, Broadcast) and isinstance(d.dim, Sym) and d.dim.name not in self.dims:
                    broad.setdefault(d.dim.name, []).append((name, axis))
        for sym, (name, axis) in plain.items():
            self.dims[sym] = self.usable[name][axis]
            self.prov[sym] = f"from {name}.shape[{self._real_axis(name, axis)}]"
        for sym, srcs in broad.items():
            if sym in self.dims:
                continue
            sizes = [self.usable[name][axis] for name, axis in srcs]
            size = broadcast_dim(*sizes)
            if size is not None:
                name, axis = srcs[sizes.index(size)]
                self.dims[sym] = size
                self.prov[sym] = f"from {name}.shape[{self._real_axis(name, axis)}] (broadcastable)"

    def _facts(self) -> None:
        """Argument facts, among the dims by key: ``itemsize(t)`` and ``t is None``."""
        for f in self.spec.facts:
            value = self.values.get(f.arg)
            if f.kind == "none":
                self.dims[f.key] = value is None
            elif isinstance(value, torch.Tensor):
                self.dims[f.key] = value.dtype.itemsize
                self.prov[f.key] = f"from {f.arg}.dtype ({dtype_name(value.dtype)})"

    def _derive(self, step: Derived) -> None:
        """A dim bound by an equality constraint, once its right side is known."""
        if step.symbol in self.dims or not step.expr.symbols() <= self.dims.keys():
            return
        try:
            self.dims[step.symbol] = step.expr.evaluate(self.dims)
        except ZeroDivisionError:
            c, w = next((c, w) for c, w in self.spec.where if c.text == step.constraint)
            self.violations.append(Violation(w.kind, "dims", c.text, f"{step.expr} divides by zero with "
                                             + self._values(c), hint=w.hint))
            return
        self.prov[step.symbol] = derived_provenance(step)

    def _bind_broadcast_and_variadic(self) -> None:
        """Dims only broadcastable axes carry take the largest size; a variadic dim takes the
        sizes most of its occurrences carry (with ``#*``: their broadcast, when there is one)."""
        for sym, srcs in self.spec.broadcast_sources.items():
            usable = [src for src in srcs if src.param in self.usable]
            if sym in self.dims or not usable:
                continue
            sizes = [self.usable[src.param][src.axis] for src in usable]
            size = broadcast_dim(*sizes)
            if size is None:  # all of size 1: bound by nothing (yet)
                continue
            src = usable[sizes.index(size)]
            self.dims[sym] = size
            self.prov[sym] = f"from {src.param}.shape[{src.axis}] (broadcastable)"
        for key, vsrcs in self.spec.variadic_sources.items():
            found = [(v, self._variadic_axes(v.param, v.start, v.after)) for v in vsrcs if v.param in self.usable]
            if not found:
                continue
            merged = bind_variadic(*((sizes, v.broadcast) for v, sizes in found)) \
                if any(v.broadcast for v, _ in found) else None
            sizes_list = [sizes for _, sizes in found]
            best = merged if isinstance(merged, tuple) else max(sizes_list, key=sizes_list.count)
            v = found[sizes_list.index(best)][0] if best in sizes_list else found[0][0]
            shape = self.usable[v.param]
            self.dims[key] = best  # type: ignore[assignment]  # a variadic dim is a tuple of sizes
            self.prov[key] = f"from {v.param}.shape[{v.start}:{len(shape) - v.after}]"

    def _variadic_axes(self, name: str, start: int, after: int) -> tuple[int, ...]:
        shape = self.usable[name]
        return shape[start:len(shape) - after]

    def _real_axis(self, name: str, axis: int) -> int:
        return axis if axis >= 0 else len(self.usable[name]) + axis

    def _check_dims(self) -> None:
        for name, shape in self.usable.items():
            tp = self.spec.tensors[name]
            bad = self.bad_axes.setdefault(name, {})
            for axis, d in tp.fixed_axes():
                real = self._real_axis(name, axis)
                expr = d.dim if isinstance(d, Broadcast) else d
                if not isinstance(expr, Expr) or real in bad or not expr.symbols() <= self.dims.keys():
                    continue
                try:
                    want = expr.evaluate(self.dims)
                except ZeroDivisionError:
                    bad[real] = (f"dim {real} ({d}) divides by zero with the bound dims", None)
                    continue
                if shape[axis] != want and not (isinstance(d, Broadcast) and shape[axis] == 1):
                    why = f" ({expr.name} {self.prov.get(expr.name, '')})" if isinstance(expr, Sym) else ""
                    bad[real] = (f"dim {real} ({d}): expected {want}{'' if expr is d else ' or 1'}{why}, "
                                 f"got {shape[axis]}", AxisMismatch(real, str(d), want, shape[axis], shape))
            v, vi = tp.variadic, tp.variadic_index
            if v is not None and v.name is not None and vi is not None and v.key in self.dims:
                after = len(tp.dims) - 1 - vi
                got, want_sizes = self._variadic_axes(name, vi, after), self.dims[v.key]
                if not fits_variadic(got, v.broadcast, want_sizes):  # type: ignore[arg-type]
                    bad[vi] = (f"dims {vi}:{len(shape) - after} ({v}): expected {fmt_ints(want_sizes)}"  # type: ignore[arg-type]
                               f"{' or sizes that broadcast to it' if v.broadcast else ''} "
                               f"({v.key} {self.prov.get(v.key, '')}), got {fmt_ints(got)}", None)
            if not bad:
                del self.bad_axes[name]

    def _concrete(self, tp: TensorNode) -> str:
        parts = []
        for d in tp.dims:
            expr = d.dim if isinstance(d, Broadcast) else d
            if isinstance(d, Variadic):
                sizes = self.dims.get(d.key) if d.name is not None else None
                parts.append("..." if sizes is None else ", ".join(map(str, sizes)) or "()")  # type: ignore[call-overload]
                continue
            if not isinstance(expr, Expr):
                parts.append("_")
                continue
            try:
                value = str(expr.evaluate(self.dims)) if expr.symbols() <= self.dims.keys() else "?"
            except ZeroDivisionError:
                value = "?"
            parts.append(f"#{value}" if isinstance(d, Broadcast) else value)
        return "[" + ", ".join(parts) + "]"

    def _shape_violations(self) -> None:
        for name, axes in self.bad_axes.items():
            tp = self.spec.tensors[name]
            self.violations.append(Violation(
                ShapeError, name,
                f"{tp.symbolic()} = {self._concrete(tp)}",
                fmt_ints(self.usable[name]),
                tuple(axes[a][0] for a in sorted(axes)),
                facts=tuple(f for a in sorted(axes) if (f := axes[a][1]) is not None),
            ))

    def _where(self) -> None:
        for c, w in self.spec.where:
            if not c.symbols() <= self.dims.keys():
                continue
            try:
                ok = c.holds(self.dims)
            except ZeroDivisionError:
                ok = False
            if not ok:
                names = c.dims() + [f.key for f in c.facts()]
                self.violations.append(Violation(
                    w.kind, "dims", c.text, self._values(c),
                    tuple(f"{s} {self.prov[s]}" for s in names if s in self.prov),
                    hint=w.hint,
                    facts=(ConstraintFailed(c.text, tuple((s, self.dims[s]) for s in names)),),
                ))

    def _values(self, c: Constraint) -> str:
        """The values a constraint read: its dims (sorted), then its argument facts."""
        said = [f"{s}={self.dims[s]}" for s in c.dims() if s in self.dims]
        for f in c.facts():
            if f.key not in self.dims:
                continue
            if f.kind == "none":
                said.append(f"{f.arg} is {'' if self.dims[f.key] else 'not '}None")
            else:
                said.append(f"{f.key}={self.dims[f.key]}")
        return ", ".join(said)

    def _tensor_rules(self, family: str) -> None:
        """Decide each tensor's rules of one family with the rules' own tests; at most one
        violation per tensor and family (the first broken rule, in declaration order). A rule
        that needs what the call cannot give (the device of an absent first tensor, the strides
        of a tensor of the wrong rank) is not decided."""
        first = self.spec.first_tensor
        device = self.values[first].device if first is not None and self.values.get(first) is not None else None
        cfg_dt = config_dtypes(self.config)
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            for rule in tp.rules:
                if rule.family != family or ("device" in rule.needs and device is None) or \
                        ("shape" in rule.needs and name not in self.usable):
                    continue
                other = self.values.get(rule.other_argument() or "")
                values = {"value": t, "dtype": t.dtype, "device": device,
                          "config_value": config_value_of(rule, self.config, cfg_dt),
                          "other_dtype": other.dtype if isinstance(other, torch.Tensor) else None}
                if "shape" in rule.needs:
                    values["shape"], values["strides"] = self.usable[name], tuple(t.stride())
                if rule.broken(**values):
                    self.violations.append(rule.violation(**values))
                    break

    def _scalars(self) -> None:
        for name, sp in self.spec.scalars.items():
            v = self.values.get(name)
            for rule in sp.rules:
                from_config = rule.config_source() is not None
                if v is None and not from_config:
                    continue  # None skips a range (the type check decided whether None is allowed)
                if from_config and self.config is None:
                    continue
                values = {"value": v, "config_value": config_value_of(rule, self.config, {}),
                          "bound": self.dims.get(name)}
                if rule.broken(**values):
                    self.violations.append(rule.violation(**values))
                    break


def config_value_of(rule: Rule, config: Any, dtypes: Mapping[str, Any]) -> Any:
    """What ``config`` fixes for ``rule`` (its ``config_value`` slot), from the dtypes it pins by
    role (``dtypes``, read once per call) or its attributes; None when the rule reads no config."""
    source = rule.config_source()
    if source is None:
        return None
    kind, key = source
    if kind == "dtype":
        return dtypes.get(key)
    return CONFIG_LACKS if config is None else getattr(config, key, CONFIG_LACKS)


def explain_call(spec: ContractSpec, values: Mapping[str, Any], config: Any
                 ) -> tuple[dict[str, int], dict[str, str], list[Violation]]:
    """Interpret the contract on one call; return (dims, provenance, violations).

    This is the specification the generated fast checker must agree with.

    Example::

        dims, provenance, violations = explain_call(contract.spec, {"x": x, "w": w}, None)
    """
    return Explainer(spec, values, config).run()


def _generic_hint(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is DtypeError:
        fact = v.fact(DtypeMismatch)
        if fact is not None and len(fact.allowed) == 1:
            (dt,) = fact.allowed
            return f"cast it: {v.argument}.to({dt})"
        return None
    if v.kind is LayoutError:
        layout = v.fact(LayoutBroken)
        tp = ctx.spec.tensors.get(v.argument)
        if tp is not None and tp.spec.mutated and layout is not None and layout.rule != "disjoint":
            return (f"{v.argument} is written in place, so a .contiguous() copy would take the writes and lose "
                    f"them: allocate {v.argument} with the layout asked (e.g. torch.empty(...) of its full shape, "
                    "then view it) and pass that tensor itself")
        if layout is not None and layout.rule == "contiguous":
            return f"pass {v.argument}.contiguous()"
        if layout is not None and layout.rule == "dim_order" and tp is not None and tp.spec.dim_order is not None:
            order = tp.spec.dim_order
            back = sorted(range(len(order)), key=order.__getitem__)
            return (f"pass {v.argument}.permute({', '.join(map(str, order))}).contiguous()"
                    f".permute({', '.join(map(str, back))}) (the same values, dense in that order)")
        if layout is not None and layout.rule == "disjoint":
            return (f"{v.argument} is written in place, so its blocks must not share memory (an .expand()ed or "
                    f"as_strided view makes them): allocate it densely")
        return (f"pass {v.argument}.contiguous(), or allocate it with a dense inner block; a transposed or "
                "sliced view has the wrong strides")
    if v.kind is DeviceError:
        dev = v.fact(DeviceMismatch)
        return f"move it: {v.argument}.to({str(dev.want if dev else '')!r})"
    return None


def concrete_dim(d: Any, env: Mapping[str, Any]) -> str:
    try:
        if isinstance(d, Variadic):
            return ", ".join(map(str, env[d.key])) if d.name is not None else "..."
        if isinstance(d, Broadcast):
            return f"#{d.dim.evaluate(env)}"
        return str(d.evaluate(env)) if isinstance(d, Expr) else "_"
    except (KeyError, TypeError, ZeroDivisionError):  # a dim bound to nothing
        return str(d)


