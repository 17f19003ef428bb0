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

import dataclasses
import sys
import typing
from types import NoneType, UnionType
from typing import Any

from ..errors import AnnotationError
from ..grammar.dims import parse_shape
from ..model.nodes import FieldsOf, MappingOf, Node, OneOf, Plain, SequenceOf, TupleOf, nested_tensor
from ..model.type_verdict import is_typeddict
from .arrays import _MAPPINGS, _SEQUENCES, array_dtypes, is_array_type, unalias, unsupported_array_type
from .type_trees import read_types


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
    """Whether the fields of a structured class (or TypedDict) mention an array type. A field
    annotation that does not resolve at decoration (a ``TYPE_CHECKING``-only import, a class defined
    later) is an AnnotationError: what it holds would go unchecked. A class marked
    ``@typing.no_type_check`` is the opt-out: an opaque type, checked with isinstance only."""
    if getattr(cls, "__no_type_check__", False):
        return False
    try:
        fields = _field_hints(cls) if not is_typeddict(cls) else typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        if isinstance(exc, AnnotationError) and not isinstance(exc, _UnreadableHints):
            raise  # (the annotations read, and say something that cannot be checked)
        raise AnnotationError(_unresolved_field_message(cls, exc)) from exc
    return fields is not None and any(mentions_array(h, _seen | {cls}) for h in fields.values())


def _unresolved_field_message(cls: type, exc: Exception) -> str:
    namespace = {**vars(sys.modules.get(cls.__module__, object())), **vars(cls)}
    shown, why = cls.__name__, str(exc.__cause__ or exc)
    for name, hint in _raw_annotations(cls).items():
        text = hint.__forward_arg__ if isinstance(hint, typing.ForwardRef) else hint
        try:
            eval(text, namespace) if isinstance(text, str) else text  # the class's own annotation
        except Exception as field_exc:
            shown, why = f"{cls.__name__}.{name} ({text})", str(field_exc)
            break
    return (f"cannot read the annotation of {shown} at decoration: {why}, so what {cls.__name__} holds would "
            "go unchecked; make it resolvable (import the names it uses at runtime, not under TYPE_CHECKING; "
            f"define a class it names before the decorated function), or mark {cls.__name__} "
            "@typing.no_type_check to pass it as an opaque object, checked with isinstance only")


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
    cls = _structured(tp) or (tp if is_typeddict(tp) else None)
    return cls is not None and cls not in _seen and _fields_mention_array(cls, _seen | {tp})


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
        if (why := unsupported_array_type(tp)) is not None:
            raise AnnotationError(f"{where}: {why}")

        return nested_tensor(tp.dim_str, parse_shape(tp.dim_str, where), array_dtypes(tp, None, where))
    if not mentions_array(tp):
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
    if is_typeddict(tp):
        raise AnnotationError(f"{where}: the TypedDict {tp.__name__} holds tensors, and kda-contracts does not walk "
                              "TypedDicts; use a dataclass, NamedTuple, pydantic model or dict[str, ...] of tensors")
    raise AnnotationError(f"{where}: {tp!r} mentions a tensor annotation inside a type kda-contracts cannot walk "
                          "(supported: list, tuple, dict, Sequence, Mapping, Union/Optional, dataclasses, "
                          "NamedTuples, pydantic models)")


def _is_doc(meta: Any) -> bool:
    return isinstance(meta, str)
