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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .dims import Constraint, parse_constraint
from .errors import ContractError

__all__ = ["Adapter", "DecodeCall", "available", "get", "names", "register", "select", "unregister"]


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
    _constraints: tuple[Constraint, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_constraints", tuple(parse_constraint(w, f"adapter {self.name!r}")
                                                       for w in self.where))

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when this backend can load here, else ``(False, why)``."""
        for mod in self.requires:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # ImportError, or a package that breaks on import
                kind = "is not installed" if isinstance(exc, ModuleNotFoundError) else f"fails to import ({exc})"
                return False, f"{mod} {kind}"
        if self.availability is not None:
            return self.availability()
        return True, ""

    def unsupported(self, call: DecodeCall) -> list[str]:
        """Why this backend cannot run ``call`` (empty when it can)."""
        why: list[str] = []
        if call.device_type not in self.devices:
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


_REGISTRY: dict[str, Adapter] = {}
_LOADED: dict[str, Callable[..., None]] = {}


def register(adapter: Adapter, *, replace: bool = False) -> Adapter:
    """Add a backend. ``replace=True`` overrides one of the same name."""
    if adapter.name in _REGISTRY and not replace:
        raise ValueError(f"a backend named {adapter.name!r} is already registered (pass replace=True)")
    _REGISTRY[adapter.name] = adapter
    _LOADED.pop(adapter.name, None)
    return adapter


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
    _LOADED.pop(name, None)


def names() -> list[str]:
    return sorted(_REGISTRY, key=lambda n: -_REGISTRY[n].priority)


def get(name: str) -> Adapter:
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
        ok, why = ad.available()
        out.append((ad, ([why] if not ok else []) + ad.unsupported(call)))
    return out


def select(backend: str, call: DecodeCall) -> Adapter:
    """The adapter to run ``call``: the named one (which must support it), or for ``"auto"``
    the highest-priority available one that supports it."""
    if backend != "auto":
        ad = get(backend)
        ok, why = ad.available()
        reasons = ([why] if not ok else []) + ad.unsupported(call)
        if reasons:
            raise BackendError(f"backend {backend!r} cannot run this call: {'; '.join(reasons)}")
        return ad
    for ad, reasons in verdicts(call):
        if not reasons:
            return ad
    lines = "; ".join(f"{ad.name}: {', '.join(r)}" for ad, r in verdicts(call))
    raise BackendError(f"no backend can run this call ({lines})")


def _register_builtin(adapters: Iterable[Adapter]) -> None:
    for ad in adapters:
        register(ad, replace=True)


_register_builtin([
    Adapter(
        name="torch",
        kernel="kda_kernels.reference:packed_decode",
        devices=("cpu", "cuda"),
        priority=0,
        description="PyTorch reference: vectorised over the batch, every dtype, layout and gate",
    ),
])


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
