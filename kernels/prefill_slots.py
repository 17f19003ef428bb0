"""The fla prefill backend's work around fla's kernel, as two Triton launches: one before fla's call
(q, k and v copied out of the packed activations, the slots gathered into a dense initial state),
one after it (fla's output into ``out``, the final states back into the slots).

fla's chunk kernels take contiguous ``[1, T, H, K]`` q/k/v, one dense initial state per sequence,
and return the output and the final states out of place (:mod:`kda_kernels.fla_prefill`). What is
left to do moves each byte once:

- :func:`prepare` (one launch): q, k and v, views of ``mixed_qkv``, copied into one new buffer (fla's
  input guard would copy each of them in a launch of its own), and ``h0[b] = pool[slot b]`` in fp32
  where the slot is valid (``0 <= slot < N``) and ``has_initial_state[b]``, zero otherwise (a padding
  slot is never read);
- :func:`finish` (one launch): ``out[t] = o[t]`` for the tokens of the sequences with a valid slot,
  zero for the others (a token's sequence found from ``cu_seqlens`` on the device), and
  ``pool[slot b] = ht[b]`` (rounded to the pool's dtype) for the valid slots; a padding or
  out-of-range slot writes nothing.

Each launch's grid holds both of its parts, one after the other (a program reads its part from its
index). At T = 4,096 tokens fla's call is host-bound, so the launches the op adds around it are its
cost there: two here, against seven as separate kernels and copies. No host sync, any number of
sequences. A pool row is ``[HV, *, *]``, contiguous (the contract's ``inner_contiguous=3``); its
row stride is free, as is ``mixed_qkv``'s. Duplicate valid slots are a caller error: the slot ends
up with one of the sequences' states. Runs on CUDA and on the CPU under the Triton interpreter.

Example::

    q, k, v, h0 = prepare(mixed_qkv, H, HV, K, V, pool, slots, has_initial_state)  # h0 [B, HV, *, *] fp32
    o, ht = chunk_kda(q=q, k=k, v=v, initial_state=h0, ...)
    finish(out, o, ht, cu_seqlens, pool, slots)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .fast_launch import FastLaunch

__all__ = ["finish", "prepare"]

_ROW_BLOCK = 4096  # state elements per program
_TOKENS, _WIDTH, _SEQS = 16, 512, 64  # a token tile: tokens x channels, and sequences per step of the search


@triton.jit(do_not_specialize=["T", "k_at", "v_at", "B", "n_copy"])
def _prepare_kernel(x, qkv, pool, h0, slots, has_init, T, k_at, v_at, x_stride, HK, W, N, row_stride, S, B, n_copy,
                    n_w, n_s,
                    BT: tl.constexpr, BW: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    # (Triton merges the names assigned in both branches of an if: each branch names its own)
    if pid < n_copy:  # a [BT, BW] tile of x's q | k | v channels into the q, k and v blocks of qkv
        t = (pid // n_w) * BT + tl.arange(0, BT)
        c = (pid % n_w) * BW + tl.arange(0, BW)
        m = (t < T)[:, None] & (c < W)[None, :]
        val = tl.load(x + t[:, None] * x_stride + c[None, :], mask=m)
        tt, cc = t[:, None], c[None, :]
        # q: [T, HK] at 0, k: [T, HK] at k_at = T*HK, v: [T, W - 2*HK] at v_at = 2*T*HK (host ints: no i32 product)
        dst = tl.where(cc < HK, tt * HK + cc,
                       tl.where(cc < 2 * HK, k_at + tt * HK + (cc - HK), v_at + tt * (W - 2 * HK) + (cc - 2 * HK)))
        tl.store(qkv + dst, val, mask=m)
    else:  # one block of one sequence's initial state
        r = pid - n_copy
        b = r // n_s
        offs = (r % n_s) * BLOCK + tl.arange(0, BLOCK)
        row_slot = tl.load(slots + b).to(tl.int64)
        take = (row_slot >= 0) & (row_slot < N) & (tl.load(has_init + b) != 0)
        # (a row's mask as a bound on offs: the interpreter cannot and a scalar into a block mask)
        row = tl.load(pool + tl.where(take, row_slot, 0) * row_stride + offs, mask=offs < tl.where(take, S, 0),
                      other=0.0)
        tl.store(h0 + b * S + offs, row.to(tl.float32), mask=offs < S)


@triton.jit(do_not_specialize=["T", "B", "n_out"])
def _finish_kernel(out, o, cu_seqlens, slots, pool, ht, T, B, N, W, row_stride, S, n_out, n_w, n_s,
                   BT: tl.constexpr, BW: tl.constexpr, BB: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    if pid < n_out:  # a [BT, BW] tile of out
        t = (pid // n_w) * BT + tl.arange(0, BT)
        w = (pid % n_w) * BW + tl.arange(0, BW)
        # a token's sequence: how many sequences end at or before it (cu_seqlens never decreases)
        seq = tl.zeros([BT], dtype=tl.int64)
        for j0 in range(0, B, BB):
            j = j0 + tl.arange(0, BB)
            ends = tl.load(cu_seqlens + 1 + j, mask=j < B, other=T).to(tl.int64)
            seq += tl.sum((ends[None, :] <= t[:, None]).to(tl.int64), axis=1)
        in_t = t < T
        slot = tl.load(slots + seq, mask=in_t & (seq < B), other=-1).to(tl.int64)  # past cu_seqlens[B]: none
        live = (slot >= 0) & (slot < N)
        m = in_t[:, None] & (w[None, :] < W)
        val = tl.load(o + t[:, None] * W + w[None, :], mask=m & live[:, None], other=0.0)
        tl.store(out + t[:, None] * W + w[None, :], val.to(out.dtype.element_ty), mask=m)
    else:  # one block of one sequence's final state into its slot
        r = pid - n_out
        b = r // n_s
        offs = (r % n_s) * BLOCK + tl.arange(0, BLOCK)
        row_slot = tl.load(slots + b).to(tl.int64)
        valid = (row_slot >= 0) & (row_slot < N)
        row_mask = offs < tl.where(valid, S, 0)
        row = tl.load(ht + b * S + offs, mask=row_mask, other=0.0)
        tl.store(pool + tl.where(valid, row_slot, 0) * row_stride + offs, row.to(pool.dtype.element_ty),
                 mask=row_mask)


_PREPARE, _FINISH = FastLaunch(_prepare_kernel), FastLaunch(_finish_kernel)


def _row(pool: Tensor) -> tuple[int, int]:
    """``(row stride, elements per row)`` of a pool whose rows are contiguous; ValueError otherwise."""
    size = 1
    for n, stride in zip(reversed(pool.shape[1:]), reversed(pool.stride()[1:]), strict=True):
        if n != 1 and stride != size:
            raise ValueError(f"the fla prefill backend needs each pool row contiguous, got strides {pool.stride()}")
        size *= n
    return pool.stride(0), size


def prepare(mixed_qkv: Tensor, num_heads: int, num_v_heads: int, K: int, V: int, pool: Tensor, slots: Tensor,
            has_initial_state: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(q, k, v, h0)``: contiguous ``[1, T, H, K]``, ``[1, T, H, K]``, ``[1, T, HV, V]`` copies of
    ``mixed_qkv``'s channels (``[T, 2*H*K + HV*V]``, last dim contiguous) and ``h0 [B, *pool.shape[1:]]``
    fp32, each sequence's slot where it is valid and continues, else zero; one launch."""
    row_stride, S = _row(pool)
    T, B = mixed_qkv.shape[0], slots.shape[0]
    HK, HVV = num_heads * K, num_v_heads * V
    W = 2 * HK + HVV
    if mixed_qkv.shape[-1] < W or (T > 1 and W > 1 and mixed_qkv.stride(-1) != 1):
        raise ValueError(f"mixed_qkv needs {W} channels, the last dim contiguous: got shape {tuple(mixed_qkv.shape)}, "
                         f"strides {mixed_qkv.stride()}")
    qkv = torch.empty(T * W, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    h0 = torch.empty(B, *pool.shape[1:], dtype=torch.float32, device=pool.device)
    n_w, n_s = triton.cdiv(W, _WIDTH), triton.cdiv(S, _ROW_BLOCK)
    n_copy = triton.cdiv(T, _TOKENS) * n_w if T * W else 0
    n_gather = B * n_s if S else 0
    if n_copy + n_gather:
        x = mixed_qkv if n_copy else h0  # (never read without a copy part: any tensor of the device)
        _PREPARE((n_copy + n_gather,), x, qkv if n_copy else h0, pool, h0, slots, has_initial_state, T,
                 T * HK, 2 * T * HK, mixed_qkv.stride(0), HK, W, pool.shape[0], row_stride, S, B, n_copy, n_w, n_s,
                 BT=_TOKENS, BW=_WIDTH, BLOCK=_ROW_BLOCK)
    q = qkv[: T * HK].view(1, T, num_heads, K)
    k = qkv[T * HK : 2 * T * HK].view(1, T, num_heads, K)
    v = qkv[2 * T * HK :].view(1, T, num_v_heads, V)
    return q, k, v, h0


def finish(out: Tensor, o: Tensor | None, ht: Tensor, cu_seqlens: Tensor, pool: Tensor, slots: Tensor) -> None:
    """``out [T, ...]`` (contiguous) from ``o`` (its shape; None without tokens): a token's row where
    its sequence's slot is valid, zero otherwise (and past ``cu_seqlens[B]``); then ``pool[slots[b]] =
    ht[b]`` in the pool's dtype for the valid slots, in place; one launch."""
    row_stride, S = _row(pool)
    T, B = out.shape[0], slots.shape[0]
    W = out[0].numel() if T else 0
    n_w, n_s = triton.cdiv(W, _WIDTH), triton.cdiv(S, _ROW_BLOCK)
    n_out = triton.cdiv(T, _TOKENS) * n_w if T * W else 0
    n_scatter = B * n_s if S else 0
    if n_out + n_scatter:
        ht = ht.contiguous()
        _FINISH((n_out + n_scatter,), out if n_out else ht, o.contiguous() if n_out and o is not None else ht,
                cu_seqlens, slots, pool, ht, T, B, pool.shape[0], W, row_stride, S, n_out, n_w, n_s,
                BT=_TOKENS, BW=_WIDTH, BB=_SEQS, BLOCK=_ROW_BLOCK)
