"""flash-linear-attention's chunk kernels behind the packed-prefill call (peers): ``chunk_kda`` for
KDA, ``chunk_gated_delta_rule`` for GDN (fla-core 0.6.0, ``fla.ops.kda`` / ``fla.ops.gated_delta_rule``).

fla takes q/k/v as dense ``[1, T, H, K]`` tensors with ``cu_seqlens`` (int64, ``[B+1]``) for varlen
input, a dense initial state of one row per sequence (``[B, HV, K, V]``, or ``[B, HV, V, K]`` with
``state_v_first=True``) and returns the final states out of place (``output_final_state=True``).
This wrapper computes the gate and beta itself (in fp32, as the references do, so the semantics are
ours whatever fla fuses), gathers each sequence's slot (zero where ``has_initial_state`` is False or
the slot is padding), runs the kernel and scatters the final states back to the valid slots, with
no host sync of its own (:class:`~kda_kernels.interface.RowSlots`). fla itself reads ``cu_seqlens``
on the host to plan its chunks. CUDA only.

Example::

    from kda_kernels.fla_prefill import is_available, packed_prefill
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .fla_decode import is_available as _fla_available
from .gdn_reference import gdn_gate
from .interface import row_slots, split_qkv
from .prefill_reference import token_sequences
from .reference import kda_gate

__all__ = ["gdn_is_available", "gdn_packed_prefill", "is_available", "packed_prefill"]


def is_available() -> tuple[bool, str]:
    """Whether fla's ``chunk_kda`` can run here, and why not."""
    return _fla_available("fla.ops.kda.chunk")


def gdn_is_available() -> tuple[bool, str]:
    """Whether fla's ``chunk_gated_delta_rule`` can run here, and why not."""
    return _fla_available("fla.ops.gated_delta_rule.chunk")


def _run(kernel: Callable[..., Any], mixed_qkv: Tensor, g: Tensor, beta: Tensor, scale: float,
         initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
         has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str) -> None:
    T = mixed_qkv.shape[0]
    N, HV = initial_state.shape[:2]
    V = out.shape[-1]
    K = (mixed_qkv.shape[1] - HV * V) // (2 * num_heads)
    B = ssm_state_indices.shape[0]
    if B == 0 or T == 0:
        out.zero_()
        if B:  # sequences without tokens: their final state is their initial one
            rows = row_slots(ssm_state_indices, N)
            old = rows.gather(initial_state)
            keep = has_initial_state.view(B, 1, 1, 1)
            rows.scatter(initial_state, torch.where(keep, old, torch.zeros_like(old)), old)
        return
    rows = row_slots(ssm_state_indices, N)
    old = rows.gather(initial_state)  # [B, HV, *, *] in the pool's layout
    start = (rows.valid & has_initial_state).view(B, 1, 1, 1)
    h0 = torch.where(start, old.float(), torch.zeros((), device=old.device)).contiguous()
    q, k, v = (x.unsqueeze(0).contiguous() for x in split_qkv(mixed_qkv, num_heads, HV, K, V))
    with torch.cuda.device(mixed_qkv.device):
        o, ht = kernel(q=q, k=k, v=v, g=g.unsqueeze(0).contiguous(), beta=beta.unsqueeze(0).contiguous(),
                       scale=scale, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm,
                       state_v_first=state_layout == "VK", cu_seqlens=cu_seqlens.long())
    live = rows.valid.index_select(0, token_sequences(cu_seqlens, T)).view(T, 1, 1)
    out.copy_(o[0].masked_fill(~live, 0.0))
    rows.scatter(initial_state, ht, old)


def packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                   initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                   has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
                   state_layout: str) -> None:
    """KDA packed prefill on fla's ``chunk_kda`` (the reference's arguments; see the module)."""
    from fla.ops.kda import chunk_kda

    HV = A_log.shape[0]
    g = kda_gate(a, dt_bias, A_log, lower_bound)  # [T, HV, K] fp32, log space
    beta = torch.sigmoid(b.float()).view(-1, HV)
    _run(chunk_kda, mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state,
         num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)


def gdn_packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                       initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                       has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str) -> None:
    """GDN packed prefill on fla's ``chunk_gated_delta_rule``; beta rounded to ``b``'s dtype (GDN's rule)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    g = gdn_gate(a, dt_bias, A_log)  # [T, HV] fp32
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    _run(chunk_gated_delta_rule, mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices,
         has_initial_state, num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)
