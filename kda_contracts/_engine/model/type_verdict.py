"""beartype's verdict on a value and on every item of every container in it (beartype samples
one item per container per call), as a :data:`Problem` naming the first item that breaks it; and
the words of a problem (:func:`words`, :func:`safe_repr`: no tensor values, a raising repr
survived).

Example::

    deep_problem([1, 2, "3"], list[int], "ks")   # (ArgumentTypeError, "ks[2]: expected int, got str")
"""

from __future__ import annotations

import collections
import collections.abc as cabc
import typing
from collections.abc import Callable, Iterable, Sequence
from types import UnionType
from typing import Any

import torch
import typing_extensions
from beartype import BeartypeConf
from beartype.door import is_bearable

from ..errors import ArgumentTypeError, ContractError, _hint_text
from ..rules.tensor import fmt_ints

Problem = tuple[type[ContractError], str]


BEARTYPE_CONF = BeartypeConf(is_pep484_tower=True)


def words(template: str, *values: Any) -> str:
    """A problem's words: ``template`` filled with ``values`` (sizes written ``[a, b]``).

    Under torch.compile, ``template`` alone (:func:`_unworded`): the traced checker only asks
    whether a value fits, and a rejected call is worded at trace time on the real values, so the
    trace never turns a symbolic size into text (dynamo cannot, and would stop the trace)."""
    return template.format(*(fmt_ints(v) if isinstance(v, (tuple, list)) else v for v in values))


_ALL_DTYPES = frozenset(v for v in vars(torch).values() if isinstance(v, torch.dtype))


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    """``float32, int32``: dtypes by their short names, sorted (``any dtype`` for none, or all of torch's)."""
    dtypes = frozenset(dtypes)
    if not dtypes or dtypes >= _ALL_DTYPES:
        return "any dtype"
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def union_words(options: Sequence[Any], none_ok: bool) -> str:
    """A union's words: its options' own, joined with ``|``; tensors whose words are the same (told
    apart by dtype alone) also say their dtypes (``Tensor[b] (float32) | Tensor[b] (int32)``)."""
    texts = [str(o) for o in options]
    if len(set(texts)) < len(texts):
        texts = [f"{t} ({dtype_names(o.dtypes)})" if hasattr(o, "dtypes") else t
                 for t, o in zip(texts, options, strict=True)]
    return " | ".join(texts + (["None"] if none_ok else []))


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
    if (typing.get_origin(hint) is not None or is_typeddict(hint)) and _has_items(hint) and _outer_fits(value, hint):
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
    if is_typeddict(hint):
        return _typeddict_problem(value, hint, path) if isinstance(value, cabc.Mapping) else None
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


def is_typeddict(hint: Any) -> bool:
    """Whether ``hint`` is a TypedDict class (``typing``'s or ``typing_extensions``')."""
    return isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__required_keys__")


_FIELD_WRAPPERS = {getattr(m, n) for m in (typing, typing_extensions)
                   for n in ("Required", "NotRequired", "ReadOnly") if hasattr(m, n)}


_TYPEDDICT_FIELDS: dict[type, dict[str, Any]] = {}


def _unmarked(hint: Any) -> Any:
    """A TypedDict field's hint without its Required/NotRequired/ReadOnly marks, also where they sit
    inside ``Annotated`` (PEP 655 allows either order); the ``Annotated`` metadata is kept."""
    origin = typing.get_origin(hint)
    if origin in _FIELD_WRAPPERS:
        return _unmarked(typing.get_args(hint)[0])
    if origin is typing.Annotated:
        inner, *meta = typing.get_args(hint)
        params = (_unmarked(inner), *meta)
        return typing.Annotated[params] if meta else params[0]  # type: ignore[valid-type]
    return hint


def typeddict_fields(td: type) -> dict[str, Any]:
    """A TypedDict's field hints (inherited ones too), without the Required/NotRequired/ReadOnly marks
    (kept per class: a plain dict, which torch.compile traces without a word)."""
    fields = _TYPEDDICT_FIELDS.get(td)
    if fields is None:
        fields = {key: _unmarked(hint) for key, hint in typing.get_type_hints(td, include_extras=True).items()}
        _TYPEDDICT_FIELDS[td] = fields
    return fields


def _typeddict_problem(value: cabc.Mapping, td: type, path: str) -> Problem | None:
    """A TypedDict's keys and values (beartype checks only that the value is a mapping): every
    required key present, and each declared key's value fits its field's hint (keys it does not
    declare are let through, as a TypedDict's subclasses add keys)."""
    missing = sorted(k for k in td.__required_keys__ if k not in value)  # type: ignore[attr-defined]
    if missing:
        return ArgumentTypeError, f"{path} key {missing[0]!r}: missing (required by {td.__name__})"
    fields = typeddict_fields(td)
    for key, item in value.items():
        if key in fields and (problem := deep_problem(item, fields[key], f"{path}[{safe_repr(key)}]")) is not None:
            return problem
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
    return is_typeddict(hint) or _typed_container(origin, args)


def _typed_container(origin: Any, args: tuple[Any, ...]) -> bool:
    """Whether a hint's origin and arguments are a container with typed items (a tuple, or one of
    :data:`_ITEMS` / :data:`_PAIRS` given its item types)."""
    return bool(args) and (origin is tuple or origin in _ITEMS or origin in _PAIRS)
