"""The backends of KDA packed prefill beside its body (``torch``, the chunked reference), registered
with the public backend API. Kernels live in ``kda_kernels`` and load on the first call that picks
them, never on ``import kda_contracts``.

| backend | priority | runs on | notes |
|---|---|---|---|
| fla | 10 | CUDA (CPU: interpreter, by name) | fla's ``chunk_kda``: slots gathered, final states scattered |
| torch | 0 | any | the op's body, ``kda_kernels.prefill_reference.packed_prefill`` (chunked) |
| loop | -10 | any | one packed-decode step per token (``packed_prefill_loop``): the oracle, only by name |

Example::

    >>> [b.name for b in packed_prefill.backends()]
    ['fla', 'torch', 'loop']
"""

from __future__ import annotations

from ..._engine import Backend
from .._packed.backends import cpu_if_interpreting, probe
from .._packed.prefill import prefill_kernel
from .prefill import packed_prefill

fla_chunk_kda = prefill_kernel(
    "kda_kernels.fla_prefill:packed_prefill",
    "flash-linear-attention's chunk_kda (varlen), slots gathered and scattered without a host sync",
    gated=True)

token_loop = prefill_kernel(
    "kda_kernels.prefill_reference:packed_prefill_loop",
    "one packed-decode reference step per token position: the test oracle (slow)",
    gated=True)

SHIPPED: tuple[Backend, ...] = (
    packed_prefill.register_backend(Backend(
        name="fla", kernel=fla_chunk_kda, devices=("cuda",), priority=10, requires=("fla",),
        availability=probe("kda_kernels.fla_prefill", interpreted=True), explicit_devices=cpu_if_interpreting,
        description=fla_chunk_kda.__doc__ or "",
        op="packed_prefill"), replace=True),
    packed_prefill.register_backend(Backend(
        name="loop", kernel=token_loop, devices=("*",), priority=-10, description=token_loop.__doc__ or "",
        op="packed_prefill"), replace=True),
)
"""The backends registered on :data:`packed_prefill` when this module is imported."""
