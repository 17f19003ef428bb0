"""``kc.adapters``: the backends of packed decode, in the kernel-interface convention.

Packed decode is a :class:`kc.Op <kda_contracts.Op>` (``kc.packed_decode``), and its backends
are that op's. This module is the documented alias kept from before ops existed: an
:class:`Adapter` is a backend whose kernel has the signature of ``kernels/INTERFACE.md``
(``kernel(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, *, num_heads,
use_qk_l2norm, lower_bound, state_layout)``) and which may restrict the state dtypes, layouts
and gate modes it supports. The kernel's signature is checked when it is registered (or, for
``"module:function"``, when it is loaded): a kernel that cannot take that call is refused with an
AnnotationError (a TypeError) naming why, never chosen by ``auto``.

Example::

    kc.adapters.register(kc.adapters.Adapter(
        name="mine", kernel="my_pkg.kernels:packed_decode", devices=("cuda",), priority=50,
        requires=("my_pkg",), where=("pow2(K)",)))
    kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._engine import AnnotationError, Backend, BackendError, CallInfo
from .._packed.backends import InterfaceBackend, shipped_kernels

if TYPE_CHECKING:
    from ..._engine import Op

__all__ = ["Adapter", "BackendError", "available", "bind", "describe", "get", "load_plugins", "names", "refresh",
           "register", "unregister", "verdicts"]


ENTRY_POINT_GROUP = "kda_contracts.adapters"  # the older group; ``kda_contracts.backends`` serves any op
_PLUGIN_ERRORS: dict[str, str] = {}


@dataclass(frozen=True)
class Adapter(InterfaceBackend):
    """One backend of packed decode, its kernel in the kernel-interface convention.

    ``kernel`` is the kernel itself or ``"module:function"`` (imported on first use).
    ``priority`` orders ``backend="auto"``: the highest available adapter that supports the
    call wins. ``state_dtypes``/``layouts``/``gates`` restrict what it supports; ``where``
    constrains the dims (``"pow2(K)"``); ``explicit_devices`` are device types it runs on only
    when asked by name (a callable is asked per call).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "op", "packed_decode")

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when this backend can load here, else ``(False, why)`` (cached)."""
        return _op().table.available(self)


_OP: list[Op] = []  # packed decode itself, once its module has made it (bind())


def bind(op: Op) -> None:
    """Make ``op`` (``kc.packed_decode``) the op this module's functions act on (its module calls this)."""
    _OP[:] = [op]


def _op() -> Op:
    return _OP[0]


def __getattr__(name: str) -> Any:
    if name == "_REGISTRY":  # the op's registry itself (tests save and restore it)
        return _op().table.registry
    raise AttributeError(name)


def register(adapter: Backend, *, replace: bool = False) -> Backend:
    """Add a backend to packed decode. ``replace=True`` overrides one of the same name.

    Third-party packages can instead expose an :class:`Adapter` (or a callable returning one or
    several) under the entry-point group ``kda_contracts.adapters`` (or any op's group,
    ``kda_contracts.backends``); it is loaded on first use.
    """
    if not isinstance(adapter, Backend):
        raise AnnotationError(f"register() takes a kda_contracts.adapters.Adapter, got {type(adapter).__name__}")
    return _op().table.register(adapter, replace=replace)


def unregister(name: str) -> None:
    _op().table.unregister(name)


def refresh(name: str | None = None) -> None:
    """Forget cached availability, loaded kernels and selections (of one backend, or all)."""
    _op().table.refresh(name)


def load_plugins(*, force: bool = False) -> dict[str, str]:
    """Register the adapters of the ``kda_contracts.adapters`` entry-point group (once), and the
    packed-decode backends of ``kda_contracts.backends``. Returns the plug-ins that failed to
    load, with why; a broken plug-in never breaks dispatch (``explain_backends`` lists it)."""
    from ..._engine import load_plugins as load_op_plugins

    table = _op().table
    if force:
        load_op_plugins(force=True)
        load_all()
    else:
        table.load_plugins()  # the op's first call does this too (load_all is its loader)
    return {**table.plugin_errors, **load_op_plugins()}


def load_all() -> None:
    """Packed decode's plug-in loader: the ``kda_contracts.adapters`` group, then the op's
    backends of ``kda_contracts.backends``."""
    from importlib.metadata import entry_points

    table = _op().table
    table.plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            made = obj() if callable(obj) and not isinstance(obj, Backend) else obj
            for ad in made if isinstance(made, (list, tuple)) else (made,):
                table.register(ad, replace=True)
        except Exception as exc:
            table.plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"
    _op()._load_plugins()


def names() -> list[str]:
    """Registered backends, highest priority first."""
    return _op().table.names()


def get(name: str) -> Backend:
    return _op().table.get(name)


def available() -> dict[str, tuple[bool, str]]:
    """Each registered backend: ``(can load here, why not)``.

    Example::

        >>> kc.adapters.available()["torch"]
        (True, '')
    """
    return _op().available()


def verdicts(info: CallInfo) -> list[tuple[Backend, list[str]]]:
    """Every backend with the reasons it cannot run a call, highest priority first."""
    return _op().table.verdicts(info)


#: the kernels kda-contracts ships for packed decode: name -> (priority, module, function, availability
#: check, description, runs on the CPU when asked by name under the Triton interpreter)
_KERNELS = {
    "triton": (30, "kda_kernels.triton_decode", "packed_decode", "is_available",
               "our Triton kernel: one program per (request, value head, V tile), bounds-guarded", True),
    "helion": (20, "kda_kernels.helion_decode", "packed_decode", "is_available",
               "our Helion kernel with pinned configs (no run-time autotuning)", True),
    "fla": (10, "kda_kernels.fla_decode", "packed_decode", "is_available",
            "flash-linear-attention's fused_recurrent_kda (peer); padding compacted on the host (syncs)", False),
}


def shipped() -> list[Adapter]:
    """The kernels kda-contracts ships (the torch reference is the op's own body)."""
    return shipped_kernels("packed_decode", _KERNELS, make=Adapter)  # type: ignore[return-value]


def describe(backend: Backend) -> dict[str, Any]:
    """A JSON-able description of a backend (for docs and ``explain_backends``)."""
    if not isinstance(backend, Backend):
        raise AnnotationError(f"describe() takes a backend (kc.Backend or an Adapter), got {backend!r}")
    ad = backend if isinstance(backend, Adapter) else None
    return {
        "name": backend.name,
        "devices": ["cpu", "cuda"] if "*" in backend.devices else list(backend.devices),
        "priority": backend.priority,
        "state_dtypes": None if ad is None or ad.state_dtypes is None
        else sorted(str(d).removeprefix("torch.") for d in ad.state_dtypes),
        "layouts": sorted(ad.layouts) if ad is not None else ["KV", "VK"],
        "gates": sorted(ad.gates) if ad is not None else ["bounded", "softplus"],
        "where": list(backend.where),
        "description": backend.description,
    }
