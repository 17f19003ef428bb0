"""The shipped kernels of GDN packed decode, registered on the op with the public backend API.

Each kernel lives in ``kda_kernels`` behind the packed-decode kernel interface
(``kernels/INTERFACE.md``: ``fn(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, *,
num_heads, use_qk_l2norm, lower_bound, state_layout)``). They are registered the way every packed
op's are (:func:`kda_contracts.ops._packed.backends.shipped_kernels`); each module is imported
on the first call that picks it, never by ``import kda_contracts``.

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

from ... import _engine as kc
from .._packed.backends import shipped_kernels
from .decode import gdn_packed_decode

#: name -> (priority, module, function, availability check, description, runs on the CPU when asked by
#: name under the Triton interpreter)
_KERNELS = {
    "triton": (30, "kda_kernels.triton_decode", "gdn_packed_decode", "is_available",
               "our Triton kernel (KDA's, one gate per value head): bounds-guarded, both layouts", True),
    "helion": (20, "kda_kernels.helion_decode", "gdn_packed_decode", "is_available",
               "our Helion kernel with pinned configs (no run-time autotuning)", True),
    "fla": (10, "kda_kernels.fla_decode", "gdn_packed_decode", "gdn_is_available",
            "flash-linear-attention's fused_recurrent_gated_delta_rule (peer): out of place, padding "
            "compacted on the host (syncs)", True),
}

SHIPPED: tuple[kc.Backend, ...] = tuple(
    gdn_packed_decode.register_backend(b, replace=True)
    for b in shipped_kernels(gdn_packed_decode.name, _KERNELS, interpreter_probe=True))
"""The backends registered on :data:`gdn_packed_decode` when this module is imported."""
