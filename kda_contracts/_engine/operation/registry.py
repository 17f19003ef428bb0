"""Every op defined so far (:func:`ops`, ``kc.ops()``), and the backends plug-in packages ship
for them through the ``kda_contracts.backends`` entry-point group (:func:`load_plugins`; a
backend for an op not defined yet waits for it).

Example::

    sorted(ops())      # ['gdn_packed_decode', 'packed_decode', ...]
"""

from __future__ import annotations

from typing import Any

from ..errors import AnnotationError
from .backends import Backend

_OPS: dict[str, Any] = {}  # name -> the Op


PLUGIN_GROUP = "kda_contracts.backends"


_PLUGIN_ERRORS: dict[str, str] = {}  # entry point -> why it failed to load


_PENDING: dict[str, list[tuple[Backend, bool]]] = {}  # op name -> plug-in backends waiting for it


_plugins_loaded = False


def ops() -> dict[str, Any]:
    """Every op defined so far, by name (plug-in backends are attached when listed)."""
    return dict(_OPS)


def load_plugins(*, force: bool = False) -> dict[str, str]:
    """Attach the backends of the ``kda_contracts.backends`` entry-point group to their ops
    (once). An entry point's value is a :class:`Backend` with ``op=`` set, or a callable
    returning one or several. Returns the plug-ins that failed to load, with why: a broken
    plug-in never breaks dispatch, and ``explain_backends`` lists it."""
    global _plugins_loaded
    if _plugins_loaded and not force:
        return dict(_PLUGIN_ERRORS)
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            obj = ep.load()
            made = obj() if callable(obj) and not isinstance(obj, Backend) else obj
            made = list(made) if isinstance(made, (list, tuple)) else [made]
            for b in made:
                if not isinstance(b, Backend) or b.op is None:
                    raise TypeError(f"expected kda_contracts Backend(s) with op= set, got {b!r}")
            for b in made:
                _attach(b, replace=True)
        except Exception as exc:
            _PLUGIN_ERRORS[f"{ep.name} ({ep.value})"] = f"{type(exc).__name__}: {exc}"
    return dict(_PLUGIN_ERRORS)


def _attach(b: Backend, *, replace: bool) -> None:
    target = _OPS.get(b.op or "")
    if target is None:
        _PENDING.setdefault(b.op or "", []).append((b, replace))
    else:
        target.table.register(b, replace=replace)


def add_op(op: Any) -> list[tuple[Backend, bool]]:
    """List ``op`` by its name (the latest op of a name is the one listed, as a module reloaded or
    two tests' local ops of one name expect); return the plug-in backends that were waiting for
    it. A shipped op's name (``packed_decode``) is an AnnotationError for an op of another
    function: it would take the shipped op's place in ``kc.ops()`` and its plug-in backends.
    (Each op's ``torch_op`` is a ``torch.library`` op of its own: see :func:`library_name`.)"""
    old = _OPS.get(op.name)
    if old is not None and _origin(old.fn) != _origin(op.fn) and _origin(old.fn).startswith("kda_contracts."):
        raise AnnotationError(f"{op.name}: the name of a kda_contracts op ({_origin(old.fn)}); an op of this name "
                              "would take its place in kc.ops() and its plug-in backends. Give this one a name of "
                              "its own: kc.op(name=...)")
    _OPS[op.name] = op
    return waiting_for(op.name)


def _origin(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


_LIBRARY: dict[str, str] = {}  # a torch.library qualified name -> the origin of the op that registered it


def library_name(namespace: str, name: str, fn: Any) -> str:
    """The ``torch.library`` name of an op's ``torch_op``: ``name``, or ``name_2``, ``name_3``, ...
    when an op of another function registered it first (two ops of one name must not share one
    library op, whose last registration would run for both). The same function defined again (a
    module reloaded, a notebook cell run twice) keeps its name."""
    origin, n, candidate = _origin(fn), 1, name
    while _LIBRARY.setdefault(f"{namespace}::{candidate}", origin) != origin:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


def waiting_for(name: str) -> list[tuple[Backend, bool]]:
    """The plug-in backends loaded for the op ``name`` before it existed (taken off the list)."""
    return _PENDING.pop(name, [])


def plugin_errors() -> dict[str, str]:
    """The plug-ins that failed to load, with why."""
    return dict(_PLUGIN_ERRORS)
