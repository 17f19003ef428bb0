"""Code generation: one straight-line checker per contract, and the wrapper that runs it.

The happy path is generated Python source: attribute reads, integer
compares and set lookups, no loops, no dict of dims, no message building. It returns the bound
dims as a tuple, or ``None`` at the first failed test; only then does the slow path
(``explain``) run to collect every violation with provenance and hints.

Example::

    src, consts, types_checked = generate_checker(spec)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..grammar.dims import (
    ANY,
    Broadcast,
    Expr,
    Sym,
    WideSizes,
    bind_variadic,
    broadcast_dim,
    dim_symbols,
    fits_variadic,
)
from ..model.nodes import DEVICE, match_dims, walk_containers
from ..model.spec import (
    ContractSpec,
    Derived,
    TensorNode,
    call_device,
    result_env,
    weak_symbols,
    widenable_variadics,
)
from ..reading.arrays import split_optional
from ..rules.tensor import Rule
from .config_views import config_view_layout
from .snippets import (
    BIND_AXIS,
    BIND_EQUAL,
    CONFIG_DIM_TEST,
    CONFIG_VIEW,
    IS_NONE,
    ITEMSIZE,
    MIN_RANK_TEST,
    NO_CONFIG,
    OPTIONAL_TYPE_TEST,
    RANK_TEST,
    READ_DEVICE,
    READ_DTYPE,
    READ_SHAPE,
    READ_STRIDES,
    REJECT,
    SOLVE,
    TYPE_TEST,
    UNPACK,
    VARIADIC_AXES,
    Gen,
    Names,
)

_SIMPLE_TYPES: dict[Any, tuple[type, ...]] = {
    # beartype's verdict for these hints, as isinstance (BeartypeConf(is_pep484_tower=True): a
    # float parameter accepts an int; bool is an int)
    float: (int, float),
    int: (int,),
    bool: (bool,),
    str: (str,),
    torch.Tensor: (torch.Tensor,),
}


def _type_guards(spec: ContractSpec, g: Gen, arg: Mapping[str, str]) -> list[str] | None:
    """Conditions that are true when an argument has the wrong Python type, equivalent to
    beartype's verdict on the stripped annotations; None when some hint is not that simple (then
    the beartype shim runs on every call instead)."""
    guards: list[str] = []
    hints: list[tuple[str, Any, bool]] = [(n, torch.Tensor, tp.optional) for n, tp in spec.tensors.items()]
    for n, sp in spec.scalars.items():
        inner, optional = split_optional(sp.hint)
        hints.append((n, inner, optional or sp.optional))
    for name, hint, optional in hints:
        if hint is Any:
            continue
        types = _SIMPLE_TYPES.get(hint)
        if types is None:
            return None
        snippet = OPTIONAL_TYPE_TEST if optional else TYPE_TEST
        guards.append(snippet.format(arg=arg[name], types=g.const(types)))
    return guards


def _bool_for_float(spec: ContractSpec, arg: Mapping[str, str]) -> list[str]:
    """Conditions true when a float parameter got a bool (``scale=True``): a mistake, although
    ``bool`` is an ``int`` and the numeric tower lets an int stand for a float."""
    return [f"({arg[n]} is True or {arg[n]} is False)" for n, sp in spec.scalars.items()
            if split_optional(sp.hint)[0] is float]


def bool_for_float(spec: ContractSpec, values: Mapping[str, Any]) -> list[str]:
    """The float parameters of a call given a bool (the slow path's side of the same test)."""
    return [n for n, sp in spec.scalars.items() if split_optional(sp.hint)[0] is float
            and isinstance(values.get(n), bool)]


# -- the checker ---------------------------------------------------------------------------------
class _Checker:
    """Builds ``check(<args by position>, <config>) -> dims tuple | None`` for one spec."""

    def __init__(self, spec: ContractSpec) -> None:
        self.spec = spec
        params = checked_parameters(spec)
        self.names = Names(params)
        self.g = Gen(self.names)
        n = self.names
        self.arg = {p: n("a", i) for i, p in enumerate(params)}
        self.shape = {p: n("s", i) for i, p in enumerate(params)}
        self.dim = {s: n("d", i) for i, s in enumerate(spec.symbols)}
        self.dim.update({f.key: n("fact", i) for i, f in enumerate(spec.facts)})  # argument facts, by key
        self.cfg = n("cfg")
        self.roles, self.matches = config_view_layout(spec)
        self.has_cfg = spec.config is not None or spec.config_arg is not None
        self.solved_axes = {(s.param, s.axis) for s in spec.solvers}
        self.dtypes_read: set[int] = set()  # arguments whose dtype is in a local already
        # Fast forms (same verdict; the slow path words a rejection): a tensor whose axes are all
        # first binders of distinct dims is unpacked in one statement (after its rank test);
        # one whose dims are all expressions is compared as one tuple once every dim is bound.
        self.weak = weak_symbols(spec)
        # variadic dims bound from every occurrence at once (some broadcastable or optional);
        # the others (all required and plain) take the first one's sizes, which the rest must equal
        self.merged_variadics = {k for k, vs in spec.variadic_sources.items() if any(v.broadcast or v.optional
                                                                                     for v in vs)}
        self.unpacked = {tp.name for tp in spec.tensors.values() if self._unpackable(tp)}
        self.whole = {tp.name for tp in spec.tensors.values()
                      if not tp.optional and tp.name not in self.unpacked and tp.variadic is None
                      and all(isinstance(d, Expr) for d in tp.dims)
                      and not any((tp.name, a) in self.solved_axes for a in range(tp.rank))}

    def _unpackable(self, tp: TensorNode) -> bool:
        syms = [d.name for d in tp.dims if isinstance(d, Sym)]
        if tp.optional or tp.variadic is not None or not syms:
            return False
        if len(syms) != len(tp.dims) or len(set(syms)) != len(syms):
            return False
        return all(s not in self.spec.scalar_sources and self.spec.sources[s][0].param == tp.name for s in syms)

    def source(self) -> tuple[str, dict[str, Any], bool]:
        spec, g, n = self.spec, self.g, self.names
        guards = _type_guards(spec, g, self.arg)
        g.reject_if(guards or ())
        g.reject_if(_bool_for_float(spec, self.arg))  # beartype's tower lets True pass as a float
        required = [tp for tp in spec.tensors.values() if not tp.optional]
        for tp in required:
            g.emit(READ_SHAPE, shape=self.shape[tp.name], arg=self.arg[tp.name])
        # (the unpacked ones too: torch 2.11's dynamo turns a failed unpack into a graph break, not a ValueError)
        g.reject_if([rank_test(tp, self.shape[tp.name]) for tp in required if tp.name not in self.whole])
        if self.has_cfg:
            self.read_config()
        self.bind()
        first = spec.first_tensor
        dev_read = first is not None and bool(spec.nested)
        if first is not None and dev_read:  # the walk holds the tensors in containers to the first argument's device
            g.emit(READ_DEVICE, device=n("dev"), arg=self.arg[first])
        self.nested_checks()
        if self.has_cfg:
            self.config_agreement()
        for tp in required:
            self.shape_checks(tp)
        for c, _w in spec.where:
            g.reject_if([f"not ({c.render(self.dim)})"])
        if spec.first_tensor is not None and not dev_read:
            g.emit(READ_DEVICE, device=n("dev"), arg=self.arg[spec.first_tensor])
        for tp in required:
            self.tensor_checks(tp)
        for tp in spec.tensors.values():
            if tp.optional:
                g.emit(f"if {self.arg[tp.name]} is not None:")
                g.indent += 1
                g.emit(READ_SHAPE, shape=self.shape[tp.name], arg=self.arg[tp.name])
                g.reject_if([rank_test(tp, self.shape[tp.name])])
                self.shape_checks(tp)
                self.tensor_checks(tp)
                g.indent -= 1
        self.scalar_checks()
        g.emit("return (" + "".join(f"{self.dim[s]}, " for s in spec.symbols) + ")")
        args = "".join(f"{a}, " for a in self.arg.values())
        src = (f"def check({args}{self.cfg}=None):\n    try:\n"
               + "\n".join("    " + ln for ln in g.lines)
               + "\n    except Exception:  # a zero divisor, an odd object: the slow path says\n        return None\n")
        return src, g.consts, guards is not None

    def bind(self) -> None:
        """Argument facts, scalars, then tensor axes (the slow path's priority), broadcastable-only
        dims (the largest size), variadic dims, then the solvers and equality bindings."""
        spec, g, n = self.spec, self.g, self.names
        for f in spec.facts:
            fact = ITEMSIZE if f.kind == "itemsize" else IS_NONE
            g.emit(fact, var=self.dim[f.key], arg=self.arg[f.arg])
        for sym, pname in spec.scalar_sources.items():
            g.emit(f"{self.dim[sym]} = {self.arg[pname]}")
        for name in self.unpacked:
            tp = spec.tensors[name]
            names = [self.dim[d.name] for d in tp.dims if isinstance(d, Sym)]
            g.emit(UNPACK, dims=", ".join(names) + ("," if tp.rank == 1 else ""), shape=self.shape[name])
        for sym, srcs in spec.sources.items():
            if sym not in spec.scalar_sources and srcs[0].param not in self.unpacked:
                g.emit(BIND_AXIS, dim=self.dim[sym], shape=self.shape[srcs[0].param], axis=srcs[0].axis)
        for sym, srcs in spec.broadcast_sources.items():
            sizes = ", ".join(f"{self.shape[src.param]}[{src.axis}]" for src in srcs)
            g.emit(f"{self.dim[sym]} = {g.const(broadcast_dim)}({sizes})")
        for key, vsrcs in spec.variadic_sources.items():
            if key not in self.merged_variadics:  # the first occurrence fixes it
                g.emit(f"{self.dim[key]} = " + VARIADIC_AXES.format(shape=self.shape[vsrcs[0].param],
                                                                    start=vsrcs[0].start, after=vsrcs[0].after))
                continue
            pairs = []
            for v in vsrcs:  # every occurrence given: optional ones when not None
                shape = f"{self.arg[v.param]}.shape" if v.optional else self.shape[v.param]
                axes = VARIADIC_AXES.format(shape=shape, start=v.start, after=v.after)
                pairs.append(f"(None if {self.arg[v.param]} is None else {axes}, {v.broadcast})" if v.optional
                             else f"({axes}, {v.broadcast})")
            g.emit(f"{self.dim[key]} = {g.const(bind_variadic)}({', '.join(pairs)})")
            g.reject_if([f"{self.dim[key]} is False"])
        for s in spec.steps:
            if isinstance(s, Derived):
                g.emit(BIND_EQUAL, dim=self.dim[s.symbol], expr=s.expr.render(self.dim))
                continue
            g.emit(*SOLVE, coef=n("coef"), rest=n("rest"), coef_expr=s.coef.render(self.dim),
                   const_expr=s.const.render(self.dim), shape=self.shape[s.param], axis=s.axis, dim=self.dim[s.symbol])

    def nested_checks(self) -> None:
        """Tensors inside containers: one walk per argument with the dims bound so far (it binds
        the dims only such tensors carry)."""
        spec, g, n = self.spec, self.g, self.names
        if not spec.nested:
            return
        env = n("env")
        bound = [s for s in spec.symbols if s not in spec.nested_only]
        widen = widenable_variadics(spec)
        wide = g.const(WideSizes)
        entries = [f"({'#' + s!r} if type({self.dim[s]}) is {wide} else {s!r}): {self.dim[s]}" if s in widen
                   else f"{s!r}: {self.dim[s]}" for s in bound]
        if spec.first_tensor is not None:
            entries.append(f"{DEVICE!r}: {n('dev')}")
        g.emit(f"{env} = {{" + ", ".join(entries) + "}")
        walks = ", ".join(f"({name!r}, {g.const(param.node)}, {self.arg[name]})" for name, param in spec.nested.items())
        g.reject_if([f"{g.const(walk_containers)}(({walks},), {env})"])
        for name, param in spec.nested.items():
            for rule in param.rules:
                g.reject_if([rule.test(g.slots(rule, value=self.arg[name]))])
        for s in (*spec.nested_only, *spec.broadcast_sources):
            widened = f", {env}.get({'#' + s!r})" if s.startswith("*") else ""
            g.emit(f"{self.dim[s]} = {env}.get({s!r}{widened})")
        for s in bound:
            if s in widen:  # a widenable variadic dim: what the walk made of it
                g.emit(f"{self.dim[s]} = {env}.get({s!r}, {env}.get({'#' + s!r}))")

    def read_config(self) -> None:
        """What a config fixes is read once per config object into a flat view (see ConfigViews);
        dims only the fixed config provides are bound from it."""
        g, n = self.g, self.names
        g.emit(f"if {self.cfg} is not None:")
        g.indent += 1
        g.emit(*CONFIG_VIEW, view=n("view"), views=n("views"), cfg=self.cfg, cdims=n("cdims"),
               cdtypes=n("cdtypes"), cmatch=n("cmatch"))
        for s in self.spec.config_only:
            g.emit(f"{self.dim[s]} = {n('cdims')}[{self.spec.symbols.index(s)}]")
        g.indent -= 1
        g.emit("else:")
        g.emit("    " + NO_CONFIG, cdtypes=n("cdtypes"), cmatch=n("cmatch"), nones=g.const((None,) * len(self.roles)))
        if self.spec.config_only:  # no config, so nothing binds them: the slow path says so
            g.emit("    " + REJECT)

    def config_agreement(self) -> None:
        """Every dim the config fixes equals what the arguments bound."""
        g, n = self.g, self.names
        conds = [CONFIG_DIM_TEST.format(cdims=n("cdims"), i=i, dim=self.dim[s])
                 for i, s in enumerate(self.spec.symbols) if s not in self.spec.config_only]
        if conds:
            g.emit(f"if {self.cfg} is not None:")
            g.indent += 1
            for cond in conds:
                g.reject_if([cond])
            g.indent -= 1

    def shape_checks(self, tp: TensorNode) -> None:
        conds = []
        shape = self.shape[tp.name]
        if tp.name in self.unpacked:
            return
        if tp.name in self.whole:
            dims = ", ".join(d.render(self.dim) for d in tp.dims if isinstance(d, Expr))
            self.g.reject_if([f"{shape} != ({dims}{',' if tp.rank == 1 else ''})"])
            return
        for axis, d in tp.fixed_axes():
            if d is ANY or (tp.name, axis) in self.solved_axes:
                continue
            if isinstance(d, Sym) and d.name not in self.spec.scalar_sources:
                first = self.spec.sources.get(d.name, ())[:1]
                if first and first[0].param == tp.name and first[0].axis == axis:
                    continue  # this axis is the binder itself
            expr = d.dim if isinstance(d, Broadcast) else d
            if tp.optional and isinstance(expr, Sym) and expr.name in self.weak:  # nothing bound it yet: this does
                size = f"{shape}[{axis}]"
                self.g.emit(f"if {self.dim[expr.name]} is None" + (f" and {size} != 1" if expr is not d else "") + ":",
                            f"    {self.dim[expr.name]} = {size}")
            if isinstance(d, Broadcast):
                conds.append(guard(f"({shape}[{axis}] != 1 and {shape}[{axis}] != {d.dim.render(self.dim)})",
                                   d.dim, self.weak, self.dim))
            elif isinstance(d, Expr):
                conds.append(guard(f"{shape}[{axis}] != {d.render(self.dim)}", d, self.weak, self.dim))
        v, vi = tp.variadic, tp.variadic_index
        if v is not None and v.name is not None and vi is not None:
            srcs = self.spec.variadic_sources.get(v.key, ())
            axes = VARIADIC_AXES.format(shape=shape, start=vi, after=len(tp.dims) - 1 - vi)
            if tp.optional:  # required ones were all decided when the dim was bound
                if v.key not in self.merged_variadics:  # (else this occurrence was merged into the binding)
                    conds.append(f"not {self.g.const(fits_variadic)}({axes}, {v.broadcast}, {self.dim[v.key]})")
            elif not any(src.broadcast for src in srcs) and srcs[0].param != tp.name:  # not the binder
                conds.append(f"{axes} != {self.dim[v.key]}")
        self.g.reject_if(conds)

    def tensor_checks(self, tp: TensorNode) -> None:
        g, n = self.g, self.names
        i = list(self.arg).index(tp.name)
        dtype, strides = n("dt", i), n("st", i)
        g.emit(READ_DTYPE, dtype=dtype, arg=self.arg[tp.name])
        self.dtypes_read.add(i)
        if any("strides" in r.needs for r in tp.rules):
            g.emit(READ_STRIDES, strides=strides, arg=self.arg[tp.name])
        for rule in tp.rules:
            source = rule.config_source()
            config_value = "None"
            if source is not None and source[0] == "dtype" and self.has_cfg:
                config_value = f"{n('cdtypes')}[{self.roles.index(source[1])}]"
            other, theirs = "None", rule.other_argument()
            if theirs is not None:
                oarg, oi = self.arg[theirs], list(self.arg).index(theirs)
                if self.spec.tensors[theirs].optional:
                    other = f"({oarg}.dtype if {oarg} is not None else None)"
                else:  # a required tensor's dtype is read before any optional one's; reuse it if so
                    other = n("dt", oi) if oi in self.dtypes_read else f"{oarg}.dtype"
            sizes = tuple(self.dim[d.name] for d in tp.dims if isinstance(d, Sym)) if tp.name in self.unpacked else None
            slots = g.slots(rule, value=self.arg[tp.name], shape=self.shape[tp.name], strides=strides, dtype=dtype,
                            device=n("dev"), config_value=config_value, other_dtype=other, sizes=sizes)
            g.reject_if([rule.test(slots)])

    def scalar_checks(self) -> None:
        g, n = self.g, self.names
        for sp in self.spec.scalars.values():
            for rule in sp.rules:
                if rule.config_source() is not None:  # a config attribute: read once per config (ConfigViews)
                    if not self.has_cfg:
                        continue
                    k = self.matches.index(sp.name)
                    slots = g.slots(rule, value=self.arg[sp.name], config_value=f"{n('cmatch')}[{k}]")
                    g.reject_if([f"({n('cmatch')} is not None and {rule.test(slots)})"])
                else:
                    bound = self.dim.get(sp.name, "None")  # (the dim an argument is named after)
                    g.reject_if([rule.test(g.slots(rule, value=self.arg[sp.name], bound=bound))])


def generate_checker(spec: ContractSpec) -> tuple[str, dict[str, Any], bool]:
    """Python source of ``check(<args by position>, <config>=None) -> tuple | None`` for ``spec``,
    its constants (the config views under ``names("views")`` are added by the caller), and whether
    it also checks the Python types (else the beartype shim must run first)."""
    return _Checker(spec).source()


def guard(cond: str, expr: Expr, weak: frozenset[str], dim: Mapping[str, str]) -> str:
    """``cond``, skipped while a dim it uses is bound to nothing."""
    unbound = sorted(expr.symbols() & weak)
    if not unbound:
        return cond
    return "(" + " and ".join(f"{dim[s]} is not None" for s in unbound) + f" and {cond})"


def rank_test(tp: TensorNode, shape: str) -> str:
    """True when a tensor has the wrong number of axes (with a variadic dim: too few)."""
    return (MIN_RANK_TEST if tp.variadic is not None else RANK_TEST).format(shape=shape, rank=tp.rank)


def checker_names(spec: ContractSpec) -> Names:
    return Names(checked_parameters(spec))


def checked_parameters(spec: ContractSpec) -> list[str]:
    """The parameters the checker takes, in signature order: ``*args``/``**kwargs`` only when annotated
    (as the tuple or dict they collect; unannotated ones pass through)."""
    return [p.name for p in spec.signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in spec.nested or p.name in spec.scalars]


def _result_rule_test(spec: ContractSpec, rule: Rule, g: Gen, t: str, shape: str, strides: str, args: str,
                      call_dev: str) -> str:
    """A result tensor's rule (the same objects an argument's rules are) as a test over the result
    and the call's checked arguments ``args`` (a caller that passes none skips what needs them:
    the call's device ``call_dev``, the dtype a ``same_dtype_as`` names)."""
    params = checked_parameters(spec)
    device, other, guards = "None", "None", []
    if "device" in rule.needs:
        device = call_dev
        guards.append(f"{call_dev} is not None")
    if (theirs := rule.other_argument()) is not None:
        j = params.index(theirs)
        other = f"({args}[{j}].dtype if len({args}) > {j} and {args}[{j}] is not None else None)"
    test = rule.test(g.slots(rule, value=t, shape=shape, strides=strides, dtype=f"{t}.dtype", device=device,
                             config_value="None", other_dtype=other))
    return f"({' and '.join([*guards, f'({test})'])})"


def generate_return_checker(spec: ContractSpec) -> tuple[str, dict[str, Any]]:
    """Python source of ``check_return(<result>, <dims tuple>, *<checked arguments>) -> bool``: True
    when the result meets the return annotation (the slow path words a failure). The arguments (in
    :func:`checked_parameters` order) give ``kc.Spec(same_dtype_as=...)`` its dtype; a caller that
    passes none skips that test."""
    assert spec.returns is not None
    n = Names(())
    g = Gen(n)
    res, dims, args = n("res"), n("dims"), n("args")
    params = checked_parameters(spec)
    dim = {s: n("d", i) for i, s in enumerate(spec.symbols)}
    weak = weak_symbols(spec)
    if spec.symbols:
        g.emit(f"{', '.join(dim.values())}, = {dims}")
    items = [res]
    if spec.returns_tuple:
        g.emit(f"if not isinstance({res}, tuple) or len({res}) != {len(spec.returns)}:", "    return False")
        items = [f"{res}[{i}]" for i in range(len(spec.returns))]
    tensor = g.const(torch.Tensor)
    env, env_made = n("env"), False
    call_dev = n("cdev")
    if any("device" in r.needs for tp in spec.returns for r in tp.rules):
        if spec.first_tensor is not None:  # (the first tensor argument's device, read directly)
            k = params.index(spec.first_tensor)
            g.emit(f"{call_dev} = {args}[{k}].device if len({args}) > {k} else None")
        else:
            values = f"dict(zip({g.const(tuple(params))}, {args})) if {args} else None"
            g.emit(f"{call_dev} = {g.const(call_device)}({g.const(spec)}, {values})")
    for i, (tp, item) in enumerate(zip(spec.returns, items, strict=True)):
        t, s = n("r", i), n("s", i)
        g.emit(f"{t} = {item}")
        if tp.optional:
            g.emit(f"if {t} is not None:")
            g.indent += 1
        g.emit(f"if not isinstance({t}, {tensor}):", "    return False")
        g.emit(READ_SHAPE, shape=s, arg=t)
        conds = [rank_test(tp, s)]
        if set(weak) & {x for d in tp.dims for x in dim_symbols(d)}:
            # a dim that may be bound to nothing: the result binds it, as an argument would
            if not env_made:
                values = f"dict(zip({g.const(tuple(params))}, {args})) if {args} else None"
                g.emit(f"{env} = {g.const(result_env)}({g.const(spec)}, {dims}, {values})")
                env_made = True
            conds.append(f"{g.const(match_dims)}({g.const(tp.dims)}, tuple({s}), {env}) is not None")
        else:
            for axis, d in tp.fixed_axes():
                if isinstance(d, Broadcast):
                    conds.append(f"({s}[{axis}] != 1 and {s}[{axis}] != {d.dim.render(dim)})")
                elif isinstance(d, Expr):
                    conds.append(f"{s}[{axis}] != {d.render(dim)}")
            v, vi = tp.variadic, tp.variadic_index
            if v is not None and v.name is not None and vi is not None:
                axes = VARIADIC_AXES.format(shape=s, start=vi, after=len(tp.dims) - 1 - vi)
                conds.append(f"not {g.const(fits_variadic)}({axes}, {v.broadcast}, {dim[v.key]})")
        if any("strides" in r.needs for r in tp.rules):
            g.emit(READ_STRIDES, strides=n("st", i), arg=t)
        conds += [_result_rule_test(spec, rule, g, t, s, n("st", i), args, call_dev) for rule in tp.rules]
        g.emit("if " + " or ".join(conds) + ":", "    return False")
        if tp.optional:
            g.indent -= 1
    g.emit("return True")
    src = (f"def check_return({res}, {dims}, *{args}):\n    try:\n" + "\n".join("    " + ln for ln in g.lines)
           + "\n    except Exception:  # the slow path words it\n        return False\n")
    return src, g.consts
