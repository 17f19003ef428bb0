"""Strict mode's run of an op's backend: the aliasing check, the transaction (what the call
writes, saved), the backend, its result against the return annotation and the op's ``after``
checks; a call rejected after the backend ran is rolled back. Compiled code (and CUDA-graph
capture) runs the backend alone, as check mode does.

Example::

    res = transact(op, chosen, dims, variant, vals, config, args, kwargs)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import hooks
from ..contract.transaction import (
    RESTORED,
    ROLLED_BACK,
    Transaction,
    rollback,
    storage_id,
    undeclared_hint,
    written_parts,
)
from ..errors import AnnotationError, ContractError, Violation, hook_violations, raise_violations
from ..explain.results import explain_return
from ..model.spec import CallContext
from ..rules.memory import without_data
from .backends import BackendError
from .protocol import OpParts
from .table import Chosen


def transact(op: OpParts, chosen: Chosen, dims: tuple[int, ...], variant: str | None, vals: tuple[Any, ...],
              config: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              memo: dict[str, Any] | None = None) -> Any:
    """Strict mode: snapshot what the op writes, run the backend, run the ``after`` checks;
    if the backend raises or a check fails, restore the snapshot, then raise. Compiled code
    (and CUDA-graph capture) runs the backend alone, as check mode does."""
    def run() -> Any:
        return chosen.run(*args, **kwargs) if chosen.direct else chosen.run(dims, variant, *args, **kwargs)

    if torch.compiler.is_compiling():
        return run()
    c = op.contracts[variant]
    values = dict(zip(c._param_names, vals, strict=True))
    env = dict(zip(c.spec.symbols, dims, strict=True))
    ctx = CallContext(c.spec, values, config, env, c.provenance(config), memo=memo if memo is not None else {})
    # asked once (the aliasing check and the snapshot share it); not of tensors without data
    parts = None if without_data(values) else written_parts(op.written, op.name, ctx)
    violations = [] if parts is None else op.alias_violations(ctx, parts)
    if violations:
        c.rejections += 1
        raise_violations(op.name, violations, env, ctx.provenance)
    saved = None if parts is None else Transaction.begin(values, parts)
    try:
        res = run()
    except Exception as exc:
        rollback(saved)
        if isinstance(exc, ContractError):
            raise
        op._failed(chosen.name, exc, vals, config, variant, rolled_back=saved is not None,
                   undeclared=saved.undeclared() if saved is not None else ())
    except BaseException:  # KeyboardInterrupt, SystemExit, a cancelled task: rolled back, then on its way
        rollback(saved)
        raise
    if saved is not None and (undeclared := saved.undeclared()):
        c.rejections += 1
        rollback(saved)
        raise_violations(f"{op.name} (after backend {chosen.name!r})", [Violation(
            BackendError, undeclared[0], f"backend {chosen.name!r} to write only what the op declares it writes",
            f"it wrote {', '.join(undeclared)} in place", hint=undeclared_hint(undeclared))], env, ctx.provenance)
    violations = checks_after(op, ctx, variant, chosen, res, saved)
    if violations:
        c.rejections += 1
        if saved is not None:
            violations = [dataclasses.replace(v, details=(*v.details, ROLLED_BACK)) for v in violations]
        try:  # saved (KDA_CONTRACTS_DUMP_DIR) as the backend left it, then rolled back
            with hooks.rejecting(op, values, config, stage="after", backend=chosen.name):
                raise_violations(f"{op.name} (after backend {chosen.name!r})", violations, env,
                                 ctx.provenance)
        finally:
            rollback(saved)
    return res

def checks_after(op: OpParts, ctx: CallContext, variant: str | None, chosen: Chosen, res: Any,
                  saved: Transaction | None) -> list[Violation]:
    """Strict mode, after the backend: the result against the return annotation, then the
    op's ``after`` checks (a check that raises is a BackendError, the call rolled back)."""
    c = op.contracts[variant]
    check = c.result_checker()
    if check is not None and op.returns is None and not op.returns_none:
        dims = tuple(ctx.dims[s] for s in c.spec.symbols)
        if not check(res, dims, *(ctx.values.get(p) for p in c._param_names)):
            found = explain_return(c.spec, res, dict(ctx.dims), ctx.values)
            if found:
                return found
    if op.returns_none and res is not None and not kept_in_arguments(res, ctx.values.values()):
        return [lost_result_violation(op, chosen.name, res, "")]  # (rolled back: the report says so)
    if op.after is None:
        return []
    try:
        found = op.after(ctx, chosen.name)
    except Exception as exc:
        rollback(saved)
        op._hook_failed("after", "the op's after checks to run on the backend's outputs", exc, subject="they",
                          hint=RESTORED if saved is not None else None)
    try:
        return hook_violations(found, f"{op.name}: after")
    except AnnotationError:
        rollback(saved)  # (the contract's mistake: the call changes nothing either way)
        raise


def kept_in_arguments(res: Any, args: Any) -> bool:
    """Whether what a ``-> None`` op's backend returned is not lost by returning None: None, or only
    tensors in the memory of the call's tensor arguments (an in-place kernel that returns its
    outputs, as fla's do) and None items."""
    items = res if isinstance(res, (tuple, list)) else (res,)
    mine = {storage_id(a) for a in args if isinstance(a, torch.Tensor)} - {None}
    return all(x is None or (isinstance(x, torch.Tensor) and storage_id(x) in mine) for x in items)


def lost_result_violation(op: OpParts, backend: str, res: Any, written: str) -> Violation:
    """The violation of a ``-> None`` op whose backend returned a result of its own (it would be
    lost); ``written``: what the backend may have written, or that strict mode restored it."""
    def what(x: Any) -> str:
        return f"a tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
    got = f"a {type(res).__name__} holding {', '.join(map(what, res))}" if isinstance(res, (tuple, list)) \
        else what(res)
    return Violation(
        BackendError, "backend", f"backend {backend!r} to write its results into the op's arguments "
                                 f"({op.name} is annotated -> None, so it returns None)",
        f"it returned {got} that is none of the call's tensors, and would be lost",
        hint="write the result in place (into the argument the op declares kc.Spec(mutated=True)), or annotate "
             "the op's return and return it" + (f"; {written}" if written else ""))
