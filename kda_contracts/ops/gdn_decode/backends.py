"""The shipped kernels of GDN packed decode, registered on the op with the public backend API.

Each kernel lives in ``kda_kernels`` behind the packed-decode kernel interface
(``kernels/INTERFACE.md``: ``fn(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, *,
num_heads, use_qk_l2norm, lower_bound, state_layout)``). The op hands a backend its own
arguments plus the bound ``dims`` and the ``variant`` (the state layout), so the adapter below is
the whole glue; the module is imported on the first call that picks it, never by ``import
kda_contracts``.

| backend | priority | runs on | notes |
|---|---|---|---|
| triton | 30 | CUDA (CPU when asked by name under ``TRITON_INTERPRET=1``) | KDA's tuned kernel, one gate per head |
| helion | 20 | CUDA (same) | pinned configs, no autotuning |
| fla | 10 | CUDA (same) | flash-linear-attention's out-of-place kernel; syncs, gathers and scatters slots |
| torch | 0 | any | the op's body, ``kda_kernels.gdn_reference`` |

Example::

    >>> sorted(b.name for b in gdn_packed_decode.backends())
    ['fla', 'helion', 'torch', 'triton']
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from kda_kernels.interface import DecodeBackend

from ... import _engine as kc
from .._packed.layouts import SYMBOLS  # B, H, HV, K, V, N: kda_kernels' DecodeDims order
from .decode import gdn_packed_decode


def _cpu_if_interpreting() -> tuple[str, ...]:
    # Read per call: a conftest may set TRITON_INTERPRET after kda_contracts is imported.
    return ("cpu",) if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else ()


def _availability(module: str, probe: str) -> Callable[[], tuple[bool, str]]:
    """Import ``module`` only when asked and call its ``probe()``; under ``TRITON_INTERPRET`` a
    module that imports is available (it then runs on the CPU when asked by name)."""

    def available() -> tuple[bool, str]:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            return False, f"{module} fails to import ({type(exc).__name__}: {exc})"
        ok, why = getattr(mod, probe)()
        if not ok and _cpu_if_interpreting() and "CUDA" in why:
            return True, "the Triton interpreter (TRITON_INTERPRET is set)"
        return ok, why

    return available


def _interface_kernel(module: str, function: str) -> Callable[..., None]:
    """A backend with the op's signature calling ``module.function`` in the kernel interface
    (resolved on the first call)."""
    resolved: list[Callable[..., None]] = []

    def kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,  # type: ignore[no-untyped-def]
               ssm_state_indices, use_qk_l2norm_in_kernel=False, *, config=None, state_layout=None,
               dims, variant):
        if not resolved:
            fn = getattr(importlib.import_module(module), function)
            # a kda_kernels DecodeBackend takes the bound dims as they are
            resolved.append(fn.launch if isinstance(fn, DecodeBackend) and dims._fields == SYMBOLS else None)
            resolved.append(fn)
        if resolved[0] is not None:
            resolved[0](dims, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                        use_qk_l2norm_in_kernel, None, variant)
        else:
            resolved[1](mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                        num_heads=dims.H, use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=None,
                        state_layout=variant)

    kernel.__name__ = kernel.__qualname__ = f"{module.rsplit('.', 1)[-1]}.{function}"
    return kernel


_KERNELS: dict[str, tuple[int, str, str, str, str]] = {
    # name: (priority, module, function, availability probe, description)
    "triton": (30, "kda_kernels.triton_decode", "gdn_packed_decode", "is_available",
               "our Triton kernel (KDA's, one gate per value head): bounds-guarded, both layouts"),
    "helion": (20, "kda_kernels.helion_decode", "gdn_packed_decode", "is_available",
               "our Helion kernel with pinned configs (no run-time autotuning)"),
    "fla": (10, "kda_kernels.fla_decode", "gdn_packed_decode", "gdn_is_available",
            "flash-linear-attention's fused_recurrent_gated_delta_rule (peer): out of place, padding "
            "compacted on the host (syncs)"),
}


def _register() -> tuple[kc.Backend, ...]:
    made = []
    for name, (priority, module, function, probe, description) in _KERNELS.items():
        made.append(gdn_packed_decode.register_backend(kc.Backend(
            name=name, kernel=_interface_kernel(module, function), devices=("cuda",), priority=priority,
            requires=(name,), availability=_availability(module, probe),
            description=description, explicit_devices=_cpu_if_interpreting, op=gdn_packed_decode.name),
            replace=True))
    return tuple(made)


SHIPPED: tuple[kc.Backend, ...] = _register()
"""The backends registered on :data:`gdn_packed_decode` when this module is imported."""
