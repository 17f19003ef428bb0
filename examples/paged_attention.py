"""A vLLM-style paged-attention decode op, written as a user would with ``kc.op``: the contract is
the annotations, the body is the torch reference, a Triton kernel is a backend.

One query token per sequence attends to the tokens of that sequence in a paged KV cache. Token
``t`` of sequence ``s`` lives in physical block ``block_tables[s, t // BS]`` at offset
``t % BS``; the key cache packs ``x = 16 // itemsize`` elements of a head into its last axis (one
16-byte load), the value cache keeps a head's ``D`` channels before the block offset:

=================  ==============================  ============================================
argument           shape                           notes
=================  ==============================  ============================================
``query``          ``[S, NH, D]``                  one token per sequence
``key_cache``      ``[NB, NKV, D//x, BS, x]``      ``x == 16 // itemsize(key_cache)``
``value_cache``    ``[NB, NKV, D, BS]``
``block_tables``   ``[S, MB]`` int32               physical block of each logical block
``seq_lens``       ``[S]`` int32                   tokens in each sequence (0: padding)
``scale``          float > 0                       usually ``D ** -0.5``
``out``            ``[S, NH, D]``                  written in place
=================  ==============================  ============================================

Query head ``h`` reads KV head ``h // (NH // NKV)`` (grouped-query attention). ``D`` is one of
vLLM's head sizes and ``BS`` one of its block sizes. A sequence of length 0 gets a zero output.
Strict mode also checks the values: ``0 <= seq_lens <= MB*BS`` and every block a sequence uses
is in ``[0, NB)``. Whatever the mode, neither the reference nor the kernel reads outside the
caches: a block id out of range, or a length past the table, reads as masked tokens.

Run it (CPU; ``TRITON_INTERPRET=1`` adds the Triton kernel under the interpreter)::

    TRITON_INTERPRET=1 python examples/paged_attention.py
"""

from __future__ import annotations

import os
from typing import Annotated

import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.facts import ConstraintFailed, RankMismatch

__all__ = ["BLOCK_SIZES", "CACHE_DTYPES", "HEAD_SIZES", "make_call", "paged_attention"]

HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)  # vLLM's paged-attention head sizes
BLOCK_SIZES = (8, 16, 32)
CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

X_RULE = "x == 16 // itemsize(key_cache)"  # one 16-byte load holds x elements of a head
WHERE = (
    X_RULE,  # its fix is worded per call by _hint_key_cache
    kc.Where("NH % NKV == 0",
             hint="each KV head serves NH // NKV query heads: NH must be a multiple of NKV (check num_kv_heads, "
                  "and that both are divided by the same tensor-parallel size)"),
    kc.Where(f"D in {HEAD_SIZES}", hint="the head size must be one the kernel is built for"),
    kc.Where(f"BS in {BLOCK_SIZES}", hint="the block size must be one the kernel is built for"),
)


def _value_checks(ctx) -> list[kc.Violation]:
    """Strict mode: every length fits its block table and every block a sequence uses exists."""
    v, d = ctx.values, ctx.dims
    seq_lens, tables = v["seq_lens"], v["block_tables"]
    if seq_lens.is_meta or (seq_lens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return []  # no values to read (or no sync allowed): the kernel masks what is out of range
    found: list[kc.Violation] = []
    capacity = d["MB"] * d["BS"]
    lens = seq_lens.long()
    outside = ((lens < 0) | (lens > capacity)).nonzero().flatten().tolist()
    if outside:
        found.append(kc.Violation(
            kc.ValueRangeError, "seq_lens", f"0 <= seq_lens <= MB*BS = {capacity}",
            f"{len(outside)} length(s) outside, e.g. seq_lens[{outside[0]}] = {int(lens[outside[0]])}",
            hint="a sequence longer than its block table would read blocks it does not own; grow block_tables "
                 "(MB) or check the lengths"))
    used = torch.arange(d["MB"], device=lens.device) * d["BS"] < lens[:, None]  # blocks holding tokens
    bad = (used & ((tables < 0) | (tables >= d["NB"]))).nonzero().tolist()
    if bad:
        s, j = bad[0]
        found.append(kc.Violation(
            kc.ValueRangeError, "block_tables", f"block ids in [0, NB={d['NB']}) for every block a sequence uses",
            f"{len(bad)} id(s) outside, e.g. block_tables[{s}, {j}] = {int(tables[s, j])} "
            f"(sequence {s} has {int(lens[s])} tokens)",
            hint="an id past the cache reads another allocation's memory; check the block allocator and that "
                 "the tables belong to this cache"))
    return found


def _hint_key_cache(v: kc.Violation, ctx) -> str | None:
    """The two ways a key cache comes in with the wrong layout: packed for another dtype's x, or
    not packed at all (the flash-attention layout ``[NB, BS, NKV, D]``)."""
    key_cache, d = ctx.values["key_cache"], ctx.dims
    if not {"NB", "NKV", "D", "BS"} <= d.keys():
        return None
    size = key_cache.element_size()
    x = 16 // size
    want = f"[NB, NKV, D//x, BS, x] = [{d['NB']}, {d['NKV']}, {d['D'] // x}, {d['BS']}, {x}]"
    failed = v.fact(ConstraintFailed)
    if failed is not None and failed.constraint == X_RULE:
        got = dict(failed.dims)["x"]
        return (f"a {str(key_cache.dtype).removeprefix('torch.')} cache packs x = 16 // {size} = {x} elements: "
                f"allocate key_cache as {want}; this one is packed with x = {got}, as for a {16 // got}-byte dtype")
    rank = v.fact(RankMismatch)
    if v.argument == "key_cache" and rank is not None and rank.shape == (d["NB"], d["BS"], d["NKV"], d["D"]):
        return (f"key_cache looks like the flash-attention layout [NB, BS, NKV, D]; this op takes vLLM's paged "
                f"layout {want}: key_cache.view(NB, BS, NKV, D // x, x).permute(0, 2, 3, 1, 4).contiguous()")
    return None


@kc.op(returns="out", where=WHERE, hints=[_hint_key_cache], value_checks=_value_checks)
def paged_attention(
    query: Annotated[Float[Tensor, "S NH D"], kc.Spec(dtypes=CACHE_DTYPES, inner_contiguous=2)],
    key_cache: Annotated[Float[Tensor, "NB NKV D//x BS x"], kc.Spec(same_dtype_as="query", inner_contiguous=3)],
    value_cache: Annotated[Float[Tensor, "NB NKV D BS"], kc.Spec(same_dtype_as="query", inner_contiguous=2)],
    block_tables: Annotated[Int[Tensor, "S MB"], kc.Spec(dtypes=(torch.int32,), contiguous=True)],
    seq_lens: Annotated[Int[Tensor, "S"], kc.Spec(dtypes=(torch.int32,), contiguous=True)],
    scale: Annotated[float, kc.Range(gt=0)],
    out: Annotated[Float[Tensor, "S NH D"], kc.Spec(same_dtype_as="query", inner_contiguous=2, mutated=True)],
) -> None:
    """PyTorch reference: gathers every block of the table, masks, softmax in float32."""
    S, NH, D = query.shape
    NB, NKV, _, BS, _ = key_cache.shape
    MB = block_tables.shape[1]
    ok = (block_tables >= 0) & (block_tables < NB)  # [S, MB]: never gather outside the cache
    blocks = torch.where(ok, block_tables, 0).long()
    keys = key_cache[blocks].permute(0, 2, 1, 4, 3, 5).reshape(S, NKV, MB * BS, D)  # [S, NKV, T, D]
    values = value_cache[blocks].permute(0, 2, 1, 4, 3).reshape(S, NKV, MB * BS, D)
    t = torch.arange(MB * BS, device=query.device)
    keep = (t < seq_lens[:, None]) & ok.repeat_interleave(BS, dim=1)  # [S, T]
    q = query.float().view(S, NKV, NH // NKV, D)
    scores = torch.einsum("skgd,sktd->skgt", q, keys.float()) * scale
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - torch.where(torch.isfinite(top), top, 0.0))  # 0 where masked
    total = weights.sum(-1, keepdim=True)
    attended = torch.einsum("skgt,sktd->skgd", weights, values.float()) / total.clamp_min(1e-30)
    out.copy_(attended.reshape(S, NH, D))


def _cpu_if_interpreting() -> tuple[str, ...]:
    # Asked per call: under TRITON_INTERPRET the kernel also runs on the CPU, when asked by name.
    return ("cpu",) if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else ()


# The kernel lives in its own module (it imports triton), loaded on first use.
_KERNEL_MODULE = f"{__name__.rpartition('.')[0]}.paged_attention_triton".lstrip(".")
paged_attention.register_backend(kc.Backend(
    name="triton", kernel=f"{_KERNEL_MODULE}:paged_attention", devices=("cuda",), priority=30,
    requires=("triton",), explicit_devices=_cpu_if_interpreting,
    description="one program per (sequence, query head): loops over the blocks, online softmax"))


def make_call(S: int = 3, NH: int = 4, NKV: int = 2, D: int = 64, BS: int = 16, NB: int | None = None, MB: int = 4,
              dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> dict[str, object]:
    """A valid call with random values: lengths 1..MB*BS, distinct blocks per sequence when the
    cache has enough (``NB``: by default two more than the sequences use).

    Example::

        >>> out = paged_attention(**make_call())
    """
    g = torch.Generator().manual_seed(seed)
    NB = S * MB + 2 if NB is None else NB
    x = 16 // dtype.itemsize
    lens = torch.randint(1, MB * BS + 1, (S,), generator=g, dtype=torch.int32)
    tables = torch.randperm(NB, generator=g)[: S * MB].view(S, MB) if NB >= S * MB \
        else torch.randint(0, NB, (S, MB), generator=g)
    return {
        "query": torch.randn(S, NH, D, generator=g).to(device, dtype),
        "key_cache": torch.randn(NB, NKV, D // x, BS, x, generator=g).to(device, dtype),
        "value_cache": torch.randn(NB, NKV, D, BS, generator=g).to(device, dtype),
        "block_tables": tables.to(device, torch.int32),
        "seq_lens": lens.to(device),
        "scale": D ** -0.5,
        "out": torch.empty(S, NH, D, dtype=dtype, device=device),
    }


if __name__ == "__main__":
    call = make_call()
    print(paged_attention)
    print(paged_attention.explain_backends(**call))
    print("out", tuple(paged_attention(**call).shape))
    if _cpu_if_interpreting():
        ref = paged_attention(**make_call(), backend="torch").clone()
        print("triton vs torch:", float((paged_attention(**make_call(), backend="triton") - ref).abs().max()))
