"""Python types as trees torch.compile can trace.

beartype checks the parameters whose hints are not tensors (and the non-tensor parts of a tensor
container), but dynamo cannot trace beartype. Handed to beartype at trace time instead, a value
would reach it as a constant: an object by identity, a symbolic size specialised, so each new
object or size would be traced again (a fresh ``Tag`` per call, ``tuple(x.shape)`` under
``dynamic=True``). A hint that types alone decide (classes, ``None``, ``Any``, unions,
``list``/``tuple``/``dict``/``Sequence``/``Mapping`` of those) is read here into a
:class:`~kda_contracts._engine.reading.structure.Node` tree of ``isinstance`` tests, which dynamo traces as guards on
the types of the values and the lengths of the containers. Every item is checked, where beartype
samples one per call; eager calls check every item too (:func:`every_item_checker`).

Example::

    tree = read_types(list[Tag])              # SequenceOf(list, InstanceOf(Tag))
    tree.match([Tag(), 3], {}, "tags")        # (ArgumentTypeError, "tags[1]: expected Tag, got int")
"""

from __future__ import annotations

import abc
import collections.abc as cabc
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any

from beartype.door import is_bearable

from ..errors import ArgumentTypeError
from ..model.nodes import InstanceOf, MappingOf, Node, OneOf, Plain, SequenceOf, TupleOf
from ..model.type_verdict import BEARTYPE_CONF, Problem, _items_problem, is_typeddict, typeddict_fields, words
from .arrays import _MAPPINGS, _SEQUENCES

_TOWER: Mapping[Any, tuple[type, ...]] = {float: (int, float), complex: (int, float, complex)}
#: sets whose items a type tree checks, every one (beartype samples one)
_SETS: Mapping[Any, type] = {set: set, frozenset: frozenset, cabc.Set: cabc.Set, cabc.MutableSet: cabc.MutableSet}


def read_types(tp: Any) -> Node | None:
    """A hint without array types as a :class:`Node` tree that gives beartype's verdict by
    ``isinstance`` alone, on every item of a container (beartype samples one item per call), so
    torch.compile can trace it; None when more than the types decides (a Literal, a Protocol, a
    validator, a callable's signature, a set's items): beartype decides those.

    Example::

        read_types(tuple[int, ...]).match(tuple(x.shape), {}, "shape")   # None: it fits
        read_types(Literal["a"])                                          # None
    """
    if tp is Any or tp is object:
        return InstanceOf(tp, (object,))
    if tp is None or tp is NoneType:
        return InstanceOf(None, (NoneType,))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    parts = [read_types(a) for a in args if a is not Ellipsis]
    if any(p is None for p in parts):
        return None
    items: tuple[Node, ...] = tuple(parts)  # type: ignore[arg-type]  # (no None left)
    if origin in (typing.Union, UnionType):
        return OneOf(tuple(p for a, p in zip(args, items, strict=True) if a is not NoneType), NoneType in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return SequenceOf(tuple, items[0], text_ok=True)
        bare = tp is typing.Tuple  # noqa: UP006  # (the bare alias itself; tuple[()] has no args either)
        return TupleOf(items) if args else (InstanceOf(tuple, (tuple,)) if bare else None)
    if origin in _SETS:
        return SequenceOf(_SETS[origin], items[0]) if len(items) == 1 else InstanceOf(origin, (origin,))
    if origin in _SEQUENCES or origin in _MAPPINGS:
        if not args:
            return InstanceOf(origin, (origin,))
        if origin in _SEQUENCES:
            return SequenceOf(_SEQUENCES[origin], items[0], text_ok=True) if len(items) == 1 else None
        return MappingOf(items[0], items[1], kind=origin) if len(items) == 2 else None
    if is_typeddict(tp):
        fields = {key: read_types(hint) for key, hint in typeddict_fields(tp).items()}
        if any(node is None for node in fields.values()):
            return None
        return TypedDictOf(tp, tuple(sorted(tp.__required_keys__)), tuple(fields.items()))  # type: ignore
    if origin is None and isinstance(tp, type) and _decided_by_type(tp):
        return InstanceOf(tp, _TOWER.get(tp, (tp,)))
    return None


@dataclass(frozen=True)
class TypedDictOf(Node):
    """A TypedDict whose fields types alone decide: a mapping with every required key, each declared
    key's value checked (keys it does not declare pass: a subclass may add them). beartype checks
    only that the value is a mapping."""

    cls: type
    required: tuple[str, ...]
    fields: tuple[tuple[str, Node], ...]

    def __str__(self) -> str:
        return self.cls.__name__

    def match(self, value: Any, env: dict[str, Any], path: str) -> Problem | None:
        if not isinstance(value, cabc.Mapping):
            return ArgumentTypeError, words("{}: expected {}, got {}", path, self, type(value).__name__)
        for key in self.required:
            if key not in value:
                return ArgumentTypeError, words("{} key {}: missing (required by {})", path, repr(key), self)
        for key, node in self.fields:
            if key in value:
                problem = node.match(value[key], env, f"{path}[{key!r}]")
                if problem is not None:
                    return problem
        return None


def _decided_by_type(cls: type) -> bool:
    """Whether ``isinstance(v, cls)`` depends on ``type(v)`` alone: not a Protocol (attributes
    decide), and no metaclass ``__instancecheck__`` of its own (one may read the value), except
    ABCMeta's and pydantic's (which only short-cuts ABCMeta's)."""
    if getattr(cls, "_is_protocol", False):
        return False
    check = type(cls).__instancecheck__
    return check in (type.__instancecheck__, abc.ABCMeta.__instancecheck__) or hasattr(cls, "model_fields")


def type_mismatch(name: str, node: Plain, value: Any) -> tuple[str, str] | None:
    """``(expected, got)`` for a parameter ``name`` whose ``value`` breaks its hint (``node``: a
    :class:`Plain` of the hint and its type tree), else None: beartype's verdict, and the tree's
    on every item of a container (the words say which item).

    Example::

        type_mismatch("tags", Plain(list[Tag], read_types(list[Tag])), [Tag(), 3])
        # ("list[Tag]", "list (tags[1]: expected Tag, got int)")
    """
    hint, tree = node.hint, node.types
    problem = tree.match(value, {}, name) if tree is not None else _items_problem(value, hint, name)
    if problem is None and is_bearable(value, hint, conf=BEARTYPE_CONF):
        return None
    if isinstance(hint, type):
        expected = hint.__name__
    else:
        expected = str(tree) if tree is not None else str(hint).replace("torch.", "")
    got = type(value).__name__
    if problem is not None and not problem[1].startswith((f"{name}[", f"{name} key", f"{name} item")):
        problem = _items_problem(value, hint, name) or problem  # (a union's tree does not say which item)
    if problem is not None and problem[1].startswith((f"{name}[", f"{name} key", f"{name} item")):
        got += f" ({problem[1]})"  # the item that breaks it
    return expected, got


