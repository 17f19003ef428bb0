"""Which functions a contract is put on when it is not put on one function by hand: the methods
of a class (``kc.contract`` on a class, the import hook) and the functions of a module (the
import hook).

A function qualifies when an annotation of it mentions a jaxtyping array type. Left alone: one
marked ``@typing.no_type_check`` (the standard opt-out, which jaxtyping's own hook also honours),
and one that carries a contract already (anywhere down its ``__wrapped__`` chain), so that
``@kc.contract(...)`` with its own options is never wrapped twice. Annotations that cannot be
read (a name only imported under ``TYPE_CHECKING``) are an :class:`AnnotationError`: whether they
mention a tensor cannot be told, and never silent means not guessing.

Example::

    names = contract_members(Model, lambda fn, name: kc.contract(fn, name=name))
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from ..errors import AnnotationError
from .structure import mentions_array

Decorate = Callable[[Callable[..., Any], str], Any]  # (function, contract name) -> what replaces it
_SUFFIX = {"fset": ".setter", "fdel": ".deleter"}  # names of a property's other accessors' contracts


def is_contracted(fn: Any) -> bool:
    """Whether ``fn`` or a function it wraps (``__wrapped__``) carries a contract."""
    for _ in range(100):  # a __wrapped__ cycle must not hang an import
        if fn is None:
            return False
        if hasattr(fn, "__kda_contract__"):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def wants_contract(fn: Any, where: str) -> bool:
    """Whether an annotation of ``fn`` mentions an array type, ``fn`` is not marked
    ``@typing.no_type_check`` and carries no contract yet. AnnotationError (naming ``where``)
    when its annotations cannot be read."""
    if getattr(fn, "__no_type_check__", False) or is_contracted(fn):
        return False
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise AnnotationError(f"{where}: cannot read the annotations: {exc}") from exc
    return any(mentions_array(h) for h in hints.values())


def accessors(member: Any) -> dict[str, Any]:
    """The Python functions a class attribute runs: a method, the function of a static or class
    method or of a ``functools.cached_property``, a property's ``fget``/``fset``/``fdel``."""
    if inspect.isfunction(member):
        return {"": member}
    if isinstance(member, (staticmethod, classmethod, functools.cached_property)):
        fn = member.func if isinstance(member, functools.cached_property) else member.__func__
        return {"": fn} if inspect.isfunction(fn) else {}
    if isinstance(member, property):
        return {k: f for k in ("fget", "fset", "fdel") if inspect.isfunction(f := getattr(member, k))}
    return {}


def _rebuilt(cls: type, attr: str, member: Any, new: dict[str, Any]) -> Any:
    """``member`` again, running the functions of ``new`` instead of its own."""
    if inspect.isfunction(member):
        return new[""]
    if isinstance(member, (staticmethod, classmethod)):
        return type(member)(new[""])
    if isinstance(member, functools.cached_property):
        cached = functools.cached_property(new[""])
        cached.__set_name__(cls, attr)
        return cached
    fget, fset, fdel = (new.get(k, getattr(member, k)) for k in ("fget", "fset", "fdel"))
    own_doc = member.fget is None or member.__doc__ is not member.fget.__doc__
    return type(member)(fget, fset, fdel, member.__doc__ if own_doc else None)  # None: the getter's (new) doc


def contract_members(cls: type, decorate: Decorate, *, base: str | None = None, defined_in: str | None = None,
                     refused: Callable[[str, AnnotationError], None] | None = None) -> tuple[str, ...]:
    """Put ``decorate`` on every qualifying function of ``cls`` (see the module docstring; plain,
    static and class methods, property and cached_property accessors), in place, and return the
    names of the attributes it changed. Contracts are named ``{base}.{attr}`` (``base``: the
    class's qualname), a property's setter and deleter ``{base}.{attr}.setter`` / ``.deleter``.

    ``defined_in``: only functions of that module (not ones assigned from elsewhere). A member
    whose contract is refused raises its AnnotationError, or is handed to ``refused`` (its
    qualified name and the error) and left as it is.
    """
    done = []
    base = base or cls.__qualname__
    for attr, member in list(vars(cls).items()):
        new: dict[str, Any] = {}
        try:
            for key, fn in accessors(member).items():
                if defined_in is not None and getattr(fn, "__module__", None) != defined_in:
                    continue
                if wants_contract(fn, f"{cls.__qualname__}.{attr}"):
                    new[key] = decorate(fn, f"{base}.{attr}{_SUFFIX.get(key, '')}")
        except AnnotationError as err:
            if refused is None:
                raise
            refused(f"{cls.__qualname__}.{attr}", err)
            continue
        if new:
            setattr(cls, attr, _rebuilt(cls, attr, member, new))
            done.append(attr)
    return tuple(done)
