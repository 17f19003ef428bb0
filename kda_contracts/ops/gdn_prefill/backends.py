"""The backends of GDN packed prefill beside its body (``torch``, the chunked reference), registered
with the public backend API; kernels load on the first call that picks them.

| backend | priority | runs on | notes |
|---|---|---|---|
| fla | 10 | CUDA (CPU: interpreter, by name) | fla's ``chunk_gated_delta_rule``: slots gathered, states scattered |
| torch | 0 | any | the op's body, ``kda_kernels.prefill_reference.gdn_packed_prefill`` (chunked) |
| loop | -10 | any | one GDN packed-decode step per token (``gdn_packed_prefill_loop``): the oracle, only by name |

Example::

    >>> [b.name for b in gdn_packed_prefill.backends()]
    ['fla', 'torch', 'loop']
"""

from __future__ import annotations

from ..._engine import Backend
from .._packed.backends import cpu_if_interpreting, probe
from .._packed.prefill import prefill_kernel
from .prefill import gdn_packed_prefill

fla_chunk_gated_delta_rule = prefill_kernel(
    "kda_kernels.fla_prefill:gdn_packed_prefill",
    "flash-linear-attention's chunk_gated_delta_rule (varlen), slots gathered and scattered without a host sync",
    gated=False)

token_loop = prefill_kernel(
    "kda_kernels.prefill_reference:gdn_packed_prefill_loop",
    "one GDN packed-decode reference step per token position: the test oracle (slow)",
    gated=False)

SHIPPED: tuple[Backend, ...] = (
    gdn_packed_prefill.register_backend(Backend(
        name="fla", kernel=fla_chunk_gated_delta_rule, devices=("cuda",), priority=10, requires=("fla",),
        availability=probe("kda_kernels.fla_prefill", "gdn_is_available", interpreted=True),
        explicit_devices=cpu_if_interpreting, description=fla_chunk_gated_delta_rule.__doc__ or "",
        op="gdn_packed_prefill"), replace=True),
    gdn_packed_prefill.register_backend(Backend(
        name="loop", kernel=token_loop, devices=("*",), priority=-10, description=token_loop.__doc__ or "",
        op="gdn_packed_prefill"), replace=True),
)
"""The backends registered on :data:`gdn_packed_prefill` when this module is imported."""
