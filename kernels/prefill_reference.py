"""PyTorch reference backends of KDA and GDN packed (varlen) prefill: the chunked form and a token loop.

A prefill call carries ``B`` sequences packed one after another: ``mixed_qkv [T, 2*H*K + HV*V]``,
``a``, ``b`` one row per token, ``cu_seqlens [B+1]`` (sequence ``i`` is tokens
``cu_seqlens[i] : cu_seqlens[i+1]``), one pool slot per sequence (``ssm_state_indices [B]``, negative
for padding) and ``has_initial_state [B]`` (continue from the slot's state, or start from zero). Every
token's output goes to ``out [T, HV, V]``; each sequence's final state is written to its slot. The
per-token math is packed decode's (``docs/semantics.md``), applied token after token.

- :func:`packed_prefill` / :func:`gdn_packed_prefill`: the chunked WY form
  (:func:`kda_kernels.chunk_delta.chunk_gated_delta`), vectorised inside each chunk of 64 tokens,
  fp32 throughout (fp64 for fp64 inputs).
- :func:`packed_prefill_loop` / :func:`gdn_packed_prefill_loop`: one packed-decode step per token
  position (the decode references, on a scratch fp32 pool of one slot per sequence): the oracle.

Both keep the state in fp32 along the sequence and round it to the pool's dtype once, at the end;
the output comes from the fp32 state. A padding sequence (slot ``< 0`` or ``>= N``) gets zero
outputs and touches no slot; no slot but the valid ones changes. The chunked form reads the longest
sequence length on the host (one sync); its slot gather and scatter need none.

Example::

    >>> T, H, HV, K, V, N = 5, 1, 2, 4, 3, 4
    >>> state, out = torch.zeros(N, HV, V, K), torch.empty(T, HV, V)
    >>> packed_prefill(torch.randn(T, 2 * H * K + HV * V), torch.randn(T, HV * K), torch.randn(T, HV),
    ...                torch.zeros(HV), torch.zeros(HV * K), K**-0.5, state, out, torch.tensor([0, 2, 5]),
    ...                torch.tensor([3, -1]), torch.tensor([False, False]), num_heads=H, use_qk_l2norm=True,
    ...                lower_bound=None, state_layout="VK")
    >>> bool(out[2:].eq(0).all()), bool(state[3].ne(0).any()), bool(state[:3].eq(0).all())
    (True, True, True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .chunk_delta import chunk_gated_delta
from .gdn_reference import gdn_gate
from .gdn_reference import gdn_packed_decode as _gdn_decode
from .interface import row_slots, split_qkv, state_as_vk
from .reference import kda_gate, l2norm
from .reference import packed_decode as _kda_decode

__all__ = ["gdn_packed_prefill", "gdn_packed_prefill_loop", "packed_prefill", "packed_prefill_loop"]


def token_sequences(cu_seqlens: Tensor, total: int) -> Tensor:
    """``[T]`` int64: the sequence each token belongs to (no host sync).

    Example::

        >>> token_sequences(torch.tensor([0, 2, 2, 5]), 5).tolist()
        [0, 0, 2, 2, 2]
    """
    t = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), t, right=True)


def _compute_dtype(*xs: Tensor) -> torch.dtype:
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _prefill(mixed_qkv: Tensor, g: Tensor, beta: Tensor, scale: float, initial_state: Tensor, out: Tensor,
             cu_seqlens: Tensor, ssm_state_indices: Tensor, has_initial_state: Tensor, *, num_heads: int,
             use_qk_l2norm: bool, state_layout: str, chunk_size: int) -> None:
    """The chunked prefill of both gates: ``g`` (log decay, ``[T, HV, K]`` or ``[T, HV]``) and
    ``beta [T, HV]`` already computed in the compute dtype."""
    T = mixed_qkv.shape[0]
    N, HV = initial_state.shape[:2]
    V = out.shape[-1]
    K = (mixed_qkv.shape[1] - HV * V) // (2 * num_heads)
    B = ssm_state_indices.shape[0]
    if B == 0 or N == 0:
        out.zero_()
        return
    dt = g.dtype
    pool = state_as_vk(initial_state, state_layout)
    rows = row_slots(ssm_state_indices, N)
    old = rows.gather(pool)
    start = (rows.valid & has_initial_state.bool()).view(B, 1, 1, 1)
    h0 = torch.where(start, old.to(dt), torch.zeros((), dtype=dt, device=old.device))
    q, k, v = (x.to(dt) for x in split_qkv(mixed_qkv, num_heads, HV, K, V))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = HV // num_heads  # value head hv reads q/k head hv // group
    q, k = (x.unsqueeze(2).expand(-1, -1, group, -1).reshape(T, HV, K) for x in (q, k))
    o, ht = chunk_gated_delta(scale * q, k, v, g, beta, h0, cu_seqlens, chunk_size=chunk_size)
    live = rows.valid.index_select(0, token_sequences(cu_seqlens, T)).view(T, 1, 1)
    out.copy_(o.masked_fill(~live, 0.0))
    rows.scatter(pool, ht, old)


def packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                   initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                   has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
                   state_layout: str, chunk_size: int = 64) -> None:
    """KDA packed prefill, chunked: writes ``out [T, HV, V]`` and the used slots in place (see the module).
    ``a [T, HV*K]``, ``b [T, HV]``, ``dt_bias [HV*K]``; ``lower_bound``: None (softplus gate) or the
    bounded gate's bound."""
    dt = _compute_dtype(mixed_qkv, initial_state)
    HV = A_log.shape[0]
    g = kda_gate(a, dt_bias, A_log, lower_bound).to(dt)  # [T, HV, K]
    beta = torch.sigmoid(b.to(dt)).view(-1, HV)
    _prefill(mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state,
             num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout, chunk_size=chunk_size)


def gdn_packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                       initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                       has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str,
                       chunk_size: int = 64) -> None:
    """GDN packed prefill, chunked: ``a``/``b`` ``[T, HV]``, ``A_log``/``dt_bias`` ``[HV]``; beta is
    rounded to ``b``'s dtype before use, as in GDN decode."""
    dt = _compute_dtype(mixed_qkv, initial_state)
    g = gdn_gate(a, dt_bias, A_log).to(dt)  # [T, HV]
    beta = torch.sigmoid(b.float()).to(b.dtype).to(dt)
    _prefill(mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state,
             num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout, chunk_size=chunk_size)


def _loop(step: Callable[..., None], mixed_qkv: Tensor, a: Tensor, b: Tensor, initial_state: Tensor, out: Tensor,
          cu_seqlens: Tensor, ssm_state_indices: Tensor, has_initial_state: Tensor, state_layout: str) -> None:
    """Prefill as one decode ``step(mixed_qkv, a, b, scratch, out, indices)`` per token position,
    over a scratch fp32 pool (VK) with one slot per sequence; finished sequences are padding."""
    T = mixed_qkv.shape[0]
    N = initial_state.shape[0]
    B = ssm_state_indices.shape[0]
    out.zero_()
    if B == 0 or N == 0:
        return
    pool = state_as_vk(initial_state, state_layout)
    rows = row_slots(ssm_state_indices, N)
    old = rows.gather(pool)
    start = (rows.valid & has_initial_state.bool()).view(B, 1, 1, 1)
    scratch = torch.where(start, old.float(), torch.zeros((), device=old.device))
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    seq = torch.arange(B, device=cu.device)
    step_out = out.new_zeros(B, 1, *out.shape[1:])
    for i in range(int(lens.max())):
        active = (lens > i) & rows.valid
        tok = torch.where(active, cu[:-1] + i, 0).clamp(max=max(T - 1, 0))
        step(mixed_qkv[tok], a[tok], b[tok], scratch, step_out, torch.where(active, seq, -1))
        out.index_put_((tok[active],), step_out[active, 0])
    rows.scatter(pool, scratch, old)


def packed_prefill_loop(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                        initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                        has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
                        state_layout: str) -> None:
    """KDA packed prefill as a token loop over :func:`kda_kernels.reference.packed_decode` (the oracle)."""

    def step(x: Tensor, a_: Tensor, b_: Tensor, pool: Tensor, o: Tensor, idx: Tensor) -> None:
        _kda_decode(x, a_, b_, A_log, dt_bias, scale, pool, o, idx, num_heads=num_heads, use_qk_l2norm=use_qk_l2norm,
                    lower_bound=lower_bound, state_layout="VK")

    _loop(step, mixed_qkv, a, b, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state, state_layout)


def gdn_packed_prefill_loop(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                            initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                            has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool,
                            state_layout: str) -> None:
    """GDN packed prefill as a token loop over :func:`kda_kernels.gdn_reference.gdn_packed_decode` (the oracle)."""

    def step(x: Tensor, a_: Tensor, b_: Tensor, pool: Tensor, o: Tensor, idx: Tensor) -> None:
        _gdn_decode(x, a_, b_, A_log, dt_bias, scale, pool, o, idx, num_heads=num_heads, use_qk_l2norm=use_qk_l2norm,
                    state_layout="VK")

    _loop(step, mixed_qkv, a, b, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state, state_layout)
