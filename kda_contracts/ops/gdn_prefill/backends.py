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

from typing import Any

from ..._engine import Backend
from .._packed.backends import cpu_if_interpreting, probe
from .prefill import gdn_packed_prefill


def fla_chunk_gated_delta_rule(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: float,
                               initial_state: Any, out: Any, cu_seqlens: Any, ssm_state_indices: Any,
                               has_initial_state: Any, use_qk_l2norm_in_kernel: bool = False, *, config: Any = None,
                               state_layout: Any = None, dims: Any, variant: str) -> None:
    """flash-linear-attention's chunk_gated_delta_rule (varlen), slots gathered and scattered without a host sync"""
    from kda_kernels.fla_prefill import gdn_packed_prefill as kernel

    kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens, ssm_state_indices,
           has_initial_state, num_heads=dims.H, use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout=variant)


def token_loop(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: float, initial_state: Any,
               out: Any, cu_seqlens: Any, ssm_state_indices: Any, has_initial_state: Any,
               use_qk_l2norm_in_kernel: bool = False, *, config: Any = None, state_layout: Any = None, dims: Any,
               variant: str) -> None:
    """one GDN packed-decode reference step per token position: the test oracle (slow)"""
    from kda_kernels.prefill_reference import gdn_packed_prefill_loop as kernel

    kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens, ssm_state_indices,
           has_initial_state, num_heads=dims.H, use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout=variant)


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
