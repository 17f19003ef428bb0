"""jaxtyping array annotations as the reader sees them: whether a hint is one
(:func:`is_array_type`), which torch dtypes it allows (:func:`array_dtypes`), why an array class
cannot be checked (:func:`unsupported_array_type`), ``X | None`` split (:func:`split_optional`),
type aliases unwrapped (:func:`unalias`).

Example::

    array_dtypes(Float[Tensor, "B"], None, "x")      # frozenset({torch.float16, torch.bfloat16, ...})
"""

from __future__ import annotations

import collections.abc as cabc
import typing
from collections.abc import Mapping
from types import NoneType, UnionType
from typing import Any

import torch

from ..errors import AnnotationError
from ..model.markers import Spec
from ..rules.tensor import dtype_name

_TORCH_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    name: dt for name in dir(torch) if isinstance(dt := getattr(torch, name, None), torch.dtype)
}


def unsupported_array_type(hint: Any) -> str | None:
    """Why a jaxtyping array annotation's array class cannot be checked, or None (torch.Tensor).
    A subclass (``Float[nn.Parameter, "D"]``) is refused rather than widened to any tensor: the
    checks test ``torch.Tensor``, so a plain tensor would pass where the annotation asks for more."""
    array_type = hint.array_type
    if array_type is torch.Tensor:
        return None
    name = getattr(array_type, "__qualname__", repr(array_type))
    if isinstance(array_type, type) and issubclass(array_type, torch.Tensor):
        return (f"{name} is a subclass of torch.Tensor, which contracts do not check as such (any tensor would "
                f"pass): annotate {getattr(hint.dtype, '__name__', 'Shaped')}[Tensor, "
                f"{hint.dim_str!r}] and test isinstance(..., {name}) in the body if it matters")
    return f"only torch.Tensor arrays are supported, got {array_type!r}"


def _is_jaxtyping_array(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "dim_str") and hasattr(tp, "dtypes") and hasattr(tp, "array_type")


def split_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(tp) if a is not NoneType]
        if len(args) == 1 and len(args) != len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def array_dtypes(array_type: Any, spec: Spec | None, where: str) -> frozenset[torch.dtype]:
    """The dtypes a jaxtyping array annotation allows, narrowed by ``Spec(dtypes=...)``."""
    names = array_type.dtypes
    if not isinstance(names, (list, tuple, set, frozenset)):  # Shaped[...]: jaxtyping's "any dtype"
        names = tuple(_TORCH_DTYPE_BY_NAME)
    allowed = frozenset(_TORCH_DTYPE_BY_NAME[n] for n in names if n in _TORCH_DTYPE_BY_NAME)
    if spec is not None and spec.dtypes is not None:
        narrowed = frozenset(spec.dtypes)
        if not narrowed <= allowed:
            extra = ", ".join(sorted(dtype_name(d) for d in narrowed - allowed))
            raise AnnotationError(f"{where}: Spec(dtypes=...) allows {extra}, outside the annotation's dtype "
                                  f"category {array_type.dtype.__name__}")
        allowed = narrowed
    if not allowed:
        raise AnnotationError(f"{where}: no torch dtype is allowed by the annotation")
    return allowed


def is_array_type(tp: Any) -> bool:
    """A jaxtyping array annotation (``Float[Tensor, "B D"]``)."""
    return isinstance(tp, type) and hasattr(tp, "dim_str") and hasattr(tp, "dtypes") and hasattr(tp, "array_type")


def unalias(tp: Any) -> Any:
    """The annotation a ``TypeAliasType`` alias (``type X = ...``, ``typing_extensions.TypeAliasType``)
    stands for, unwrapped all the way; anything else unchanged."""
    while type(tp).__name__ == "TypeAliasType" and hasattr(tp, "__value__"):
        tp = tp.__value__
    return tp


# get_origin gives the runtime class for both list[X] and typing.List[X], Sequence[X] and
# typing.Sequence[X], and so on.
_SEQUENCES: Mapping[Any, type] = {list: list, cabc.Sequence: cabc.Sequence, cabc.MutableSequence: cabc.MutableSequence}


_MAPPINGS = (dict, cabc.Mapping, cabc.MutableMapping)


def int_hint(hint: Any) -> bool:
    """Whether a scalar's hint (its ``None`` split off) gives an int: ``int``, or a ``Literal`` of
    ints (``Literal[3, 4]``), so an argument named like a dim binds it or is checked against it."""
    inner, _ = split_optional(hint)
    if inner is int:
        return True
    args = typing.get_args(inner)
    return typing.get_origin(inner) is typing.Literal and bool(args) and \
        all(isinstance(a, int) and not isinstance(a, bool) for a in args)
