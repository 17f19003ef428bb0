"""The fla prefill backend's work around fla's kernel, as three small Triton kernels: the slots into
a dense initial state, fla's output into ``out``, the final states back into the slots.

fla's chunk kernels take one dense initial state per sequence and return the output and the final
states out of place (:mod:`kda_kernels.fla_prefill`). What is left to do moves each byte once:

- :func:`gather_slots`: ``h0[b] = pool[slot b]`` in fp32 where the slot is valid (``0 <= slot < N``)
  and ``has_initial_state[b]``, zero otherwise (a padding slot is never read);
- :func:`write_output`: ``out[t] = o[t]`` for the tokens of the sequences with a valid slot, zero for
  the others (a token's sequence found from ``cu_seqlens`` on the device);
- :func:`scatter_slots`: ``pool[slot b] = ht[b]`` (rounded to the pool's dtype) for the valid slots;
  a padding or out-of-range slot writes nothing.

No host sync, any number of sequences. Torch ops would take about twenty launches and, per
sequence, three more passes over its state (the padding-safe scatter of
:class:`~kda_kernels.interface.RowSlots` redirects invalid rows to a donor slot instead of masking
the store). A pool row is ``[HV, *, *]``, contiguous (the contract's ``inner_contiguous=3``); its
row stride is free. Duplicate valid slots are a caller error: the slot ends up with one of the
sequences' states. Runs on CUDA and on the CPU under the Triton interpreter.

Example::

    h0 = gather_slots(pool, slots, has_initial_state)   # [B, HV, *, *] fp32
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .fast_launch import FastLaunch

__all__ = ["gather_slots", "scatter_slots", "write_output"]

_ROW_BLOCK = 4096  # state elements per program
_TOKENS, _WIDTH, _SEQS = 16, 512, 64  # write_output's tile: tokens x channels, and sequences per step


@triton.jit
def _gather_kernel(pool, h0, slots, has_init, N, row_stride, S, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots + b).to(tl.int64)
    take = (slot >= 0) & (slot < N) & (tl.load(has_init + b) != 0)
    # (a row's mask as a bound on offs: the interpreter cannot and a scalar into a block mask)
    x = tl.load(pool + tl.where(take, slot, 0) * row_stride + offs, mask=offs < tl.where(take, S, 0), other=0.0)
    tl.store(h0 + b * S + offs, x.to(tl.float32), mask=offs < S)


@triton.jit
def _scatter_kernel(pool, ht, slots, N, row_stride, S, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots + b).to(tl.int64)
    valid = (slot >= 0) & (slot < N)
    m = offs < tl.where(valid, S, 0)
    x = tl.load(ht + b * S + offs, mask=m, other=0.0)
    tl.store(pool + tl.where(valid, slot, 0) * row_stride + offs, x.to(pool.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T", "B"])
def _output_kernel(out, o, cu_seqlens, slots, T, B, N, W, BT: tl.constexpr, BW: tl.constexpr,
                   BB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    w = tl.program_id(1).to(tl.int64) * BW + tl.arange(0, BW)
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
    x = tl.load(o + t[:, None] * W + w[None, :], mask=m & live[:, None], other=0.0)
    tl.store(out + t[:, None] * W + w[None, :], x.to(out.dtype.element_ty), mask=m)


_GATHER, _SCATTER, _OUTPUT = FastLaunch(_gather_kernel), FastLaunch(_scatter_kernel), FastLaunch(_output_kernel)


def _row(pool: Tensor) -> tuple[int, int]:
    """``(row stride, elements per row)`` of a pool whose rows are contiguous; ValueError otherwise."""
    size = 1
    for n, stride in zip(reversed(pool.shape[1:]), reversed(pool.stride()[1:]), strict=True):
        if n != 1 and stride != size:
            raise ValueError(f"the fla prefill backend needs each pool row contiguous, got strides {pool.stride()}")
        size *= n
    return pool.stride(0), size


def gather_slots(pool: Tensor, slots: Tensor, has_initial_state: Tensor) -> Tensor:
    """``[B, *pool.shape[1:]]`` fp32: each sequence's slot where it is valid and continues, else zero."""
    stride, S = _row(pool)
    B = slots.shape[0]
    h0 = torch.empty(B, *pool.shape[1:], dtype=torch.float32, device=pool.device)
    if B and S:
        _GATHER((B, triton.cdiv(S, _ROW_BLOCK)), pool, h0, slots, has_initial_state, pool.shape[0], stride, S,
                BLOCK=_ROW_BLOCK)
    return h0


def scatter_slots(pool: Tensor, ht: Tensor, slots: Tensor) -> None:
    """``pool[slots[b]] = ht[b]`` in the pool's dtype for the valid slots, in place; nothing else changes."""
    stride, S = _row(pool)
    B = slots.shape[0]
    if B and S:
        _SCATTER((B, triton.cdiv(S, _ROW_BLOCK)), pool, ht.contiguous(), slots, pool.shape[0], stride, S,
                 BLOCK=_ROW_BLOCK)


def write_output(out: Tensor, o: Tensor, cu_seqlens: Tensor, slots: Tensor, num_slots: int) -> None:
    """``out [T, ...]`` (contiguous) from ``o`` (its shape): a token's row where its sequence's slot is
    valid, zero otherwise (and past ``cu_seqlens[B]``)."""
    T, B = out.shape[0], slots.shape[0]
    W = out[0].numel() if T else 0
    if T and W:
        grid = (triton.cdiv(T, _TOKENS), triton.cdiv(W, _WIDTH))
        _OUTPUT(grid, out, o.contiguous(), cu_seqlens, slots, T, B, num_slots, W, BT=_TOKENS, BW=_WIDTH,
                             BB=_SEQS)
