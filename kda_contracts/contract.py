"""Contracts as data: read a function's annotations once into a :class:`ContractSpec`, plan how
every dim is bound, and (on the slow path only) explain a call that broke it.

How a parameter is declared::

    from typing import Annotated
    x: Float[Tensor, "B HV*K"]                                   # shape + dtype category
    x: Annotated[Float[Tensor, "B HV*K"], kc.Spec(inner_contiguous=1, dtypes=(torch.bfloat16,))]
    y: Float[Tensor, "B D"] | None                               # optional tensor
    scale: Annotated[float, kc.Range(gt=0)]                      # scalar with a range
    num_heads: int                                               # an int named like a dim binds it

and across arguments: ``@kc.contract(where=["HV % H == 0", "pow2(K)"])``.

Binding is order-independent (principle 2 of DESIGN.md): a config binds first, then int scalars,
then tensor axes whose dim is a plain name (in ``bind_first`` order, then argument order); a dim
that is a linear expression with one unknown (``2*H*K+HV*V``) solves that unknown with a
divisibility check. Everything else is a check against what is bound.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any

import torch

from .dims import ANY, Constraint, DimSpec, Expr, Sym, linear_form, parse_constraint, parse_shape
from .errors import (
    AnnotationError,
    ContractError,
    DeviceError,
    DtypeError,
    LayoutError,
    ShapeError,
    ValueRangeError,
    Violation,
)

__all__ = ["ContractSpec", "Dims", "MatchConfig", "Range", "Spec", "Where", "build_spec"]

_TORCH_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    name: dt for name in dir(torch) if isinstance(dt := getattr(torch, name, None), torch.dtype)
}


# -- what users write next to an annotation ------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """Rules for one tensor beyond its shape, given as ``Annotated[Float[Tensor, ...], kc.Spec(...)]``.

    - ``dtypes``: the allowed dtypes (narrows the jaxtyping category, e.g. ``Float``).
    - ``contiguous``: the whole tensor must be contiguous.
    - ``inner_contiguous``: the last *n* dims must form one dense row-major block (``1``: the last
      dim has stride 1; ``3`` on a ``[N, HV, V, K]`` pool: each slot is dense, the pool stride is free).
    - ``same_dtype_as``: name of another tensor argument whose dtype this one must equal.
    - ``config_dtype``: a role (``"state"``, ``"activation"``, ``"index"``) whose dtype the config
      may pin (see ``KDAConfig.contract_dtypes``).
    - ``same_device``: must share the device of the call's first tensor (default True).
    - ``disjoint``: the tensor is written in place, so its dense inner blocks must not share
      memory (with ``inner_contiguous=3`` on a pool: ``stride(0) >= HV*V*K`` unless N == 1; an
      ``.expand()``ed pool is rejected).

    Example::

        state: Annotated[Float[Tensor, "N HV V K"], kc.Spec(inner_contiguous=3, config_dtype="state")]
    """

    dtypes: tuple[torch.dtype, ...] | None = None
    contiguous: bool = False
    inner_contiguous: int = 0
    same_dtype_as: str | None = None
    config_dtype: str | None = None
    same_device: bool = True
    disjoint: bool = False


@dataclass(frozen=True)
class Range:
    """Bounds for a scalar: ``Annotated[float, kc.Range(gt=0)]``. NaN is always out of range.

    Example::

        lower_bound: Annotated[float | None, kc.Range(lt=0)] = None   # None skips the check
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def holds(self, x: float) -> bool:
        return (
            x == x  # NaN fails every bound
            and (self.gt is None or x > self.gt)
            and (self.ge is None or x >= self.ge)
            and (self.lt is None or x < self.lt)
            and (self.le is None or x <= self.le)
        )

    def describe(self) -> str:
        parts = [f"{op} {v}" for op, v in (("> ", self.gt), (">=", self.ge), ("< ", self.lt), ("<=", self.le))
                 if v is not None]
        return " and ".join(p.replace("  ", " ") for p in parts) or "any number"

    def render(self, var: str) -> str:
        """Python source that is True when ``var`` is in range."""
        terms = [f"{var} == {var}"]
        for op, v in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le)):
            if v is not None:  # repr(inf) is not Python source
                terms.append(f"{var} {op} {v!r}" if math.isfinite(v) else f"{var} {op} float({str(v)!r})")
        return " and ".join(terms)

    def malformed(self) -> str | None:
        """Why no value can satisfy this range (a NaN bound, bounds that exclude each other)."""
        bounds = [v for v in (self.gt, self.ge, self.lt, self.le) if v is not None]
        if any(v != v for v in bounds):
            return "a bound is NaN"
        lows = [(v, True) for v in (self.gt,) if v is not None] + [(v, False) for v in (self.ge,) if v is not None]
        highs = [(v, True) for v in (self.lt,) if v is not None] + [(v, False) for v in (self.le,) if v is not None]
        for lo, lo_strict in lows:
            for hi, hi_strict in highs:
                if lo > hi or (lo == hi and (lo_strict or hi_strict)):
                    return f"no number is {self.describe()}"
        return None


class _ConfigLacks:
    """What a config without a MatchConfig attribute gives for it (the scalar is then free)."""

    def __repr__(self) -> str:
        return "CONFIG_LACKS"


CONFIG_LACKS = _ConfigLacks()


@dataclass(frozen=True)
class MatchConfig:
    """A scalar that must equal a config attribute when the call has a config:
    ``Annotated[float, kc.MatchConfig("scale", rel_tol=1e-6)]``. Without a config, or with a
    config that has no such attribute (a plain pydantic model of dims), it is free.

    Example::

        lower_bound: Annotated[float | None, kc.Range(lt=0), kc.MatchConfig("effective_lower_bound")] = None
    """

    attr: str
    rel_tol: float = 0.0

    def agrees(self, value: Any, config: Any) -> bool:
        return self.agrees_value(value, getattr(config, self.attr, CONFIG_LACKS))

    def agrees_value(self, value: Any, want: Any) -> bool:
        if want is CONFIG_LACKS:
            return True
        if value is None or want is None:
            return value is None and want is None
        if isinstance(value, (int, float)) and isinstance(want, (int, float)):
            return math.isclose(value, want, rel_tol=self.rel_tol, abs_tol=0.0)
        return bool(value == want)


@dataclass(frozen=True)
class Where:
    """A cross-argument constraint on dims, ``kc.Where("HV % H == 0", hint="...")``; a plain
    string in ``where=[...]`` is the same without a hint."""

    expr: str
    hint: str | None = None
    kind: type[ContractError] = ShapeError


# -- the parsed contract -------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorParam:
    name: str
    dim_str: str
    dims: tuple[DimSpec, ...]
    dtypes: frozenset[torch.dtype]
    spec: Spec
    optional: bool

    @property
    def rank(self) -> int:
        return len(self.dims)

    def symbolic(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class ScalarParam:
    name: str
    hint: Any  # the type beartype checks (Annotated metadata stripped)
    range: Range | None
    optional: bool
    binds: str | None  # the dim symbol an int parameter binds, if named like one
    match: MatchConfig | None = None


@dataclass(frozen=True)
class AxisSource:
    param: str
    axis: int


@dataclass(frozen=True)
class Solver:
    """``symbol = (param.shape[axis] - const) / coef``, from a dim linear in ``symbol``."""

    symbol: str
    param: str
    axis: int
    dim: Expr
    coef: Expr
    const: Expr


@dataclass
class ContractSpec:
    """Everything the engine knows about one contract, built once at decoration time."""

    name: str
    signature: inspect.Signature
    tensors: dict[str, TensorParam]
    scalars: dict[str, ScalarParam]
    returns: tuple[TensorParam, ...] | None  # None: no tensor return contract
    returns_tuple: bool
    where: tuple[tuple[Constraint, Where], ...]
    symbols: tuple[str, ...]  # the order in which bound dims are reported
    sources: dict[str, tuple[AxisSource, ...]]
    scalar_sources: dict[str, str]
    solvers: tuple[Solver, ...]
    config: Any = None
    config_arg: str | None = None
    hints: tuple[Callable[[Violation, CallContext], str | None], ...] = ()
    value_checks: Callable[[CallContext], list[Violation]] | None = None
    first_tensor: str | None = None

    # -- provenance of a successful binding (static: every required tensor was usable) --------
    def provenance(self, config: Any) -> dict[str, str]:
        prov: dict[str, str] = {}
        cfg_dims = config_dims(config)
        for sym in self.symbols:
            if sym in cfg_dims:
                prov[sym] = f"from config ({config_dim_source(config, sym)})"
            elif sym in self.scalar_sources:
                prov[sym] = f"from {self.scalar_sources[sym]}"
            elif self.sources.get(sym):
                src = self.sources[sym][0]
                prov[sym] = f"from {src.param}.shape[{src.axis}]"
            else:
                for s in self.solvers:
                    if s.symbol == sym:
                        prov[sym] = f"solved from {s.param}.shape[{s.axis}] = {s.dim}"
                        break
        return prov

    # -- the slow path: every violation, with provenance ---------------------------------------
    def explain(self, values: Mapping[str, Any], config: Any) -> tuple[dict[str, int], dict[str, str],
                                                                        list[Violation]]:
        """Interpret the contract on one call; return (dims, provenance, violations).

        This is the specification the generated fast checker must agree with.
        """
        return _Explainer(self, values, config).run()


@dataclass
class CallContext:
    """What hints and value checks see of a call: its arguments, config and bound dims."""

    spec: ContractSpec
    values: Mapping[str, Any]
    config: Any
    dims: dict[str, int]
    provenance: dict[str, str]
    violations: list[Violation] = field(default_factory=list)


class Dims(Mapping[str, int]):
    """The dims a call bound, by symbol, with where each came from.

    Example::

        >>> dims = kc.validate_packed_decode(...)
        >>> dims.H, dims["HV"], dims.provenance["HV"]
        (32, 32, 'from initial_state.shape[1]')
    """

    __slots__ = ("_provenance", "_values")

    def __init__(self, values: dict[str, int], provenance: dict[str, str]) -> None:
        self._values = values
        self._provenance = provenance

    @property
    def provenance(self) -> dict[str, str]:
        return dict(self._provenance)

    def __getattr__(self, name: str) -> int:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> int:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "Dims(" + ", ".join(f"{k}={v}" for k, v in self._values.items()) + ")"


# -- config access (KDAConfig, any object with contract_dims(), or a plain pydantic model) -------
def config_dims(config: Any) -> Mapping[str, int]:
    if config is None:
        return {}
    getter = getattr(config, "contract_dims", None)
    if getter is not None:
        return getter()
    fields = getattr(type(config), "model_fields", None)
    if fields is not None:  # a plain pydantic model: its int fields, by name
        return {k: v for k in fields if isinstance(v := getattr(config, k), int) and not isinstance(v, bool)}
    raise AnnotationError(f"config {config!r} has no contract_dims() and is not a pydantic model")


def config_dim_source(config: Any, sym: str) -> str:
    getter = getattr(config, "contract_dim_source", None)
    if getter is not None:
        return getter(sym)
    return f"{type(config).__name__}.{sym}={config_dims(config)[sym]}"


def config_dtypes(config: Any) -> Mapping[str, torch.dtype]:
    getter = getattr(config, "contract_dtypes", None) if config is not None else None
    return getter() if getter is not None else {}


# -- reading annotations -------------------------------------------------------------------------
def _is_jaxtyping_array(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "dim_str") and hasattr(tp, "dtypes") and hasattr(tp, "array_type")


def split_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(tp) if a is not NoneType]
        if len(args) == 1 and len(args) != len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def _dtypes_of(array_type: Any, spec: Spec, where: str) -> frozenset[torch.dtype]:
    names = array_type.dtypes
    if not isinstance(names, (list, tuple, set, frozenset)):  # Shaped[...]: jaxtyping's "any dtype"
        names = tuple(_TORCH_DTYPE_BY_NAME)
    allowed = frozenset(_TORCH_DTYPE_BY_NAME[n] for n in names if n in _TORCH_DTYPE_BY_NAME)
    if spec.dtypes is not None:
        narrowed = frozenset(spec.dtypes)
        if not narrowed <= allowed:
            extra = ", ".join(sorted(dtype_name(d) for d in narrowed - allowed))
            raise AnnotationError(f"{where}: Spec(dtypes=...) allows {extra}, outside the annotation's dtype "
                                  f"category {array_type.dtype.__name__}")
        allowed = narrowed
    if not allowed:
        raise AnnotationError(f"{where}: no torch dtype is allowed by the annotation")
    return allowed


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _read_param(name: str, annotation: Any, where: str) -> TensorParam | ScalarParam | None:
    if annotation is inspect.Parameter.empty:
        return None
    meta: tuple[Any, ...] = ()
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *rest = typing.get_args(annotation)
        meta = tuple(rest)
    inner, optional = split_optional(annotation)
    if typing.get_origin(inner) is typing.Annotated:  # Optional[Annotated[...]]
        inner, *rest = typing.get_args(inner)
        meta += tuple(rest)
    specs = [m for m in meta if isinstance(m, Spec)]
    ranges = [m for m in meta if isinstance(m, Range)]
    matches = [m for m in meta if isinstance(m, MatchConfig)]
    if len(specs) > 1 or len(ranges) > 1 or len(matches) > 1:
        raise AnnotationError(f"{where}: at most one kc.Spec, one kc.Range and one kc.MatchConfig per argument")
    if _is_jaxtyping_array(inner):
        if ranges or matches:
            raise AnnotationError(f"{where}: kc.Range and kc.MatchConfig apply to scalars; tensor values are "
                                  "checked in strict mode")
        if not (isinstance(inner.array_type, type) and issubclass(inner.array_type, torch.Tensor)):
            raise AnnotationError(f"{where}: only torch.Tensor arrays are supported, got {inner.array_type!r}")
        spec = specs[0] if specs else Spec()
        dims = parse_shape(inner.dim_str, where)
        if spec.inner_contiguous > len(dims) or spec.inner_contiguous < 0:
            raise AnnotationError(f"{where}: inner_contiguous={spec.inner_contiguous} but the tensor has rank "
                                  f"{len(dims)}")
        return TensorParam(name, inner.dim_str, dims, _dtypes_of(inner, spec, where), spec, optional)
    if specs:
        raise AnnotationError(f"{where}: kc.Spec applies to tensor annotations like Float[Tensor, '...']")
    if inner is torch.Tensor:
        raise AnnotationError(f"{where}: a bare torch.Tensor has no shape; annotate it as "
                              f"Float[Tensor, 'dims'] (or Shaped[Tensor, '...'])")
    rng = ranges[0] if ranges else None
    if rng is not None and inner not in (int, float):
        raise AnnotationError(f"{where}: kc.Range needs an int or float annotation, got {inner!r}")
    if rng is not None and (why := rng.malformed()) is not None:
        raise AnnotationError(f"{where}: kc.Range{_range_args(rng)} can never hold: {why}")
    hint = annotation if not meta else (inner if not optional else inner | None)
    return ScalarParam(name, hint, rng, optional, None, matches[0] if matches else None)


def _range_args(r: Range) -> str:
    bounds = ((k, getattr(r, k)) for k in ("gt", "ge", "lt", "le"))
    return "(" + ", ".join(f"{k}={v!r}" for k, v in bounds if v is not None) + ")"


def build_spec(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    config: Any = None,
    config_arg: str | None = None,
    where: Iterable[str | Where] = (),
    bind_first: Sequence[str] = (),
    hints: Sequence[Callable[[Violation, CallContext], str | None]] = (),
    value_checks: Callable[[CallContext], list[Violation]] | None = None,
) -> ContractSpec:
    """Read ``fn``'s annotations into a :class:`ContractSpec` and plan the binding.

    Raises :class:`AnnotationError` naming the problem when the contract is malformed.
    """
    qualname: str = name or str(getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn))))
    try:
        hints_map = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve, a bad dim string ...
        raise AnnotationError(f"{qualname}: cannot read the annotations: {exc}") from exc
    sig = inspect.signature(fn)
    tensors: dict[str, TensorParam] = {}
    scalars: dict[str, ScalarParam] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue  # passed through unchecked
        read = _read_param(p.name, hints_map.get(p.name, inspect.Parameter.empty), f"{qualname}: argument {p.name!r}")
        if isinstance(read, TensorParam):
            tensors[p.name] = read
        elif isinstance(read, ScalarParam):
            scalars[p.name] = read
    if config_arg is not None and config_arg not in sig.parameters:
        raise AnnotationError(f"{qualname}: config_arg={config_arg!r} is not a parameter")
    if config is not None and config_arg is not None:
        raise AnnotationError(f"{qualname}: give either config= or config_arg=, not both")

    # The return contract: a tensor, or a tuple of tensors.
    returns: tuple[TensorParam, ...] | None = None
    returns_tuple = False
    ret = hints_map.get("return", None)
    if ret is not None and ret is not NoneType:
        ret_items: tuple[Any, ...] = (ret,)
        if typing.get_origin(ret) is tuple:
            ret_items, returns_tuple = typing.get_args(ret), True
        read_ret = [_read_param(f"return[{i}]" if returns_tuple else "return", r, f"{qualname}: return")
                    for i, r in enumerate(ret_items)]
        if all(isinstance(r, TensorParam) for r in read_ret):
            returns = tuple(r for r in read_ret if isinstance(r, TensorParam))
        elif any(isinstance(r, TensorParam) for r in read_ret):
            raise AnnotationError(f"{qualname}: a tuple return contract must be all tensors")

    for tp in tensors.values():
        for other in (tp.spec.same_dtype_as,):
            if other is not None and other not in tensors:
                raise AnnotationError(f"{qualname}: argument {tp.name!r}: same_dtype_as={other!r} is not a tensor "
                                      f"argument")
    for b in bind_first:
        if b not in tensors:
            raise AnnotationError(f"{qualname}: bind_first names {b!r}, which is not a tensor argument")
    for sp in scalars.values():
        if sp.match is not None and config is not None and not hasattr(config, sp.match.attr):
            raise AnnotationError(f"{qualname}: argument {sp.name!r}: kc.MatchConfig({sp.match.attr!r}) names no "
                                  f"attribute of the config ({type(config).__name__})")

    # Which symbols appear, in first-appearance order.
    symbols: list[str] = []

    def note(syms: Iterable[str]) -> None:
        for s in sorted(syms):
            if s not in symbols:
                symbols.append(s)

    for tp in tensors.values():
        for d in tp.dims:
            if isinstance(d, Expr):
                note(d.symbols())
    constraints: list[tuple[Constraint, Where]] = []
    for w in where:
        wobj = w if isinstance(w, Where) else Where(w)
        c = parse_constraint(wobj.expr, f"{qualname}: where {wobj.expr!r}")
        constraints.append((c, wobj))

    # Direct sources: plain-name dims of required tensors, in priority order.
    order = list(bind_first) + [n for n in tensors if n not in bind_first]
    sources: dict[str, list[AxisSource]] = {}
    for n in order:
        tp = tensors[n]
        if tp.optional:
            continue  # an argument that may be None cannot be what a dim hangs on
        for axis, d in enumerate(tp.dims):
            if isinstance(d, Sym):
                sources.setdefault(d.name, []).append(AxisSource(n, axis))
    scalar_sources: dict[str, str] = {}
    for sp in list(scalars.values()):
        if sp.hint is int and sp.name in symbols and not sp.optional:
            scalar_sources[sp.name] = sp.name
            scalars[sp.name] = ScalarParam(sp.name, sp.hint, sp.range, sp.optional, sp.name, sp.match)
    static_cfg = set(config_dims(config)) if config is not None else set()

    # Solve the rest: repeatedly find a dim that is linear in exactly one unknown.
    known = set(sources) | set(scalar_sources) | static_cfg
    solvers: list[Solver] = []
    progress = True
    while progress:
        progress = False
        for n in order:
            tp = tensors[n]
            if tp.optional:
                continue
            for axis, d in enumerate(tp.dims):
                if not isinstance(d, Expr):
                    continue
                unknown = d.symbols() - known
                if len(unknown) != 1:
                    continue
                (x,) = unknown
                lin = linear_form(d, x)
                if lin is None:
                    continue
                solvers.append(Solver(x, n, axis, d, lin[0], lin[1]))
                known.add(x)
                progress = True
    unbound = [s for s in symbols if s not in known]
    for c, _w in constraints:
        unbound += [s for s in sorted(c.symbols()) if s not in known and s not in unbound]
    if returns:
        for r in returns:
            for d in r.dims:
                if isinstance(d, Expr):
                    unbound += [s for s in sorted(d.symbols()) if s not in known and s not in unbound]
    if unbound:
        where_used = []
        for s in unbound:
            users = [f"{tp.name}: {tp.dim_str!r}" for tp in tensors.values()
                     if any(isinstance(d, Expr) and s in d.symbols() for d in tp.dims)]
            where_used.append(f"{s!r} (in {', '.join(users) or 'a constraint or the return'})")
        raise AnnotationError(
            f"{qualname}: cannot bind dim {', '.join(where_used)}: no required tensor has it as a plain dim, "
            "no config or int argument provides it, and no dim is linear in it alone. Add an argument "
            "that carries it, pass a config that fixes it, or rewrite the expression."
        )
    for s in static_cfg:
        if s not in symbols and any(s in c.symbols() for c, _ in constraints):
            symbols.append(s)
    first_tensor = next((n for n in tensors if not tensors[n].optional), None)
    return ContractSpec(
        name=qualname,
        signature=sig,
        tensors=tensors,
        scalars=scalars,
        returns=returns,
        returns_tuple=returns_tuple,
        where=tuple(constraints),
        symbols=tuple(symbols),
        sources={k: tuple(v) for k, v in sources.items()},
        scalar_sources=scalar_sources,
        solvers=tuple(solvers),
        config=config,
        config_arg=config_arg,
        hints=tuple(hints),
        value_checks=value_checks,
        first_tensor=first_tensor,
    )


# -- the slow path -------------------------------------------------------------------------------
def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def dense_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def inner_block_ok(shape: Sequence[int], strides: Sequence[int], n: int) -> bool:
    """True when the last ``n`` dims form one dense row-major block (size-1 dims are free)."""
    expected = dense_strides(shape)
    return all(shape[a] == 1 or strides[a] == expected[a] for a in range(len(shape) - n, len(shape)))


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


class _Explainer:
    def __init__(self, spec: ContractSpec, values: Mapping[str, Any], config: Any) -> None:
        self.spec = spec
        self.values = values
        self.config = config
        self.dims: dict[str, int] = {}
        self.prov: dict[str, str] = {}
        self.violations: list[Violation] = []
        self.usable: dict[str, tuple[int, ...]] = {}
        # Per tensor: mismatching axes and notes, merged into one violation per argument.
        self.bad_axes: dict[str, dict[int, str]] = {}

    def run(self) -> tuple[dict[str, int], dict[str, str], list[Violation]]:
        spec = self.spec
        self._ranks()
        self._bind()
        self._check_dims()
        self._shape_violations()
        self._where()
        self._dtypes()
        self._devices()
        self._layouts()
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
        return v.with_hint(_generic_hint(v, ctx))

    def _ranks(self) -> None:
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            shape = tuple(int(s) for s in t.shape)
            if len(shape) != tp.rank:
                self.violations.append(Violation(
                    ShapeError, name,
                    f"{tp.symbolic()} (rank {tp.rank})",
                    f"{_fmt_shape(shape)} (rank {len(shape)})",
                    facts={"rank": True, "shape": shape},
                ))
                continue
            self.usable[name] = shape

    def _bind(self) -> None:
        spec = self.spec
        cfg_dims = config_dims(self.config)
        for sym in spec.symbols:
            if sym in cfg_dims:
                self.dims[sym] = int(cfg_dims[sym])
                self.prov[sym] = f"from config ({config_dim_source(self.config, sym)})"
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
        for s in spec.solvers:
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
            if coef > 0 and rest % coef == 0 and rest // coef >= 1:
                self.dims[s.symbol] = rest // coef
                self.prov[s.symbol] = f"solved from {s.param}.shape[{s.axis}] = {s.dim}"
                continue
            known = ", ".join(f"{k}={self.dims[k]}" for k in sorted(s.dim.symbols() - {s.symbol}))
            frac = f"({size} - {const}) / {coef} = {rest / coef:g}" if coef else f"coefficient {s.coef} is 0"
            self.bad_axes.setdefault(s.param, {})[s.axis] = (
                f"dim {s.axis} ({s.dim}) = {size} gives no positive integer {s.symbol} "
                f"with {known}: {s.symbol} = {frac}")

    def _check_dims(self) -> None:
        for name, shape in self.usable.items():
            tp = self.spec.tensors[name]
            for axis, d in enumerate(tp.dims):
                if d is ANY or axis in self.bad_axes.get(name, {}):
                    continue
                assert isinstance(d, Expr)
                if not d.symbols() <= self.dims.keys():
                    continue
                try:
                    want = d.evaluate(self.dims)
                except ZeroDivisionError:
                    self.bad_axes.setdefault(name, {})[axis] = f"dim {axis} ({d}) divides by zero with the bound dims"
                    continue
                if shape[axis] != want:
                    why = ""
                    if isinstance(d, Sym):
                        why = f" ({d.name} {self.prov.get(d.name, '')})"
                    self.bad_axes.setdefault(name, {})[axis] = (
                        f"dim {axis} ({d}): expected {want}{why}, got {shape[axis]}")

    def _concrete(self, tp: TensorParam) -> str:
        parts = []
        for d in tp.dims:
            if d is ANY:
                parts.append("_")
                continue
            assert isinstance(d, Expr)
            try:
                parts.append(str(d.evaluate(self.dims)) if d.symbols() <= self.dims.keys() else "?")
            except ZeroDivisionError:
                parts.append("?")
        return "[" + ", ".join(parts) + "]"

    def _shape_violations(self) -> None:
        for name, axes in self.bad_axes.items():
            tp = self.spec.tensors[name]
            self.violations.append(Violation(
                ShapeError, name,
                f"{tp.symbolic()} = {self._concrete(tp)}",
                _fmt_shape(self.usable[name]),
                tuple(axes[a] for a in sorted(axes)),
                facts={"axes": sorted(axes), "shape": self.usable[name]},
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
                got = ", ".join(f"{s}={self.dims[s]}" for s in sorted(c.symbols()))
                self.violations.append(Violation(
                    w.kind, "dims", c.text, got,
                    tuple(f"{s} {self.prov[s]}" for s in sorted(c.symbols()) if s in self.prov),
                    hint=w.hint, facts={"constraint": c.text},
                ))

    def _dtypes(self) -> None:
        cfg_dt = config_dtypes(self.config)
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            allowed: frozenset[torch.dtype] = tp.dtypes
            why = ""
            if tp.spec.config_dtype is not None and tp.spec.config_dtype in cfg_dt:
                allowed = frozenset((cfg_dt[tp.spec.config_dtype],))
                why = f" (config {tp.spec.config_dtype} dtype)"
            if t.dtype not in allowed:
                names = " or ".join(sorted(dtype_name(d) for d in allowed))
                self.violations.append(Violation(DtypeError, name, names + why, dtype_name(t.dtype),
                                                 facts={"allowed": allowed, "dtype": t.dtype}))
                continue
            other = tp.spec.same_dtype_as
            if other is not None and self.values.get(other) is not None:
                od = self.values[other].dtype
                if t.dtype != od:
                    self.violations.append(Violation(
                        DtypeError, name, f"{dtype_name(od)} (same as {other})", dtype_name(t.dtype),
                        facts={"allowed": frozenset((od,)), "dtype": t.dtype}))

    def _devices(self) -> None:
        first = self.spec.first_tensor
        if first is None or self.values.get(first) is None:
            return
        dev = self.values[first].device
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None or name == first or not tp.spec.same_device:
                continue
            if t.device != dev:
                self.violations.append(Violation(DeviceError, name, f"{dev} (device of {first})", str(t.device),
                                                 facts={"device": dev}))

    def _layouts(self) -> None:
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None or name not in self.usable:
                continue
            shape, strides = self.usable[name], tuple(t.stride())
            if tp.spec.contiguous and not t.is_contiguous():
                self.violations.append(Violation(
                    LayoutError, name, f"contiguous (strides {_fmt_shape(dense_strides(shape))})",
                    f"strides {_fmt_shape(strides)}", facts={"rule": "contiguous"}))
            elif tp.spec.inner_contiguous and not inner_block_ok(shape, strides, tp.spec.inner_contiguous):
                n = tp.spec.inner_contiguous
                dense = dense_strides(shape)
                want = ["*"] * (len(shape) - n) + [str(s) for s in dense[len(shape) - n:]]
                what = "last dim stride 1" if n == 1 else f"last {n} dims dense"
                self.violations.append(Violation(
                    LayoutError, name, f"{what} (strides [{', '.join(want)}])", f"strides {_fmt_shape(strides)}",
                    facts={"rule": "inner", "n": n}))
            elif tp.spec.disjoint and not tp.spec.contiguous and not blocks_disjoint(
                    shape, strides, tp.spec.inner_contiguous):
                n = tp.spec.inner_contiguous
                block = math.prod(max(s, 1) for s in shape[len(shape) - n:])
                self.violations.append(Violation(
                    LayoutError, name, f"blocks of the last {n} dims that do not overlap (stride[0] >= {block})"
                    if len(shape) - n == 1 else f"blocks of the last {n} dims that do not overlap",
                    f"strides {_fmt_shape(strides)}", facts={"rule": "disjoint", "n": n}))

    def _scalars(self) -> None:
        for name, sp in self.spec.scalars.items():
            v = self.values.get(name)
            if sp.range is not None and v is not None and not sp.range.holds(v):
                self.violations.append(Violation(ValueRangeError, name, sp.range.describe(), repr(v)))
            elif sp.match is not None and self.config is not None and not sp.match.agrees(v, self.config):
                self.violations.append(Violation(
                    ValueRangeError, name, f"{getattr(self.config, sp.match.attr)!r} (config {sp.match.attr})",
                    repr(v), facts={"match": sp.match.attr}))


def _generic_hint(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is DtypeError:
        allowed = v.facts.get("allowed")
        if isinstance(allowed, frozenset) and len(allowed) == 1:
            (dt,) = allowed
            return f"cast it: {v.argument}.to({dt})"
        return None
    if v.kind is LayoutError:
        if v.facts.get("rule") == "contiguous":
            return f"pass {v.argument}.contiguous()"
        if v.facts.get("rule") == "disjoint":
            return (f"{v.argument} is written in place, so its blocks must not share memory (an .expand()ed or "
                    f"as_strided view makes them): allocate it densely")
        return (f"pass {v.argument}.contiguous(), or allocate it with a dense inner block; a transposed or "
                "sliced view has the wrong strides")
    if v.kind is DeviceError:
        return f"move it: {v.argument}.to({str(v.facts.get('device'))!r})"
    return None

