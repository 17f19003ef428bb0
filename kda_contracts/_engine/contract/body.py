"""Checks inside a contracted function's body: ``kc.check``, ``kc.dims`` and ``isinstance`` against
jaxtyping types, all against the dims the call bound.

While a contracted function whose body mentions ``check``, ``dims`` or ``isinstance`` runs, the
call's dims are held in a context variable (so threads and asyncio tasks each see their own
call) and handed to jaxtyping's shape memo, so ``isinstance(x, Float[Tensor, "B D"])`` means "B
and D of this call". Other functions pay nothing for it.

Example::

    @kc.contract
    def attend(q: Float[Tensor, "B H D"], k: Float[Tensor, "B H D"]) -> Float[Tensor, "B H D"]:
        scores = q @ k.transpose(-1, -2)
        kc.check(scores, "B H H", name="scores")      # the call's B and H
        return scores @ k
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from ..compile.marks import mark_constant_result, tracing
from ..errors import (
    AnnotationError,
    ContractError,
    DtypeError,
    ShapeError,
    Violation,
    passthrough_for_compile,
    raise_violations,
)
from ..grammar.dims import parse_shape
from ..model.nodes import match_dims
from ..reading.arrays import is_array_type
from ..rules.tensor import dtype_name, fmt_ints

_BODY_NAMES = frozenset({"check", "dims", "isinstance"})


@dataclass
class _Call:
    name: str
    env: dict[str, Any]
    provenance: dict[str, str] = field(default_factory=dict)


_CURRENT: ContextVar[_Call | None] = ContextVar("kda_contracts_call", default=None)


@mark_constant_result  # dynamo cannot trace ContextVar.get (compiled bodies use _TRACED instead)
def _current_eager() -> _Call | None:
    return _CURRENT.get()


# The calls whose bodies torch.compile is tracing, innermost last: a plain list, which dynamo traces
# (its appends and pops are side effects it replays), holding the call's dims as traced values, so
# that kc.check in a compiled body compares against the call's dims (guards, not constants).
_TRACED: list[_Call] = []


def _current() -> _Call | None:
    # Under torch.compile only the traced list is read. (A body compiled on its own after a graph
    # break inside it sees no call: the context variable could be read at trace time, but as an
    # unguarded constant, so later calls would be judged against the first call's dims.)
    if torch.compiler.is_compiling():  # (a constant under dynamo: the branch is not traced)
        return _TRACED[-1] if _TRACED else None
    return _current_eager()


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def body_uses_checks(fn: Callable[..., Any]) -> bool:
    """Whether a function's code mentions ``check``, ``dims`` or ``isinstance`` (then its body
    runs with the call's dims in context)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    return code is not None and not _BODY_NAMES.isdisjoint(_code_names(code))


def _jaxtyping_memo(env: dict[str, Any]) -> bool:
    """Give jaxtyping's shape memo the call's dims (so isinstance agrees with the contract)."""
    try:
        from jaxtyping._storage import push_shape_memo
    except ImportError:  # a jaxtyping without the memo: isinstance checks standalone
        return False
    single, variadic, _, _ = push_shape_memo({})
    for k, v in env.items():
        if isinstance(v, tuple):
            variadic[k.removeprefix("*")] = (False, v)
        elif isinstance(v, int):
            single[k] = v
    return True


@contextmanager
def in_body(name: str, env: dict[str, Any]) -> Iterator[None]:
    """Run the block as the body of call ``name`` with bound dims ``env``."""
    token = _CURRENT.set(_Call(name, env))
    pushed = _jaxtyping_memo(env)
    try:
        yield
    finally:
        if pushed:
            from jaxtyping._storage import pop_shape_memo

            pop_shape_memo()
        _CURRENT.reset(token)


def runner(name: str, symbols: tuple[str, ...], fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    """``fn`` called as ``runner(dims, *args, **kwargs)``: the body runs with the call's dims."""
    if is_async:
        async def run_async(bound: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
            with in_body(name, dict(zip(symbols, bound, strict=True))):
                return await fn(*args, **kwargs)

        return run_async

    @functools.wraps(fn)
    def run(bound: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # the dims as traced values, on a list dynamo traces
            _TRACED.append(_Call(name, dict(zip(symbols, bound, strict=True))))
            try:
                return fn(*args, **kwargs)
            finally:
                _TRACED.pop()
        with in_body(name, dict(zip(symbols, bound, strict=True))):
            return fn(*args, **kwargs)

    return run


def dims() -> dict[str, Any]:
    """The dims the current contracted call bound (``{}`` outside one); in-body ``kc.check``
    calls add the dims they bind. Variadic dims appear as ``"*name"`` with a tuple of sizes.

    Example::

        B, D = kc.dims()["B"], kc.dims()["D"]
    """
    call = _current()
    return dict(call.env) if call is not None else {}


def check(t: Any, spec: Any, name: str = "tensor") -> Any:
    """Check ``t`` against a dim string (``"B H*P"``) or a jaxtyping type (``Float[Tensor, "B D"]``),
    with the current call's dims inside a contracted body (binding new dims for the rest of the
    body) or on its own outside one. Returns ``t``; raises a ShapeError/DtypeError report.

    Example::

        y = kc.check(x @ w, "B E", name="y")
    """
    call = _current()
    env = call.env if call is not None else {}
    where = call.name if call is not None else "kc.check"
    dtypes = None
    if is_array_type(spec):
        from ..reading.arrays import array_dtypes, unsupported_array_type

        if (why := unsupported_array_type(spec)) is not None:
            raise AnnotationError(f"kc.check: {why}")
        dim_str, dtypes = spec.dim_str, array_dtypes(spec, None, f"{where}: check({name})")
    elif isinstance(spec, str):
        dim_str = spec
    else:
        raise AnnotationError(f"kc.check: spec must be a dim string or a jaxtyping type, got {spec!r}")
    dims_ = parse_shape(dim_str, f"{where}: check({name})")
    if isinstance(t, torch.Tensor) and not t.is_nested and (dtypes is None or t.dtype in dtypes):
        trial = dict(env)
        if match_dims(dims_, tuple(t.shape), trial) is None:
            env.update(trial)
            return t
    _reject(t, dim_str, dtypes, name, where, env)
    return t


def _reject_impl(t: Any, dim_str: str, dtypes: Any, name: str, where: str, env: dict[str, Any]) -> None:
    """Raise the report of a failed ``kc.check`` (under torch.compile: at trace time, on the real
    tensor, never traced, as a class dynamo lets through; see decorator.outside_compile)."""
    try:
        if not isinstance(t, torch.Tensor) or t.is_nested:
            got = "a nested tensor (no single shape)" if isinstance(t, torch.Tensor) else type(t).__name__
            problem = Violation(ShapeError, name, f"a tensor [{dim_str}]", got)
        elif dtypes is not None and t.dtype not in dtypes:
            problem = Violation(DtypeError, name, " or ".join(sorted(dtype_name(d) for d in dtypes)),
                                dtype_name(t.dtype))
        else:
            why = match_dims(parse_shape(dim_str, f"{where}: check({name})"), tuple(t.shape), dict(env))
            problem = Violation(ShapeError, name, f"[{dim_str}]", fmt_ints(t.shape), (why or "",))
        raise_violations(where, [problem], {k: v for k, v in env.items() if isinstance(v, int)}, {})
    except ContractError as err:
        if tracing():
            raise passthrough_for_compile(err) from None
        raise


_reject = mark_constant_result(_reject_impl)
