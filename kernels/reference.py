"""PyTorch reference backend for KDA packed decode.

Plain torch ops, vectorised over requests and heads, all math in fp32. It runs on any
device torch supports and is the backend the faster kernels are checked against. The
semantics are those of ``kernels/INTERFACE.md`` (the oracle ``tests/kda_oracle.py`` spells the
math out one request and one head at a time).

The update never synchronises with the host (no ``.item()``, no boolean-mask or 0-dim tensor
indexing), so it is meant to be usable inside CUDA-graph capture; see :func:`packed_decode` for
how padding rows are kept away from the pool without a data-dependent branch. What every backend
shares (the signature, layouts, the q/k/v split, the row scatter) is in :mod:`kda_kernels.interface`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .interface import DecodeArgs, DecodeBackend, row_slots, split_qkv, state_as_vk

__all__ = ["L2NORM_EPS", "kda_gate", "l2norm", "packed_decode"]

# softplus(x) is taken as x above this; the same threshold as sglang/vLLM/fla kernels.
_SOFTPLUS_THRESHOLD = 20.0
# Added under the square root (not to the norm), as docs/semantics.md and the public kernels do.
L2NORM_EPS = 1e-6


def kda_gate(a: Tensor, dt_bias: Tensor, A_log: Tensor, lower_bound: float | None) -> Tensor:
    """Per-channel log-space decay ``g`` (fp32, ``<= 0``) from the raw forget-gate logits.

    ``a`` is ``[..., HV*K]`` (index ``hv*K + k``), ``dt_bias`` ``[HV*K]``, ``A_log`` ``[HV]``.
    With ``x = a + dt_bias`` and ``A = exp(A_log)``:

    - ``lower_bound is None`` (softplus gate): ``g = -A * softplus(x)``, where softplus is
      ``log(1 + exp(x))`` for ``x <= 20`` and ``x`` above (no overflow for huge logits);
    - ``lower_bound`` a float (bounded gate): ``g = lower_bound * sigmoid(A * x)``.

    Returns ``[..., HV, K]`` in fp32; the state is multiplied by ``exp(g)`` along K.

    Example:
        >>> a = torch.zeros(1, 2 * 4)
        >>> g = kda_gate(a, torch.zeros(8), torch.zeros(2), lower_bound=None)
        >>> g.shape, round(g[0, 0, 0].item(), 4)  # -1 * log(2)
        (torch.Size([1, 2, 4]), -0.6931)
    """
    num_v_heads = A_log.shape[0]
    head_k_dim = dt_bias.shape[0] // num_v_heads
    x = a.float().unflatten(-1, (num_v_heads, head_k_dim)) + dt_bias.float().view(num_v_heads, head_k_dim)
    A = A_log.float().exp().unsqueeze(-1)  # [HV, 1]: broadcast over K
    if lower_bound is None:
        return -A * F.softplus(x, beta=1.0, threshold=_SOFTPLUS_THRESHOLD)
    return lower_bound * torch.sigmoid(A * x)


def l2norm(x: Tensor) -> Tensor:
    """``x`` scaled to unit l2 norm along its last dim, ``x / sqrt(sum(x²) + L2NORM_EPS)`` (the q/k
    norm of every reference: decode, GDN and prefill)."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2NORM_EPS)


@DecodeBackend
def packed_decode(call: DecodeArgs) -> None:
    """One KDA decode step for ``B`` requests: writes ``out`` and the used state slots in place.

    Shapes and dtypes are those of ``kernels/INTERFACE.md`` (validated by ``kda_contracts``
    before the call): ``mixed_qkv [B, 2*H*K + HV*V]``, ``a [B, HV*K]``, ``b [B, HV]``,
    ``A_log [HV]``, ``dt_bias [HV*K]``, ``state [N, HV, V, K]`` (``"VK"``) or
    ``[N, HV, K, V]`` (``"KV"``), ``out [B, 1, HV, V]``, ``indices [B]`` int32/int64.

    A request whose index is ``< 0`` (padding) or ``>= N`` gets a zero output and its index
    never touches the pool (:class:`~kda_kernels.interface.RowSlots` says how, without a host
    sync). Only slots named by valid indices are written; all math is fp32, and ``out`` comes
    from the fp32 state before it is rounded to the state dtype.

    Duplicate valid indices are a caller error (strict mode rejects them): every request
    reads the pre-call state, and the shared slot ends up holding the result of one of them
    (the last one on CPU, an unspecified one on GPU), never a sequential composition.

    Example:
        >>> B, H, HV, K, V, N = 2, 1, 2, 4, 4, 8
        >>> state = torch.zeros(N, HV, V, K)
        >>> out = torch.empty(B, 1, HV, V)
        >>> packed_decode(
        ...     torch.randn(B, 2 * H * K + HV * V), torch.randn(B, HV * K), torch.randn(B, HV),
        ...     torch.zeros(HV), torch.zeros(HV * K), K**-0.5, state, out,
        ...     torch.tensor([5, -1]), num_heads=H, use_qk_l2norm=True, lower_bound=None,
        ... )
        >>> bool(out[1].eq(0).all()), bool(state[5].ne(0).any()), bool(state[:5].eq(0).all())
        (True, True, True)
    """
    batch, num_heads, num_v_heads, head_k_dim, head_v_dim, num_slots = call.dims
    if num_slots == 0:
        # Every index is out of range of an empty pool.
        call.out.zero_()
        return
    pool = state_as_vk(call.state, call.state_layout)  # [N, HV, V, K], a view of the state
    rows = row_slots(call.indices, num_slots)
    old = rows.gather(pool)  # [B, HV, V, K] in the state dtype
    S = old.float()  # rows are values

    q, k, v = split_qkv(call.mixed_qkv, num_heads, num_v_heads, head_k_dim, head_v_dim)
    q, k, v = q.float(), k.float(), v.float()
    if call.use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    # GVA: value head hv reads q/k head hv // (HV / H), i.e. consecutive blocks share a head.
    # expand+reshape rather than repeat_interleave, whose output size may be computed on device.
    group = num_v_heads // num_heads
    q, k = (x.unsqueeze(2).expand(-1, -1, group, -1).reshape(batch, num_v_heads, head_k_dim) for x in (q, k))

    g = kda_gate(call.a, call.dt_bias, call.A_log, call.lower_bound)  # [B, HV, K]
    beta = torch.sigmoid(call.b.float()).unsqueeze(-1)  # [B, HV, 1]

    S = S * g.exp().unsqueeze(-2)  # decay each key channel (a column of the V×K matrix)
    u = beta * (v - (S @ k.unsqueeze(-1)).squeeze(-1))  # delta rule on the decayed state
    S = S + u.unsqueeze(-1) * k.unsqueeze(-2)  # rank-1 update u ⊗ k
    o = (S @ (call.scale * q).unsqueeze(-1)).squeeze(-1)  # from fp32 S, before any rounding

    call.out.copy_(o.masked_fill(~rows.valid.view(batch, 1, 1), 0.0).unsqueeze(1))
    rows.scatter(pool, S, old)
