"""The function ``@kc.contract`` returns (:func:`build_wrapper`): generated with the contracted
function's exact signature, it reads the mode, runs the checker, strict mode's value checks and
transaction (for functions, generators, coroutines and async generators alike), the function or
its body runner, and the return checker.

Example::

    wrapper = build_wrapper(contract, None)     # what kc.contract(fn) returns
"""

from __future__ import annotations

import functools
import inspect
import itertools
import keyword
from collections.abc import Callable
from typing import Any

import torch
from beartype.roar import BeartypeCallHintParamViolation

from .. import modes
from ..codegen.snippets import Names
from ..codegen.wrapper import wrapper_source
from ..compile.marks import (
    eager_value_checks,
    outside_compile,
)
from ..errors import (
    raise_violations,
)
from ..rules.aliasing import alias_violations, tensor_leaves
from ..rules.memory import without_data
from ..source import define
from .body import body_uses_checks, runner
from .compiled import Contract
from .transaction import Transaction, guarded, rollback

_ids = itertools.count()  # a serial number per wrapper, in its source's file name


def _call_kind(fn: Callable[..., Any]) -> str:
    """How a contracted function runs, for its strict-mode guard (:func:`transaction.guarded`)."""
    if inspect.isasyncgenfunction(fn):
        return "async generator"
    if inspect.isgeneratorfunction(fn):
        return "generator"
    return "async" if inspect.iscoroutinefunction(fn) else "function"


class _Hooks:
    """The wrapper's slow paths for one contract, each taking the checked arguments positionally:
    word a rejection, strict mode's transaction and value checks, a rejected result."""

    def __init__(self, c: Contract) -> None:
        self.c = c
        self.names = c._param_names
        # strict mode copies every tensor the function is declared to write before it runs, and puts
        # the copies back if the call does not return, or returns a rejected result: anything the
        # function calls may reject the call midway (a kc.check in a helper, another contracted
        # function), which its code does not show
        self.mutated = [i for i, p in enumerate(self.names) if p in c.written]
        self.written = [self.names[i] for i in self.mutated]
        self.whole = dict.fromkeys(self.written)

    def values(self, *vals: Any) -> dict[str, Any]:
        return dict(zip(self.names, vals, strict=True))

    def fail(self, *vals: Any) -> None:
        values = self.values(*vals)
        self.c.fail(values, self.c._config_for(values))

    def fail_types(self, *vals: Any) -> None:
        self.c.fail_types(self.values(*vals))

    def snap(self, *vals: Any) -> Transaction | None:
        """Strict mode, before the function runs: its transaction, a copy of each tensor it is
        declared to write (not while torch.compile traces: the copy would become part of the graph)."""
        if torch.compiler.is_compiling():
            return None
        return Transaction.begin({self.names[i]: vals[i] for i in self.mutated}, self.whole)

    def fail_return(self, res: Any, saved: Transaction | None, *vals: Any) -> None:
        rollback(saved)  # (strict mode: a rejected call changes no tensor)
        # the dims again, from the arguments: under torch.compile the traced ones may be symbolic
        c = self.c
        dims = c._check(*vals, c._config_for(self.values(*vals)))
        if dims is not None:
            c.fail_return(res, dims, self.values(*vals), rolled_back=bool(saved))

    def strict(self, dims: tuple[int, ...], *vals: Any) -> None:
        c, values = self.c, self.values(*vals)
        config = c._config_for(values)
        env = dict(zip(c.spec.symbols, dims, strict=True))
        if self.written:  # what the function writes shares no byte with another tensor (as an op's call)
            found = [] if without_data(values) else alias_violations(tensor_leaves(values), self.written,
                                                                       function=c.name)
            if found:
                c.rejections += 1
                raise_violations(c.name, found, env, c.provenance(config))
        c.run_value_checks(values, config, env, c.provenance(config))


def build_wrapper(c: Contract, fixed_mode: int | None) -> Callable[..., Any]:
    """The function ``@kc.contract`` returns for ``c`` (``fixed_mode``: a pinned mode, else the one in force)."""
    spec, h = c.spec, _Hooks(c)
    fn_name = getattr(c.fn, "__name__", "wrapper")
    if not fn_name.isidentifier() or keyword.iskeyword(fn_name):
        fn_name = "wrapper"
    n = Names([*(p for p in spec.signature.parameters), fn_name])
    ns: dict[str, Any] = {
        n("enter"): modes.counting_mode(c, fixed_mode),
        n("types"): c.check_types,  # (marked in Contract.__init__)
        n("TypeViolation"): BeartypeCallHintParamViolation,
        n("fail_types"): outside_compile(h.fail_types),
        n("check"): c._check,
        n("fail"): outside_compile(h.fail),
        n("strict"): eager_value_checks(h.strict, c.name),
        n("fn"): c.fn,
        n("check_return"): c.result_checker(),
        n("fail_return"): outside_compile(h.fail_return),
        n("snap"): h.snap,
        n("watch"): c._watch,
        n("static_cfg"): spec.config,
    }
    for i, p in enumerate(spec.signature.parameters.values()):
        if p.default is not inspect.Parameter.empty:
            ns[n("default", i)] = p.default
    is_async = inspect.iscoroutinefunction(c.fn)
    kind = _call_kind(c.fn)
    ns[n("body")] = runner(spec.name, spec.symbols, c.fn, is_async)
    ns[n("guarded_body")] = guarded(ns[n("body")], kind)
    ns[n("guarded_fn")] = guarded(c.fn, kind)
    src = wrapper_source(spec, fn_name, n, has_return=c.result_checker() is not None,
                         value_checks=spec.value_checks is not None or bool(spec.value_rules) or bool(h.written),
                         watch=c._watch is not None,
                         beartype_first=not c.types_in_checker,
                         body=body_uses_checks(c.fn), is_async=is_async, saves=bool(h.mutated))
    wrapper = define(src, f"<kda_contracts wrapper for {spec.name} #{next(_ids)}>", fn_name, ns)
    functools.update_wrapper(wrapper, c.fn)
    wrapper.__kda_contract__ = c  # type: ignore[attr-defined]
    wrapper.__wrapped__ = c.fn  # type: ignore[attr-defined]
    return wrapper
