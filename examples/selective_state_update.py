"""Mamba2's ``selective_state_update`` (one decode step of the SSM) as a ``kc.op``, written as a
user would: the contract is the annotations, the body is the torch reference.

For each row ``b`` of the batch and head ``h`` (group ``g = h // (nheads // ngroups)``)::

    dt'   = softplus(dt + dt_bias) if dt_softplus else dt + dt_bias    # [dim]
    s     = state[slot] * exp(dt'[:, None] * A[h]) + (dt' * x)[:, None] * B[g][None, :]
    state[slot] = s                                                    # [dim, dstate]
    out   = (s @ C[g] + D[h] * x) * silu(z)                            # [dim]

where ``slot = state_batch_indices[b]`` (row ``b`` without indices). A row whose index is
``pad_slot_id`` is padding: its slot is not touched and its output is computed from a zero state
(as vLLM's kernel does; callers ignore it). Strict mode checks that every other index is a slot
of the pool and that no two rows share one; whatever the mode, the reference never reads or
writes outside the pool (an index out of range is treated as padding).

``A``, ``dt``, ``dt_bias`` and ``D`` are per channel: Mamba2 keeps them per head and passes
stride-0 broadcast views (``A[:, None, None].expand(nheads, dim, dstate)``), which the contract
accepts as they are.

=======================  =================================  =====================================
argument                 shape                              notes
=======================  =================================  =====================================
``state``                ``[pool, nheads, dim, dstate]``    written in place; each slot dense
``x``, ``dt``            ``[batch, nheads, dim]``
``A``                    ``[nheads, dim, dstate]``
``B``, ``C``             ``[batch, ngroups, dstate]``       ``nheads % ngroups == 0``
``D``, ``dt_bias``       ``[nheads, dim]``                  optional
``z``                    ``[batch, nheads, dim]``           optional (the gate)
``state_batch_indices``  ``[batch]`` int32 or int64         optional; ``pool == batch`` without
``out``                  ``[batch, nheads, dim]``           written in place
=======================  =================================  =====================================

Run it::

    python examples/selective_state_update.py
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.facts import RankMismatch

__all__ = ["INDEX_DTYPES", "make_call", "selective_state_update"]

INDEX_DTYPES = (torch.int32, torch.int64)

WHERE = (
    kc.Where("nheads % ngroups == 0",
             hint="B and C hold one projection per group of nheads // ngroups heads: ngroups must divide nheads "
                  "(check ngroups, and that B and C are split per tensor-parallel rank like the heads)"),
    kc.Where("pool == batch if state_batch_indices is None",
             hint="without state_batch_indices, row i updates state[i]: pass the slot of each row "
                  "(state_batch_indices=...) or a state of exactly batch rows"),
)


def _hint_per_head(v: kc.Violation, ctx) -> str | None:
    """Mamba2 keeps A, D and dt_bias per head, dt per (row, head), and x, z flattened as
    [batch, nheads*dim]: the op takes them per channel."""
    rank = v.fact(RankMismatch)
    d = ctx.dims
    if rank is None or not {"nheads", "dim"} <= d.keys():
        return None
    nheads, dim, shape = d["nheads"], d["dim"], rank.shape
    if v.argument in _PER_HEAD and len(shape) == _PER_HEAD[v.argument][0] and shape[-1] == nheads:
        return (f"`{v.argument}` looks per head ({list(shape)}); the op takes it per channel: pass "
                f"{_PER_HEAD[v.argument][1]} (a stride-0 view, no copy)")
    if len(shape) == rank.rank - 1 and shape[-1] == nheads * dim:
        lead = "" if rank.rank == 2 else "batch, "
        return f"`{v.argument}` looks flattened ({list(shape)}): pass {v.argument}.view({lead}nheads, dim)"
    return None


_PER_HEAD = {  # argument: (its rank when per head, the broadcast that makes it per channel)
    "A": (1, "A[:, None, None].expand(nheads, dim, dstate)"), "D": (1, "D[:, None].expand(nheads, dim)"),
    "dt_bias": (1, "dt_bias[:, None].expand(nheads, dim)"), "dt": (2, "dt[..., None].expand(batch, nheads, dim)"),
}


def _hint_index_dtype(v: kc.Violation, ctx) -> str | None:
    if v.argument == "state_batch_indices" and v.kind is kc.DtypeError:
        return "slot indices are integers: state_batch_indices.to(torch.int32) (padding stays pad_slot_id)"
    return None


def _value_checks(ctx) -> list[kc.Violation]:
    """Strict mode: every index is a slot of the pool or padding, and no two rows share a slot."""
    idx = ctx.values["state_batch_indices"]
    if idx is None or idx.is_meta or (idx.is_cuda and torch.cuda.is_current_stream_capturing()):
        return []
    pad, pool = ctx.values["pad_slot_id"], ctx.dims["pool"]
    idx = idx.long()
    live = idx != pad
    found: list[kc.Violation] = []
    outside = (live & ((idx < 0) | (idx >= pool))).nonzero().flatten().tolist()
    if outside:
        found.append(kc.Violation(
            kc.ValueRangeError, "state_batch_indices", f"slots in [0, pool={pool}), or pad_slot_id={pad} for padding",
            f"{len(outside)} index(es) outside, e.g. state_batch_indices[{outside[0]}] = {int(idx[outside[0]])}",
            hint="an index past the pool would read and write another request's state; check the slot allocator, "
                 "and that padding uses pad_slot_id"))
    slots, counts = torch.unique(idx[live], return_counts=True)
    shared = slots[counts > 1].tolist()
    if shared:
        rows = (idx == shared[0]).nonzero().flatten().tolist()
        found.append(kc.Violation(
            kc.ValueRangeError, "state_batch_indices", "a distinct slot per row (padding excepted)",
            f"{len(shared)} slot(s) shared, e.g. slot {shared[0]} by rows {', '.join(map(str, rows))}",
            hint="rows on one slot race on its state (all but one update is lost); give each request its own slot"))
    return found


@kc.op(returns="out", where=WHERE, hints=[_hint_per_head, _hint_index_dtype], value_checks=_value_checks)
def selective_state_update(
    state: Annotated[Float[Tensor, "pool nheads dim dstate"], kc.Spec(inner_contiguous=3, disjoint=True, mutated=True)],
    x: Float[Tensor, "batch nheads dim"],
    dt: Float[Tensor, "batch nheads dim"],
    A: Float[Tensor, "nheads dim dstate"],
    B: Float[Tensor, "batch ngroups dstate"],
    C: Annotated[Float[Tensor, "batch ngroups dstate"], kc.Spec(same_dtype_as="B")],
    D: Float[Tensor, "nheads dim"] | None = None,
    z: Annotated[Float[Tensor, "batch nheads dim"] | None, kc.Spec(same_dtype_as="x")] = None,
    dt_bias: Float[Tensor, "nheads dim"] | None = None,
    dt_softplus: bool = False,
    state_batch_indices: Annotated[Int[Tensor, "batch"] | None, kc.Spec(dtypes=INDEX_DTYPES)] = None,
    pad_slot_id: int = -1,
    *,
    out: Annotated[Float[Tensor, "batch nheads dim"], kc.Spec(same_dtype_as="x", mutated=True)],
) -> None:
    """PyTorch reference: float32 math, one gather and one masked write of the pool."""
    batch, nheads, _ = x.shape
    pool = state.shape[0]
    rows = torch.arange(batch, device=x.device)
    slot = rows if state_batch_indices is None else state_batch_indices.long()
    live = (slot != pad_slot_id) & (slot >= 0) & (slot < pool)  # padding, or out of range: never touched
    safe = torch.where(live, slot, 0)
    old = torch.where(live[:, None, None, None], state[safe].float(), 0.0)
    step = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    step = F.softplus(step) if dt_softplus else step
    per_head = nheads // B.shape[1]
    Bh = B.float().repeat_interleave(per_head, dim=1)  # [batch, nheads, dstate]
    Ch = C.float().repeat_interleave(per_head, dim=1)
    new = old * torch.exp(step[..., None] * A.float()) + (step * x.float())[..., None] * Bh[:, :, None, :]
    y = (new @ Ch[..., None]).squeeze(-1)
    if D is not None:
        y = y + D.float() * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    out.copy_(y)
    # Each slot takes the new state of the live row that names it (the last one, for duplicates).
    owner = torch.full((pool,), -1, dtype=torch.long, device=x.device)
    owner = owner.scatter_reduce(0, safe, torch.where(live, rows, -1), reduce="amax")
    written = owner >= 0
    state.copy_(torch.where(written[:, None, None, None], new[owner.clamp_min(0)].to(state.dtype), state))


def make_call(batch: int = 3, nheads: int = 4, dim: int = 8, dstate: int = 16, ngroups: int = 2, pool: int = 6,
              dtype: torch.dtype = torch.float32, *, indices: bool = True, optional: bool = True,
              seed: int = 0) -> dict[str, object]:
    """A valid call with random values, Mamba2-style: A, D, dt_bias and dt broadcast from per-head
    values (stride-0 views); distinct slots, the last row padding when there are indices.

    Example::

        >>> out = selective_state_update(**make_call())
    """
    g = torch.Generator().manual_seed(seed)
    A_log = torch.rand(nheads, generator=g)
    call: dict[str, object] = {
        "state": torch.randn(pool if indices else batch, nheads, dim, dstate, generator=g).to(dtype),
        "x": torch.randn(batch, nheads, dim, generator=g).to(dtype),
        "dt": torch.randn(batch, nheads, generator=g).to(dtype)[..., None].expand(batch, nheads, dim),
        "A": (-torch.exp(A_log))[:, None, None].expand(nheads, dim, dstate),
        "B": torch.randn(batch, ngroups, dstate, generator=g).to(dtype),
        "C": torch.randn(batch, ngroups, dstate, generator=g).to(dtype),
        "out": torch.empty(batch, nheads, dim, dtype=dtype),
    }
    if optional:
        call |= {"D": torch.randn(nheads, generator=g)[:, None].expand(nheads, dim),
                 "z": torch.randn(batch, nheads, dim, generator=g).to(dtype),
                 "dt_bias": torch.randn(nheads, generator=g)[:, None].expand(nheads, dim), "dt_softplus": True}
    if indices:
        slots = torch.randperm(pool, generator=g)[:batch].to(torch.int32)
        slots[-1] = -1  # a padding row
        call["state_batch_indices"] = slots
    return call


if __name__ == "__main__":
    call = make_call()
    print(selective_state_update)
    print(selective_state_update.explain_backends(**call))
    print("out", tuple(selective_state_update(**call).shape))
