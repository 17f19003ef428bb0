"""What a config fixes for one contract, flattened once per config object (the generated checker
reads a flat view instead of calling into the config on every call).

Example::

    views = ConfigViews(spec); view = views.get(id(cfg)) or views.make(cfg)
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..compile.marks import made_in_trace, mark_constant_result
from ..compile.trace_args import flatten
from ..errors import ArgumentTypeError, ContractError, Violation, passthrough_for_compile, raise_violations
from ..model.markers import CONFIG_LACKS, config_dims, config_is_frozen, config_nonint_dims, int_dim_fix
from ..model.spec import ContractSpec


def config_view_layout(spec: ContractSpec) -> tuple[list[str], list[str]]:
    """The dtype roles and the MatchConfig scalars of a contract, in view order."""
    roles = sorted({tp.spec.config_dtype for tp in spec.tensors.values() if tp.spec.config_dtype is not None})
    matches = [sp.name for sp in spec.scalars.values() if sp.match is not None]
    return roles, matches


def _same(obj: Any) -> Any:
    return obj


def config_ref(cfg: Any) -> Callable[[], Any]:
    """A weak reference to ``cfg`` (a strong one, called the same way, for objects that refuse
    weak references): ``ref() is cfg`` tells a recycled id from the object that was cached."""
    try:
        return weakref.ref(cfg)
    except TypeError:  # no __weakref__ slot
        return functools.partial(_same, cfg)


class ConfigViews:
    """What each config object fixes for one contract, flattened once per config object:
    ``(reference to the config, dims aligned with spec.symbols, dtypes aligned with the roles,
    match values)``.

    Keyed by ``id``; the entry holds a weak reference to its config (a strong one only for
    objects that refuse weak references), so a recycled id is detected and a cached view never
    keeps a model layer alive. Bounded.

    Under torch.compile ``get`` and ``make`` run at trace time and are never traced (dynamo
    calls them on the real config and takes the view as a constant, guarding only on the
    config's identity): the config is flattened before the trace sees it, so a cold first call
    compiles, and later eager use of the cache does not recompile anything. Compiled code
    therefore keeps the view of the trace: a mutable config changed afterwards is seen by eager
    calls, not by compiled code until it is traced again.
    """

    MAX = 64

    def __init__(self, spec: ContractSpec) -> None:
        self.spec = spec
        self.roles, self.matches = config_view_layout(spec)
        self._views: dict[int, tuple[Any, ...]] = {}
        self._lock = threading.Lock()  # the bound holds under threads (two misses at MAX - 1 grew it past)

    @mark_constant_result
    def get(self, key: int) -> tuple[Any, ...] | None:
        return self._views.get(key)

    @mark_constant_result
    def make(self, cfg: Any) -> tuple[Any, ...]:
        if made_in_trace(cfg):  # (the fast checker then falls to the slow path, which refuses the call)
            refuse_built_in_trace(self.spec, cfg)
        dims = config_dims(cfg)
        wrong = dim_type_violations(self.spec, cfg, dims)
        if wrong:  # a per-call config (a fixed one is refused at decoration)
            _refuse(self.spec, wrong)
        dts = _config_dtypes(cfg) or {}
        view = (
            config_ref(cfg),
            tuple(dims.get(s) for s in self.spec.symbols),
            tuple(dts.get(r) for r in self.roles),
            tuple(getattr(cfg, self.spec.scalars[n].match.attr, CONFIG_LACKS)  # type: ignore[union-attr]
                  for n in self.matches),
        )
        if not config_is_frozen(cfg):
            return view  # a mutable config is read fresh on every call
        with self._lock:
            if len(self._views) >= self.MAX:
                self._views.clear()
            self._views[id(cfg)] = view
        return view


def dim_type_violations(spec: ContractSpec, cfg: Any, dims: Mapping[str, Any] | None = None) -> list[Violation]:
    """A config that gives a dim of the contract as something other than an int (a float from
    ``hidden / heads``, a str, a bool, a numpy integer): it binds nothing, so the call is refused
    rather than checked without it (None leaves the dim free). ``dims``: ``config_dims(cfg)``, when
    the caller read it already (``contract_dims()`` is then not called again)."""
    wrong = config_nonint_dims(cfg, dims)
    return [Violation(ArgumentTypeError, spec.config_arg or "config", f"{sym} as an int (a dim of the contract)",
                      f"{sym}={wrong[sym]!r}, a {type(wrong[sym]).__name__}, which binds no dim",
                      hint=f"make {type(cfg).__name__}'s {sym} an int: {int_dim_fix(wrong[sym])}")
            for sym in spec.symbols if sym in wrong]


def _refuse(spec: ContractSpec, violations: list[Violation]) -> None:
    """Raise the report from inside the fast checker (under torch.compile, past dynamo)."""
    try:
        raise_violations(spec.name, violations, {}, {})
    except ContractError as err:
        raise passthrough_for_compile(err) from None


def refuse_built_in_trace(spec: ContractSpec, cfg: Any) -> None:
    """Refuse a config built inside the region torch.compile traces: dynamo has not run its
    ``__init__`` when the contract reads it at trace time (read as it stands, a dataclass would show
    its class defaults), so the call is never judged on what the config is not."""
    name = spec.config_arg or "config"
    try:
        raise_violations(spec.name, [Violation(
            ArgumentTypeError, name, "a config built outside the region torch.compile traces",
            f"a {type(cfg).__name__} built inside it (dynamo has not initialised it when the contract reads it)",
            hint=f"build the {type(cfg).__name__} before the compiled function and pass it in")], {}, {})
    except ContractError as err:
        raise passthrough_for_compile(err) from None


def walked_built_in_trace(spec: ContractSpec, values: Mapping[str, Any]) -> list[Violation]:
    """At trace time, for a call the traced checker rejected: the arguments whose fields the
    contract walks that hold an object built inside the region torch.compile traces (a dataclass
    holding tensors, made there). Such an object cannot be read yet (dynamo has not initialised
    it), so the call is refused naming it, never worded from what the object is not. (A call
    that fits the contract is checked in the trace, on what dynamo built, and passes.)"""
    violations = []
    for name in spec.nested:
        leaves: list[Any] = []
        flatten(values.get(name), leaves)
        built = next((v for v in leaves if made_in_trace(v)), None)
        if built is not None:
            kind = type(built).__name__
            violations.append(Violation(
                ArgumentTypeError, name, f"a {kind} built outside the region torch.compile traces (to word the report)",
                f"a {kind} built inside it (dynamo has not initialised it when the contract reads it)",
                hint=f"the call breaks the contract: build the {kind} before the compiled function, or call eagerly, "
                     "to see how"))
    return violations


def _config_dtypes(cfg: Any) -> Mapping[str, torch.dtype] | None:
    getter = getattr(cfg, "contract_dtypes", None)
    return getter() if getter is not None else None
