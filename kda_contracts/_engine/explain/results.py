"""The slow path for a result: every way a function's (or a backend's) result breaks the return
annotation, worded as violations with the call's dims (the same rules an argument of that
annotation meets; a dim a container item fixed is matched exactly, a dim that divides by zero is
said so).

Example::

    violations = explain_return(contract.spec, result, dims, values)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import NoneType
from typing import Any

import torch

from ..errors import ArgumentTypeError, ShapeError, Violation
from ..grammar.dims import Broadcast, Expr, dim_symbols, fits_variadic
from ..model.nodes import match_dims
from ..model.spec import (
    ContractSpec,
    TensorNode,
    call_device,
    result_env,
)
from ..rules.tensor import fmt_ints
from .explainer import concrete_dim


def explain_return(spec: ContractSpec, result: Any, env: Mapping[str, int],
                   values: Mapping[str, Any] | None = None) -> list[Violation]:
    """Every violation of a result against the return annotation (slow path); ``values``, the
    call's arguments by name, give ``kc.Spec(same_dtype_as=...)`` its dtype."""
    if spec.returns is None:  # a return annotation without tensors (checked with beartype)
        hint = spec.return_hint
        want = "None" if hint is NoneType else getattr(hint, "__name__", None) if isinstance(hint, type) else None
        want = want or str(hint).replace("typing.", "").replace("torch.", "")
        return [Violation(ArgumentTypeError, "return", want, type(result).__name__,
                          ("the function returned a value its return annotation does not allow",))]
    items = result if spec.returns_tuple else (result,)
    if spec.returns_tuple and (not isinstance(items, tuple) or len(items) != len(spec.returns)):
        return [Violation(ShapeError, "return", f"a tuple of {len(spec.returns)} tensors", type(result).__name__)]
    violations: list[Violation] = []
    env = result_env(spec, tuple(env.get(s) for s in spec.symbols), values)
    for tp, t in zip(spec.returns, items, strict=True):
        if not isinstance(t, torch.Tensor):
            if not (tp.optional and t is None):
                violations.append(Violation(ArgumentTypeError, tp.name, "a torch.Tensor", type(t).__name__))
            continue
        got = tuple(t.shape)
        try:
            shape_ok = _result_shape_ok(tp, got, env)
        except ZeroDivisionError:
            conc = "[" + ", ".join(concrete_dim(d, env) for d in tp.dims) + "]"
            violations.append(Violation(ShapeError, tp.name, f"{tp.symbolic()} = {conc}", fmt_ints(got),
                                        (f"a dim of {tp.symbolic()} divides by zero with "
                                         + ", ".join(f"{k}={env[k]}" for k in sorted(tp.symbols()) if k in env),)))
            continue
        if not shape_ok:
            conc = "[" + ", ".join(concrete_dim(d, env) for d in tp.dims) + "]"
            violations.append(Violation(ShapeError, tp.name, f"{tp.symbolic()} = {conc}", fmt_ints(got),
                                        ("the function returned a tensor of the wrong shape",)))
            continue
        broken = _broken_rule(spec, tp, t, values)
        if broken is not None:
            violations.append(broken)
    return violations


def _broken_rule(spec: ContractSpec, tp: TensorNode, t: torch.Tensor, values: Mapping[str, Any] | None
                 ) -> Violation | None:
    """The first rule of a result tensor it breaks (the rules an argument of its annotation would
    have, decided with their own tests); what needs the call's arguments is skipped without them."""
    device = call_device(spec, values)
    for rule in tp.rules:
        other = values.get(rule.other_argument() or "") if values is not None else None
        slots = {"value": t, "dtype": t.dtype, "shape": tuple(t.shape), "strides": tuple(t.stride()),
                 "device": device, "config_value": None,
                 "other_dtype": other.dtype if isinstance(other, torch.Tensor) else None}
        if "device" in rule.needs and slots["device"] is None:
            continue
        if rule.broken(**slots):
            return rule.violation(**slots)
    return None


def _result_shape_ok(tp: TensorNode, got: tuple[int, ...], env: dict[str, Any]) -> bool:
    if weak_symbols_used(tp, env):  # the result binds what nothing bound, as the fast path does
        return match_dims(tp.dims, got, env) is None
    v, vi = tp.variadic, tp.variadic_index
    if len(got) < tp.rank if v is not None else len(got) != tp.rank:
        return False
    for axis, d in tp.fixed_axes():
        expr = d.dim if isinstance(d, Broadcast) else d
        if not isinstance(expr, Expr) or any(env.get(s) is None for s in expr.symbols()):
            continue  # a dim bound to nothing: the result may bind it
        if got[axis] != expr.evaluate(env) and not (isinstance(d, Broadcast) and got[axis] == 1):
            return False
    if v is not None and v.name is not None and vi is not None:
        return fits_variadic(got[vi:len(got) - (len(tp.dims) - 1 - vi)], v.broadcast, env.get(v.key))
    return True


def weak_symbols_used(tp: TensorNode, env: Mapping[str, Any]) -> bool:
    """Whether a result tensor mentions a dim the call bound to nothing."""
    return any(x not in env for d in tp.dims for x in dim_symbols(d))
