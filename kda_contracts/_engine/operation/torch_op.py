"""``op.torch_op``: an op as a ``torch.library`` custom op whose fake (meta) implementation is
the contract, so torch.compile, torch.export and ``opcheck`` see exactly the shapes, dtypes and
devices the contract accepts.

- Arguments: the op's tensor and scalar (float, int, bool, str, optional ones) parameters, plus
  ``backend: str = "auto"``, all by position or name (keyword-only ones of the op included; a
  required one that follows a parameter with a default gets the default None, refused by the
  contract).
  A parameter of another type (a config object) is left out and
  takes its default; one without a default cannot be part of a custom op (AnnotationError).
- Mutated arguments: the tensors marked ``kc.Spec(mutated=True)``.
- Outputs: none when the op returns its own arguments (``returns=``; they are mutated in
  place); otherwise the tensors of the return annotation, shaped by the call's dims, with the
  dtype of ``kc.Spec(same_dtype_as=...)``, else the one dtype allowed, else that of the first
  tensor argument whose dtype is allowed, on the device of the first tensor argument.
- Output layout: the one the return annotation declares, ``kc.Spec(dim_order=...)`` (a
  transposed ``[B, D]`` result: ``dim_order=(1, 0)``, strides ``[1, B]``), else contiguous. torch
  trusts the fake's strides (inductor's code reads the output with them; opcheck compares them),
  so the real kernel's output must have them too: a backend result whose strides differ (size-1
  dims and empty tensors aside, as torch compares them) is refused with a LayoutError, on every
  call in every mode (one stride comparison per output), whose fix says what to declare. Refused,
  not copied: a silent ``.contiguous()`` would cost a copy of every output on every call, throw
  away the layout the backend chose, and make the custom op return another layout than the op
  itself; the declaration makes both agree at no cost.
- A call that breaks the contract raises its ContractError from the fake implementation, also
  under torch.compile (as a subclass torch lets through: ``except kc.ShapeError`` works). On
  torch < 2.13 dynamo wraps whatever a fake implementation raises in a TorchRuntimeError (the
  report is in its message); there an op without outputs (one that writes its arguments) lets
  the trace go on and its call in the compiled code raises the ContractError, before any
  kernel runs.

Example::

    out = torch.empty_like(x)
    my_op.torch_op(x, w, out)                       # torch.ops.kda_contracts_ops.my_op
    torch.library.opcheck(my_op.torch_op, (x, w, out))
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import torch

from ..compile.marks import TORCH_2_13, tracing
from ..errors import AnnotationError, ContractError, LayoutError, Violation, passthrough_for_compile, raise_violations
from ..grammar.dims import ANY, Broadcast, Expr, Variadic
from ..model.markers import Spec
from ..model.spec import TensorNode
from ..reading.arrays import split_optional
from ..rules.order import dense_in_order, dense_order_of, order_strides
from ..rules.tensor import fmt_ints
from .protocol import OpParts
from .registry import library_name

_SCALARS = (float, int, bool, str)
# torch 2.13's dynamo lets an IndexError out of a fake kernel as itself (errors.passthrough_for_compile);
# torch 2.11's wraps every exception in a TorchRuntimeError (2.12 not checked: treated as 2.11)
_FAKE_ERRORS_PASS = TORCH_2_13


def _schema_params(o: OpParts) -> tuple[list[inspect.Parameter], list[str]]:
    """The custom op's parameters (plain annotations torch can infer a schema from), and the
    names of the op's parameters left out (they take their defaults)."""
    spec = o.contract.spec
    kept: list[inspect.Parameter] = []
    left: list[str] = []
    for p in o.signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise AnnotationError(f"{o.name}: a custom op cannot take *{p.name}; give the op named parameters")
        if p.kind is p.POSITIONAL_ONLY:
            raise AnnotationError(f"{o.name}: parameter {p.name!r} is positional-only; a custom op passes its "
                                  "arguments by name: drop the '/'")
        kind = p.POSITIONAL_OR_KEYWORD  # a custom op takes every argument by position or name
        if p.name in spec.tensors:
            ann: Any = torch.Tensor | None if spec.tensors[p.name].optional else torch.Tensor
        elif p.name in spec.scalars:
            inner, optional = split_optional(spec.scalars[p.name].hint)
            if inner not in _SCALARS:
                if p.default is inspect.Parameter.empty:
                    raise AnnotationError(f"{o.name}: parameter {p.name!r} ({inner}) cannot be a custom op argument "
                                          "and has no default to stand in for it")
                left.append(p.name)
                continue
            ann = inner | None if optional or spec.scalars[p.name].optional else inner
        else:
            raise AnnotationError(f"{o.name}: parameter {p.name!r} (tensors inside a container) cannot be a custom "
                                  "op argument")
        default = p.default
        if default is p.empty and any(q.default is not q.empty for q in kept):
            # A required keyword-only parameter after one with a default (``pad=-1, *, out``): in a
            # custom op every argument goes by position too, so it defaults to None, which the
            # contract refuses on a call.
            default, ann = None, ann | None
        kept.append(inspect.Parameter(p.name, kind, default=default, annotation=ann))
    kept.append(inspect.Parameter("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="auto", annotation=str))
    return kept, left


def _output_rule(o: OpParts, tp: TensorNode) -> Any:
    """How the fake implementation makes one output: ``(dims, dtype_of(values))``."""
    for d in tp.dims:
        if d is ANY or (isinstance(d, Variadic) and d.name is None):
            raise AnnotationError(f"{o.name}: output {tp.symbolic()}: a custom op must know every output size, and "
                                  f"{d} is bound to nothing; name the dim")
    spec = o.contract.spec
    if tp.spec.same_dtype_as is not None:
        src = tp.spec.same_dtype_as
        return lambda values: values[src].dtype
    if len(tp.dtypes) == 1:
        (only,) = tp.dtypes
        return lambda values: only
    candidates = [n for n, t in spec.tensors.items() if t.dtypes & tp.dtypes]
    if not candidates:
        raise AnnotationError(f"{o.name}: output {tp.symbolic()}: cannot tell its dtype; add "
                              "kc.Spec(same_dtype_as='arg') to the return annotation")

    def dtype_of(values: dict[str, Any]) -> torch.dtype:
        for n in candidates:
            t = values.get(n)
            if isinstance(t, torch.Tensor) and t.dtype in tp.dtypes:
                return t.dtype
        return next(iter(sorted(tp.dtypes, key=str)))

    return dtype_of


def _shape(tp: TensorNode, env: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for d in tp.dims:
        if isinstance(d, Variadic):
            out.extend(env[d.key])
        elif isinstance(d, Broadcast):
            out.append(d.dim.evaluate(env))
        else:
            assert isinstance(d, Expr)
            out.append(d.evaluate(env))
    return out


def make_torch_op(o: OpParts) -> Any:
    """Register ``o`` as ``torch.ops.<namespace>.<name>`` (see the module docstring)."""
    params, left_out = _schema_params(o)
    spec = o.contract.spec
    mutated = tuple(n for n, t in spec.tensors.items() if t.spec.mutated)
    if o.returns is not None:
        outs: tuple[TensorNode, ...] = ()
        unmarked = [n for n in ((o.returns,) if isinstance(o.returns, str) else o.returns) if n not in mutated]
        if unmarked:
            raise AnnotationError(f"{o.name}: returns= {', '.join(unmarked)}, which the op must then write: mark "
                                  "them kc.Spec(mutated=True)")
    else:
        outs = spec.returns or ()
    rules = [_output_rule(o, tp) for tp in outs]
    names = [p.name for p in params]
    ret: Any = None if not outs else torch.Tensor if not spec.returns_tuple and len(outs) == 1 else \
        tuple[tuple(torch.Tensor for _ in outs)]  # type: ignore[misc]

    def values_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        backend = bound.pop("backend", "auto")
        for n, p in o.signature.parameters.items():
            if n not in bound:
                bound[n] = None if p.default is p.empty else p.default  # see _schema_params
        return bound, backend

    def impl(*args: Any, **kwargs: Any) -> Any:
        values, backend = values_of(args, kwargs)
        res = o(**values, backend=backend)  # type: ignore[operator]  # each op's class has a generated __call__
        if not outs:
            return None
        made = tuple(r.clone() if _aliases(r, values) else r for r in res) if isinstance(res, tuple) else \
            (res.clone() if _aliases(res, values) else res,)
        _check_layouts(o, outs, made)
        return made if ret is not torch.Tensor else made[0]

    def fake(*args: Any, **kwargs: Any) -> Any:
        values, _ = values_of(args, kwargs)
        try:
            _, c = o.contract_for(values)
            config = c._config_for(values)
            # the generated checker: its dims stay symbolic under torch.compile (the full explain
            # reads every size as an int, which specialised the batch: one graph per size)
            dims = c.run_checks(tuple(values.get(p) for p in c._param_names), config)
            if not outs:
                return None
            env = dict(zip(c.spec.symbols, dims, strict=True))
        except ContractError as err:  # torch would wrap it in a TorchRuntimeError: let it through as itself
            if not outs and not _FAKE_ERRORS_PASS and tracing():
                # torch < 2.13's dynamo wraps anything a fake kernel raises. An op that only writes
                # its arguments needs no shapes from the contract: its call in the compiled code
                # checks the real arguments and raises this error, before any kernel writes.
                return None
            raise passthrough_for_compile(err) from None
        device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        made = [_empty(_shape(tp, env), tp, rule(values), device) for tp, rule in zip(outs, rules, strict=True)]
        return tuple(made) if ret is not torch.Tensor else made[0]

    impl.__signature__ = inspect.Signature(params, return_annotation=ret)  # type: ignore[attr-defined]
    impl.__annotations__ = {p.name: p.annotation for p in params} | {"return": ret}
    impl.__name__ = library_name(o.namespace, o.name, o.fn)
    qualified = f"{o.namespace}::{impl.__name__}"
    try:
        custom = torch.library.custom_op(qualified, mutates_args=mutated)(impl)
    except Exception as exc:
        raise AnnotationError(f"{o.name}: cannot register the custom op {qualified}: {exc}") from exc
    custom.register_fake(fake)
    custom.__kda_left_out__ = tuple(left_out)  # type: ignore[attr-defined]
    return custom


def _layout(tp: TensorNode, rank: int) -> tuple[int, ...]:
    """The dim order an output is made in: the declared ``kc.Spec(dim_order=...)``, else row-major."""
    return tp.spec.dim_order if tp.spec.dim_order is not None else tuple(range(rank))


def _empty(shape: list[Any], tp: TensorNode, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The fake implementation's output: ``shape``, dense in its declared layout."""
    return torch.empty_strided(shape, order_strides(shape, _layout(tp, len(shape))), dtype=dtype, device=device)


def _check_layouts(o: OpParts, outs: tuple[TensorNode, ...], made: tuple[Any, ...]) -> None:
    """Refuse a backend's output whose strides are not the ones the fake implementation gives it
    (see the module docstring): torch.compile's code would read it with the wrong strides."""
    for i, (tp, t) in enumerate(zip(outs, made, strict=False)):
        if not isinstance(t, torch.Tensor):
            continue
        if t.layout != torch.strided or t.is_nested:  # (no strides to give the fake's)
            raise_violations(o.name, [Violation(LayoutError, tp.name, "a strided tensor (op.torch_op's fake "
                                                "implementation makes one)", f"a {t.layout} tensor" +
                                                (" (nested)" if t.is_nested else ""))], {}, {})
        shape, strides = tuple(t.shape), tuple(t.stride())
        order = _layout(tp, len(shape))
        if dense_in_order(shape, strides, order):
            continue
        declared = tp.spec.dim_order is not None or tp.spec.contiguous
        word = "contiguous" if order == tuple(range(len(order))) else f"dense in dim order {order}"
        why = ("op.torch_op's fake implementation (what torch.compile and opcheck see) makes it in its declared "
               "layout" if declared else "op.torch_op's fake implementation (what torch.compile and opcheck see) "
               "makes it contiguous: the return annotation declares no layout")
        raise_violations(o.name, [Violation(
            LayoutError, tp.name, f"{word} (strides {fmt_ints(order_strides(shape, order))})",
            f"strides {fmt_ints(strides)}", (why,), hint=_layout_fix(o, i, tp, shape, strides, declared))],
            {}, {})


_NO_RULES = Spec()


def _layout_fix(o: OpParts, i: int, tp: TensorNode, shape: tuple[int, ...], strides: tuple[int, ...],
                declared: bool) -> str:
    """What to write so that the fake implementation's layout is the backend's."""
    found = dense_order_of(shape, strides)
    if found is None:  # (a slice, a padded row, an expand(): no declaration describes it)
        return ("return a dense tensor from the backend (.contiguous(), or one dense in an order declared with "
                "kc.Spec(dim_order=...) in the return annotation)")
    fields = {k: v for k, v in vars(tp.spec).items() if v != getattr(_NO_RULES, k)
              and k not in ("contiguous", "inner_contiguous", "dim_order")}
    spec = ", ".join([*(f"{k}={v!r}" for k, v in fields.items()), f"dim_order={found!r}"])
    fix = f"declare the result's layout: {_annotation_text(o, i, tp, f'kc.Spec({spec})')}"
    return f"return the result in its declared layout, or {fix}" if declared else fix


def _annotation_text(o: OpParts, i: int, tp: TensorNode, spec: str) -> str:
    """``Annotated[Float[Tensor, "B D"], <spec>]``, the annotation of output ``i`` with ``spec``."""
    category = "Float"
    try:
        hint: Any = typing.get_type_hints(o.contract.fn, include_extras=True).get("return")
        if typing.get_origin(hint) is tuple:
            hint = typing.get_args(hint)[i]
        while typing.get_origin(hint) is typing.Annotated or split_optional(hint)[1]:
            hint = split_optional(typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated
                                  else hint)[0]
        category = hint.dtype.__name__
    except Exception:  # (the annotation cannot be read again: the usual category)
        pass
    where = f"the return annotation of {o.name}" if tp.name == "return" else \
        f"item {i} of the return annotation of {o.name}"
    return f'Annotated[{category}[Tensor, "{tp.dim_str}"], {spec}] as {where}'


def _aliases(t: Any, values: dict[str, Any]) -> bool:
    """A custom op's output may not alias an input: copy one that does."""
    return isinstance(t, torch.Tensor) and any(
        isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        for v in values.values())


_ = typing  # annotations are built at run time
