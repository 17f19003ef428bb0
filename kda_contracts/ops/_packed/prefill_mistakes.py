"""The known mistakes of a packed-prefill call, shared by KDA's and GDN's catalogues: each builds the
wrong call from a valid one (:data:`LENGTHS` sequences on a pool of :data:`~.mistakes.POOL` slots)
and names the fix; each op's catalogue adds its own gate mistake and runs them through its
validating entry point (:func:`~.mistakes.reproduce`).

Example::

    mistakes = prefill_mistakes(prefix="prefill-", gdn=False)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..._engine import DtypeError, ShapeError, ValueRangeError
from .config import KDAConfig
from .mistakes import POOL, Attempt, Mistake
from .prefill import make_prefill_call

LENGTHS = (2, 3, 1, 4)  # four sequences, ten tokens: the messages stay short


@functools.lru_cache(maxsize=8)
def _valid_call(cfg: KDAConfig, gdn: bool) -> dict[str, Any]:
    return make_prefill_call(cfg, LENGTHS, POOL, gdn=gdn)


def valid_prefill_call(cfg: KDAConfig, gdn: bool) -> dict[str, Any]:
    """A valid call (a fresh dict; mistakes replace arguments, never mutate them)."""
    return dict(_valid_call(cfg, gdn))


Builder = Callable[[dict[str, Any], KDAConfig], Attempt]


def _int64_cu(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, cu_seqlens=c["cu_seqlens"].long()), cfg)


def _no_leading_zero(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, cu_seqlens=c["cu_seqlens"][1:].contiguous()), cfg)


def _padded(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    x = c["mixed_qkv"]
    return Attempt(dict(c, mixed_qkv=x.view(2, x.shape[0] // 2, x.shape[1])), cfg,
                   notes=["the ten tokens viewed as two padded rows of five"])


def _decode_out(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, out=c["out"].unsqueeze(1)), cfg)


def _short_gate(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, a=c["a"][:-1]), cfg)


def _int_mask(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, has_initial_state=c["has_initial_state"].long()), cfg)


def _offset_cu(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    return Attempt(dict(c, cu_seqlens=c["cu_seqlens"] + 7), cfg, strict=True,
                   notes=["strict mode; offsets of a batch sliced out of a larger one, its first offset 7"])


def _lengths(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    lengths = torch.tensor([0, *LENGTHS], dtype=torch.int32)
    return Attempt(dict(c, cu_seqlens=lengths), cfg, strict=True, notes=["strict mode"])


def _duplicate_slots(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    idx = c["ssm_state_indices"].clone()
    idx[1] = idx[0]
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode"])


def _past_pool(c: dict[str, Any], cfg: KDAConfig) -> Attempt:
    idx = c["ssm_state_indices"].clone()
    idx[-1] = POOL
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode"])


_SHARED: tuple[tuple[str, str, str, str, str, type, Builder], ...] = (
    ("int64-cu-seqlens", "`cu_seqlens` in int64", "cu_seqlens = torch.cat([zero, lengths.cumsum(0)])  # int64",
     "a varlen kernel built for int32 offsets reads them two at a time: wrong sequence boundaries",
     "build `cu_seqlens` as int32 (`.to(torch.int32)` once per batch)", DtypeError, _int64_cu),
    ("cu-seqlens-without-zero", "`cu_seqlens` without its leading 0 (B entries)", "cu_seqlens = lengths.cumsum(0)",
     "the kernel reads B-1 sequences shifted by one and one past the end of the offsets",
     "pass B+1 offsets starting with 0: `torch.cat([cu.new_zeros(1), lengths.cumsum(0)])`", ShapeError,
     _no_leading_zero),
    ("padded-activations", "padded `[B, L, ...]` activations", "mixed_qkv = qkv_padded  # [B, L, 2*H*K + HV*V]",
     "padding tokens run through the recurrence and end up in the state",
     "pack the tokens, one row per real token (`x[mask]`), with `cu_seqlens` marking the sequences", ShapeError,
     _padded),
    ("decode-shaped-out", "a decode-shaped `out` [T, 1, HV, V]", "out = torch.empty(T, 1, HV, V)  # as for decode",
     "a kernel writing [T, HV, V] rows into it strides over the wrong axis",
     "allocate `out` as `[T, HV, V]`, one row per token", ShapeError, _decode_out),
    ("token-rows", "a per-token tensor with another T", "a = gate_proj(x[:-1])  # one token short",
     "the kernel reads past the end of `a`: garbage gates for the last tokens",
     "build `mixed_qkv`, `a`, `b` and `out` from the same packed tokens", ShapeError, _short_gate),
    ("int-mask", "`has_initial_state` as integers", "has_initial_state = (cached_lens > 0).long()",
     "a kernel reading bytes as bools sees every eighth flag",
     "pass a bool mask: `has_initial_state.bool()`", DtypeError, _int_mask),
    ("cu-seqlens-offset", "`cu_seqlens` not starting at 0 (strict mode)",
     "cu_seqlens = batch_cu[i:j + 1]  # a slice of a larger batch's offsets",
     "every sequence reads tokens past its own: wrong outputs and states, reads past the end",
     "subtract the first offset: `cu_seqlens - cu_seqlens[0]`", ValueRangeError, _offset_cu),
    ("lengths-not-offsets", "lengths where offsets are expected (strict mode)", "cu_seqlens = [0, *lengths]",
     "sequences overlap and the last ones are cut: silently wrong outputs and states",
     "pass cumulative offsets: `torch.cat([zero, lengths.cumsum(0)])`", ValueRangeError, _lengths),
    ("duplicate-slots", "two sequences on one slot (strict mode)", "ssm_state_indices[1] = ssm_state_indices[0]",
     "two sequences race on one slot's state: one final state is lost",
     "give every live sequence its own slot; -1 pads", ValueRangeError, _duplicate_slots),
    ("index-past-pool", "a slot >= N (strict mode)", "ssm_state_indices[-1] = N",
     "out-of-bounds read and write of another request's memory in kernels without guards",
     "fix the slot allocator; mark padding sequences with -1", ValueRangeError, _past_pool),
)


def prefill_mistakes(prefix: str, *, gdn: bool) -> tuple[Mistake, ...]:
    """The shared prefill mistakes, keys prefixed with ``prefix``, built on a valid call of the op
    (``gdn``: GDN's gate)."""

    def build(make: Builder) -> Callable[[KDAConfig], Attempt]:
        return lambda cfg: make(valid_prefill_call(cfg, gdn), cfg)

    who = "GDN prefill: " if gdn else "Prefill: "
    return tuple(Mistake(prefix + key, who + title, code, hazard, fix, error, build(make))
                 for key, title, code, hazard, fix, error, make in _SHARED)
