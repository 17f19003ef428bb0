"""The chunked (WY / UT-transform) form of the gated delta rule, in plain torch, for varlen prefill.

A sequence is cut into chunks of ``C`` tokens (64 by default). Inside a chunk every token is
handled at once, with matrix products; only the state passes from one chunk to the next, so the
Python loop runs ``ceil(max_len / C)`` times, never once per token. Every sequence of the batch is
processed together: each is laid out in its own row of a zero-padded ``[B, chunks, C]`` grid,
and a padded position (``k = v = q = 0``, ``beta = 0``, ``g = 0``) changes nothing.

The math, per sequence and value head, with the state ``S`` a ``V x K`` matrix, ``S0`` its value at
the start of the chunk and ``gamma_t = g_1 + ... + g_t`` the decay accumulated inside the chunk (a
vector over K for KDA, a scalar for GDN). The recurrence ``S_t = S_{t-1} D_t + u_t k_t^T`` with
``D_t = diag(exp(g_t))`` and ``u_t = beta_t (v_t - S_{t-1} D_t k_t)`` unrolls to::

    S_t = S0 diag(exp(gamma_t)) + sum_{s <= t} u_s (k_s * exp(gamma_t - gamma_s))^T

so the pseudo-values ``u`` solve one unit lower-triangular system per chunk (the UT transform)::

    (I + A) U = diag(beta) (V - K~ S0^T),  A[t, s] = beta_t <k_t, k_s * exp(gamma_t - gamma_s)>  (s < t)

with ``K~[t] = k_t * exp(gamma_t)``. Writing ``W = (I + A)^-1 diag(beta) K~`` and
``U' = (I + A)^-1 diag(beta) V`` (the WY representation), ``U = U' - W S0^T``; then::

    O      = scale * ((Q * exp(gamma)) S0^T + P U),  P[t, s] = <q_t, k_s * exp(gamma_t - gamma_s)>  (s <= t)
    S_next = S0 diag(exp(gamma_C)) + U^T (K * exp(gamma_C - gamma))

Every exponent is ``gamma_t - gamma_s`` with ``s <= t`` (the decay only shrinks, ``g <= 0``), so no
term overflows, whatever the decay; the pairs ``s > t`` are masked before the exponential. KDA's
per-channel decay makes ``A`` and ``P`` need one ``C x C x K`` tensor per head (memory
``B * HV * C^2 * K`` per chunk step); GDN's scalar decay needs ``C x C``.

Example::

    >>> T, HV, K, V = 5, 2, 4, 3
    >>> q, k = torch.randn(T, HV, K), torch.nn.functional.normalize(torch.randn(T, HV, K), dim=-1)
    >>> o, ht = chunk_gated_delta(q, k, torch.randn(T, HV, V), -torch.rand(T, HV), torch.rand(T, HV),
    ...                           torch.zeros(2, HV, V, K), torch.tensor([0, 2, 5]), chunk_size=2)
    >>> o.shape, ht.shape
    (torch.Size([5, 2, 3]), torch.Size([2, 2, 3, 4]))
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["chunk_gated_delta", "pad_sequences"]


def pad_sequences(cu_seqlens: Tensor, chunk_size: int, total: int | None = None) -> tuple[Tensor, Tensor, int]:
    """Where each padded position reads its token: ``(pos [B, L], real [B, L], chunks)``, ``L =
    chunks * chunk_size`` with ``chunks = ceil(max_len / chunk_size)``; ``pos`` is ``total`` (the
    number of packed tokens, one past the last: a zero row; default ``cu_seqlens[-1]``) where
    ``real`` is False. One host read (the longest sequence) when ``total`` is given.

    Example::

        >>> pos, real, n = pad_sequences(torch.tensor([0, 1, 4]), 2)
        >>> pos.tolist(), n
        ([[0, 4, 4, 4], [1, 2, 3, 4]], 2)
    """
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    if total is None:
        total = int(cu[-1]) if cu.numel() else 0
    longest = int(lens.max()) if lens.numel() else 0
    chunks = max(1, -(-longest // chunk_size))
    j = torch.arange(chunks * chunk_size, device=cu.device)
    real = j.unsqueeze(0) < lens.unsqueeze(1)
    pos = torch.where(real, cu[:-1].unsqueeze(1) + j.unsqueeze(0), total)
    return pos, real, chunks


def _pad(x: Tensor, pos: Tensor) -> Tensor:
    """``x [T, ...]`` laid out as ``[B, L, ...]`` by ``pos`` (position ``T`` reads zeros)."""
    padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
    return padded[pos]


def _chunk_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk for every sequence and head at once: ``S [B, HV, V, K]`` at its start; ``q``, ``k``
    ``[B, HV, C, K]`` (q scaled), ``v [B, HV, C, V]``, ``g`` ``[B, HV, C, K]`` (KDA) or ``[B, HV, C]``
    (GDN), ``beta [B, HV, C]``. Returns the chunk's output ``[B, HV, C, V]`` and the next state."""
    C = q.shape[-2]
    gamma = g.cumsum(dim=2)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    per_channel = g.dim() == 4
    if per_channel:  # KDA: decay[t, s, k] = exp(gamma_t[k] - gamma_s[k]) for s <= t
        diff = gamma.unsqueeze(3) - gamma.unsqueeze(2)
        decay = diff.masked_fill(~causal.unsqueeze(-1), float("-inf")).exp()
        ks = decay * k.unsqueeze(2)  # [t, s, k]: k_s decayed from s to t
        A = (ks @ k.unsqueeze(-1)).squeeze(-1)
        P = (ks @ q.unsqueeze(-1)).squeeze(-1)
        last = gamma[:, :, -1:, :]  # [B, HV, 1, K]
        k_to_end = k * (last - gamma).exp()
        S_decayed = S * last.exp()  # column k of the V x K matrix times exp(gamma_C[k])
        q_in, k_in = q * gamma.exp(), k * gamma.exp()
    else:  # GDN: one scalar decay per head and token
        diff = gamma.unsqueeze(3) - gamma.unsqueeze(2)
        decay = diff.masked_fill(~causal, float("-inf")).exp()
        A = (k @ k.transpose(-1, -2)) * decay
        P = (q @ k.transpose(-1, -2)) * decay
        last = gamma[:, :, -1:]  # [B, HV, 1]
        k_to_end = k * (last - gamma).exp().unsqueeze(-1)
        S_decayed = S * last.exp().unsqueeze(-1)
        q_in, k_in = q * gamma.exp().unsqueeze(-1), k * gamma.exp().unsqueeze(-1)
    A = (A * beta.unsqueeze(-1)).tril(-1)
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    rhs = beta.unsqueeze(-1) * torch.cat([k_in, v], dim=-1)
    WU = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    W, U_v = WU.split([k.shape[-1], v.shape[-1]], dim=-1)
    St = S.transpose(-1, -2)  # [B, HV, K, V]
    U = U_v - W @ St
    o = q_in @ St + (P * causal) @ U
    return o, S_decayed + U.transpose(-1, -2) @ k_to_end


def chunk_gated_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor, cu_seqlens: Tensor,
                      *, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """The gated delta rule over packed varlen sequences, chunk by chunk (see the module).

    ``q``, ``k`` ``[T, HV, K]`` (already normalised, grouped to the value heads and, for ``q``,
    scaled), ``v [T, HV, V]``, ``g`` the log decay, ``[T, HV, K]`` (KDA) or ``[T, HV]`` (GDN),
    ``beta [T, HV]``, ``h0 [B, HV, V, K]`` the state each sequence starts from, ``cu_seqlens [B+1]``.
    Everything is computed in ``h0``'s dtype. Returns ``o [T, HV, V]`` and the final states
    ``[B, HV, V, K]``.
    """
    T = q.shape[0]
    dt = h0.dtype
    pos, _, chunks = pad_sequences(cu_seqlens, chunk_size, T)  # (padding reads row T: zeros, whatever cu_seqlens)
    C = chunk_size

    def grid(x: Tensor) -> Tensor:  # [T, HV, ...] -> [chunks, B, HV, C, ...]
        p = _pad(x.to(dt), pos).unflatten(1, (chunks, C))  # [B, chunks, C, HV, ...]
        return p.movedim(3, 2).movedim(1, 0)

    qs, ks, vs, gs, bs = (grid(x) for x in (q, k, v, g, beta))
    S = h0
    outs = []
    for c in range(chunks):
        o, S = _chunk_step(S, qs[c], ks[c], vs[c], gs[c], bs[c])
        outs.append(o)
    o_grid = torch.stack(outs, dim=1).movedim(3, 2).flatten(1, 2)  # [B, L, HV, V]
    o_flat = o_grid.new_zeros((T + 1, *o_grid.shape[2:]))
    o_flat.index_copy_(0, pos.flatten(), o_grid.flatten(0, 1))  # padded positions all land on row T
    return o_flat[:T], S
