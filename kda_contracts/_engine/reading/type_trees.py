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
import collections
import collections.abc as cabc
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any

from beartype.door import is_bearable
from beartype.roar import BeartypeCallHintParamViolation

from ..errors import ArgumentTypeError
from .annotations import _hint_text
from .structure import (
    _MAPPINGS,
    _SEQUENCES,
    BEARTYPE_CONF,
    MappingOf,
    Node,
    OneOf,
    Plain,
    Problem,
    SequenceOf,
    TupleOf,
    safe_repr,
    words,
)

__all__ = ["InstanceOf", "ItemTypeViolation", "deep_problem", "every_item_checker", "read_types", "traced_type_check",
           "type_mismatch"]


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


_TOWER: Mapping[Any, tuple[type, ...]] = {float: (int, float), complex: (int, float, complex)}


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
    if origin in _SEQUENCES or origin in _MAPPINGS:
        if not args:
            return InstanceOf(origin, (origin,))
        if origin in _SEQUENCES:
            return SequenceOf(_SEQUENCES[origin], items[0], text_ok=True) if len(items) == 1 else None
        return MappingOf(items[0], items[1], kind=origin) if len(items) == 2 else None
    if origin is None and isinstance(tp, type) and _decided_by_type(tp):
        return InstanceOf(tp, _TOWER.get(tp, (tp,)))
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


# containers whose items can be read without consuming anything (not Iterable, Iterator, Generator)
_ITEMS = (list, tuple, set, frozenset, cabc.Sequence, cabc.MutableSequence, cabc.Set, cabc.MutableSet,
          cabc.Collection, collections.deque)
_PAIRS = (dict, cabc.Mapping, cabc.MutableMapping, collections.OrderedDict, collections.defaultdict)


def deep_problem(value: Any, hint: Any, path: str) -> Problem | None:
    """beartype's verdict on ``value`` and on every item of every container in it (beartype checks
    one item per container per call, picked at random), as a :data:`Problem` naming the first item
    that breaks it; None when it fits.

    Example::

        deep_problem([1, 2, "3"], list[int], "ks")   # (ArgumentTypeError, "ks[2]: expected int, got str")
    """
    # the items first: beartype's verdict on a container rests on one sampled item, so its rejection
    # would name the container where the items can name the item
    if typing.get_origin(hint) is not None and _has_items(hint) and _outer_fits(value, hint):
        problem = _items_problem(value, hint, path)
        if problem is not None:
            return problem
    if not is_bearable(value, hint, conf=BEARTYPE_CONF):
        return ArgumentTypeError, f"{path}: expected {_hint_text(hint)}, got {type(value).__name__}"
    return None


def _outer_fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is the kind of container ``hint`` asks for (its items unread; beartype's
    verdict for any other hint). Deterministic where beartype samples: it never depends on which
    item beartype happens to look at."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:  # (the metadata is beartype's to check, on the value)
        return _outer_fits(value, args[0]) and is_bearable(value, hint, conf=BEARTYPE_CONF)
    if origin in (typing.Union, UnionType):
        return any(_outer_fits(value, member) for member in args)
    if _typed_container(origin, args):
        if not isinstance(value, origin):
            return False
        return origin is not tuple or args[-1] is Ellipsis or len(value) == len(args)
    return is_bearable(value, hint, conf=BEARTYPE_CONF)


def _items_problem(value: Any, hint: Any, path: str) -> Problem | None:
    """The items' side of :func:`deep_problem`, for a value whose outer kind fits (:func:`_outer_fits`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:  # (beartype checked the metadata on the value itself)
        return _items_problem(value, args[0], path)
    if origin in (typing.Union, UnionType):  # it must fit one member wholly
        first: Problem | None = None
        for member in args:
            if _outer_fits(value, member):
                problem = _items_problem(value, member, path)
                if problem is None:
                    return None
                first = first or problem
        return first
    if not args or isinstance(value, (str, bytes)) or not _outer_fits(value, hint):
        return None  # (a value of another kind, or a tuple of another length: not an item's problem)
    # (item, its hint, how its path is worded: only for an item that fails, as a repr may be costly or raise)
    pairs: Iterable[tuple[Any, Any, Callable[[], str]]]
    if origin is tuple:
        pairs = ((v, args[0] if args[-1] is Ellipsis else args[i], lambda i=i: f"{path}[{i}]")  # type: ignore[misc]
                 for i, v in enumerate(value))
    elif origin in _PAIRS and len(args) == 2:
        pairs = (p for k, v in value.items()
                 for p in ((k, args[0], lambda k=k: f"{path} key {safe_repr(k)}"),
                           (v, args[1], lambda k=k: f"{path}[{safe_repr(k)}]")))
    elif origin in _ITEMS and len(args) == 1:
        ordered = isinstance(value, cabc.Sequence)
        pairs = ((v, args[0], _index_path(path, i) if ordered else _item_path(path, v)) for i, v in enumerate(value))
    else:
        return None
    for item, item_hint, where in pairs:
        if deep_problem(item, item_hint, path) is not None:
            return deep_problem(item, item_hint, where())
    return None


def _index_path(path: str, i: int) -> Callable[[], str]:
    return lambda: f"{path}[{i}]"


def _item_path(path: str, v: Any) -> Callable[[], str]:
    return lambda: f"{path} item {safe_repr(v)}"


def _has_items(hint: Any) -> bool:
    """Whether a hint has a container with typed items anywhere (beartype samples those)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _has_items(args[0])
    if origin in (typing.Union, UnionType):
        return any(_has_items(a) for a in args)
    return _typed_container(origin, args)


def _typed_container(origin: Any, args: tuple[Any, ...]) -> bool:
    """Whether a hint's origin and arguments are a container with typed items (a tuple, or one of
    :data:`_ITEMS` / :data:`_PAIRS` given its item types)."""
    return bool(args) and (origin is tuple or origin in _ITEMS or origin in _PAIRS)


class ItemTypeViolation(BeartypeCallHintParamViolation):
    """An item of a container argument that beartype's sample did not look at breaks its hint
    (caught wherever beartype's own violation is: the call then takes the slow path)."""


def every_item_checker(check_types: Callable[..., None], params: Sequence[str],
                       hints: Mapping[str, Any]) -> Callable[..., None]:
    """``check_types`` (beartype's shim over ``params``), then every item of each container argument
    against its hint (a type tree where types alone decide, else beartype item by item); raises
    :class:`ItemTypeViolation`. ``check_types`` itself when no hint has a container."""
    deep = [(i, name, hints[name], read_types(hints[name])) for i, name in enumerate(params)
            if name in hints and _has_items(hints[name])]
    if not deep:
        return check_types

    def check_every_item(*vals: Any) -> None:
        try:
            check_types(*vals)
        except BeartypeCallHintParamViolation:
            raise
        except Exception as exc:  # beartype wording its report (an item's repr that raises): the slow path words it
            raise ItemTypeViolation(f"{type(exc).__name__} while checking the types", culprits=(exc,)) from None
        for i, name, hint, tree in deep:
            value = vals[i]
            problem = tree.match(value, {}, name) if tree is not None else _items_problem(value, hint, name)
            if problem is not None:
                raise ItemTypeViolation(problem[1], culprits=(value,))

    return check_every_item


_TRACED_TYPES = compile('''
def traced(*vals):
    for node, name, value in zip(_kc_nodes, _kc_names, vals):
        if node is not None and node.match(value, {}, name) is not None:
            return _kc_reject(*vals)
''', "<kda_contracts traced type check>", "exec")


def traced_type_check(check_types: Callable[..., None], params: Sequence[str], nodes: Mapping[str, Plain],
                      reject: Callable[..., None]) -> None:
    """Make torch.compile trace ``check_types`` (beartype's shim, over ``params`` in order) as the
    parameters' ``nodes`` (a :class:`Plain` per hint: its type tree, else beartype at trace time);
    ``reject``, a constant-result function taking every argument, raises the report of a call
    they reject. Eager calls are untouched: this only sets the attribute dynamo reads.

    Example::

        traced_type_check(contract.check_types, ["x", "tags"], {"tags": Plain(list[Tag], ...)}, reject)
    """
    ns: dict[str, Any] = {"_kc_nodes": tuple(nodes.get(p) for p in params), "_kc_names": tuple(params),
                          "_kc_reject": reject}
    exec(_TRACED_TYPES, ns)  # our own source; closure-free (dynamo guards a stand-in's closure via the shim's)
    check_types._torchdynamo_inline = ns["traced"]  # type: ignore[attr-defined]  # what dynamo traces
