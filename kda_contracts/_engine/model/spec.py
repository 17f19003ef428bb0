"""A contract as plain data, built once at decoration: :class:`ContractSpec` (its tensors,
scalars, containers, return, constraints and binding plan), the options it was made with, and
what a call hands hints and value checks (:class:`CallContext`, :class:`Dims`).

Example::

    spec = contract.spec
    spec.symbols, spec.tensors["x"].symbolic()      # ('B', 'D'), '[B, D]'
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import Violation
from ..grammar.constraints import Constraint
from ..grammar.dims import ArgFact, Expr, WideSizes
from ..rules.tensor import Rule
from ..rules.values import ValueRule
from .markers import MatchConfig, Range, Where, config_dim_source, config_dims
from .nodes import FieldsOf, MappingOf, Node, OneOf, SequenceOf, TensorNode, TupleOf, walk_containers


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
    value_rules: tuple[ValueRule, ...] = ()  # strict mode (one read) and watch mode (on the device)
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
    tensors: dict[str, TensorNode]
    scalars: dict[str, ScalarParam]
    nested: dict[str, NestedParam]  # tensors inside containers, unions, dataclasses, models
    returns: tuple[TensorNode, ...] | None  # None: no tensor return contract
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
    def value_rules(self) -> tuple[ValueRule, ...]:
        return self.options.value_rules

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
            elif self.variadic_sources.get(sym):
                prov[sym] = variadic_provenance(self.variadic_sources[sym])
            elif sym in self.nested_only:  # bound by the first tensor inside a container that carries it
                holders = [n for n, p in self.nested.items() if sym in p.node.symbols()]
                prov[sym] = f"from the tensors inside {', '.join(holders)}"
            else:
                for s in self.steps:
                    if s.symbol == sym:
                        prov[sym] = derived_provenance(s)
                        break
        return prov


def variadic_provenance(sources: tuple[VariadicSource, ...]) -> str:
    """Where a variadic dim comes from, as docs and reports say it: ``from x.shape[:-1]``; the
    broadcast of several occurrences when any is broadcastable (``#*name``)."""
    axes = [f"{v.param}.shape[{v.start or ''}:{-v.after if v.after else ''}]" for v in sources]
    if not any(v.broadcast for v in sources):
        return f"from {axes[0]}"
    return "from " + (axes[0] if len(axes) == 1 else "the broadcast of " + ", ".join(axes))


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


NO_HINT: Any = inspect.Parameter.empty  # no return annotation to check (ContractSpec.return_hint's default)


@dataclass(frozen=True)
class AxisSource:
    """Dim ``param.shape[axis]`` binds a symbol directly."""

    param: str
    axis: int


@dataclass(frozen=True)
class VariadicSource:
    """Axes ``param.shape[start:len - after]`` carry a variadic dim (``broadcast``: ``#*name``)."""

    param: str
    start: int
    after: int
    broadcast: bool
    optional: bool = False  # an argument that may be None: it binds the dim only when given


@dataclass(frozen=True)
class Solver:
    """``symbol = (param.shape[axis] - const) / coef``, from a dim linear in ``symbol``."""

    symbol: str
    param: str
    axis: int
    dim: Expr
    coef: Expr
    const: Expr


@dataclass(frozen=True)
class Derived:
    """``symbol = expr``, from the unconditional equality constraint ``constraint`` (its text)."""

    symbol: str
    expr: Expr
    constraint: str


@dataclass(frozen=True)
class BindingPlan:
    symbols: tuple[str, ...]  # every bound dim, in the order reports list them
    sources: dict[str, tuple[AxisSource, ...]]  # plain-name axes, in priority order
    scalar_sources: dict[str, str]  # dim -> the int argument that carries it
    solvers: tuple[Solver, ...]  # in solving order
    config_only: tuple[str, ...]  # dims only the fixed config provides
    broadcast_sources: dict[str, tuple[AxisSource, ...]]  # dims only broadcastable axes (#B) carry
    nested_only: tuple[str, ...]  # dims only tensors inside containers carry (bound by the walk)
    variadic_sources: dict[str, tuple[VariadicSource, ...]]  # *name -> the axes that carry it
    steps: tuple[Solver | Derived, ...] = ()  # solvers and equality bindings, in binding order
    facts: tuple[ArgFact, ...] = ()  # argument facts dims and constraints read (itemsize(t), t is None)


def bound_dims(symbols: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    """The dims a call bound, leaving out those bound to nothing; a variadic dim only
    broadcastable occurrences bound (a :class:`WideSizes`) goes by ``#*name``, so a result may
    still widen it."""
    return {widened_key(k, v): v for k, v in zip(symbols, values, strict=True) if v is not None}


def widened_key(key: str, value: Any) -> str:
    """The name a dim goes by in a walk's environment: ``#*name`` for a variadic dim only
    broadcastable occurrences bound (its sizes a :class:`WideSizes`)."""
    return "#" + key if type(value) is WideSizes else key


def widenable_variadics(spec: ContractSpec) -> frozenset[str]:
    """Variadic dims only broadcastable arguments may carry (``#*name``; an optional argument
    with a plain ``*name`` may be None): a container item or the result may still widen them, as
    torch's broadcasting would. Whether a call's binding is widenable: :func:`widened_key`."""
    return frozenset(k for k, srcs in spec.variadic_sources.items()
                     if all(s.broadcast for s in srcs if not s.optional) and any(s.broadcast for s in srcs))


def weak_symbols(spec: ContractSpec) -> frozenset[str]:
    """Dims that may be bound to nothing at run time (None): those only tensors inside containers
    carry (an empty list), and those only broadcastable axes carry (all of size 1)."""
    return frozenset(spec.nested_only) | frozenset(spec.broadcast_sources) | widenable_variadics(spec)


def result_env(spec: ContractSpec, dims: tuple[Any, ...], values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The dims a result is checked against: the call's, where a variadic dim only broadcastable
    arguments carry goes by ``#*name`` (a result may widen it, as torch's broadcasting would),
    unless a tensor inside one of the call's containers fixed it: then the result must match it
    exactly, as an argument would. ``values``: the call's arguments by name (None: unknown, so the
    containers are not asked).

    Example::

        # f(xs: list[Float[T, "*b"]], y: Float[T, "#*b"]) -> Float[T, "*b"], called with xs = [t(2,)]
        result_env(spec, dims, values)   # {"*b": (2,)}: a (7, 2) result is rejected
    """
    env = bound_dims(spec.symbols, dims)
    fixable = {k[1:] for k in env if k.startswith("#")} & {s for p in spec.nested.values()
                                                           for s in p.node.plain_symbols()}
    if fixable and values is not None:
        trial = dict(env)
        walk_containers(tuple((n, p.node, values.get(n)) for n, p in spec.nested.items()), trial)
        for key in fixable & trial.keys():
            env.pop("#" + key, None)
            env[key] = trial[key]
    return env


def call_device(spec: ContractSpec, values: Mapping[str, Any] | None) -> Any:
    """The call's device, which a result is held to: the first tensor argument's, else that of the
    first tensor in the call's containers (the walk holds them all to it); None where unknown."""
    if values is None:
        return None
    if spec.first_tensor is not None:
        first = values.get(spec.first_tensor)
        return first.device if isinstance(first, torch.Tensor) else None
    for n, p in spec.nested.items():  # (the arguments' check held every tensor inside to one device)
        found = first_tensor(p.node, values.get(n))
        if found is not None:
            return found.device
    return None


def first_tensor(node: Node, value: Any) -> torch.Tensor | None:
    """The first tensor ``value`` holds where ``node`` annotates one (no dims matched: a cheap walk
    that stops at the first), or None. Plain loops: torch.compile traces this."""
    try:
        if isinstance(node, TensorNode):
            return value if isinstance(value, torch.Tensor) else None
        pairs: list[tuple[Node, Any]] = []
        if isinstance(node, SequenceOf):
            pairs = [(node.item, v) for v in value]
        elif isinstance(node, TupleOf):
            pairs = list(zip(node.items, value, strict=False))
        elif isinstance(node, MappingOf):
            pairs = [(node.value, v) for v in value.values()]
        elif isinstance(node, FieldsOf):
            pairs = [(n, getattr(value, f)) for f, n in node.fields]
        elif isinstance(node, OneOf):
            pairs = [(o, value) for o in node.options]
        for inner, v in pairs:
            found = first_tensor(inner, v)
            if found is not None:
                return found
        return None
    except Exception:  # (a value the arguments' check refused would not get here; nothing to find)
        return None
