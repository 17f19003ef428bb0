"""``@kc.contract``: a compiled :class:`Contract` (spec + generated checker + slow path) and the
registry of contracts.

The happy path is generated Python source: attribute reads, integer
compares and set lookups, no loops, no dict of dims, no message building. It returns the bound
dims as a tuple, or ``None`` at the first failed test; only then does the slow path
(``ContractSpec.explain``) run to collect every violation with provenance and hints.

beartype checks the non-tensor parameters and the Tensor-ness of tensor parameters through a
shim function carrying the stripped annotations (principle 4).
"""


from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from .. import hooks, modes
from ..errors import (
    AnnotationError,
    Violation,
)
from ..model.markers import Where, config_nonint_dims, int_dim_fix
from ..model.spec import NO_HINT, CallContext, ContractOptions, ContractSpec
from ..reading.annotations import build_spec
from ..reading.members import accessors, contract_members, is_contracted
from ..rules.values import ValueRule
from .compiled import Contract
from .options import contract_options
from .wrapping import build_wrapper

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, Contract] = {}


def registered_contracts() -> dict[str, Contract]:
    """Every contract created with ``register=True`` (the default), by name (for docs, CLIs and
    the pytest plugin's summary)."""
    return dict(_REGISTRY)


def register_contract(key: str, c: Contract) -> Contract:
    """Add a contract built without the decorator to :func:`registered_contracts`."""
    _REGISTRY[key] = c
    return c


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
    value_rules: Sequence[ValueRule] = (),
    mode: modes.ModeName | None = None,
    name: str | None = None,
    register: bool = True,
    doc: bool | None = None,
    autograd: bool = False,
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
    value_rules: Sequence[ValueRule] = (),
    mode: modes.ModeName | None = None,
    name: str | None = None,
    register: bool = True,
    doc: bool | None = None,
    autograd: bool = False,
) -> Any:
    """Enforce a function's jaxtyping annotations (plus ``kc.Spec``/``kc.Range``/``where``) per call.

    - ``config``: a ``KDAConfig`` (or any object with ``contract_dims()``, or a pydantic model)
      whose dims every call must agree with; ``config_arg`` instead names a parameter carrying one.
    - ``where``: cross-argument constraints, e.g. ``["HV % H == 0"]``.
    - ``bind_first``: tensors to bind dims from before the others (affects provenance only).
    - ``hints``: callables ``(violation, ctx) -> str | None`` giving a fix for known mistakes.
    - ``value_checks``: callable ``ctx -> [Violation]`` run in strict mode only.
    - ``value_rules``: declared rules over tensor contents (``kc.InRange``, ``kc.Distinct``,
      ``kc.Finite``, ...), read in one sync in strict mode and on the device, without a sync, in
      watch mode.
    - ``mode``: pin this contract's mode (``"off"`` returns ``fn`` itself); None follows
      ``kc.mode``/``KDA_CONTRACTS_MODE``. If the mode in force at decoration is ``off``, ``fn`` is
      returned unchanged: a true zero-cost switch.
    - ``autograd``: tensors marked ``kc.Spec(mutated=True)`` may require grad (the function supports
      autograd); by default one that does is rejected before anything is written.
    - ``doc``: append the contract's shape table to the wrapper's ``__doc__`` (for ``help()``, IDE
      hovers, Sphinx); None follows ``kc.set_contract_docs`` / ``KDA_CONTRACTS_DOC``.

    Example::

        @kc.contract(config=cfg, where=["HV % H == 0"])
        def forward(x: Float[Tensor, "B D"], state: Float[Tensor, "N HV V K"]) -> Float[Tensor, "B HV*V"]:
            ...
    """
    options = contract_options("kc.contract", config=config, config_arg=config_arg, where=where,
                               bind_first=bind_first, hints=hints, value_checks=value_checks,
                               value_rules=value_rules, mode=mode, name=name, register=register, doc=doc,
                               autograd=autograd)
    if fn is None:
        return functools.partial(_decorate, options=options)
    return _decorate(fn, options)


def _contract_class(cls: type, options: ContractOptions) -> type:
    """Contract every method of ``cls`` whose annotations mention a tensor type (see
    :func:`~kda_contracts._engine.reading.members.contract_members`); a class with none is an AnnotationError
    (nothing would be checked)."""
    done = contract_members(cls, lambda fn, name: _decorate(fn, dataclasses.replace(options, name=name)),
                            base=options.name)
    if not done:
        raise AnnotationError(f"{cls.__qualname__}: kc.contract on a class contracts its methods annotated with "
                              "tensor types, and it has none")
    cls.__kda_contracted__ = done  # type: ignore[attr-defined]
    if any(is_contracted(f) for a in done for f in accessors(vars(cls)[a]).values()):
        hooks.class_decorated(cls, done, options.doc)
    return cls


def refuse_non_function(fn: Any, origin: str = "kc.contract") -> None:
    """A callable object that is not a function (an ``nn.Module`` instance, a ``functools.partial``)
    is refused: its ``__call__`` is not what its annotations describe, and a wrapper would stand in
    for the object (its parameters, state and methods)."""
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.iscoroutinefunction(fn):
        return
    what = type(fn).__name__
    fix = ("contract its class (kc.contract(MyModule): its annotated methods, forward included) or its forward's "
           "function" if hasattr(fn, "forward") and hasattr(fn, "parameters") else
           "contract the function itself (a Python function or method with annotated parameters)")
    takes = "a function, a method or a class" if origin == "kc.contract" else "a function or a method"
    raise AnnotationError(f"{origin} takes {takes}, got a {what} instance: {fix}")


def refuse_nothing_to_check(spec: ContractSpec, options: ContractOptions, origin: str = "kc.contract") -> None:
    """A function with no annotation to check is refused (a contract that checks nothing would pass
    every call silently)."""
    if not (spec.tensors or spec.scalars or spec.nested or spec.returns or spec.where) \
            and spec.return_hint is NO_HINT and options.config is None:
        fix = ("or drop the decorator (kc.check(t, 'B D') checks a tensor on its own)" if origin == "kc.contract" else
               "the contract every backend's call is checked against (kc.check in the body checks the torch "
               "reference only)")
        raise AnnotationError(f"{spec.name}: {origin} found nothing to check: no parameter or return annotation. "
                              f"Annotate its tensors (x: Float[Tensor, 'B D']) and scalars, {fix}")


def _decorate(fn: Callable[..., Any], options: ContractOptions) -> Any:
    if inspect.isclass(fn):
        return _contract_class(fn, options)
    if isinstance(fn, (staticmethod, classmethod)):  # @kc.contract above @staticmethod / @classmethod
        return type(fn)(_decorate(fn.__func__, options))
    refuse_non_function(fn)
    mode = options.mode
    fixed = modes.parse_mode(mode, f"contract(mode={mode!r})") if mode is not None else None
    spec = build_spec(fn, options)
    refuse_nothing_to_check(spec, options)
    wrong = config_nonint_dims(options.config)
    for sym in spec.symbols:
        if sym in wrong:
            raise AnnotationError(f"{spec.name}: the config's {sym} is {wrong[sym]!r}, a {type(wrong[sym]).__name__}, "
                                  f"so it binds no dim; dims are ints ({int_dim_fix(wrong[sym])})")
    if options.config is None and options.config_arg is None:
        for sp in spec.scalars.values():
            if sp.match is not None:
                raise AnnotationError(f"{spec.name}: argument {sp.name!r}: kc.MatchConfig({sp.match.attr!r}) compares "
                                      "the value with a config, and this contract has none: give "
                                      "kc.contract(config=...) or config_arg=")
    if (fixed if fixed is not None else modes.current_mode()) == modes.OFF:
        return fn
    c = Contract(spec, fn)
    if options.register:
        _REGISTRY[c.name] = c
    wrapper = build_wrapper(c, fixed)
    hooks.decorated(wrapper, c, options.doc)
    return wrapper
