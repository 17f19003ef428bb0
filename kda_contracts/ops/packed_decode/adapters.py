"""``kc.adapters``: the backends of packed decode, in the kernel-interface convention.

Packed decode is a :class:`kc.Op <kda_contracts.Op>` (``kc.packed_decode``), and its backends
are that op's. This module is the documented alias kept from before ops existed: an
:class:`Adapter` is a backend whose kernel has the signature of ``kernels/INTERFACE.md``
(``kernel(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, *, num_heads,
use_qk_l2norm, lower_bound, state_layout)``) and which may restrict the state dtypes, layouts
and gate modes it supports. The kernel's signature is checked when it is registered (or, for
``"module:function"``, when it is loaded): a kernel that cannot take that call is refused with a
TypeError naming why, never chosen by ``auto``.

Example::

    kc.adapters.register(kc.adapters.Adapter(
        name="mine", kernel="my_pkg.kernels:packed_decode", devices=("cuda",), priority=50,
        requires=("my_pkg",), where=("pow2(K)",)))
    kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx)
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..._engine import Backend, BackendError, CallInfo
from .._packed.layouts import SYMBOLS  # B, H, HV, K, V, N: kda_kernels' DecodeDims order

if TYPE_CHECKING:
    from ..._engine import Op

__all__ = ["Adapter", "BackendError", "available", "bind", "describe", "get", "load_plugins", "names", "refresh",
           "register", "unregister", "verdicts"]


ENTRY_POINT_GROUP = "kda_contracts.adapters"  # the older group; ``kda_contracts.backends`` serves any op
_INTERFACE_ARGS = 9  # mixed_qkv ... indices, then the keywords below
_INTERFACE_KEYWORDS = ("num_heads", "use_qk_l2norm", "lower_bound", "state_layout")
_PLUGIN_ERRORS: dict[str, str] = {}


@dataclass(frozen=True)
class Adapter(Backend):
    """One backend of packed decode, its kernel in the kernel-interface convention.

    ``kernel`` is the kernel itself or ``"module:function"`` (imported on first use).
    ``priority`` orders ``backend="auto"``: the highest available adapter that supports the
    call wins. ``state_dtypes``/``layouts``/``gates`` restrict what it supports; ``where``
    constrains the dims (``"pow2(K)"``); ``explicit_devices`` are device types it runs on only
    when asked by name (a callable is asked per call).
    """

    state_dtypes: frozenset[torch.dtype] | None = None
    layouts: frozenset[str] = frozenset({"VK", "KV"})
    gates: frozenset[str] = frozenset({"softplus", "bounded"})

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "op", "packed_decode")

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when this backend can load here, else ``(False, why)`` (cached)."""
        return _op().table.available(self)

    def key_args(self, floating: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (("initial_state",) if self.state_dtypes is not None else (),
                ("lower_bound",) if self.gates != {"softplus", "bounded"} else ())

    def extra_unsupported(self, info: CallInfo) -> list[str]:
        why = []
        state = info.dtypes.get("initial_state")
        if self.state_dtypes is not None and state is not None and state not in self.state_dtypes:
            why.append(f"state dtype {str(state).removeprefix('torch.')} not supported")
        if info.variant is not None and info.variant not in self.layouts:
            why.append(f"state layout {info.variant} not supported")
        gate = "softplus" if "lower_bound" in info.absent else "bounded"
        if gate not in self.gates:
            why.append(f"{gate} gate not supported")
        return why

    def signature_problem(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter]) -> str | None:
        try:
            sig = inspect.signature(kernel)
        except (TypeError, ValueError) as exc:
            return f"its signature cannot be read ({exc})"
        try:
            sig.bind(*range(_INTERFACE_ARGS), **dict.fromkeys(_INTERFACE_KEYWORDS))
        except TypeError as exc:
            return (f"it cannot be called as kernels/INTERFACE.md says (9 tensors and scalars, then "
                    f"{', '.join(k + '=' for k in _INTERFACE_KEYWORDS)}): {exc}")
        return None

    def make_runner(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter],
                    dims_types: Mapping[str | None, type]) -> Callable[..., Any]:
        heads = {v: t._fields.index("H") for v, t in dims_types.items()}  # type: ignore[attr-defined]
        from kda_kernels.interface import DecodeBackend  # plain torch (no triton, helion or fla)

        launch = kernel.launch if isinstance(kernel, DecodeBackend) else None
        if launch is not None and all(t._fields == SYMBOLS for t in dims_types.values()):  # type: ignore[attr-defined]
            # a kda_kernels DecodeBackend: hand it the dims the contract bound (not read again)
            def run_with_dims(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any,
                              dt_bias: Any, scale: float, initial_state: Any, out: Any, ssm_state_indices: Any,
                              use_qk_l2norm_in_kernel: bool, lower_bound: float | None, *, config: Any,
                              state_layout: Any) -> None:
                launch(d, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                       use_qk_l2norm_in_kernel, lower_bound, layout)

            return run_with_dims

        def run(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                scale: float, initial_state: Any, out: Any, ssm_state_indices: Any, use_qk_l2norm_in_kernel: bool,
                lower_bound: float | None, *, config: Any, state_layout: Any) -> None:
            kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   num_heads=d[heads[layout]],
                   use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound, state_layout=layout)

        return run


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
        raise TypeError(f"register() takes a kda_contracts.adapters.Adapter, got {type(adapter).__name__}")
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


def shipped() -> list[Adapter]:
    """The kernels kda-contracts ships (the torch reference is the op's own body)."""
    return [
        _gpu_backend("triton", 30, "our Triton kernel: one program per (request, value head, V tile), bounds-guarded",
                     interpreted=True),
        _gpu_backend("helion", 20, "our Helion kernel with pinned configs (no run-time autotuning)", interpreted=True),
        _gpu_backend("fla", 10, "flash-linear-attention's fused_recurrent_kda (peer); padding compacted on the host "
                     "(syncs)"),
    ]


def describe(backend: Backend) -> dict[str, Any]:
    """A JSON-able description of a backend (for docs and ``explain_backends``)."""
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
