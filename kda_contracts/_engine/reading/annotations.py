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
from dataclasses import replace
from types import NoneType
from typing import Any

import torch
from beartype.door import is_bearable

from ..errors import AnnotationError, _hint_text
from ..grammar.constraints import parse_constraint
from ..grammar.dims import Variadic, parse_shape
from ..model.markers import DTYPE_ROLES, MatchConfig, Range, Spec, Where, config_dtypes, read_metadata
from ..model.nodes import CALL_DEVICE, tensor_rules
from ..model.spec import NO_HINT, ContractOptions, ContractSpec, NestedParam, ScalarParam, TensorNode
from ..model.type_verdict import BEARTYPE_CONF, dtype_names, is_typeddict
from ..rules.scalar import scalar_param_rules
from .arrays import _is_jaxtyping_array, array_dtypes, int_hint, split_optional, unalias, unsupported_array_type
from .plan import plan_binding
from .structure import mentions_array, read_structure

# -- the parsed contract -------------------------------------------------------------------------


# -- reading annotations -------------------------------------------------------------------------


def _read_param(name: str, annotation: Any, where: str) -> TensorNode | ScalarParam | NestedParam | None:
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
        if spec.dim_order is not None:
            _check_dim_order(spec, len(dims) if v is None else None, where)
        return TensorNode(name, inner.dim_str, dims, array_dtypes(inner, spec, where), spec, optional)
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


def _check_dim_order(spec: Spec, rank: int | None, where: str) -> None:
    """A ``kc.Spec(dim_order=...)`` must be a permutation of the axes of a tensor of fixed rank
    (``rank``; None: it has a variadic dim), and the only layout rule."""
    order = spec.dim_order
    if rank is None:
        raise AnnotationError(f"{where}: dim_order={order!r} needs a tensor of fixed rank; this one has a variadic "
                              "dim")
    if not isinstance(order, tuple) or any(type(a) is not int for a in order) \
            or sorted(order) != list(range(rank)):
        raise AnnotationError(f"{where}: dim_order={order!r} must list each of the tensor's {rank} axes once, "
                              f"outermost first (a permutation of {tuple(range(rank))}, as torch's "
                              "Tensor.dim_order() gives it)")
    others = [k for k in ("contiguous", "inner_contiguous") if getattr(spec, k)]
    if others:
        raise AnnotationError(f"{where}: dim_order= fixes every stride; drop {others[0]}= (contiguous=True is "
                              f"dim_order={tuple(range(rank))})")


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
        if r.spec.same_dtype_as is not None:
            _refuse_disjoint_dtypes(f"{qualname}: {r.name}", r, tensors[r.spec.same_dtype_as])
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
    if returns is not None:
        # a result is held to the call's device: the first tensor argument's, else the containers' one
        call = first_tensor if first_tensor is not None else CALL_DEVICE if nested else None
        returns = tuple(replace(r, rules=tensor_rules(r, call)) for r in returns)
    scalars = {n: replace(sp, rules=scalar_param_rules(
        # (an int that binds a dim is a size: a negative one is its own fault, not the tensors')
        sp.name, sp.range if sp.range is not None or sp.name not in plan.scalar_sources else Range(ge=0),
        sp.optional, sp.match, sp.constraints,
        dim=sp.name if sp.name in plan.symbols and sp.name not in plan.scalar_sources and int_hint(sp.hint) else None))
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
                 ) -> tuple[dict[str, TensorNode], dict[str, ScalarParam], dict[str, NestedParam]]:
    tensors: dict[str, TensorNode] = {}
    scalars: dict[str, ScalarParam] = {}
    nested: dict[str, NestedParam] = {}
    for p in sig.parameters.values():
        hint = hints_map.get(p.name, inspect.Parameter.empty)
        where = f"{qualname}: argument {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            # passed through unchecked: unannotated, Any, or a ParamSpec's P.args / P.kwargs (any arguments)
            if hint in (inspect.Parameter.empty, Any, object) or isinstance(hint, _PARAM_SPEC_PARTS):
                continue
            # each value the parameter collects is checked against its annotation, as the items of the
            # tuple (*args) or the values of the dict (**kwargs) Python hands the function
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            where = f"{qualname}: argument {star}{p.name}"
            if typing.get_origin(hint) in _UNPACK:  # *args: Unpack[tuple[...]] / **kwargs: Unpack[TypedDict]
                hint = _unpacked(typing.get_args(hint)[0], p.kind is p.VAR_POSITIONAL, where)
                if hint is None:  # *args: Unpack[Ts], a TypeVarTuple: any items, as an unannotated *args
                    continue
            else:
                hint = tuple[hint, ...] if p.kind is p.VAR_POSITIONAL else dict[str, hint]  # type: ignore[valid-type]
        read = _read_param(p.name, hint, where)
        if isinstance(read, ScalarParam):
            _refuse_unbearable(read.hint, where)
        if p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            _refuse_breaking_default(read, p.default, where)
        if isinstance(read, TensorNode):
            tensors[p.name] = read
        elif isinstance(read, ScalarParam):
            scalars[p.name] = read
        elif isinstance(read, NestedParam):
            nested[p.name] = read
    return tensors, scalars, nested


def _unpacked(inner: Any, positional: bool, where: str) -> Any:
    """The hint the collected ``*args`` tuple / ``**kwargs`` dict is checked against for ``Unpack[inner]``
    (PEP 646 / PEP 692): the tuple type itself, or the TypedDict; None for a TypeVarTuple (no constraint)."""
    if positional and isinstance(inner, _TYPE_VAR_TUPLES):
        return None
    if positional and typing.get_origin(inner) is tuple:
        return inner
    if not positional and is_typeddict(inner):
        return inner
    what = "a tuple type or a TypeVarTuple" if positional else "a TypedDict"
    raise AnnotationError(f"{where}: Unpack[{_hint_text(inner)}] on this parameter takes {what}")


def _refuse_disjoint_dtypes(where: str, tp: TensorNode, other: TensorNode) -> None:
    """``same_dtype_as=`` between two tensors whose annotations share no dtype can never hold."""
    if tp.dtypes and other.dtypes and not tp.dtypes & other.dtypes:
        raise AnnotationError(f"{where}: same_dtype_as={other.name!r}, but its dtypes ({dtype_names(tp.dtypes)}) "
                              f"and {other.name}'s ({dtype_names(other.dtypes)}) have none in common: no call could "
                              "pass")


def _refuse_breaking_default(read: TensorNode | ScalarParam | NestedParam | None, default: Any, where: str) -> None:
    """A default its own annotation refuses would make every call that leaves the argument out a
    violation blamed on the caller: an AnnotationError here instead (``y: Float[Tensor, "b"] = None``
    wants ``| None``). A tensor default is not judged here (its dims are the call's)."""
    if read is None or isinstance(default, torch.Tensor):
        return
    if isinstance(read, TensorNode):
        refused = default is None and not read.optional
    elif isinstance(read, ScalarParam):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            refused = not is_bearable(default, read.hint, conf=BEARTYPE_CONF)
    elif default is None:
        refused = read.node.match(None, {}, read.name) is not None
    else:
        return
    if refused:
        fix = "add | None to the annotation" if default is None else "give a default of the annotated type"
        raise AnnotationError(f"{where}: the default {default!r} does not fit the annotation, so every call that "
                              f"leaves it out would be refused; {fix}")


def _refuse_unbearable(hint: Any, where: str, subject: str = "it") -> None:
    """A hint beartype cannot check (``x: 3``, ``x: ClassVar[int]``, a Protocol that is not
    runtime-checkable) is an AnnotationError here, at decoration, naming the argument (or the return),
    not a failure at every call."""
    try:
        with warnings.catch_warnings():  # (its deprecation notes, e.g. typing.Iterator, are not ours to print)
            warnings.simplefilter("ignore")
            is_bearable(None, hint, conf=BEARTYPE_CONF)
    except Exception as exc:
        raise AnnotationError(f"{where}: {_hint_text(hint)} cannot be checked ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160]}); annotate {subject} with a checkable type, or leave "
                              "it unannotated") from exc


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
    _refuse_unbearable(ret, f"{qualname}: return", "the return")
    return ret


def _special_forms(*names: str) -> tuple[Any, ...]:
    import typing_extensions

    return tuple({getattr(m, n) for m in (typing, typing_extensions) for n in names if hasattr(m, n)})


# return annotations that are not checked: ``Self`` (the class of the first argument: a typing notion
# beartype checks only on methods it decorates itself) and ``NoReturn``/``Never`` (the function never
# returns)
_UNCHECKED_RETURNS = _special_forms("Self", "NoReturn", "Never")
_UNPACK = _special_forms("Unpack")
_TYPE_VAR_TUPLES = _special_forms("TypeVarTuple")
_PARAM_SPEC_PARTS = _special_forms("ParamSpecArgs", "ParamSpecKwargs")
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


# kc.Spec fields a return cannot have, and why (dtypes=, same_dtype_as=, same_device=, contiguous=,
# inner_contiguous= and dim_order= are checked on the result as on an argument)
_NOT_ON_RETURNS = {
    "config_dtype": "a result is checked after the call, against the dtypes it declares; use dtypes= or "
                    "same_dtype_as=",
    "disjoint": "it is a rule for tensors a call writes in place",
    "mutated": "a call writes its arguments in place, not its result",
}


def _read_returns(qualname: str, ret: Any) -> tuple[tuple[TensorNode, ...] | None, bool]:
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
    if all(isinstance(r, TensorNode) for r in read):
        for r in read:
            assert isinstance(r, TensorNode)
            unchecked = [k for k, v in vars(r.spec).items() if k in _NOT_ON_RETURNS and v != getattr(Spec(), k)]
            if unchecked:
                raise AnnotationError(f"{qualname}: {r.name}: kc.Spec({unchecked[0]}=...) does not apply to a "
                                      f"return ({_NOT_ON_RETURNS[unchecked[0]]}); drop it")
        return tuple(r for r in read if isinstance(r, TensorNode)), as_tuple
    if any(isinstance(r, TensorNode) for r in read):
        raise AnnotationError(f"{qualname}: a tuple return contract must be all tensors")
    return None, False


def _check_options(qualname: str, options: ContractOptions, sig: inspect.Signature,
                   tensors: Mapping[str, TensorNode], scalars: Mapping[str, ScalarParam]) -> None:
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
        if other is not None:
            _refuse_disjoint_dtypes(f"{qualname}: argument {tp.name!r}", tp, tensors[other])
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
