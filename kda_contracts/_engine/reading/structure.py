"""Tensors inside containers: lists, tuples, dicts, ``Sequence``/``Mapping``, unions, Optional,
dataclasses, NamedTuples and pydantic models, checked with the call's dims (principle 3: what
mentions an array type is enforced, never skipped).

An annotation that mentions an array type anywhere is read once, at decoration, into a small
tree of :class:`Node` objects. At call time one walk over the value checks every tensor in it
(not a sample) against the same dims as the rest of the call, binding a dim at its first
occurrence when nothing outside the container binds it. The walk returns None when the value
fits, else ``(error kind, what is wrong and where)``: the generated checker only asks whether the
result is None; the explainer words the very same result.

Example::

    @kc.contract
    def attend(qs: list[Float[Tensor, "B H D"]], k: Float[Tensor, "B H D"]) -> None: ...
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any

import torch
from beartype import BeartypeConf
from beartype.door import is_bearable

from ..errors import AnnotationError, ArgumentTypeError, ContractError, DtypeError, ShapeError
from ..grammar.dims import ANY, Broadcast, DimSpec, Expr, Sym, Variadic, broadcast_sizes, fits_variadic, parse_shape
from ..modes import mark_constant_result
from ..rules.tensor import DtypeIn, dtype_name, fmt_ints
from .plan import dim_symbols

__all__ = ["Node", "mentions_array", "read_structure", "walk_containers"]

Problem = tuple[type[ContractError], str]
BEARTYPE_CONF = BeartypeConf(is_pep484_tower=True)


def is_array_type(tp: Any) -> bool:
    """A jaxtyping array annotation (``Float[Tensor, "B D"]``)."""
    return isinstance(tp, type) and hasattr(tp, "dim_str") and hasattr(tp, "dtypes") and hasattr(tp, "array_type")


def unalias(tp: Any) -> Any:
    """The annotation a ``TypeAliasType`` alias (``type X = ...``, ``typing_extensions.TypeAliasType``)
    stands for, unwrapped all the way; anything else unchanged."""
    while type(tp).__name__ == "TypeAliasType" and hasattr(tp, "__value__"):
        tp = tp.__value__
    return tp


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _structured(tp: Any) -> type | None:
    """The dataclass, NamedTuple or pydantic class ``tp`` is, or is a parameterised form of
    (``Box[int]`` for a generic ``Box``); None for anything else."""
    cls = tp if isinstance(tp, type) else typing.get_origin(tp)
    if not isinstance(cls, type):
        return None
    if dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields")) \
            or hasattr(cls, "model_fields"):
        return cls
    return None


def _fields_mention_array(cls: type, _seen: frozenset[Any]) -> bool:
    """Whether the fields of a structured class (or TypedDict) mention an array type. When its
    annotations do not resolve as a whole, each field is tried alone: a class whose resolvable
    fields hold tensors while others do not resolve is an AnnotationError (its tensors would go
    unchecked); one without tensors stays an opaque type, checked with isinstance."""
    try:
        fields = _field_hints(cls) if not _is_typeddict(cls) else typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        if isinstance(exc, AnnotationError) and not isinstance(exc, _UnreadableHints):
            raise  # (the annotations read, and say something that cannot be checked)
        unresolved, holds = [], False
        namespace = {**vars(sys.modules.get(cls.__module__, object())), **vars(cls)}
        for name, hint in _raw_annotations(cls).items():
            try:
                hint = eval(hint, namespace) if isinstance(hint, str) else hint  # the class's own annotation
            except Exception:
                unresolved.append(name)
                continue
            holds = holds or mentions_array(hint, _seen | {cls})
        if holds and unresolved:
            raise AnnotationError(f"cannot read the annotation of {cls.__name__}.{unresolved[0]} "
                                  f"({exc.__cause__ or exc}), and its other fields hold tensors, which would "
                                  "go unchecked; make those annotations resolvable at decoration (import the names "
                                  "they use at runtime)") from exc
        return False
    return fields is not None and any(mentions_array(h, _seen | {cls}) for h in fields.values())


class _UnreadableHints(AnnotationError):
    """A class's annotations do not resolve (``typing.get_type_hints`` failed)."""


def _raw_annotations(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        out.update(getattr(base, "__annotations__", {}) if base is not object else {})
    return out


def _field_hints(cls: type) -> dict[str, Any] | None:
    """The annotated fields of a dataclass, NamedTuple or pydantic model class (None: not one)."""
    if _structured(cls) is not None:
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception as exc:
            raise _UnreadableHints(f"cannot read the field annotations of {cls.__name__}: {exc}") from exc
        if hasattr(cls, "model_fields"):
            fields = {k: _with_field_metadata(hints[k], info) for k, info in cls.model_fields.items() if k in hints}
        elif dataclasses.is_dataclass(cls):
            fields = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name in hints}
        else:
            fields = {k: hints[k] for k in cls._fields if k in hints}  # type: ignore[attr-defined]
        for name, hint in hints.items():  # ClassVar / InitVar: not fields, so never checked
            inner = _class_or_init_var(hint)
            if name not in fields and inner is not None and mentions_array(inner):
                raise AnnotationError(f"{cls.__name__}.{name} is annotated {hint!r}: a class variable or init-only "
                                      "variable is not a field, so its tensor would go unchecked; make it a field, "
                                      "or annotate it without a tensor type")
        return fields
    return None


def _class_or_init_var(hint: Any) -> Any:
    """What a ``ClassVar[X]`` or dataclasses ``InitVar[X]`` annotation holds (X), else None."""
    if typing.get_origin(hint) is typing.ClassVar:
        args = typing.get_args(hint)
        return args[0] if args else None
    if isinstance(hint, dataclasses.InitVar):
        return hint.type
    return None


def _with_field_metadata(hint: Any, info: Any) -> Any:
    """A pydantic field's type with the constraints ``Field(gt=0)`` put in its metadata (the same
    as ``Annotated[int, Gt(0)]``, which the annotation already shows), so they are checked or
    refused as that would be, never skipped."""
    metadata = tuple(getattr(info, "metadata", ()) or ())
    if not metadata or typing.get_origin(hint) is typing.Annotated:
        return hint
    params = (hint, *metadata)
    return typing.Annotated[params]


def mentions_array(tp: Any, _seen: frozenset[Any] = frozenset()) -> bool:
    """Whether an annotation mentions a jaxtyping array type anywhere inside it: in its arguments,
    the fields of a dataclass, NamedTuple, pydantic model or TypedDict (also a parameterised generic
    one), what a type alias stands for, or a TypeVar's bound or constraints."""
    tp = unalias(tp)
    if is_array_type(tp):
        return True
    if isinstance(tp, list):  # a Callable's parameter types
        return any(mentions_array(a, _seen) for a in tp)
    if tp in _seen:
        return False
    if isinstance(tp, typing.TypeVar):
        return any(mentions_array(a, _seen | {tp}) for a in (tp.__bound__, *tp.__constraints__) if a is not None)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Annotated:
        return mentions_array(args[0], _seen)
    if any(mentions_array(a, _seen | {tp}) for a in args if a is not Ellipsis):
        return True
    cls = _structured(tp) or (tp if _is_typeddict(tp) else None)
    return cls is not None and cls not in _seen and _fields_mention_array(cls, _seen | {tp})


class Node:
    """One level of a container annotation."""

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        raise NotImplementedError

    def symbols(self) -> frozenset[str]:
        return frozenset()

    def plain_symbols(self) -> frozenset[str]:
        """The symbols some tensor inside carries as a plain dim (so a walk can bind them)."""
        return frozenset()


@dataclass(frozen=True)
class Leaf(Node):
    """A tensor: its dims and allowed dtypes."""

    text: str
    dims: tuple[DimSpec, ...]
    dtypes: frozenset[torch.dtype]
    # the dtype rule's test, made once (torch.compile traces the walk: nothing is compiled then)
    dtype_broken: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype_broken", DtypeIn(self.text, self.dtypes).compiled_test())

    def __str__(self) -> str:
        return f"Tensor[{self.text}]"

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(dim_symbols(d) for d in self.dims))

    def plain_symbols(self) -> frozenset[str]:
        return frozenset(d.name for d in self.dims if isinstance(d, Sym)) | frozenset(
            d.key for d in self.dims if isinstance(d, Variadic) and d.name is not None)

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, torch.Tensor):
            return ArgumentTypeError, f"{path}: expected a torch.Tensor, got {type(value).__name__}"
        if self.dtype_broken(dtype=value.dtype, config_value=None):
            allowed = " or ".join(sorted(dtype_name(d) for d in self.dtypes))
            return DtypeError, f"{path}: dtype {dtype_name(value.dtype)}, expected {allowed}"
        why = match_dims(self.dims, tuple(value.shape), env)
        return None if why is None else (ShapeError, words("{}: shape {}: {}", path, tuple(value.shape), why))


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
                    env["#" + d.key] = merged
                else:
                    del env["#" + d.key]
                    env[d.key] = merged
            elif bound is None:
                env[("#" if d.broadcast else "") + d.key] = tuple(sizes)
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


def words(template: str, *values: Any) -> str:
    """A problem's words: ``template`` filled with ``values`` (sizes written ``[a, b]``).

    Under torch.compile, ``template`` alone (:func:`_unworded`): the traced checker only asks
    whether a value fits, and a rejected call is worded at trace time on the real values, so the
    trace never turns a symbolic size into text (dynamo cannot, and would stop the trace)."""
    return template.format(*(fmt_ints(v) if isinstance(v, (tuple, list)) else v for v in values))


def _unworded(template: str, *values: Any) -> str:
    return template


words._torchdynamo_inline = _unworded  # type: ignore[attr-defined]  # what dynamo traces instead


def safe_repr(value: Any) -> str:
    """``repr(value)`` for a report, or its type's name when its repr raises; a tensor as its kind
    and shape, never its values (reports hold no tensor values)."""
    if isinstance(value, torch.Tensor):
        try:
            return f"<tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}>"
        except Exception:
            return "<tensor>"
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


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
        from .type_trees import deep_problem  # (type_trees builds on this module)

        return deep_problem(value, self.hint, path)

    @mark_constant_result
    def bearable(self, value: Any) -> bool:
        """beartype's verdict, at trace time under torch.compile (on the value: guarded on it)."""
        return is_bearable(value, self.hint, conf=BEARTYPE_CONF)


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
            return self.item.match(item, env, f"{path}[{i}]")
        for i, item in enumerate(value):  # type: ignore[var-annotated, arg-type]
            problem = self.item.match(item, env, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None


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
        return " | ".join([str(o) for o in self.options] + (["None"] if self.none_ok else []))

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
        kind = problems[0][0] if len({p[0] for p in problems}) == 1 else ShapeError
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


# get_origin gives the runtime class for both list[X] and typing.List[X], Sequence[X] and
# typing.Sequence[X], and so on.
_SEQUENCES: Mapping[Any, type] = {list: list, cabc.Sequence: cabc.Sequence, cabc.MutableSequence: cabc.MutableSequence}
_MAPPINGS = (dict, cabc.Mapping, cabc.MutableMapping)


def read_structure(tp: Any, where: str, _reading: frozenset[type] = frozenset()) -> Node:
    """Read an annotation that mentions an array type into a :class:`Node` tree; anything the
    walk could not check is an AnnotationError naming it (``_reading``: the classes whose fields
    are being read, so a class that holds itself is refused rather than read forever)."""
    tp = unalias(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def read(inner: Any, at: str = where) -> Node:
        return read_structure(inner, at, _reading)

    if origin is typing.Annotated:
        if any(not _is_doc(m) for m in args[1:]):
            raise AnnotationError(f"{where}: metadata {args[1:]!r} inside a container cannot be checked; "
                                  "put kc.Spec/kc.Range on a top-level argument")
        return read(args[0])
    if is_array_type(tp):
        from .annotations import (  # the dtype table lives with the annotation reader
            array_dtypes,
            unsupported_array_type,
        )

        if (why := unsupported_array_type(tp)) is not None:
            raise AnnotationError(f"{where}: {why}")

        return Leaf(tp.dim_str, parse_shape(tp.dim_str, where), array_dtypes(tp, None, where))
    if not mentions_array(tp):
        from .type_trees import read_types  # (it builds these nodes)

        return Plain(tp, read_types(tp))
    if origin in (typing.Union, UnionType):
        options = tuple(read(a) for a in args if a is not NoneType)
        return OneOf(options, any(a is NoneType for a in args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return SequenceOf(tuple, read(args[0]))
        return TupleOf(tuple(read(a) for a in args))
    if origin in _SEQUENCES:
        return SequenceOf(_SEQUENCES[origin], read(args[0]))
    if origin in _MAPPINGS:
        return MappingOf(read(args[0]), read(args[1]))
    cls = _structured(tp)
    if cls is not None:  # (a parameterised generic class is read as its class: a field typed T is any value)
        if cls is not tp and any(mentions_array(a) for a in args):
            raise AnnotationError(f"{where}: {tp!r} gives a type parameter of {cls.__name__} a tensor type, and "
                                  "kda-contracts does not substitute type parameters (a field typed by it would go "
                                  f"unchecked); annotate {cls.__name__}'s fields with the tensor types")
        if cls in _reading:
            raise AnnotationError(f"{where}: {cls.__name__} holds itself (a recursive structure), which "
                                  "kda-contracts does not walk; check the tensors of such a structure inside "
                                  "the function with kc.check")
        fields = _field_hints(cls) or {}
        return FieldsOf(cls, tuple((k, read_structure(h, f"{where}.{k}", _reading | {cls}))
                                   for k, h in fields.items()))
    if isinstance(tp, typing.TypeVar):
        raise AnnotationError(f"{where}: the TypeVar {tp.__name__} is bound to or constrained by tensor annotations, "
                              "which kda-contracts does not check through a TypeVar; annotate the tensor itself "
                              "(Float[Tensor, '...'])")
    if _is_typeddict(tp):
        raise AnnotationError(f"{where}: the TypedDict {tp.__name__} holds tensors, and kda-contracts does not walk "
                              "TypedDicts; use a dataclass, NamedTuple, pydantic model or dict[str, ...] of tensors")
    raise AnnotationError(f"{where}: {tp!r} mentions a tensor annotation inside a type kda-contracts cannot walk "
                          "(supported: list, tuple, dict, Sequence, Mapping, Union/Optional, dataclasses, "
                          "NamedTuples, pydantic models)")


def _is_doc(meta: Any) -> bool:
    return isinstance(meta, str)
