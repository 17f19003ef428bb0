"""PyTorch reference backend for GDN (Gated DeltaNet, Qwen3-Next) packed decode.

Plain torch ops, vectorised over requests and heads, all math in fp32, written from
``docs/semantics.md``. GDN differs from KDA only in the gate: one scalar decay per
value head (``a`` is ``[B, HV]``, ``dt_bias`` ``[HV]``) instead of one per key channel. The
q/k/v split, the state layouts and the padding-safe row gather/scatter are shared with the KDA
reference (:mod:`kda_kernels.interface`); no host sync, so it is usable under CUDA-graph capture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .interface import row_slots, split_qkv, state_as_vk
from .reference import l2norm

__all__ = ["gdn_gate", "gdn_packed_decode"]

_SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this, as the public kernels do


def gdn_gate(a: Tensor, dt_bias: Tensor, A_log: Tensor) -> Tensor:
    """The log-space decay ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32, ``<= 0``), one
    scalar per request and value head: ``a`` ``[..., HV]``, ``dt_bias`` and ``A_log`` ``[HV]``.

    Example:
        >>> g = gdn_gate(torch.zeros(1, 2), torch.zeros(2), torch.zeros(2))
        >>> g.shape, round(g[0, 0].item(), 4)  # -1 * log(2)
        (torch.Size([1, 2]), -0.6931)
    """
    x = a.float() + dt_bias.float()
    return -A_log.float().exp() * F.softplus(x, beta=1.0, threshold=_SOFTPLUS_THRESHOLD)


def gdn_packed_decode(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                      initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor, *, num_heads: int,
                      use_qk_l2norm: bool, state_layout: str) -> None:
    """One GDN decode step for ``B`` requests: writes ``out`` and the used state slots in place.

    ``mixed_qkv [B, 2*H*K + HV*V]``, ``a``/``b`` ``[B, HV]``, ``A_log``/``dt_bias`` ``[HV]``,
    ``initial_state [N, HV, V, K]`` (``"VK"``) or ``[N, HV, K, V]`` (``"KV"``), ``out [B, 1, HV, V]``,
    ``ssm_state_indices [B]``. An index ``< 0`` or ``>= N`` gives a zero output row and touches no
    slot. ``beta = sigmoid(b)`` is rounded to the dtype of ``b`` before use, as sglang does.

    Example:
        >>> B, H, HV, K, V, N = 2, 1, 2, 4, 4, 8
        >>> state, out = torch.zeros(N, HV, V, K), torch.empty(B, 1, HV, V)
        >>> gdn_packed_decode(torch.randn(B, 2 * H * K + HV * V), torch.randn(B, HV), torch.randn(B, HV),
        ...                   torch.zeros(HV), torch.zeros(HV), K**-0.5, state, out, torch.tensor([5, -1]),
        ...                   num_heads=H, use_qk_l2norm=True, state_layout="VK")
        >>> bool(out[1].eq(0).all()), bool(state[5].ne(0).any()), bool(state[:5].eq(0).all())
        (True, True, True)
    """
    N, HV = initial_state.shape[:2]
    batch = mixed_qkv.shape[0]
    V = out.shape[-1]
    K = (mixed_qkv.shape[1] - HV * V) // (2 * num_heads)
    if batch == 0:  # nothing to do (and no first valid row for row_slots to find)
        return
    if N == 0:
        out.zero_()
        return
    pool = state_as_vk(initial_state, state_layout)  # [N, HV, V, K] view
    rows = row_slots(ssm_state_indices, N)
    old = rows.gather(pool)
    S = old.float()
    q, k, v = (x.float() for x in split_qkv(mixed_qkv, num_heads, HV, K, V))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = HV // num_heads  # value head hv reads q/k head hv // group
    q, k = (x.unsqueeze(2).expand(-1, -1, group, -1).reshape(batch, HV, K) for x in (q, k))
    decay = gdn_gate(a, dt_bias, A_log).exp()  # [B, HV]
    beta = torch.sigmoid(b.float()).to(b.dtype).float().unsqueeze(-1)  # [B, HV, 1]
    S = S * decay.view(batch, HV, 1, 1)  # one scalar for the whole V x K slot
    u = beta * (v - (S @ k.unsqueeze(-1)).squeeze(-1))
    S = S + u.unsqueeze(-1) * k.unsqueeze(-2)
    o = (S @ (scale * q).unsqueeze(-1)).squeeze(-1)
    out.copy_(o.masked_fill(~rows.valid.view(batch, 1, 1), 0.0).unsqueeze(1))
    rows.scatter(pool, S, old)
