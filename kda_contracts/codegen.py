"""Code generation: one straight-line checker per contract, and the wrapper that runs it.

The happy path (principle 4 of DESIGN.md) is generated Python source: attribute reads, integer
compares and set lookups, no loops, no dict of dims, no message building. It returns the bound
dims as a tuple, or ``None`` at the first failed test; only then does the slow path
(``explain``) run to collect every violation with provenance and hints.

Example::

    src, consts, types_checked = generate_checker(spec)
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .dims import ANY, Expr, Sym
from .explain import blocks_disjoint
from .markers import CONFIG_LACKS, config_dims
from .spec import ContractSpec, TensorParam, split_optional

__all__ = ["ConfigViews", "generate_checker", "wrapper_source"]


def config_view_layout(spec: ContractSpec) -> tuple[list[str], list[str]]:
    """The dtype roles and the MatchConfig scalars of a contract, in view order."""
    roles = sorted({tp.spec.config_dtype for tp in spec.tensors.values() if tp.spec.config_dtype is not None})
    matches = [sp.name for sp in spec.scalars.values() if sp.match is not None]
    return roles, matches


def _same(obj: Any) -> Any:
    return obj


class ConfigViews:
    """What each config object fixes for one contract, flattened once per config object:
    ``(reference to the config, dims aligned with spec.symbols, dtypes aligned with the roles,
    match values)``.

    Keyed by ``id``; the entry holds a weak reference to its config (a strong one only for
    objects that refuse weak references), so a recycled id is detected and a cached view never
    keeps a model layer alive. Bounded.
    """

    MAX = 64

    def __init__(self, spec: ContractSpec) -> None:
        self.spec = spec
        self.roles, self.matches = config_view_layout(spec)
        self._views: dict[int, tuple[Any, ...]] = {}

    def get(self, key: int) -> tuple[Any, ...] | None:
        return self._views.get(key)

    def make(self, cfg: Any) -> tuple[Any, ...]:
        dims = config_dims(cfg)
        dts = _config_dtypes(cfg) or {}
        try:
            ref: Callable[[], Any] = weakref.ref(cfg)
        except TypeError:  # no __weakref__ slot
            ref = functools.partial(_same, cfg)
        view = (
            ref,
            tuple(dims.get(s) for s in self.spec.symbols),
            tuple(dts.get(r) for r in self.roles),
            tuple(getattr(cfg, self.spec.scalars[n].match.attr, CONFIG_LACKS)  # type: ignore[union-attr]
                  for n in self.matches),
        )
        if len(self._views) >= self.MAX:
            self._views.clear()
        self._views[id(cfg)] = view
        return view


class _Gen:
    """Accumulates the lines of the generated checker."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self.indent = 1

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def const(self, value: Any, prefix: str = "_k") -> str:
        for k, v in self.consts.items():
            if v is value:
                return k
        name = f"{prefix}{len(self.consts)}"
        self.consts[name] = value
        return name


def _var(sym: str) -> str:
    return f"d_{sym}"


_SIMPLE_TYPES: dict[Any, tuple[type, ...]] = {
    # beartype's verdict for these hints, as isinstance (BeartypeConf(is_pep484_tower=True): a
    # float parameter accepts an int; bool is an int)
    float: (int, float),
    int: (int,),
    bool: (bool,),
    torch.Tensor: (torch.Tensor,),
}


def _type_guards(spec: ContractSpec, g: _Gen) -> list[str] | None:
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
        k = g.const(types, "_ty")
        guards.append(f"({name} is not None and not isinstance({name}, {k}))" if optional
                      else f"not isinstance({name}, {k})")
    return guards


def generate_checker(spec: ContractSpec) -> tuple[str, dict[str, Any], bool]:
    """Python source of ``check(<params>, _cfg) -> tuple | None`` for ``spec``, its constants,
    and whether it also checks the Python types (else the beartype shim must run first)."""
    g = _Gen()
    guards = _type_guards(spec, g)
    if guards:
        g.emit("if " + " or ".join(guards) + ":")
        g.emit("    return None")
    names = {s: _var(s) for s in spec.symbols}
    dtype_roles, match_params = config_view_layout(spec)
    bound: set[str] = set()
    params = [p for p in spec.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    args = ", ".join(p.name for p in params)
    required = [tp for tp in spec.tensors.values() if not tp.optional]
    optional = [tp for tp in spec.tensors.values() if tp.optional]

    for tp in spec.tensors.values():
        if tp.optional:
            continue
        g.emit(f"s_{tp.name} = {tp.name}.shape")
    if required:
        g.emit("if " + " or ".join(f"len(s_{tp.name}) != {tp.rank}" for tp in required) + ":")
        g.emit("    return None")
    # Bind: scalars, then tensor axes (same priority as the slow path), then solvers.
    for sym, pname in spec.scalar_sources.items():
        g.emit(f"{names[sym]} = {pname}")
        bound.add(sym)
    for sym, srcs in spec.sources.items():
        if sym in bound:
            continue
        first = srcs[0]
        g.emit(f"{names[sym]} = s_{first.param}[{first.axis}]")
        bound.add(sym)
    solved_axes: set[tuple[str, int]] = set()
    for solver in spec.solvers:
        g.emit(f"_c = {solver.coef.render(names)}")
        g.emit(f"_r = s_{solver.param}[{solver.axis}] - ({solver.const.render(names)})")
        g.emit("if _c <= 0 or _r % _c or _r < _c:")
        g.emit("    return None")
        g.emit(f"{names[solver.symbol]} = _r // _c")
        bound.add(solver.symbol)
        solved_axes.add((solver.param, solver.axis))
    # Config agreement: every dim the config fixes must equal what the tensors bound. What a
    # config fixes is read once per config object into a flat "view" (see ConfigViews).
    has_cfg = spec.config is not None or spec.config_arg is not None
    if has_cfg:
        g.emit("if _cfg is not None:")
        g.indent += 1
        g.emit("_v = _views.get(id(_cfg))")
        g.emit("if _v is None or _v[0]() is not _cfg:")
        g.emit("    _v = _views.make(_cfg)")
        g.emit("_cd, _cdt, _cm = _v[1], _v[2], _v[3]")
        for i, s in enumerate(spec.symbols):
            g.emit(f"if _cd[{i}] is not None and _cd[{i}] != {names[s]}:")
            g.emit("    return None")
        g.indent -= 1
        g.emit("else:")
        g.emit("    _cdt = _cm = None")

    def shape_checks(tp: TensorParam, shape_var: str) -> None:
        conds = []
        for axis, d in enumerate(tp.dims):
            if d is ANY or (tp.name, axis) in solved_axes:
                continue
            assert isinstance(d, Expr)
            if isinstance(d, Sym) and any(src.param == tp.name and src.axis == axis
                                          for src in spec.sources.get(d.name, ())[:1]) \
                    and d.name not in spec.scalar_sources:
                continue  # this axis is the binder itself
            conds.append(f"{shape_var}[{axis}] != {d.render(names)}")
        if conds:
            g.emit("if " + " or ".join(conds) + ":")
            g.emit("    return None")

    for tp in required:
        shape_checks(tp, f"s_{tp.name}")
    for c, _w in spec.where:
        g.emit(f"if not ({c.render(names)}):")
        g.emit("    return None")

    dtype_read: set[str] = set()  # tensors whose dtype is already in a local

    def dtype_of(t: str) -> str:
        return f"dt_{t}" if t in dtype_read else f"{t}.dtype"

    def tensor_checks(tp: TensorParam) -> None:
        t = tp.name
        dts = g.const(tp.dtypes, "_dt")
        g.emit(f"dt_{t} = {t}.dtype")
        dtype_read.add(t)
        g.emit(f"if dt_{t} not in {dts}:")
        g.emit("    return None")
        if tp.spec.config_dtype is not None and has_cfg:
            j = dtype_roles.index(tp.spec.config_dtype)
            g.emit(f"if _cdt is not None and _cdt[{j}] is not None and dt_{t} != _cdt[{j}]:")
            g.emit("    return None")
        if tp.spec.same_dtype_as is not None:
            other = tp.spec.same_dtype_as
            if spec.tensors[other].optional:
                g.emit(f"if {other} is not None and dt_{t} != {other}.dtype:")
            else:
                g.emit(f"if dt_{t} != {dtype_of(other)}:")
            g.emit("    return None")
        if tp.spec.same_device and spec.first_tensor is not None and t != spec.first_tensor:
            g.emit(f"if {t}.device != _dev:")
            g.emit("    return None")
        n, r = tp.spec.inner_contiguous, tp.rank
        if tp.spec.contiguous:
            g.emit(f"if not {t}.is_contiguous():")
            g.emit("    return None")
        elif n:
            # Dense row-major strides of the inner block; a size-0 dim counts as 1 (as in the
            # interpreter's dense_strides), a size-1 dim may have any stride.
            g.emit(f"_st = {t}.stride()")
            conds = [f"(s_{t}[{r - 1}] != 1 and _st[{r - 1}] != 1)"]
            for axis in range(r - 2, r - 1 - n, -1):
                g.emit(f"_e{axis} = {'' if axis == r - 2 else f'_e{axis + 1}*'}(s_{t}[{axis + 1}] or 1)")
                conds.append(f"(s_{t}[{axis}] != 1 and _st[{axis}] != _e{axis})")
            g.emit("if " + " or ".join(conds) + ":")
            g.emit("    return None")
        if tp.spec.disjoint and not tp.spec.contiguous:
            if not n:
                g.emit(f"_st = {t}.stride()")
            if r - n == 1:  # one outer axis (a pool of slots): its stride must step over a whole block
                block = (f"_e1*(s_{t}[1] or 1)" if n >= 2 else
                         "*".join(f"(s_{t}[{axis}] or 1)" for axis in range(1, r)) or "1")
                g.emit(f"if s_{t}[0] > 1 and _st[0] < {block}:")
                g.emit("    return None")
            elif r - n > 1:
                g.emit(f"if not {g.const(blocks_disjoint, '_disjoint')}(s_{t}, _st, {n}):")
                g.emit("    return None")

    if spec.first_tensor is not None:
        g.emit(f"_dev = {spec.first_tensor}.device")
    for tp in required:
        tensor_checks(tp)
    for tp in optional:
        g.emit(f"if {tp.name} is not None:")
        g.indent += 1
        g.emit(f"s_{tp.name} = {tp.name}.shape")
        g.emit(f"if len(s_{tp.name}) != {tp.rank}:")
        g.emit("    return None")
        shape_checks(tp, f"s_{tp.name}")
        tensor_checks(tp)
        g.indent -= 1
    for sp in spec.scalars.values():
        if sp.range is not None:
            cond = f"not ({sp.range.render(sp.name)})"
            if sp.optional:
                cond = f"{sp.name} is not None and {cond}"
            g.emit(f"if {cond}:")
            g.emit("    return None")
        if sp.match is not None and has_cfg:
            m = g.const(sp.match, "_match")
            k = match_params.index(sp.name)
            g.emit(f"if _cm is not None and not {m}.agrees_value({sp.name}, _cm[{k}]):")
            g.emit("    return None")
    g.emit("return (" + "".join(f"{names[s]}, " for s in spec.symbols) + ")")
    body = "\n".join(g.lines)
    src = (f"def check({args}{', ' if args else ''}_cfg=None):\n"
           f"    try:\n" + "\n".join("    " + ln for ln in body.splitlines()) + "\n"
           "    except ZeroDivisionError:\n"
           "        return None\n")
    return src, g.consts, guards is not None


def _config_dtypes(cfg: Any) -> Mapping[str, torch.dtype] | None:
    getter = getattr(cfg, "contract_dtypes", None)
    return getter() if getter is not None else None


def wrapper_source(spec: ContractSpec, fn_name: str, has_return: bool, value_checks: bool,
                    beartype_first: bool) -> str:
    """Source of a wrapper with ``fn``'s exact signature (so Python binds the arguments)."""
    sig = spec.signature
    parts: list[str] = []
    call: list[str] = []
    seen_kwonly = False
    seen_posonly = False
    for i, p in enumerate(sig.parameters.values()):
        default = f"=_dflt{i}" if p.default is not inspect.Parameter.empty else ""
        if p.kind is p.POSITIONAL_ONLY:
            seen_posonly = True
            parts.append(f"{p.name}{default}")
            call.append(p.name)
            continue
        if seen_posonly:
            parts.append("/")
            seen_posonly = False
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            parts.append(f"{p.name}{default}")
            call.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            call.append(f"*{p.name}")
            seen_kwonly = True
        elif p.kind is p.KEYWORD_ONLY:
            if not seen_kwonly:
                parts.append("*")
                seen_kwonly = True
            parts.append(f"{p.name}{default}")
            call.append(f"{p.name}={p.name}")
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            call.append(f"**{p.name}")
    if seen_posonly:
        parts.append("/")
    checked = [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    plain = ", ".join(checked)
    cfg = spec.config_arg if spec.config_arg is not None else "_static_cfg"
    lines = [
        f"def {fn_name}({', '.join(parts)}):",
        "    _m = _current_mode() if _fixed_mode is None else _fixed_mode",
        "    if _m:",
        "        _self.calls += 1",
    ]
    if beartype_first:  # hints the generated checker cannot decide with isinstance
        lines += [
            "        try:",
            f"            _types({plain})",
            "        except _TypeViolation:",
            f"            _fail_types({plain})",
        ]
    lines += [
        f"        _d = _check({plain}{', ' if plain else ''}_cfg={cfg})",
        "        if _d is None:",
        f"            _fail({plain})",
    ]
    if value_checks:
        lines += [
            "        if _m == 2:",
            f"            _strict(_d, {plain})",
        ]
    if has_return:
        lines += [
            f"        _res = _fn({', '.join(call)})",
            "        _check_return(_res, _d)",
            "        return _res",
        ]
    lines.append(f"    return _fn({', '.join(call)})")
    return "\n".join(lines) + "\n"
