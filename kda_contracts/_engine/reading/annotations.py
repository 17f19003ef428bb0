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

Binding is order-independent: a config binds first, then int scalars,
then tensor axes whose dim is a plain name (in ``bind_first`` order, then argument order); a dim
that is a linear expression with one unknown (``2*H*K+HV*V``) solves that unknown with a
divisibility check. Everything else is a check against what is bound.
"""


from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import NoneType, UnionType
from typing import Any

import torch
from beartype.door import is_bearable

from ..errors import AnnotationError, Violation
from ..grammar.constraints import Constraint, parse_constraint
from ..grammar.dims import ArgFact, DimSpec, Variadic, parse_shape
from ..model.markers import (
    DTYPE_ROLES,
    MatchConfig,
    Range,
    Spec,
    Where,
    config_dim_source,
    config_dims,
    config_dtypes,
    read_metadata,
)
from ..rules.scalar import scalar_param_rules
from ..rules.tensor import (
    Contiguous,
    Disjoint,
    DtypeIn,
    InnerDense,
    Rule,
    SameDevice,
    SameDtype,
    Writable,
    dtype_name,
)
from .plan import AxisSource, Derived, Solver, VariadicSource, plan_binding
from .structure import BEARTYPE_CONF, Node, mentions_array, read_structure, unalias

__all__ = ["CallContext", "ContractOptions", "ContractSpec", "Dims", "build_spec", "dtype_name"]

_TORCH_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    name: dt for name in dir(torch) if isinstance(dt := getattr(torch, name, None), torch.dtype)
}


# -- the parsed contract -------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorParam:
    name: str
    dim_str: str
    dims: tuple[DimSpec, ...]
    dtypes: frozenset[torch.dtype]
    spec: Spec
    optional: bool
    rules: tuple[Rule, ...] = ()  # dtype, device and stride rules, in checking order

    @property
    def rank(self) -> int:
        """The number of axes (with a variadic dim: the fewest it can have)."""
        return len(self.dims) - (self.variadic_index is not None)

    @property
    def variadic_index(self) -> int | None:
        """Where the variadic dim (``*name``, ``...``) stands among ``dims``, if there is one."""
        return next((i for i, d in enumerate(self.dims) if isinstance(d, Variadic)), None)

    @property
    def variadic(self) -> Variadic | None:
        i = self.variadic_index
        return None if i is None else self.dims[i]  # type: ignore[return-value]

    def fixed_axes(self) -> list[tuple[int, DimSpec]]:
        """Every dim but the variadic one with the index of its axis: counted from the front before
        the variadic dim, from the back (negative) after it."""
        v = self.variadic_index
        if v is None:
            return list(enumerate(self.dims))
        return [(i, d) for i, d in enumerate(self.dims[:v])] + \
               [(i - len(self.dims), d) for i, d in enumerate(self.dims) if i > v]

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
    rules: tuple[Rule, ...] = ()  # range, then config agreement, then the constraints below
    constraints: tuple[Rule, ...] = ()  # from annotated_types / pydantic Field metadata


@dataclass(frozen=True)
class NestedParam:
    """An argument whose annotation has tensors inside a container, union, dataclass or model."""

    name: str
    node: Node
    rules: tuple[Rule, ...] = ()  # length / predicate constraints on the value itself


@dataclass(frozen=True)
class ContractOptions:
    """Every option of a contract, as ``kc.contract(...)`` received it (see its docstring)."""

    config: Any = None  # a config fixed at decoration
    config_arg: str | None = None  # or the parameter that carries one per call
    where: tuple[str | Where, ...] = ()  # cross-argument constraints
    bind_first: tuple[str, ...] = ()  # tensors to bind dims from first (provenance only)
    hints: tuple[Callable[[Violation, CallContext], str | None], ...] = ()
    value_checks: Callable[[CallContext], list[Violation]] | None = None  # strict mode only
    mode: str | None = None  # pins the contract's mode
    name: str | None = None  # the name errors and docs use (default: the qualname)
    register: bool = True  # list it in kc.registered_contracts()
    autograd: bool = False  # tensors marked Spec(mutated=True) may require grad (the op supports autograd)
    doc: bool | None = None  # append the shape table to __doc__ (None: kc.set_contract_docs / $KDA_CONTRACTS_DOC)


@dataclass
class ContractSpec:
    """Everything the engine knows about one contract, built once at decoration time."""

    name: str
    signature: inspect.Signature
    tensors: dict[str, TensorParam]
    scalars: dict[str, ScalarParam]
    nested: dict[str, NestedParam]  # tensors inside containers, unions, dataclasses, models
    returns: tuple[TensorParam, ...] | None  # None: no tensor return contract
    returns_tuple: bool
    where: tuple[tuple[Constraint, Where], ...]
    symbols: tuple[str, ...]  # the order in which bound dims are reported
    sources: dict[str, tuple[AxisSource, ...]]
    scalar_sources: dict[str, str]
    solvers: tuple[Solver, ...]
    broadcast_sources: dict[str, tuple[AxisSource, ...]]  # dims only broadcastable axes carry
    variadic_sources: dict[str, tuple[VariadicSource, ...]]  # *name -> the axes that carry it
    nested_only: tuple[str, ...]  # dims only tensors inside containers carry (bound by the walk)
    config_only: tuple[str, ...]  # dims bound by the fixed config alone (no argument carries them)
    options: ContractOptions
    first_tensor: str | None = None
    steps: tuple[Solver | Derived, ...] = ()  # solvers and equality bindings, in binding order
    facts: tuple[ArgFact, ...] = ()  # argument facts read by dims and constraints (itemsize(t), t is None)
    #: a return annotation without tensors (``-> int``, ``-> None``, ``-> list[str]``), checked with
    #: beartype after the call; ``NO_HINT`` when there is none (unannotated, ``Any``, ``object``)
    return_hint: Any = inspect.Parameter.empty

    @property
    def config(self) -> Any:
        return self.options.config

    @property
    def config_arg(self) -> str | None:
        return self.options.config_arg

    @property
    def hints(self) -> tuple[Callable[[Violation, CallContext], str | None], ...]:
        return self.options.hints

    @property
    def value_checks(self) -> Callable[[CallContext], list[Violation]] | None:
        return self.options.value_checks

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
            elif sym in self.nested_only:  # bound by the first tensor inside a container that carries it
                holders = [n for n, p in self.nested.items() if sym in p.node.symbols()]
                prov[sym] = f"from the tensors inside {', '.join(holders)}"
            else:
                for s in self.steps:
                    if s.symbol == sym:
                        prov[sym] = derived_provenance(s)
                        break
        return prov

    # -- the slow path: every violation, with provenance ---------------------------------------
    def explain(self, values: Mapping[str, Any], config: Any) -> tuple[dict[str, int], dict[str, str],
                                                                        list[Violation]]:
        """Interpret the contract on one call; return (dims, provenance, violations).

        This is the specification the generated fast checker must agree with.
        """
        from ..explain.explainer import Explainer  # the slow path imports this module

        return Explainer(self, values, config).run()


def derived_provenance(step: Solver | Derived) -> str:
    """Where a solved or equality-bound dim came from, as reports say it."""
    if isinstance(step, Derived):
        return f"from where {step.constraint}"
    return f"solved from {step.param}.shape[{step.axis}] = {step.dim}"


@dataclass
class CallContext:
    """What hints and value checks see of a call: its arguments, config and bound dims.

    ``memo`` is shared by one call's strict-mode checks, in order: the contract's value checks,
    the op's ``written=`` (asked for the aliasing check and the snapshot) and its ``after=``
    checks. A check may leave there what it read from the device, so that the next one need not
    read it again (packed decode's value checks leave the host copy of the indices they read in
    their single sync, and ``written=`` takes the used slots from it instead of syncing again).
    """

    spec: ContractSpec
    values: Mapping[str, Any]
    config: Any
    dims: dict[str, int]
    provenance: dict[str, str]
    violations: list[Violation] = field(default_factory=list)
    memo: dict[str, Any] = field(default_factory=dict)


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


def tensor_rules(tp: TensorParam, first_tensor: str | None, autograd: bool = False) -> tuple[Rule, ...]:
    """The rules a tensor argument's annotation and ``kc.Spec`` declare, in checking order
    (``autograd``: the contract lets a written tensor require grad)."""
    sp = tp.spec
    rules: list[Rule] = [DtypeIn(tp.name, tp.dtypes, sp.config_dtype)]
    if sp.same_dtype_as is not None:
        rules.append(SameDtype(tp.name, sp.same_dtype_as))
    if sp.same_device and first_tensor is not None and tp.name != first_tensor:
        rules.append(SameDevice(tp.name, first_tensor))
    if sp.contiguous:
        rules.append(Contiguous(tp.name))
    elif sp.inner_contiguous:
        rules.append(InnerDense(tp.name, sp.inner_contiguous))
    if sp.disjoint and not sp.contiguous:
        rules.append(Disjoint(tp.name, None if tp.variadic is not None else tp.rank, sp.inner_contiguous))
    if sp.mutated:
        rules.append(Writable(tp.name, autograd))
    return tuple(rules)


# -- reading annotations -------------------------------------------------------------------------
def unsupported_array_type(hint: Any) -> str | None:
    """Why a jaxtyping array annotation's array class cannot be checked, or None (torch.Tensor).
    A subclass (``Float[nn.Parameter, "D"]``) is refused rather than widened to any tensor: the
    checks test ``torch.Tensor``, so a plain tensor would pass where the annotation asks for more."""
    array_type = hint.array_type
    if array_type is torch.Tensor:
        return None
    name = getattr(array_type, "__qualname__", repr(array_type))
    if isinstance(array_type, type) and issubclass(array_type, torch.Tensor):
        return (f"{name} is a subclass of torch.Tensor, which contracts do not check as such (any tensor would "
                f"pass): annotate {getattr(hint.dtype, '__name__', 'Shaped')}[Tensor, "
                f"{hint.dim_str!r}] and test isinstance(..., {name}) in the body if it matters")
    return f"only torch.Tensor arrays are supported, got {array_type!r}"


def _is_jaxtyping_array(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "dim_str") and hasattr(tp, "dtypes") and hasattr(tp, "array_type")


def split_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(tp) if a is not NoneType]
        if len(args) == 1 and len(args) != len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def array_dtypes(array_type: Any, spec: Spec | None, where: str) -> frozenset[torch.dtype]:
    """The dtypes a jaxtyping array annotation allows, narrowed by ``Spec(dtypes=...)``."""
    names = array_type.dtypes
    if not isinstance(names, (list, tuple, set, frozenset)):  # Shaped[...]: jaxtyping's "any dtype"
        names = tuple(_TORCH_DTYPE_BY_NAME)
    allowed = frozenset(_TORCH_DTYPE_BY_NAME[n] for n in names if n in _TORCH_DTYPE_BY_NAME)
    if spec is not None and spec.dtypes is not None:
        narrowed = frozenset(spec.dtypes)
        if not narrowed <= allowed:
            extra = ", ".join(sorted(dtype_name(d) for d in narrowed - allowed))
            raise AnnotationError(f"{where}: Spec(dtypes=...) allows {extra}, outside the annotation's dtype "
                                  f"category {array_type.dtype.__name__}")
        allowed = narrowed
    if not allowed:
        raise AnnotationError(f"{where}: no torch dtype is allowed by the annotation")
    return allowed


def _read_param(name: str, annotation: Any, where: str) -> TensorParam | ScalarParam | NestedParam | None:
    if annotation is inspect.Parameter.empty:
        return None
    annotation = unalias(annotation)
    meta: tuple[Any, ...] = ()
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *rest = typing.get_args(annotation)
        annotation = unalias(annotation)
        meta = tuple(rest)
    inner, optional = split_optional(annotation)
    if typing.get_origin(inner) is typing.Annotated:  # Optional[Annotated[...]]
        inner, *rest = typing.get_args(inner)
        meta += tuple(rest)
    specs = [m for m in meta if isinstance(m, Spec)]
    matches = [m for m in meta if isinstance(m, MatchConfig)]
    foreign = read_metadata([m for m in meta if not isinstance(m, (Spec, MatchConfig))], where)
    ranges = [foreign.range] if foreign.range is not None else []
    if len(specs) > 1 or len(matches) > 1:
        raise AnnotationError(f"{where}: at most one kc.Spec, one kc.Range and one kc.MatchConfig per argument")
    try:
        nested = not _is_jaxtyping_array(inner) and mentions_array(inner)
    except AnnotationError as exc:  # (a class whose field annotations do not resolve)
        raise AnnotationError(f"{where}: {exc}") from exc
    if nested:
        if specs or ranges or matches or foreign.multiple_of is not None:
            raise AnnotationError(f"{where}: kc.Spec, kc.Range, kc.MatchConfig and number bounds apply to a "
                                  "top-level tensor or number, not to a container of tensors")
        return NestedParam(name, read_structure(annotation, where), foreign.rules(name, optional))
    if _is_jaxtyping_array(inner):
        if ranges or matches or foreign.any():
            raise AnnotationError(f"{where}: kc.Range and kc.MatchConfig apply to scalars; tensor values are "
                                  "checked in strict mode")
        if (why := unsupported_array_type(inner)) is not None:
            raise AnnotationError(f"{where}: {why}")
        spec = specs[0] if specs else Spec()
        dims = parse_shape(inner.dim_str, where)
        v = next((i for i, d in enumerate(dims) if isinstance(d, Variadic)), None)
        most = len(dims) if v is None else len(dims) - 1 - v  # a dense block may not reach into *batch
        if spec.inner_contiguous < 0 or spec.inner_contiguous > most:
            raise AnnotationError(f"{where}: inner_contiguous={spec.inner_contiguous} but the tensor has "
                                  + (f"rank {len(dims)}" if v is None else f"{most} dims after its variadic dim"))
        return TensorParam(name, inner.dim_str, dims, array_dtypes(inner, spec, where), spec, optional)
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
    if foreign.multiple_of is not None and inner not in (int, float):
        raise AnnotationError(f"{where}: MultipleOf needs an int or float annotation, got {inner!r}")
    origin = typing.get_origin(inner) or inner
    if foreign.length is not None and isinstance(origin, type) and not hasattr(origin, "__len__"):
        raise AnnotationError(f"{where}: MinLen/MaxLen/Len need a sized annotation (a str, list, tuple, ...), "
                              f"got {_hint_text(inner)}, which has no len()")
    if _has_nested_metadata(inner):  # beartype would ignore it: refused, not dropped
        raise AnnotationError(f"{where}: metadata inside {_hint_text(inner)} is not checked (bounds apply to a "
                              "top-level number); move it to the top level or check the values in the function")
    hint = annotation if not meta else (inner if not optional else inner | None)
    return ScalarParam(name, hint, rng, optional, None, matches[0] if matches else None,
                       constraints=foreign.rules(name, optional))


def _range_args(r: Range) -> str:
    bounds = ((k, getattr(r, k)) for k in ("gt", "ge", "lt", "le"))
    return "(" + ", ".join(f"{k}={v!r}" for k, v in bounds if v is not None) + ")"


def build_spec(fn: Callable[..., Any], options: ContractOptions | None = None, **kwargs: Any) -> ContractSpec:
    """Read ``fn``'s annotations into a :class:`ContractSpec` and plan the binding.

    ``options`` (or the same fields as keywords) are the contract's options. Raises
    :class:`AnnotationError` naming the problem when the contract is malformed.

    Example::

        spec = build_spec(my_kernel, where=["HV % H == 0"])
        spec.symbols        # ('B', 'H', 'HV', ...)
    """
    if options is None:
        fields: dict[str, Any] = {k: tuple(v) if k in ("where", "bind_first", "hints") else v
                                  for k, v in kwargs.items()}
        options = ContractOptions(**fields)
    qualname: str = options.name or str(getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn))))
    try:
        hints_map = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve, a bad dim string ...
        raise AnnotationError(f"{qualname}: cannot read the annotations: {exc}") from exc
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:  # a builtin or C function without a signature
        raise AnnotationError(f"{qualname}: cannot read the signature: {exc}; wrap it in a Python function with "
                              "annotated parameters") from exc
    tensors, scalars, nested = _read_params(qualname, sig, hints_map)
    returns, returns_tuple = _read_returns(qualname, hints_map.get("return", NO_HINT))
    return_hint = NO_HINT if returns is not None else _plain_return(qualname, hints_map.get("return", NO_HINT))
    for r in returns or ():
        if r.spec.same_dtype_as is not None and r.spec.same_dtype_as not in tensors:
            raise AnnotationError(f"{qualname}: {r.name}: same_dtype_as={r.spec.same_dtype_as!r} is not a tensor "
                                  "argument")
    _check_options(qualname, options, sig, tensors, scalars)
    constraints = []
    for w in options.where:
        wobj = w if isinstance(w, Where) else Where(w)
        constraints.append((parse_constraint(wobj.expr, f"{qualname}: where {wobj.expr!r}"), wobj))
    plan = plan_binding(qualname, tensors, scalars, tuple(constraints), returns, options,
                        {n: p.node for n, p in nested.items()})
    for sym in plan.scalar_sources:
        scalars[sym] = replace(scalars[sym], binds=sym)
    first_tensor = next((n for n in tensors if not tensors[n].optional), None)
    tensors = {n: replace(tp, rules=tensor_rules(tp, first_tensor, options.autograd)) for n, tp in tensors.items()}
    scalars = {n: replace(sp, rules=scalar_param_rules(sp.name, sp.range, sp.optional, sp.match, sp.constraints))
               for n, sp in scalars.items()}
    return ContractSpec(
        name=qualname, signature=sig, tensors=tensors, scalars=scalars, nested=nested, returns=returns,
        returns_tuple=returns_tuple, where=tuple(constraints), symbols=plan.symbols, sources=plan.sources,
        scalar_sources=plan.scalar_sources, solvers=plan.solvers, broadcast_sources=plan.broadcast_sources,
        nested_only=plan.nested_only,
        variadic_sources=plan.variadic_sources, config_only=plan.config_only, options=options,
        first_tensor=first_tensor,
        steps=plan.steps, facts=plan.facts, return_hint=return_hint,
    )


def _read_params(qualname: str, sig: inspect.Signature, hints_map: Mapping[str, Any],
                 ) -> tuple[dict[str, TensorParam], dict[str, ScalarParam], dict[str, NestedParam]]:
    tensors: dict[str, TensorParam] = {}
    scalars: dict[str, ScalarParam] = {}
    nested: dict[str, NestedParam] = {}
    for p in sig.parameters.values():
        hint = hints_map.get(p.name, inspect.Parameter.empty)
        where = f"{qualname}: argument {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if hint in (inspect.Parameter.empty, Any, object):  # passed through unchecked
                continue
            # each value the parameter collects is checked against its annotation, as the items of the
            # tuple (*args) or the values of the dict (**kwargs) Python hands the function
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            where = f"{qualname}: argument {star}{p.name}"
            hint = tuple[hint, ...] if p.kind is p.VAR_POSITIONAL else dict[str, hint]  # type: ignore[valid-type]
        read = _read_param(p.name, hint, where)
        if isinstance(read, TensorParam):
            tensors[p.name] = read
        elif isinstance(read, ScalarParam):
            scalars[p.name] = read
        elif isinstance(read, NestedParam):
            nested[p.name] = read
    return tensors, scalars, nested


NO_HINT: Any = inspect.Parameter.empty  # no return annotation to check (ContractSpec.return_hint's default)


def _plain_return(qualname: str, ret: Any) -> Any:
    """A return annotation without tensors, as beartype checks it (``NO_HINT``: nothing to check).
    Metadata beartype would ignore (kc.Range, annotated_types bounds) is refused, not dropped."""
    if ret is NO_HINT or ret is Any or ret is object or ret in _UNCHECKED_RETURNS:
        return NO_HINT
    if ret is None:
        return NoneType
    if typing.get_origin(ret) in _BOOL_RETURNS:  # TypeGuard[X] / TypeIs[X]: the function returns a bool
        return bool
    if typing.get_origin(ret) is typing.Annotated:
        meta = [m for m in typing.get_args(ret)[1:] if not _is_doc_or_validator(m)]
        if meta:
            raise AnnotationError(f"{qualname}: return: {meta[0]!r} on a return annotation is not checked; check "
                                  "the value in the function, or annotate the return without it")
    if _has_nested_metadata(ret):
        raise AnnotationError(f"{qualname}: return: metadata inside {_hint_text(ret)} is not checked; annotate the "
                              "return without it")
    try:  # a hint beartype cannot check raises here, at decoration, not at every call
        with warnings.catch_warnings():  # (its deprecation notes, e.g. typing.Iterator, are not ours to print)
            warnings.simplefilter("ignore")
            is_bearable(None, ret, conf=BEARTYPE_CONF)
    except Exception as exc:
        raise AnnotationError(f"{qualname}: return: {_hint_text(ret)} cannot be checked ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160]}); annotate the return with a checkable type, or "
                              "leave it unannotated") from exc
    return ret


def _special_forms(*names: str) -> tuple[Any, ...]:
    import typing_extensions

    return tuple({getattr(m, n) for m in (typing, typing_extensions) for n in names if hasattr(m, n)})


# return annotations that are not checked: ``Self`` (the class of the first argument: a typing notion
# beartype checks only on methods it decorates itself) and ``NoReturn``/``Never`` (the function never
# returns)
_UNCHECKED_RETURNS = _special_forms("Self", "NoReturn", "Never")
_BOOL_RETURNS = _special_forms("TypeGuard", "TypeIs")


def _is_doc_or_validator(meta: Any) -> bool:
    """Metadata beartype checks itself inside a hint (its ``beartype.vale`` validators), or a doc string."""
    return isinstance(meta, str) or type(meta).__module__.startswith("beartype.")


def _has_nested_metadata(tp: Any) -> bool:
    """Whether ``Annotated`` metadata beartype would ignore (not a doc string, not a beartype
    validator) sits anywhere inside ``tp``."""
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        return any(not _is_doc_or_validator(m) for m in args[1:]) or _has_nested_metadata(args[0])
    return any(_has_nested_metadata(a) for a in typing.get_args(tp) if not isinstance(a, (list, type(...))))


def _read_returns(qualname: str, ret: Any) -> tuple[tuple[TensorParam, ...] | None, bool]:
    """The return contract: a tensor, or a tuple of tensors (None: no tensor return contract)."""
    if ret is NO_HINT or ret is None or ret is NoneType:
        return None, False
    items: tuple[Any, ...] = (ret,)
    as_tuple = typing.get_origin(ret) is tuple
    if as_tuple:
        items = typing.get_args(ret)
    read = [_read_param(f"return[{i}]" if as_tuple else "return", r, f"{qualname}: return")
            for i, r in enumerate(items)]
    if any(isinstance(r, NestedParam) for r in read):  # never silent: refused, not left unchecked
        raise AnnotationError(f"{qualname}: return: tensors inside a container ({_hint_text(ret)}) are not checked "
                              "in a return contract; annotate the return as a tensor or a tuple of tensors, or "
                              "return the container unannotated (plain Tensor types) and check it with kc.check")
    if all(isinstance(r, TensorParam) for r in read):
        for r in read:
            assert isinstance(r, TensorParam)
            unchecked = [k for k, v in vars(r.spec).items()
                         if k not in ("dtypes", "same_dtype_as") and v != getattr(Spec(), k)]
            if unchecked:
                raise AnnotationError(f"{qualname}: {r.name}: kc.Spec({unchecked[0]}=...) is not checked on a "
                                      "return (dtypes= and same_dtype_as= are); check the result in the function, "
                                      "or drop it")
        return tuple(r for r in read if isinstance(r, TensorParam)), as_tuple
    if any(isinstance(r, TensorParam) for r in read):
        raise AnnotationError(f"{qualname}: a tuple return contract must be all tensors")
    return None, False


def _hint_text(tp: Any) -> str:
    """A hint as a report words it: a class by its name, anything else without module prefixes."""
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("jaxtyping.", "").replace("typing.", "").replace("torch.", "")


def _check_options(qualname: str, options: ContractOptions, sig: inspect.Signature,
                   tensors: Mapping[str, TensorParam], scalars: Mapping[str, ScalarParam]) -> None:
    config, config_arg = options.config, options.config_arg
    if config_arg is not None and config_arg not in sig.parameters:
        raise AnnotationError(f"{qualname}: config_arg={config_arg!r} is not a parameter")
    if config is not None and config_arg is not None:
        raise AnnotationError(f"{qualname}: give either config= or config_arg=, not both")
    for tp in tensors.values():
        other = tp.spec.same_dtype_as
        if other is not None and other not in tensors:
            raise AnnotationError(f"{qualname}: argument {tp.name!r}: same_dtype_as={other!r} is not a tensor "
                                  f"argument")
    roles = set(DTYPE_ROLES) | set(config_dtypes(config)) if config is not None else set(DTYPE_ROLES)
    for tp in tensors.values():
        role = tp.spec.config_dtype
        if role is not None and role not in roles:
            raise AnnotationError(f"{qualname}: argument {tp.name!r}: config_dtype={role!r} is not a dtype role "
                                  f"(known: {', '.join(sorted(roles))}; a fixed config adds the roles its "
                                  "contract_dtypes() returns)")
    for b in options.bind_first:
        if b not in tensors:
            raise AnnotationError(f"{qualname}: bind_first names {b!r}, which is not a tensor argument")
    for sp in scalars.values():
        if sp.match is not None and config is not None and not hasattr(config, sp.match.attr):
            raise AnnotationError(f"{qualname}: argument {sp.name!r}: kc.MatchConfig({sp.match.attr!r}) names no "
                                  f"attribute of the config ({type(config).__name__})")
