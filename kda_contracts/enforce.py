"""Enforcement: one generated, straight-line checker per contract, and the ``@kc.contract`` wrapper.

The happy path (principle 3 of DESIGN.md) is generated Python source: attribute reads, integer
compares and set lookups, no loops, no dict of dims, no message building. It returns the bound
dims as a tuple, or ``None`` at the first failed test; only then does the slow path
(``ContractSpec.explain``) run to collect every violation with provenance and hints.

beartype checks the non-tensor parameters and the Tensor-ness of tensor parameters through a
shim function carrying the stripped annotations (principle 4).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

import torch
from beartype import BeartypeConf, beartype
from beartype.door import is_bearable
from beartype.roar import BeartypeCallHintParamViolation

from . import modes
from .contract import (
    CONFIG_LACKS,
    CallContext,
    ContractSpec,
    Dims,
    TensorParam,
    Where,
    blocks_disjoint,
    build_spec,
    config_dims,
    dtype_name,
    split_optional,
)
from .dims import ANY, Expr, Sym
from .errors import (
    ArgumentTypeError,
    ContractError,
    DtypeError,
    ShapeError,
    Violation,
    passthrough_for_compile,
    raise_violations,
)

__all__ = ["Contract", "contract", "register_contract", "registered_contracts"]

F = TypeVar("F", bound=Callable[..., Any])

_BEARTYPE_CONF = BeartypeConf(is_pep484_tower=True)  # a float parameter accepts an int
_REGISTRY: dict[str, Contract] = {}
_ids = itertools.count()


def registered_contracts() -> dict[str, Contract]:
    """Every contract created with ``register=True`` (the default), by name (for docs, CLIs and
    the pytest plugin's summary)."""
    return dict(_REGISTRY)


def register_contract(key: str, c: Contract) -> Contract:
    """Add a contract built without the decorator to :func:`registered_contracts`."""
    _REGISTRY[key] = c
    return c


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


def _generate_checker(spec: ContractSpec) -> tuple[str, dict[str, Any], bool]:
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


def _strip_for_beartype(spec: ContractSpec) -> dict[str, Any]:
    ann: dict[str, Any] = {}
    for name, tp in spec.tensors.items():
        ann[name] = torch.Tensor | None if tp.optional else torch.Tensor
    for name, sp in spec.scalars.items():
        ann[name] = sp.hint
    return ann


class Contract:
    """A compiled contract: its spec, generated checker, and the ways to run it.

    Usually made by :func:`contract`; ``fn.__kda_contract__`` holds it on the decorated function.

    Example::

        c = kc.contract(my_kernel_wrapper).__kda_contract__
        dims = c.validate(*args)         # raises a ContractError listing every violation
    """

    def __init__(self, spec: ContractSpec, fn: Callable[..., Any]) -> None:
        self.spec = spec
        self.fn = fn
        self.name = spec.name
        params = [p for p in spec.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self._param_names = [p.name for p in params]
        src, consts, self.types_in_checker = _generate_checker(spec)
        self.checker_source = src
        namespace: dict[str, Any] = dict(consts)
        namespace["_views"] = ConfigViews(spec)
        code = compile(src, f"<kda_contracts checker for {spec.name}>", "exec")
        exec(code, namespace)  # our own generated source, built from the parsed tree only
        self.check: Callable[..., tuple[int, ...] | None] = namespace["check"]
        shim_src = f"def types({', '.join(self._param_names)}):\n    return None\n"
        shim_ns: dict[str, Any] = {}
        exec(compile(shim_src, f"<kda_contracts type shim for {spec.name}>", "exec"), shim_ns)
        shim = shim_ns["types"]
        shim.__annotations__ = _strip_for_beartype(spec)
        shim.__qualname__ = spec.name  # beartype names the shim in its own messages
        self._type_annotations = shim.__annotations__
        self.check_types: Callable[..., None] = beartype(conf=_BEARTYPE_CONF)(shim)
        self._provenance: dict[bool, dict[str, str]] = {}
        # Usage counters (for the pytest plugin's summary): checked calls and rejected calls.
        self.calls = 0
        self.rejections = 0

    # -- the slow paths ----------------------------------------------------------------------
    def _bind_values(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        ba = self.spec.signature.bind(*args, **kwargs)
        ba.apply_defaults()
        return dict(ba.arguments)

    def type_violations(self, values: Mapping[str, Any]) -> list[Violation]:
        out = []
        for name, hint in self._type_annotations.items():
            v = values.get(name)
            if not is_bearable(v, hint, conf=_BEARTYPE_CONF):
                expected = getattr(hint, "__name__", None) or str(hint).replace("torch.", "")
                if name in self.spec.tensors:
                    expected = f"a torch.Tensor shaped {self.spec.tensors[name].symbolic()}"
                    if self.spec.tensors[name].optional:
                        expected += " or None"
                out.append(Violation(ArgumentTypeError, name, expected, f"{type(v).__name__}"))
        return out

    def fail(self, values: Mapping[str, Any], config: Any) -> None:
        """Raise the full report for a call the fast path rejected."""
        tv = self.type_violations(values)
        if tv:
            self.rejections += 1
            raise_violations(self.name, tv, {}, {})
        dims, prov, violations = self.spec.explain(values, config)
        if violations:
            self.rejections += 1
            raise_violations(self.name, violations, dims, prov)
        # The generated checker and the interpreter disagree: trust the interpreter, but say so.
        warnings.warn(f"kda_contracts: the fast checker of {self.name} rejected a call the full check accepts; "
                      "please report this with the call's shapes", RuntimeWarning, stacklevel=3)

    def provenance(self, config: Any) -> dict[str, str]:
        key = config is not None
        if key:
            return self.spec.provenance(config)
        cached = self._provenance.get(key)
        if cached is None:
            cached = self._provenance[key] = self.spec.provenance(None)
        return cached

    # -- public ------------------------------------------------------------------------------
    def validate(self, *args: Any, _config: Any = None, **kwargs: Any) -> Dims:
        """Check a call's arguments (whatever the mode) and return its bound :class:`Dims`."""
        values = self._bind_values(args, kwargs)
        config = _config if _config is not None else self._config_for(values)
        return self.validate_values(values, config)

    def enforce(self, vals: Sequence[Any], config: Any, mode: int = modes.CHECK) -> tuple[int, ...]:
        """Run the checks of ``mode`` on arguments given positionally (every checked parameter, in
        signature order); return the bound dims in ``spec.symbols`` order or raise."""
        self.calls += 1
        try:
            if not self.types_in_checker:
                self.check_types(*vals)
            dims = self.check(*vals, _cfg=config)
        except BeartypeCallHintParamViolation:
            dims = None
        if dims is None:
            values = dict(zip(self._param_names, vals, strict=True))
            self.fail(values, config)
            env, _, _ = self.spec.explain(values, config)
            dims = tuple(env[s] for s in self.spec.symbols)
        if mode == modes.STRICT and self.spec.value_checks is not None:
            env = dict(zip(self.spec.symbols, dims, strict=True))
            self.run_value_checks(dict(zip(self._param_names, vals, strict=True)), config, env,
                                  self.provenance(config))
        return dims

    def validate_values(self, values: Mapping[str, Any], config: Any = None, *, strict: bool = False) -> Dims:
        """Check arguments given by name; ``strict`` adds the contract's value checks."""
        vals = tuple(values.get(n) for n in self._param_names)
        dims = self.enforce(vals, config, modes.STRICT if strict else modes.CHECK)
        return Dims(dict(zip(self.spec.symbols, dims, strict=True)), self.provenance(config))

    def run_value_checks(self, values: Mapping[str, Any], config: Any, dims: dict[str, int],
                         prov: dict[str, str]) -> None:
        """Strict mode: the contract's value checks (after a clean metadata check)."""
        if self.spec.value_checks is None:
            return
        ctx = CallContext(self.spec, values, config, dims, prov)
        violations = self.spec.value_checks(ctx)
        if violations:
            self.rejections += 1
            raise_violations(self.name, violations, dims, prov)

    def wrap(self, fixed_mode: int | None = None) -> Callable[..., Any]:
        """A function with ``fn``'s signature that enforces this contract, then calls ``fn``."""
        return _build_wrapper(self, fixed_mode)

    def explain(self, *args: Any, **kwargs: Any) -> tuple[Dims, list[Violation]]:
        """Every violation of a call (empty when it is valid), without raising."""
        values = self._bind_values(args, kwargs)
        tv = self.type_violations(values)
        if tv:
            return Dims({}, {}), tv
        d, prov, violations = self.spec.explain(values, self._config_for(values))
        return Dims(d, prov), violations

    def _config_for(self, values: Mapping[str, Any]) -> Any:
        if self.spec.config_arg is not None:
            return values.get(self.spec.config_arg)
        return self.spec.config

    def check_return(self, result: Any, dims: tuple[int, ...]) -> None:
        spec = self.spec
        assert spec.returns is not None
        items = result if spec.returns_tuple else (result,)
        env = dict(zip(spec.symbols, dims, strict=True))
        violations: list[Violation] = []
        if spec.returns_tuple and (not isinstance(items, tuple) or len(items) != len(spec.returns)):
            violations.append(Violation(ShapeError, "return", f"a tuple of {len(spec.returns)} tensors",
                                        type(result).__name__))
        else:
            for tp, t in zip(spec.returns, items, strict=True):
                if not isinstance(t, torch.Tensor):
                    if tp.optional and t is None:
                        continue
                    violations.append(Violation(ArgumentTypeError, tp.name, "a torch.Tensor", type(t).__name__))
                    continue
                want = tuple(None if d is ANY else d.evaluate(env) for d in tp.dims)  # type: ignore[union-attr]
                got = tuple(t.shape)
                if len(got) != len(want) or any(w is not None and w != s for w, s in zip(want, got, strict=False)):
                    conc = "[" + ", ".join("_" if w is None else str(w) for w in want) + "]"
                    violations.append(Violation(ShapeError, tp.name, f"{tp.symbolic()} = {conc}",
                                                "[" + ", ".join(map(str, got)) + "]",
                                                ("the function returned a tensor of the wrong shape",)))
                elif t.dtype not in tp.dtypes:
                    allowed = " or ".join(sorted(dtype_name(d) for d in tp.dtypes))
                    violations.append(Violation(DtypeError, tp.name, allowed, dtype_name(t.dtype)))
        if violations:
            raise_violations(self.name, violations, env, self.provenance(None))


def _wrapper_source(spec: ContractSpec, fn_name: str, has_return: bool, value_checks: bool,
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


def _outside_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` so that torch.compile runs it in plain Python on the real arguments at trace
    time instead of tracing it (beartype's wrapper, the report builder, strict value checks).
    The generated shape checker itself *is* traced: its compares become guards. No eager cost:
    the marker is an attribute on the same function object."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContractError as err:
            if torch.compiler.is_compiling():
                raise passthrough_for_compile(err) from None
            raise

    return modes.mark_constant_result(run)


def _build_wrapper(c: Contract, fixed_mode: int | None) -> Callable[..., Any]:
    spec = c.spec
    names = c._param_names

    def as_values(*vals: Any) -> dict[str, Any]:
        return dict(zip(names, vals, strict=True))

    def fail(*vals: Any) -> None:
        values = as_values(*vals)
        c.fail(values, c._config_for(values))

    def fail_types(*vals: Any) -> None:
        values = as_values(*vals)
        c.rejections += 1
        raise_violations(c.name, c.type_violations(values), {}, {})

    def strict(dims: tuple[int, ...], *vals: Any) -> None:
        values = as_values(*vals)
        config = c._config_for(values)
        c.run_value_checks(values, config, dict(zip(spec.symbols, dims, strict=True)), c.provenance(config))

    ns: dict[str, Any] = {
        "_current_mode": modes.current_mode,
        "_fixed_mode": fixed_mode,
        "_types": modes.mark_constant_result(c.check_types),
        "_TypeViolation": BeartypeCallHintParamViolation,
        "_fail_types": _outside_compile(fail_types),
        "_check": c.check,
        "_fail": _outside_compile(fail),
        "_strict": _outside_compile(strict),
        "_fn": c.fn,
        "_check_return": c.check_return,
        "_static_cfg": spec.config,
        "_self": c,
    }
    for i, p in enumerate(spec.signature.parameters.values()):
        if p.default is not inspect.Parameter.empty:
            ns[f"_dflt{i}"] = p.default
    fn_name = getattr(c.fn, "__name__", "wrapper")
    if not fn_name.isidentifier():
        fn_name = "wrapper"
    src = _wrapper_source(spec, fn_name, spec.returns is not None, spec.value_checks is not None,
                          not c.types_in_checker)
    exec(compile(src, f"<kda_contracts wrapper for {spec.name} #{next(_ids)}>", "exec"), ns)
    wrapper = ns[fn_name]
    functools.update_wrapper(wrapper, c.fn)
    wrapper.__kda_contract__ = c  # type: ignore[attr-defined]
    wrapper.__wrapped__ = c.fn  # type: ignore[attr-defined]
    return wrapper


@overload
def contract(fn: F, /) -> F: ...
@overload
def contract(
    *,
    config: Any = None,
    config_arg: str | None = None,
    where: Iterable[str | Where] = (),
    bind_first: Sequence[str] = (),
    hints: Sequence[Callable[[Violation, CallContext], str | None]] = (),
    value_checks: Callable[[CallContext], list[Violation]] | None = None,
    mode: modes.ModeName | None = None,
    name: str | None = None,
    register: bool = True,
) -> Callable[[F], F]: ...
def contract(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    config: Any = None,
    config_arg: str | None = None,
    where: Iterable[str | Where] = (),
    bind_first: Sequence[str] = (),
    hints: Sequence[Callable[[Violation, CallContext], str | None]] = (),
    value_checks: Callable[[CallContext], list[Violation]] | None = None,
    mode: modes.ModeName | None = None,
    name: str | None = None,
    register: bool = True,
) -> Any:
    """Enforce a function's jaxtyping annotations (plus ``kc.Spec``/``kc.Range``/``where``) per call.

    - ``config``: a ``KDAConfig`` (or any object with ``contract_dims()``, or a pydantic model)
      whose dims every call must agree with; ``config_arg`` instead names a parameter carrying one.
    - ``where``: cross-argument constraints, e.g. ``["HV % H == 0"]``.
    - ``bind_first``: tensors to bind dims from before the others (affects provenance only).
    - ``hints``: callables ``(violation, ctx) -> str | None`` giving a fix for known mistakes.
    - ``value_checks``: callable ``ctx -> [Violation]`` run in strict mode only.
    - ``mode``: pin this contract's mode (``"off"`` returns ``fn`` itself); None follows
      ``kc.mode``/``KDA_CONTRACTS_MODE``. If the mode in force at decoration is ``off``, ``fn`` is
      returned unchanged: a true zero-cost switch.

    Example::

        @kc.contract(config=cfg, where=["HV % H == 0"])
        def forward(x: Float[Tensor, "B D"], state: Float[Tensor, "N HV V K"]) -> Float[Tensor, "B HV*V"]:
            ...
    """
    if fn is None:
        return functools.partial(
            contract, config=config, config_arg=config_arg, where=tuple(where), bind_first=tuple(bind_first),
            hints=tuple(hints), value_checks=value_checks, mode=mode, name=name, register=register,
        )
    fixed = modes.parse_mode(mode, f"contract(mode={mode!r})") if mode is not None else None
    spec = build_spec(fn, name=name, config=config, config_arg=config_arg, where=where, bind_first=bind_first,
                      hints=hints, value_checks=value_checks)
    if (fixed if fixed is not None else modes.current_mode()) == modes.OFF:
        return fn
    c = Contract(spec, fn)
    if register:
        _REGISTRY[c.name] = c
    return c.wrap(fixed)
