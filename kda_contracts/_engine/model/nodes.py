"""The tree a contract's annotation is read into, one node per level: :class:`TensorNode` (every
tensor a contract can see, with its rules), the containers (:class:`SequenceOf`,
:class:`TupleOf`, :class:`MappingOf`, :class:`FieldsOf`), unions (:class:`OneOf`) and plain
types (:class:`Plain`, :class:`InstanceOf`). :meth:`Node.match` walks a value with the call's
dims; the generated checker asks only whether it fits, the explainer words the same result.

Example::

    node = SequenceOf(list, nested_tensor("B D", parse_shape("B D", "x"), frozenset({torch.float32})))
    node.match([torch.zeros(2, 3)], {"B": 2}, "xs")     # None: it fits, and D=3 is now bound
"""

from __future__ import annotations

import collections.abc as cabc
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..compile.marks import mark_constant_result
from ..errors import ArgumentTypeError, ShapeError, Violation
from ..grammar.dims import (
    ANY,
    Broadcast,
    DimSpec,
    Expr,
    Sym,
    Variadic,
    WideSizes,
    broadcast_sizes,
    dim_symbols,
    fits_variadic,
)
from ..rules.compiled import first_broken
from ..rules.order import DenseOrder
from ..rules.tensor import Contiguous, Disjoint, DtypeIn, InnerDense, Rule, SameDevice, SameDtype, Writable
from .markers import Spec
from .type_verdict import Problem, deep_problem, safe_repr, union_words, words


class Node:
    """One level of a container annotation."""

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        raise NotImplementedError

    def symbols(self) -> frozenset[str]:
        return frozenset()

    def plain_symbols(self) -> frozenset[str]:
        """The symbols some tensor inside carries as a plain dim (so a walk can bind them)."""
        return frozenset()


#: where a walk keeps the device of the call's tensors (the first tensor it meets binds it, as a
#: dim's first occurrence binds the dim; the generated checker starts it at the first argument's)
DEVICE = "@device"
#: where the explainer's walk collects, for the problem a tensor inside reports (by its words),
#: every rule that tensor breaks (the generated checker's walk stops at the first; the report names all)
REPORT = "@report"


@dataclass(frozen=True)
class TensorNode(Node):
    """One tensor the contract can see: an argument, an item or a field inside one, a value a
    ``*args``/``**kwargs`` collects, the return or an item of a returned tuple. Every node meets
    its rules (dtype, device, layout, written in place) by one mechanism: the generated checker
    inlines their tests; a walk over a container or a result (:meth:`match`) runs the very same
    tests, compiled once; the explainer and the docs read the same rule objects."""

    name: str  # the argument ("x"), "return" or "return[1]"; inside a container, its annotation's dims
    dim_str: str
    dims: tuple[DimSpec, ...]
    dtypes: frozenset[torch.dtype]
    spec: Spec = field(default_factory=Spec)
    optional: bool = False
    rules: tuple[Rule, ...] = ()  # dtype, device, layout and written-in-place rules, in checking order
    # the rules' tests as one function, compiled once (torch.compile traces the walk: nothing is compiled then)
    broken: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "broken", first_broken(self.rules))

    def __str__(self) -> str:
        return f"Tensor[{self.dim_str}]"

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

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(dim_symbols(d) for d in self.dims))

    def plain_symbols(self) -> frozenset[str]:  # (a broadcastable "#B" too: the walk binds it from a size > 1)
        return frozenset(d.name for d in self.dims if isinstance(d, Sym)) | frozenset(
            d.key for d in self.dims if isinstance(d, Variadic) and d.name is not None) | frozenset(
            d.dim.name for d in self.dims if isinstance(d, Broadcast) and isinstance(d.dim, Sym))

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, torch.Tensor):
            return ArgumentTypeError, f"{path}: expected a torch.Tensor, got {type(value).__name__}"
        device = env.get(DEVICE)
        if device is None:
            env[DEVICE] = device = value.device
        if (i := self.broken(value, device)) >= 0:
            slots = {"value": value, "dtype": value.dtype, "device": device, "config_value": None, "other_dtype": None,
                     "shape": tuple(value.shape), "strides": value.stride()}
            problem = self.rules[i].kind, self.rules[i].words(path, **slots)
            if (report := env.get(REPORT)) is not None:
                report[problem[1]] = self.every_problem(value, env, path, slots)
            return problem
        why = match_dims(self.dims, tuple(value.shape), env)
        return None if why is None else (ShapeError, words("{}: shape {}: {}", path, tuple(value.shape), why))

    def every_problem(self, value: torch.Tensor, env: dict[str, Any], path: str, slots: dict[str, Any]
                      ) -> list[tuple[Problem, Violation]]:
        """Each rule family this tensor breaks (its first broken rule), then its shape, with the
        rule's own violation (its facts give the hint): what a top-level argument's report says."""
        slots.update(shape=tuple(value.shape), strides=value.stride())
        found: list[tuple[Problem, Violation]] = []
        families: set[str] = set()
        for rule in self.rules:
            if rule.family not in families and rule.broken(**slots):
                families.add(rule.family)
                found.append(((rule.kind, rule.words(path, **slots)), replace(rule.violation(**slots), argument=path)))
        why = match_dims(self.dims, tuple(value.shape), {k: v for k, v in env.items() if k != REPORT})
        if why is not None:
            text = words("{}: shape {}: {}", path, tuple(value.shape), why)
            found.append(((ShapeError, text), Violation(ShapeError, path, str(self), text)))
        return found


def tensor_rules(node: TensorNode, first: str | None, autograd: bool = False) -> tuple[Rule, ...]:
    """The rules a tensor's annotation and ``kc.Spec`` declare, in checking order, wherever the
    tensor stands. ``first``: what the device rule names as the call's device (the first required
    tensor argument; None for that argument itself); ``autograd``: the contract lets a written
    tensor require grad."""
    sp, name = node.spec, node.name
    rules: list[Rule] = [DtypeIn(name, node.dtypes, sp.config_dtype)]
    if sp.same_dtype_as is not None:
        rules.append(SameDtype(name, sp.same_dtype_as))
    if sp.same_device and first is not None and name != first:
        rules.append(SameDevice(name, first))
    if sp.contiguous:
        rules.append(Contiguous(name))
    elif sp.dim_order is not None:
        rules.append(DenseOrder(name, sp.dim_order))
    elif sp.inner_contiguous:
        rules.append(InnerDense(name, sp.inner_contiguous))
    if sp.disjoint and not sp.contiguous and sp.dim_order is None:  # (a dense tensor's elements are disjoint)
        rules.append(Disjoint(name, None if node.variadic is not None else node.rank, sp.inner_contiguous))
    if sp.mutated:
        rules.append(Writable(name, autograd))
    return tuple(rules)


#: what the device rule of a tensor inside a container or a result names as the call's device
CALL_DEVICE = "the call's other tensors"


def nested_tensor(dim_str: str, dims: tuple[DimSpec, ...], dtypes: frozenset[torch.dtype]) -> TensorNode:
    """A tensor inside a container (or a value ``*args``/``**kwargs`` collects), with its rules."""
    node = TensorNode(dim_str, dim_str, dims, dtypes)
    return replace(node, rules=tensor_rules(node, CALL_DEVICE))


UNEVALUABLE = "cannot be evaluated with the bound dims"


def walk_containers(walks: tuple[tuple[str, Any, Any], ...], env: dict[str, Any]) -> dict[str, Problem]:
    """Walk each ``(name, node, value)`` container argument with the dims bound so far (each walk
    binds the dims its tensors carry first), and return the problems by name. A walk that stops at
    a dim expression it cannot evaluate yet (``N+1`` where only a later argument binds ``N``) is
    walked again after the others, as long as that binds more: the verdict does not depend on the
    arguments' order (binding is order-independent). The fast and slow paths both call this."""
    problems: dict[str, Problem] = {}
    pending = walks
    while pending:
        deferred = []
        for name, node, value in pending:
            problem = node.match(value, env, name)
            if problem is None:
                problems.pop(name, None)
                continue
            problems[name] = problem
            if problem[1].endswith(UNEVALUABLE):
                deferred.append((name, node, value))
        if len(deferred) == len(pending):  # nothing more was bound: these stay as they are
            break
        pending = tuple(deferred)
    return problems


def match_dims(dims: tuple[DimSpec, ...], shape: tuple[int, ...], env: dict[str, Any]) -> str | None:
    """Match a shape against dims, binding unbound plain dims (and variadic dims) in ``env`` at
    their first occurrence; None when it fits, else why not."""
    vi = next((i for i, d in enumerate(dims) if isinstance(d, Variadic)), None)
    fixed = len(dims) - (vi is not None)
    if (len(shape) < fixed) if vi is not None else (len(shape) != fixed):
        return f"expected rank {'≥ ' if vi is not None else ''}{fixed}, got {len(shape)}"
    after = 0 if vi is None else len(dims) - 1 - vi
    for i, d in enumerate(dims):
        if isinstance(d, Variadic):
            sizes = shape[i:len(shape) - after]
            if d.name is None:
                continue
            bound = env.get(d.key)
            widenable = env.get("#" + d.key)  # bound only by broadcastable occurrences so far
            if bound is None and widenable is not None:
                merged = broadcast_sizes((widenable, True), (sizes, True))
                if merged is None or (not d.broadcast and merged != tuple(sizes)):
                    return words("dims {}: {} does not broadcast with {}", d, sizes, widenable)
                if d.broadcast:
                    env["#" + d.key] = WideSizes(merged)
                else:
                    del env["#" + d.key]
                    env[d.key] = merged
            elif bound is None:
                if d.broadcast:
                    env["#" + d.key] = WideSizes(sizes)
                else:
                    env[d.key] = tuple(sizes)
            elif d.broadcast:  # it must broadcast to what a plain occurrence fixed
                if broadcast_sizes((bound, True), (sizes, True)) != tuple(bound):
                    return words("dims {}: {} does not broadcast to {}", d, sizes, bound)
            elif not fits_variadic(sizes, False, bound):
                return words("dims {}: expected {}, got {}", d, bound, sizes)
            continue
        axis = i if vi is None or i < vi else i - len(dims)
        size = shape[axis]
        expr = d.dim if isinstance(d, Broadcast) else d
        if d is ANY or (isinstance(d, Broadcast) and size == 1) or not isinstance(expr, Expr):
            continue
        if isinstance(expr, Sym) and env.get(expr.name) is None:
            env[expr.name] = size
            continue
        try:
            want = expr.evaluate(env)
        except (KeyError, TypeError, ZeroDivisionError):
            return f"dim {axis} ({d}) {UNEVALUABLE}"
        if size != want:
            return words("dim {} ({}): expected {}, got {}", axis, d, want, size)
    return None


@dataclass(frozen=True)
class Plain(Node):
    """A non-tensor part of a container annotation (checked with beartype's verdict; under
    torch.compile by ``types``, see :func:`_plain_match_traced`)."""

    hint: Any
    types: Node | None = field(default=None, compare=False)  # type_trees.read_types(hint)

    def __str__(self) -> str:
        return getattr(self.hint, "__name__", str(self.hint))

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if self.hint is Any:
            return None
        if self.types is not None:  # every item of a container (beartype samples one)
            return self.types.match(value, env, path)
        return deep_problem(value, self.hint, path)

    @mark_constant_result
    def bearable(self, value: Any) -> bool:
        """beartype's verdict and every item's (a TypedDict's fields too), at trace time under
        torch.compile (on the value: guarded on it)."""
        return deep_problem(value, self.hint, "") is None


def _plain_match_traced(self: Plain, value: Any, env: dict[str, Any], path: str) -> Problem | None:
    """:meth:`Plain.match` as torch.compile traces it: beartype cannot be traced, so a hint that
    types alone decide is checked by its type tree (isinstance on every item: dynamo guards on
    the items' types, never on objects or sizes); any other hint (a Literal, a Protocol) by
    beartype at trace time, on the value (so guarded on it: one graph per object or value)."""
    if self.hint is Any:
        return None
    if self.types is not None:
        return self.types.match(value, env, path)
    if self.bearable(value):
        return None
    return ArgumentTypeError, words("{}: expected {}, got {}", path, self, type(value).__name__)


Plain.match._torchdynamo_inline = _plain_match_traced  # type: ignore[attr-defined]  # what dynamo traces


@dataclass(frozen=True)
class SequenceOf(Node):
    """``list[X]``, ``tuple[X, ...]``, ``Sequence[X]``: every item is an X."""

    kind: type
    item: Node
    text_ok: bool = False  # a str is a Sequence of str (beartype's verdict; a tensor container refuses it)

    def __str__(self) -> str:
        return f"{self.kind.__name__}[{self.item}{', ...' if self.kind is tuple else ''}]"

    def symbols(self) -> frozenset[str]:
        return self.item.symbols()

    def plain_symbols(self) -> frozenset[str]:
        return self.item.plain_symbols()

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, self.kind) or (isinstance(value, (str, bytes)) and not self.text_ok):
            return ArgumentTypeError, f"{path}: expected a {self.kind.__name__}, got {type(value).__name__}"
        classes = getattr(self.item, "by_type", None)
        if classes is not None:  # items a type decides: each distinct type once (C loops), no path per item
            items: Any = value
            if all(issubclass(t, classes) for t in set(map(type, items))):
                return None
            i, item = next((i, v) for i, v in enumerate(items) if not isinstance(v, classes))
            return self.item.match(item, env, self.item_path(path, i, item))
        ordered = self.ordered
        for i, item in enumerate(value):  # type: ignore[var-annotated, arg-type]
            problem = self.item.match(item, env, f"{path}[{i}]" if ordered else self.item_path(path, i, item))
            if problem is not None:
                return problem
        return None

    def item_path(self, path: str, i: int, item: Any) -> str:
        """How a report names an item: by its index (a set's items have none: by their value)."""
        return f"{path}[{i}]" if self.ordered else f"{path} item {safe_repr(item)}"

    @property
    def ordered(self) -> bool:
        return not issubclass(self.kind, cabc.Set)


@dataclass(frozen=True)
class TupleOf(Node):
    """``tuple[X, Y]`` and NamedTuples: one node per position."""

    items: tuple[Node, ...]

    def __str__(self) -> str:
        return "tuple[" + ", ".join(str(i) for i in self.items) + "]"

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(i.symbols() for i in self.items))

    def plain_symbols(self) -> frozenset[str]:
        return frozenset().union(*(i.plain_symbols() for i in self.items))

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, tuple) or len(value) != len(self.items):
            got = f"a tuple of {len(value)}" if isinstance(value, tuple) else type(value).__name__
            return ArgumentTypeError, f"{path}: expected a tuple of {len(self.items)}, got {got}"
        for i, (node, item) in enumerate(zip(self.items, value, strict=True)):
            problem = node.match(item, env, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None


@dataclass(frozen=True)
class MappingOf(Node):
    """``dict[K, X]``, ``Mapping[K, X]``: every key a K, every value an X."""

    key: Node
    value: Node
    kind: type = cabc.Mapping  # dict for dict[K, X] in a type tree (a tensor container takes any mapping)

    def __str__(self) -> str:
        return f"{getattr(self.kind, '__name__', 'Mapping')}[{self.key}, {self.value}]"

    def symbols(self) -> frozenset[str]:
        return self.value.symbols()

    def plain_symbols(self) -> frozenset[str]:
        return self.value.plain_symbols()

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, self.kind):
            what = "mapping" if self.kind is cabc.Mapping else self.kind.__name__
            return ArgumentTypeError, f"{path}: expected a {what}, got {type(value).__name__}"
        kc_, vc_ = getattr(self.key, "by_type", None), getattr(self.value, "by_type", None)
        if kc_ is not None and vc_ is not None:  # keys and values a type decides: each distinct type once
            pairs: Any = value
            if all(issubclass(t, kc_) for t in set(map(type, pairs))) and \
                    all(issubclass(t, vc_) for t in set(map(type, pairs.values()))):
                return None
        for k, v in value.items():  # type: ignore[attr-defined]  # (a Mapping: self.kind is one)
            # (the path is worded only for an item that fails: a key's repr may be costly, or raise)
            problem = self.key.match(k, env, path)
            if problem is not None:
                return self.key.match(k, env, f"{path} key {safe_repr(k)}")
            problem = self.value.match(v, env, path)
            if problem is not None:
                return self.value.match(v, env, f"{path}[{safe_repr(k)}]")
        return None


@dataclass(frozen=True)
class OneOf(Node):
    """A union: the first option that fits wins (its dims are kept); None when allowed."""

    options: tuple[Node, ...]
    none_ok: bool

    def __str__(self) -> str:
        return union_words(self.options, self.none_ok)

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(o.symbols() for o in self.options))

    def plain_symbols(self) -> frozenset[str]:
        return frozenset.intersection(*(o.plain_symbols() for o in self.options)) if self.options else frozenset()

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if value is None and self.none_ok:
            return None
        problems = []
        for option in self.options:
            trial = dict(env)
            problem = option.match(value, trial, path)
            if problem is None:
                env.update(trial)
                return None
            problems.append(problem)
        # the kind of the options the value was the right kind of thing for (failing deeper in), if
        # they agree: a list of tensors on the wrong device, against Tensor | list[Tensor], is a DeviceError
        deeper = {p[0] for p in problems if p[0] is not ArgumentTypeError} or {p[0] for p in problems}
        kind = next(iter(deeper)) if len(deeper) == 1 else ShapeError
        return kind, words("{}: fits none of {}: {}", path, self, "; ".join(p[1] for p in problems))


@dataclass(frozen=True)
class FieldsOf(Node):
    """A dataclass, NamedTuple or pydantic model: an instance of the class, each field checked."""

    cls: type
    fields: tuple[tuple[str, Node], ...]

    def __str__(self) -> str:
        return self.cls.__name__

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(n.symbols() for _, n in self.fields))

    def plain_symbols(self) -> frozenset[str]:
        return frozenset().union(*(n.plain_symbols() for _, n in self.fields))

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, self.cls):
            return ArgumentTypeError, f"{path}: expected a {self.cls.__name__}, got {type(value).__name__}"
        for name, node in self.fields:
            problem = node.match(getattr(value, name), env, f"{path}.{name}")
            if problem is not None:
                return problem
        return None


@dataclass(frozen=True)
class InstanceOf(Node):
    """A class that ``isinstance`` decides from the value's type alone, with beartype's numeric
    tower (a float accepts an int): ``classes`` is what ``isinstance`` is asked."""

    hint: Any
    classes: tuple[type, ...]

    @property
    def by_type(self) -> tuple[type, ...]:
        """What a container checks each distinct item type against (the type alone decides)."""
        return self.classes

    def __str__(self) -> str:
        return getattr(self.hint, "__name__", str(self.hint))

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if isinstance(value, self.classes):
            return None
        return ArgumentTypeError, words("{}: expected {}, got {}", path, self, type(value).__name__)
