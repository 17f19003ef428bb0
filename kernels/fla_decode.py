"""flash-linear-attention's ``fused_recurrent_kda`` (KDA) and ``fused_recurrent_gated_delta_rule``
(GDN) behind the packed-decode interface (peers).

fla's kernel takes q/k/v as separate dense ``[B, T, H, K]`` tensors, the state in KV layout by
default (``state_v_first=True`` for VK), the raw gate when ``use_gate_in_kernel=True`` and raw
beta logits with ``use_beta_sigmoid_in_kernel=True``; with ``inplace_final_state=True`` and
``ssm_state_indices`` it updates the pool in place (its continuous-batching path, the one serving
engines call). It does no bounds or padding handling: a negative or too-large index would read
and write outside the pool. This wrapper therefore runs only the rows whose index is in
``[0, N)`` (a boolean compaction, which syncs with the host) and zeroes the others: memory-safe,
at the price of a sync. Benchmarks that want fla's raw speed call :func:`raw_call` with indices
known to be valid.

fla's GDN kernel has no in-place pool path: :func:`gdn_packed_decode` gathers the valid rows'
slots into a dense initial state, asks for the final state (fp32) and scatters it back into the
pool. ``sigmoid(b)`` is computed outside the kernel and rounded to ``b``'s dtype, the GDN
semantics (``docs/semantics.md``), since fla's in-kernel sigmoid does not round.

Example::

    from kda_kernels.fla_decode import is_available, packed_decode
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import Tensor

from .interface import DecodeArgs, DecodeBackend, _elsewhere, decode_dims, split_qkv, valid_rows

__all__ = ["gdn_is_available", "gdn_packed_decode", "is_available", "packed_decode", "raw_call"]


def is_available(module: str = "fla.ops.kda.fused_recurrent") -> tuple[bool, str]:
    """Whether fla's kernel (its KDA one, or ``module``) can run here, and why not."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # not installed, or breaks on import with this torch/triton
        kind = "is not installed" if isinstance(exc, ModuleNotFoundError) else f"fails to import ({exc})"
        return False, f"fla-core {kind}"
    if not torch.cuda.is_available():
        return False, "fla's Triton kernel needs a CUDA device"
    return True, ""


def gdn_is_available() -> tuple[bool, str]:
    """Whether fla's GDN kernel (``fused_recurrent_gated_delta_rule``) can run here, and why not."""
    return is_available("fla.ops.gated_delta_rule.fused_recurrent")


def _fwd() -> Any:
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    return fused_recurrent_kda_fwd


def raw_call(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    state: Tensor, indices: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
    state_layout: str = "VK", out: Tensor | None = None,
) -> Tensor:
    """Call fla's in-place continuous-batching kernel as engines do; every index must be in [0, N).

    Returns the output ``[B, 1, HV, V]`` (``out`` if given, which must then be dense). Runs with the
    pool's GPU as the current CUDA device (fla's kernels launch on the current one).
    """
    if _elsewhere(state):
        with torch.cuda.device(state.device):
            return raw_call(mixed_qkv, a, b, A_log, dt_bias, scale, state, indices, num_heads=num_heads,
                            use_qk_l2norm=use_qk_l2norm, lower_bound=lower_bound, state_layout=state_layout, out=out)
    B, H, HV, K, V, _ = decode_dims(state, indices, num_heads, state_layout)
    # fla indexes q/k/v as dense [B, T, H, K]: the packed row stride needs a copy.
    q, k, v = (x.unsqueeze(1).contiguous() for x in split_qkv(mixed_qkv, H, HV, K, V))
    g = a.reshape(B, 1, HV, K).contiguous()
    beta = b.reshape(B, 1, HV).contiguous()
    o, _ = _fwd()(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=state, scale=scale,
        inplace_final_state=True, state_v_first=state_layout == "VK", ssm_state_indices=indices,
        use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        lower_bound=lower_bound, out=None if out is None else out.view(B, 1, HV, V),
    )
    return o


@DecodeBackend
def packed_decode(call: DecodeArgs) -> None:
    """The packed-decode interface (``kernels/INTERFACE.md``) on fla's kernel, memory-safe."""
    valid = valid_rows(call.indices, call.dims.num_slots)
    rows = valid.nonzero().flatten()  # host sync: fla has no in-kernel padding or bounds guard
    call.out.zero_()
    if rows.numel() == 0:
        return
    o = raw_call(call.mixed_qkv[rows], call.a[rows], call.b[rows], call.A_log, call.dt_bias, call.scale, call.state,
                 call.indices[rows], num_heads=call.num_heads, use_qk_l2norm=call.use_qk_l2norm,
                 lower_bound=call.lower_bound, state_layout=call.state_layout)
    call.out[rows] = o.to(call.out.dtype)


def _gdn_fwd() -> Any:
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

    return fused_recurrent_gated_delta_rule_fwd


@DecodeBackend
def gdn_packed_decode(call: DecodeArgs) -> None:
    """GDN packed decode (``a`` ``[B, HV]``, ``dt_bias`` ``[HV]``) on fla's out-of-place kernel:
    valid rows only (a host sync), their slots gathered, the fp32 final state scattered back.
    Duplicate slots (rejected by strict mode) race as in every kernel: one row's state wins."""
    if call.lower_bound is not None:
        raise ValueError("GDN has no bounded gate: lower_bound must be None")
    _, H, HV, K, V, N = call.dims
    rows = valid_rows(call.indices, N).nonzero().flatten()  # host sync: fla has no padding or bounds guard
    call.out.zero_()
    if rows.numel() == 0:
        return
    n = rows.numel()
    slots = call.indices[rows].long()
    q, k, v = (x[rows].unsqueeze(1).contiguous() for x in split_qkv(call.mixed_qkv, H, HV, K, V))
    beta = torch.sigmoid(call.b[rows].float()).to(call.b.dtype).view(n, 1, HV)
    o, final = _gdn_fwd()(
        q=q, k=k, v=v, g=call.a[rows].reshape(n, 1, HV).contiguous(), beta=beta, A_log=call.A_log,
        dt_bias=call.dt_bias, scale=call.scale, initial_state=call.state.index_select(0, slots),
        output_final_state=True, use_qk_l2norm_in_kernel=call.use_qk_l2norm, use_beta_sigmoid_in_kernel=False,
        state_v_first=call.state_layout == "VK", cu_seqlens=None,
    )
    call.state.index_copy_(0, slots, final.to(call.state.dtype))
    call.out[rows] = o.view(n, 1, HV, V).to(call.out.dtype)
