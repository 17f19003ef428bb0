"""The fla prefill backend's work around fla's kernel, as two Triton launches: one before fla's call
(q, k and v copied out of the packed activations, the slots gathered into a dense initial state),
one after it (fla's output into ``out``, the final states back into the slots).

fla's chunk kernels take contiguous ``[1, T, H, K]`` q/k/v, one dense initial state per sequence,
and return the output and the final states out of place (:mod:`kda_kernels.fla_prefill`). What is
left to do moves each byte once:

- :func:`prepare` (one launch): q, k and v, views of ``mixed_qkv``, copied into new contiguous tensors (fla's
  input guard would copy each of them in a launch of its own), q's and k's heads scaled to unit l2 norm on
  the way and KDA's ``beta = sigmoid(b)`` (fla's ``use_qk_l2norm_in_kernel`` and
  ``use_beta_sigmoid_in_kernel``: three more launches of fla's), and ``h0[b] = pool[slot b]`` in fp32
  where the slot is valid (``0 <= slot < N``) and ``has_initial_state[b]``, zero otherwise (a padding
  slot is never read);
- :func:`finish` (one launch): ``out[t] = o[t]`` for the tokens of the sequences with a valid slot,
  zero for the others (a token's sequence found from ``cu_seqlens`` on the device), and
  ``pool[slot b] = ht[b]`` (rounded to the pool's dtype) for the valid slots; a padding or
  out-of-range slot writes nothing.

Each launch's grid holds both of its parts, one after the other (a program reads its part from its
index). At T = 4,096 tokens fla's call is host-bound, so the launches the op adds around it are its
cost there: two here, against seven as separate kernels and copies, and three fewer in fla's call. No
host sync, any number of sequences. A pool row is ``[HV, *, *]``, contiguous (the contract's
``inner_contiguous=3``); its row stride is free, as is ``mixed_qkv``'s. Duplicate valid slots are a
caller error: the slot ends up with one of the sequences' states. Runs on CUDA and on the CPU under the
Triton interpreter.

Example::

    q, k, v, h0, cu, _, beta = prepare(mixed_qkv, H, HV, K, V, pool, slots, has_initial_state, cu_seqlens,
                                       l2norm=True, beta_logits=b)
    o, ht = chunk_kda(q=q, k=k, v=v, beta=beta, initial_state=h0, cu_seqlens=cu, ...)
    finish(out, o, ht, cu, pool, slots)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .fast_launch import FastLaunch
from .reference import L2NORM_EPS  # (under the square root; fla's l2norm_fwd default too)

__all__ = ["CHUNK", "Prepared", "chunk_plan", "finish", "fuses_l2norm", "prepare"]

_ROW_BLOCK = 4096  # state elements per program
_TOKENS, _WIDTH, _SEQS = 16, 512, 64  # a token tile: tokens x channels, and sequences per step of the search
_PLAN_ROWS = 64  # chunk-plan rows per program

CHUNK = 64
"""fla's chunk length (its ``chunk_size`` default, which both chunk kernels are called with)."""


@triton.jit(do_not_specialize=["T", "B", "n_copy", "n_beta", "n_gather", "n_plan", "rows"])
def _prepare_kernel(x, qbuf, kbuf, vbuf, braw, beta, pool, h0, slots, has_init, cu, cu64, plan, T, x_stride, HK, W,
                    b_stride0, b_stride1, HB, N, row_stride, S, B, n_copy, n_beta, n_gather, n_plan, rows, n_w, n_s,
                    BT: tl.constexpr, BW: tl.constexpr, BLOCK: tl.constexpr, BR: tl.constexpr, BB: tl.constexpr,
                    CHUNK: tl.constexpr, NORM_K: tl.constexpr, EPS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    # (Triton merges the names assigned in both branches of an if: each part names its own)
    if pid < n_copy:  # a [BT, BW] tile of x's q | k | v channels into q, k and v
        t = (pid // n_w) * BT + tl.arange(0, BT)
        c = (pid % n_w) * BW + tl.arange(0, BW)
        m = (t < T)[:, None] & (c < W)[None, :]
        val = tl.load(x + t[:, None] * x_stride + c[None, :], mask=m, other=0.0)
        tt, cc = t[:, None], c[None, :]
        if NORM_K > 0:  # q's and k's heads (NORM_K channels, a divisor of BW: whole heads per tile) to unit l2 norm
            xf = tl.reshape(val.to(tl.float32), (BT, BW // NORM_K, NORM_K))
            rstd = 1 / tl.sqrt(tl.sum(xf * xf, 2) + EPS)
            qk = tl.where(cc < 2 * HK, tl.reshape(xf * rstd[:, :, None], (BT, BW)).to(val.dtype), val)
        else:
            qk = val
        # q: [T, HK], k: [T, HK], v: [T, W - 2*HK], each its own tensor (each 16-byte aligned, whatever HK)
        tl.store(qbuf + tt * HK + cc, qk, mask=m & (cc < HK))
        tl.store(kbuf + tt * HK + (cc - HK), qk, mask=m & (cc >= HK) & (cc < 2 * HK))
        tl.store(vbuf + tt * (W - 2 * HK) + (cc - 2 * HK), val, mask=m & (cc >= 2 * HK))
    elif pid < n_copy + n_beta:  # BLOCK entries of beta = sigmoid(b) in fp32, [T, HB] from b's strides
        i = (pid - n_copy) * BLOCK + tl.arange(0, BLOCK)
        mb = i < T * HB
        logit = tl.load(braw + (i // HB) * b_stride0 + (i % HB) * b_stride1, mask=mb, other=0.0)
        tl.store(beta + i, tl.sigmoid(logit.to(tl.float32)), mask=mb)
    elif pid < n_copy + n_beta + n_gather:  # one block of one sequence's initial state
        r = pid - n_copy - n_beta
        b = r // n_s
        offs = (r % n_s) * BLOCK + tl.arange(0, BLOCK)
        row_slot = tl.load(slots + b).to(tl.int64)
        take = (row_slot >= 0) & (row_slot < N) & (tl.load(has_init + b) != 0)
        # (a row's mask as a bound on offs: the interpreter cannot and a scalar into a block mask)
        row = tl.load(pool + tl.where(take, row_slot, 0) * row_stride + offs, mask=offs < tl.where(take, S, 0),
                      other=0.0)
        tl.store(h0 + b * S + offs, row.to(tl.float32), mask=offs < S)
    elif pid < n_copy + n_beta + n_gather + n_plan:  # BR rows of the chunk plan (see chunk_plan)
        p = (pid - n_copy - n_beta - n_gather) * BR + tl.arange(0, BR)
        seq = tl.zeros([BR], dtype=tl.int64)  # sequences whose chunks end at or before the row
        before = tl.zeros([BR], dtype=tl.int64)  # their chunks
        carry = tl.zeros([1], dtype=tl.int64)
        for j0 in range(0, B, BB):
            j = j0 + tl.arange(0, BB)
            lo = tl.load(cu + j, mask=j < B, other=0).to(tl.int64)
            hi = tl.load(cu + 1 + j, mask=j < B, other=0).to(tl.int64)
            ch = tl.where(j < B, (hi - lo + (CHUNK - 1)) // CHUNK, 0)
            ends = carry + tl.cumsum(ch, 0)
            done = (ends[None, :] <= p[:, None]) & (j < B)[None, :]
            seq += tl.sum(done.to(tl.int64), axis=1)
            before += tl.sum(tl.where(done, ch[None, :], 0), axis=1)
            carry += tl.sum(ch, 0)
        live = seq < B
        pm = p < rows
        tl.store(plan + 2 * p, tl.where(live, seq, 0), mask=pm)
        tl.store(plan + 2 * p + 1, tl.where(live, p - before, rows), mask=pm)
    else:  # BR entries of cu_seqlens as int64
        e = (pid - n_copy - n_beta - n_gather - n_plan) * BR + tl.arange(0, BR)
        tl.store(cu64 + e, tl.load(cu + e, mask=e <= B).to(tl.int64), mask=e <= B)


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


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` in plain Python (``triton.cdiv`` is a ConstexprFunction: several µs of host time
    a call, which at T = 4,096 is the op's overhead)."""
    return -(-a // b)


def _parts(T: int, W: int, S: int, B: int) -> tuple[int, int, int, int]:
    """Both launches' grid: ``(token-tile columns, blocks per state row, token-tile programs, state-row
    programs)`` for ``T`` tokens of ``W`` channels and ``B`` states of ``S`` elements."""
    n_w, n_s = _cdiv(W, _WIDTH), _cdiv(S, _ROW_BLOCK)
    return n_w, n_s, _cdiv(T, _TOKENS) * n_w if T * W else 0, B * n_s if S else 0


def _row(pool: Tensor) -> tuple[int, int]:
    """``(row stride, elements per row)`` of a pool whose rows are contiguous; ValueError otherwise."""
    size = 1
    for n, stride in zip(reversed(pool.shape[1:]), reversed(pool.stride()[1:]), strict=True):
        if n != 1 and stride != size:
            raise ValueError(f"the fla prefill backend needs each pool row contiguous, got strides {pool.stride()}")
        size *= n
    return pool.stride(0), size


class Prepared(NamedTuple):
    """What :func:`prepare` makes for fla's call."""

    q: Tensor  # [1, T, H, K], contiguous (each head scaled to unit l2 norm with l2norm=True)
    k: Tensor  # [1, T, H, K], contiguous (the same)
    v: Tensor  # [1, T, HV, V], contiguous
    h0: Tensor  # [B, *pool.shape[1:]] fp32: each sequence's slot where it is valid and continues, else zero
    cu_seqlens: Tensor  # [B + 1] int64, new each call
    chunk_indices: Tensor | None  # chunk_plan(cu_seqlens, T) where asked for
    beta: Tensor | None  # [1, T, HB] fp32, sigmoid(beta_logits), where given


def fuses_l2norm(K: int) -> bool:
    """Whether :func:`prepare` can scale q's and k's heads of ``K`` channels to unit l2 norm in its copy:
    where a head never straddles two of its tiles (``K`` a power of two up to the tile's width)."""
    return 0 < K <= _WIDTH and _WIDTH % K == 0


def prepare(mixed_qkv: Tensor, num_heads: int, num_v_heads: int, K: int, V: int, pool: Tensor, slots: Tensor,
            has_initial_state: Tensor, cu_seqlens: Tensor, *, plan: bool = False, l2norm: bool = False,
            beta_logits: Tensor | None = None) -> Prepared:
    """Everything fla's call takes besides the gate, in one launch: contiguous copies of ``mixed_qkv``'s
    q/k/v channels (``[T, 2*H*K + HV*V]``, last dim contiguous, any row stride), with ``l2norm`` each q and
    k head scaled to unit l2 norm on the way (``x / sqrt(sum(x**2) + 1e-6)`` in fp32, rounded once to
    ``mixed_qkv``'s dtype: fla's ``use_qk_l2norm_in_kernel``, which then stays off; needs
    :func:`fuses_l2norm`), the slots gathered into a dense fp32 initial state, ``cu_seqlens`` as int64,
    with ``plan`` the chunk plan (:func:`chunk_plan`) and, given ``beta_logits`` (``[T, HB]``, any
    strides), ``beta = sigmoid(beta_logits)`` in fp32 (fla's ``use_beta_sigmoid_in_kernel``, bit for bit).
    Each of these is a launch (and host time) of its own in fla's call otherwise."""
    row_stride, S = _row(pool)
    T, B = mixed_qkv.shape[0], slots.shape[0]
    HK, HVV = num_heads * K, num_v_heads * V
    W = 2 * HK + HVV
    if mixed_qkv.shape[-1] < W:
        raise ValueError(f"mixed_qkv needs {W} channels: got shape {tuple(mixed_qkv.shape)}")
    if l2norm and not fuses_l2norm(K):
        raise ValueError(f"the copy cannot take the l2 norm of heads of {K} channels (see fuses_l2norm)")
    if T and W > 1 and mixed_qkv.stride(-1) != 1:  # (the copy reads each row's channels as contiguous)
        mixed_qkv = mixed_qkv.contiguous()
    device = mixed_qkv.device
    q = torch.empty(1, T, num_heads, K, dtype=mixed_qkv.dtype, device=device)
    k = torch.empty(1, T, num_heads, K, dtype=mixed_qkv.dtype, device=device)
    v = torch.empty(1, T, num_v_heads, V, dtype=mixed_qkv.dtype, device=device)
    h0 = torch.empty(B, *pool.shape[1:], dtype=torch.float32, device=device)
    cu64 = torch.empty(B + 1, dtype=torch.long, device=device)
    rows = _rows(T, B)
    chunk_indices = torch.empty(rows, 2, dtype=torch.long, device=device) if plan else None
    n_w, n_s, n_copy, n_gather = _parts(T, W, S, B)
    n_plan = _cdiv(rows, _PLAN_ROWS) if plan else 0
    b_strides: tuple[int, ...]
    if beta_logits is None:
        beta, HB, b_strides, n_beta = None, 0, (0, 0), 0
    else:
        HB = beta_logits.shape[-1]
        beta = torch.empty(1, T, HB, dtype=torch.float32, device=device)
        b_strides, n_beta = beta_logits.stride(), _cdiv(T * HB, _ROW_BLOCK)
    grid = n_copy + n_beta + n_gather + n_plan + _cdiv(B + 1, _PLAN_ROWS)  # (the last part: cu_seqlens as int64)
    _PREPARE((grid,), mixed_qkv if n_copy else h0, q if n_copy else h0, k if n_copy else h0, v if n_copy else h0,
             h0 if beta is None else beta_logits, h0 if beta is None else beta, pool, h0, slots, has_initial_state,
             cu_seqlens, cu64, cu64 if chunk_indices is None else chunk_indices, T, mixed_qkv.stride(0), HK, W,
             *b_strides, HB, pool.shape[0], row_stride, S, B, n_copy, n_beta, n_gather, n_plan, rows, n_w, n_s,
             BT=_TOKENS, BW=_WIDTH, BLOCK=_ROW_BLOCK, BR=_PLAN_ROWS, BB=_SEQS, CHUNK=CHUNK, NORM_K=K if l2norm else 0,
             EPS=L2NORM_EPS)
    return Prepared(q, k, v, h0, cu64, chunk_indices, beta)


def chunk_plan(cu_seqlens: Tensor, T: int) -> Tensor:
    """fla's ``chunk_indices`` for ``cu_seqlens`` (``[B+1]``, int32 or int64) built on the device in one
    launch, without a sync: ``[ceil(T / 64) + B - 1, 2]`` int64 rows ``(sequence, chunk within it)``,
    the real 64-token chunks first in order, then spare rows ``(0, rows)``: a chunk past the end of
    every sequence, which the kernels skip. The row count is an upper bound from the shapes alone
    (each sequence boundary can split at most one chunk), so it never depends on the offsets' values.

    Example::

        >>> chunk_plan(torch.tensor([0, 3, 3, 70]), 70).tolist()
        [[0, 0], [2, 0], [2, 1], [0, 4]]
    """
    B, device = cu_seqlens.shape[0] - 1, cu_seqlens.device
    rows = _rows(T, B)
    chunk_indices = torch.empty(rows, 2, dtype=torch.long, device=device)
    if rows:
        # (the plan part alone: no copy, beta, gather or int64 part in the grid; the other tensors never read)
        n_plan = _cdiv(rows, _PLAN_ROWS)
        c = chunk_indices
        _PREPARE((n_plan,), c, c, c, c, c, c, c, c, cu_seqlens, cu_seqlens, cu_seqlens, c, c, T, 0, 0, 0, 0, 0, 0, 0,
                 0, 0, B, 0, 0, 0, n_plan, rows, 1, 1, BT=_TOKENS, BW=_WIDTH, BLOCK=_ROW_BLOCK, BR=_PLAN_ROWS,
                 BB=_SEQS, CHUNK=CHUNK, NORM_K=0, EPS=L2NORM_EPS)
    return chunk_indices


def _rows(T: int, B: int) -> int:
    """The chunk plan's row count: the most 64-token chunks ``B`` sequences of ``T`` tokens can have."""
    return -(-T // CHUNK) + max(B - 1, 0)


def finish(out: Tensor, o: Tensor | None, ht: Tensor, cu_seqlens: Tensor, pool: Tensor, slots: Tensor) -> None:
    """``out [T, ...]`` (contiguous) from ``o`` (its shape; None without tokens): a token's row where
    its sequence's slot is valid, zero otherwise (and past ``cu_seqlens[B]``); then ``pool[slots[b]] =
    ht[b]`` in the pool's dtype for the valid slots, in place; one launch."""
    row_stride, S = _row(pool)
    T, B = out.shape[0], slots.shape[0]
    W = out.numel() // T if T else 0
    n_w, n_s, n_out, n_scatter = _parts(T, W, S, B)
    if n_out + n_scatter:
        ht = ht.contiguous()
        _FINISH((n_out + n_scatter,), out if n_out else ht, o.contiguous() if n_out and o is not None else ht,
                cu_seqlens, slots, pool, ht, T, B, pool.shape[0], W, row_stride, S, n_out, n_w, n_s,
                BT=_TOKENS, BW=_WIDTH, BB=_SEQS, BLOCK=_ROW_BLOCK)
