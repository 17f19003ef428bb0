"""Backends for packed decode: who can run a validated call, and which one ``backend="auto"`` picks.

An :class:`Adapter` declares its name, the device types it runs on, how to tell whether it can
load here (and why not), and what it supports beyond the base contract: state dtypes, layouts,
gate modes and dim constraints in the contract grammar (``"pow2(K)"``, ``"K <= 256"``). Kernels
load lazily: nothing here imports triton, helion or fla until a backend is asked for.

Example::

    kc.adapters.register(kc.adapters.Adapter(
        name="mine", kernel="my_pkg.kernels:packed_decode", devices=("cuda",), priority=50,
        requires=("my_pkg",), where=("pow2(K)",)))
    kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...constraints import Constraint, parse_constraint
from ...errors import AnnotationError, ContractError, Violation, raise_violations

__all__ = ["Adapter", "DecodeCall", "available", "get", "names", "register", "select_cached", "unregister"]


class BackendError(ContractError):
    """The requested backend cannot run this call (not installed, wrong device, unsupported)."""

    kind_name = "BackendError"


@dataclass(frozen=True)
class DecodeCall:
    """What a backend needs to know of a validated call to say whether it supports it."""

    device_type: str
    state_dtype: torch.dtype
    activation_dtype: torch.dtype
    index_dtype: torch.dtype
    layout: str
    gate: str
    dims: Mapping[str, int]


@dataclass(frozen=True)
class Adapter:
    """One backend of packed decode.

    ``kernel`` is the kernel itself or ``"module:function"`` (imported on first use); it has the
    signature of ``kernels/INTERFACE.md``. ``priority`` orders ``backend="auto"``: the highest
    available adapter that supports the call wins (faster kernels get higher numbers).
    """

    name: str
    kernel: str | Callable[..., None]
    devices: tuple[str, ...]
    priority: int = 0
    requires: tuple[str, ...] = ()
    availability: Callable[[], tuple[bool, str]] | None = None
    state_dtypes: frozenset[torch.dtype] | None = None
    layouts: frozenset[str] = frozenset({"VK", "KV"})
    gates: frozenset[str] = frozenset({"softplus", "bounded"})
    where: tuple[str, ...] = ()
    description: str = ""
    # Device types it also runs on when asked by name (e.g. the CPU under TRITON_INTERPRET, for
    # tests): never chosen by backend="auto", which is about speed. A callable is asked per call.
    explicit_devices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    _constraints: tuple[Constraint, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_constraints", tuple(parse_constraint(w, f"adapter {self.name!r}")
                                                       for w in self.where))
        for c in self._constraints:
            if c.facts():  # a backend sees the call's dims, not its arguments: never skip silently
                raise AnnotationError(f"adapter {self.name!r}: where {c.text!r}: a backend constraint is on dims "
                                      f"only; {', '.join(f.key for f in c.facts())} is not a dim")

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when this backend can load here, else ``(False, why)``. Cached: the
        answer does not change within a process (``refresh()`` forgets it)."""
        cached = _AVAILABLE.get(self.name)
        if cached is None:
            cached = _AVAILABLE[self.name] = self._probe()
        return cached

    def _probe(self) -> tuple[bool, str]:
        for mod in self.requires:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # ImportError, or a package that breaks on import
                kind = "is not installed" if isinstance(exc, ModuleNotFoundError) else f"fails to import ({exc})"
                return False, f"{mod} {kind}"
        if self.availability is not None:
            try:
                ok, why = self.availability()
            except Exception as exc:  # a plug-in's probe must not break dispatch
                return False, f"availability check failed: {exc!r}"
            return (True, "") if ok else (False, why)
        return True, ""

    def unsupported(self, call: DecodeCall, *, explicit: bool = False) -> list[str]:
        """Why this backend cannot run ``call`` (empty when it can); ``explicit``: asked by name."""
        why: list[str] = []
        extra = self.explicit_devices if explicit else ()
        devices = self.devices + (extra() if callable(extra) else extra)
        if call.device_type not in devices:
            why.append(f"runs on {'/'.join(self.devices)}, not {call.device_type}")
        if self.state_dtypes is not None and call.state_dtype not in self.state_dtypes:
            why.append(f"state dtype {str(call.state_dtype).removeprefix('torch.')} not supported")
        if call.layout not in self.layouts:
            why.append(f"state layout {call.layout} not supported")
        if call.gate not in self.gates:
            why.append(f"{call.gate} gate not supported")
        for c in self._constraints:
            if c.symbols() <= call.dims.keys() and not c.holds(dict(call.dims)):
                got = ", ".join(f"{s}={call.dims[s]}" for s in sorted(c.symbols()))
                why.append(f"needs {c.text} (got {got})")
        return why

    def load(self) -> Callable[..., None]:
        if callable(self.kernel):
            return self.kernel
        fn = _LOADED.get(self.name)
        if fn is None:
            module, _, attr = self.kernel.partition(":")
            fn = _LOADED[self.name] = getattr(importlib.import_module(module), attr)
        return fn


ENTRY_POINT_GROUP = "kda_contracts.adapters"

_REGISTRY: dict[str, Adapter] = {}
_LOADED: dict[str, Callable[..., None]] = {}
_AVAILABLE: dict[str, tuple[bool, str]] = {}
_SELECTED: dict[tuple[Any, ...], Adapter] = {}
_SELECTED_MAX = 256
_PLUGINS_LOADED = False
_PLUGIN_ERRORS: dict[str, str] = {}


def register(adapter: Adapter, *, replace: bool = False) -> Adapter:
    """Add a backend. ``replace=True`` overrides one of the same name.

    Third-party packages can instead expose an :class:`Adapter` (or a callable returning one or
    several) under the entry-point group ``kda_contracts.adapters``; it is loaded on first use.
    """
    if not isinstance(adapter, Adapter):
        raise TypeError(f"register() takes a kda_contracts.adapters.Adapter, got {type(adapter).__name__}")
    if adapter.name in _REGISTRY and not replace:
        raise ValueError(f"a backend named {adapter.name!r} is already registered (pass replace=True)")
    _REGISTRY[adapter.name] = adapter
    refresh(adapter.name)
    return adapter


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
    refresh(name)


def refresh(name: str | None = None) -> None:
    """Forget cached availability, loaded kernels and selections (of one backend, or all)."""
    for cache in (_LOADED, _AVAILABLE):
        if name is None:
            cache.clear()
        else:
            cache.pop(name, None)
    _SELECTED.clear()


def load_plugins(*, force: bool = False) -> dict[str, str]:
    """Register the adapters of the ``kda_contracts.adapters`` entry-point group (once).

    Returns the plug-ins that failed to load, with why; a broken plug-in never breaks dispatch.
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED and not force:
        return dict(_PLUGIN_ERRORS)
    _PLUGINS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            made = obj() if callable(obj) and not isinstance(obj, Adapter) else obj
            for ad in made if isinstance(made, (list, tuple)) else (made,):
                register(ad, replace=True)
        except Exception as exc:
            _PLUGIN_ERRORS[ep.name] = f"{type(exc).__name__}: {exc}"
    return dict(_PLUGIN_ERRORS)


def names() -> list[str]:
    """Registered backends, highest priority first."""
    load_plugins()
    return sorted(_REGISTRY, key=lambda n: -_REGISTRY[n].priority)


def get(name: str) -> Adapter:
    load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; registered: {', '.join(names())}") from None


def available() -> dict[str, tuple[bool, str]]:
    """Each registered backend: ``(can load here, why not)``.

    Example::

        >>> kc.adapters.available()["torch"]
        (True, '')
    """
    return {n: _REGISTRY[n].available() for n in names()}


def verdicts(call: DecodeCall) -> list[tuple[Adapter, list[str]]]:
    """Every backend with the reasons it cannot run ``call``, highest priority first."""
    out = []
    for n in names():
        ad = _REGISTRY[n]
        reasons = ad.unsupported(call)
        if call.device_type in ad.devices:  # no need to import a GPU backend for a CPU call
            ok, why = ad.available()
            reasons = ([why] if not ok else []) + reasons
        out.append((ad, reasons))
    return out


def select_cached(key: tuple[Any, ...], backend: str, make_call: Callable[[], DecodeCall]) -> Adapter:
    """The adapter to run a call: the named one (which must support it), or for ``"auto"`` the
    highest-priority available one that supports it. Cached by ``key``, which the caller builds
    and which must determine the call (the hot path: one dict lookup, no :class:`DecodeCall`
    built unless the key is new)."""
    hit = _SELECTED.get(key)
    if hit is not None:
        return hit
    call = make_call()
    if backend != "auto":
        ad = get(backend)
        ok, why = ad.available()
        reasons = ([why] if not ok else []) + ad.unsupported(call, explicit=True)
        if reasons:
            raise_violations("packed_decode", [Violation(
                BackendError, "backend", f"a backend that can run this call ({backend!r} was asked for)",
                f"{backend!r}: {'; '.join(reasons)}",
                hint="pass backend='auto' to let kda_contracts pick, or see kc.explain_backends(...)")],
                dict(call.dims), {})
    else:
        table = verdicts(call)
        chosen = next((a for a, r in table if not r), None)
        if chosen is None:
            raise_violations("packed_decode", [Violation(
                BackendError, "backend", "an available backend that supports this call",
                "; ".join(f"{a.name}: {', '.join(r)}" for a, r in table))], dict(call.dims), {})
        assert chosen is not None  # raise_violations raised
        ad = chosen
    if len(_SELECTED) >= _SELECTED_MAX:
        _SELECTED.clear()
    _SELECTED[key] = ad
    return ad


def _probe_of(module: str) -> Callable[[], tuple[bool, str]]:
    """An availability check that imports ``module`` only when asked and calls its is_available()."""

    def probe() -> tuple[bool, str]:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            return False, f"{module} fails to import ({type(exc).__name__}: {exc})"
        return mod.is_available()

    return probe


def _cpu_if_interpreting() -> tuple[str, ...]:
    # Read per call, not at import: the pytest plugin imports kda_contracts before a conftest
    # can set TRITON_INTERPRET.
    return ("cpu",) if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else ()


def _gpu_backend(name: str, priority: int, description: str, *, interpreted: bool = False) -> Adapter:
    """A shipped CUDA backend: ``kda_kernels.<name>_decode`` behind the ``<name>`` package;
    ``interpreted``: also on the CPU when asked by name under ``TRITON_INTERPRET`` (for tests)."""
    module = f"kda_kernels.{name}_decode"
    return Adapter(name=name, kernel=f"{module}:packed_decode", devices=("cuda",), priority=priority,
                   requires=(name,), availability=_probe_of(module), description=description,
                   explicit_devices=_cpu_if_interpreting if interpreted else ())


for _ad in (
    Adapter(
        name="torch",
        kernel="kda_kernels.reference:packed_decode",
        devices=("cpu", "cuda"),
        priority=0,
        description="PyTorch reference: vectorised over the batch, every dtype, layout and gate",
    ),
    _gpu_backend("triton", 30, "our Triton kernel: one program per (request, value head, V tile), bounds-guarded",
                 interpreted=True),
    _gpu_backend("helion", 20, "our Helion kernel with pinned configs (no run-time autotuning)", interpreted=True),
    _gpu_backend("fla", 10, "flash-linear-attention's fused_recurrent_kda (peer); padding compacted on the host "
                 "(syncs)"),
):
    register(_ad, replace=True)


def describe(adapter: Adapter) -> dict[str, Any]:
    """A JSON-able description of an adapter (for docs and ``explain_backends``)."""
    return {
        "name": adapter.name,
        "devices": list(adapter.devices),
        "priority": adapter.priority,
        "state_dtypes": None if adapter.state_dtypes is None
        else sorted(str(d).removeprefix("torch.") for d in adapter.state_dtypes),
        "layouts": sorted(adapter.layouts),
        "gates": sorted(adapter.gates),
        "where": list(adapter.where),
        "description": adapter.description,
    }
