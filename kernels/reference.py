"""PyTorch reference backend for KDA packed decode.

Plain torch ops, vectorised over requests and heads, all math in fp32. It runs on any
device torch supports and is the backend the faster kernels are checked against. The
semantics are those of ``shared/SPEC-kda-decode.md`` ("Math") and ``kernels/INTERFACE.md``.

The update never synchronises with the host (no ``.item()``, no boolean-mask or 0-dim tensor
indexing), so it is meant to be usable inside CUDA-graph capture; see :func:`packed_decode` for
how padding rows are kept away from the pool without a data-dependent branch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["kda_gate", "packed_decode", "split_mixed_qkv"]

# softplus(x) is taken as x above this; the same threshold as sglang/vLLM/fla kernels.
_SOFTPLUS_THRESHOLD = 20.0
# Added under the square root (not to the norm), as the spec and the public kernels do.
_L2NORM_EPS = 1e-6


def split_mixed_qkv(
    mixed_qkv: Tensor, num_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Split the packed conv output into per-head q, k and v views (no copy).

    ``mixed_qkv`` is ``[..., 2*H*K + HV*V]``: the q heads, then the k heads, then the v heads,
    each head-major (``h*K + d``). Returns views shaped ``[..., H, K]``, ``[..., H, K]`` and
    ``[..., HV, V]`` in the input dtype; the row stride of the input may be arbitrary.

    Example:
        >>> x = torch.arange(2 * (2 * 2 * 4 + 4 * 3), dtype=torch.float32).view(2, -1)
        >>> q, k, v = split_mixed_qkv(x, num_heads=2, num_v_heads=4, head_k_dim=4, head_v_dim=3)
        >>> q.shape, k.shape, v.shape
        (torch.Size([2, 2, 4]), torch.Size([2, 2, 4]), torch.Size([2, 4, 3]))
        >>> k[0, 0, 0].item()  # k starts right after the H*K q channels
        8.0
    """
    qk_width = num_heads * head_k_dim
    q = mixed_qkv[..., :qk_width].unflatten(-1, (num_heads, head_k_dim))
    k = mixed_qkv[..., qk_width : 2 * qk_width].unflatten(-1, (num_heads, head_k_dim))
    v = mixed_qkv[..., 2 * qk_width : 2 * qk_width + num_v_heads * head_v_dim].unflatten(-1, (num_v_heads, head_v_dim))
    return q, k, v


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


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + _L2NORM_EPS)


def packed_decode(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    scale: float,
    state: Tensor,
    out: Tensor,
    indices: Tensor,
    *,
    num_heads: int,
    use_qk_l2norm: bool,
    lower_bound: float | None,
    state_layout: str = "VK",
) -> None:
    """One KDA decode step for ``B`` requests: writes ``out`` and the used state slots in place.

    Shapes and dtypes are those of ``kernels/INTERFACE.md`` (validated by ``kda_contracts``
    before the call): ``mixed_qkv [B, 2*H*K + HV*V]``, ``a [B, HV*K]``, ``b [B, HV]``,
    ``A_log [HV]``, ``dt_bias [HV*K]``, ``state [N, HV, V, K]`` (``"VK"``) or
    ``[N, HV, K, V]`` (``"KV"``), ``out [B, 1, HV, V]``, ``indices [B]`` int32/int64.

    A request whose index is ``< 0`` (padding) or ``>= N`` gets a zero output and its index
    never touches the pool. Only slots named by valid indices are written; all math is fp32,
    and ``out`` comes from the fp32 state before it is rounded to the state dtype.

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
    if state_layout not in ("VK", "KV"):
        raise ValueError(f"state_layout must be 'VK' or 'KV', got {state_layout!r}")
    batch = mixed_qkv.shape[0]
    if batch == 0:
        return
    num_slots, num_v_heads = state.shape[0], state.shape[1]
    if num_slots == 0:
        # Every index is out of range of an empty pool.
        out.zero_()
        return
    kv = state_layout == "KV"
    head_k_dim, head_v_dim = (state.shape[2], state.shape[3]) if kv else (state.shape[3], state.shape[2])

    # Memory safety without a host sync. Each invalid row is redirected to a slot that is
    # written anyway, with bytes identical to that write, so the duplicate write is harmless
    # whatever order the device applies it in: the slot of the first valid row (the donor),
    # carrying the donor's new state. With no valid row at all, the invalid rows rewrite
    # slot 0 with its own unchanged bytes. Invalid rows thus never read or write their own
    # index, and no slot outside the valid indices changes.
    idx = indices.long()
    valid = (idx >= 0) & (idx < num_slots)
    # Shape-[1] tensors and index_select throughout: indexing with a 0-dim tensor may sync.
    donor = torch.argmax(valid.to(torch.int32), dim=0, keepdim=True)  # first valid row, else 0
    any_valid = valid.index_select(0, donor)
    slots = torch.where(valid, idx, torch.where(any_valid, idx.index_select(0, donor), 0))

    old = state.index_select(0, slots)  # [B, HV, *, *] in the state dtype
    S = (old.transpose(-1, -2) if kv else old).float()  # [B, HV, V, K]: rows are values

    q, k, v = split_mixed_qkv(mixed_qkv, num_heads, num_v_heads, head_k_dim, head_v_dim)
    q, k, v = q.float(), k.float(), v.float()
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    # GVA: value head hv reads q/k head hv // (HV / H), i.e. consecutive blocks share a head.
    # expand+reshape rather than repeat_interleave, whose output size may be computed on device.
    group = num_v_heads // num_heads
    q, k = (x.unsqueeze(2).expand(-1, -1, group, -1).reshape(batch, num_v_heads, head_k_dim) for x in (q, k))

    g = kda_gate(a, dt_bias, A_log, lower_bound)  # [B, HV, K]
    beta = torch.sigmoid(b.float()).unsqueeze(-1)  # [B, HV, 1]

    S = S * g.exp().unsqueeze(-2)  # decay each key channel (a column of the V×K matrix)
    u = beta * (v - (S @ k.unsqueeze(-1)).squeeze(-1))  # delta rule on the decayed state
    S = S + u.unsqueeze(-1) * k.unsqueeze(-2)  # rank-1 update u ⊗ k
    o = (S @ (scale * q).unsqueeze(-1)).squeeze(-1)  # from fp32 S, before any rounding

    row_valid = valid.view(batch, 1, 1)
    out.copy_(o.masked_fill(~row_valid, 0.0).unsqueeze(1))

    new = (S.transpose(-1, -2) if kv else S).to(state.dtype)
    # What invalid rows write (see above): the donor's new bytes, or their slot's old bytes.
    fallback = torch.where(any_valid.view(1, 1, 1, 1), new.index_select(0, donor), old)
    state.index_copy_(0, slots, torch.where(row_valid.unsqueeze(-1), new, fallback))
