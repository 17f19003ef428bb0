"""Hints of the packed-prefill contracts (KDA's and GDN's): the fixes for the mistakes of a varlen
call — ``cu_seqlens`` as int64 or without its leading 0, padded ``[B, L, ...]`` activations where
packed ``[T, ...]`` rows are expected, a decode-shaped ``out``, a boolean mask of another dtype —
then the packed ops' shared ones (width, index dtype, strides). Hints read typed facts and bound
dims, never message text.

Example::

    hints = prefill_hints(gate_per_head=False)
"""

from __future__ import annotations

from ..._engine import CallContext, DtypeError, ShapeError, Violation
from ..._engine.facts import AxisMismatch, DtypeMismatch, RankMismatch
from .hints import Hint, hint_index_dtype, hint_state_strides, hint_width


def _hint_cu_seqlens(v: Violation, ctx: CallContext) -> str | None:
    if v.argument != "cu_seqlens":
        return None
    if v.kind is DtypeError and v.fact(DtypeMismatch) is not None:
        return ("cu_seqlens must be int32, as the varlen kernels (flash-attention, flash-linear-attention) take it: "
                "build it once per batch with dtype=torch.int32 (torch.cumsum gives int64: cast it)")
    axis, b = v.fact(AxisMismatch), ctx.dims.get("B")
    if v.kind is ShapeError and axis is not None and b is not None and axis.got == b:
        return (f"cu_seqlens has B = {b} entries, one per sequence: it needs B+1 offsets starting with 0, "
                "[0, len0, len0+len1, ...] (torch.cat([cu.new_zeros(1), lengths.cumsum(0)])); "
                "ssm_state_indices and has_initial_state have one entry per sequence")
    return None


def _hint_padded(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or rank is None or v.argument not in ("mixed_qkv", "a", "b", "out"):
        return None
    shape = list(rank.shape)
    if v.argument == "out" and len(shape) == 4 and 1 in shape[:2]:
        return (f"out is {shape}: prefill writes one row per token, [T, HV, V] (decode's out is [B, 1, HV, V]); "
                "pass out.view(-1, HV, V) of a buffer with T rows")
    if v.argument != "out" and len(shape) == 3:
        return (f"`{v.argument}` looks padded per sequence ({shape} = [B, L, ...]): prefill takes the tokens packed, "
                "one row per token, [T, ...] with cu_seqlens marking the sequences: x[mask] for a padding mask, or "
                "x.flatten(0, 1) with cu_seqlens = [0, L, 2L, ...] when every sequence has L tokens")
    return None


def _hint_token_rows(v: Violation, ctx: CallContext) -> str | None:
    """One per-token tensor with another number of rows than ``mixed_qkv``."""
    axis, t = v.fact(AxisMismatch), ctx.dims.get("T")
    if v.kind is not ShapeError or axis is None or axis.axis != 0 or t is None \
            or v.argument not in ("a", "b", "out") or axis.got == t:
        return None
    return (f"`{v.argument}` has {axis.got} rows, mixed_qkv {t}: every per-token tensor (mixed_qkv, a, b, out) has "
            "one row per packed token, T = cu_seqlens[-1]; build them from the same packed batch")


def _hint_mask_dtype(v: Violation, ctx: CallContext) -> str | None:
    if v.argument != "has_initial_state" or v.kind is not DtypeError:
        return None
    return "has_initial_state is a bool mask, one per sequence: pass has_initial_state.bool() (or lengths_before > 0)"


def prefill_hints() -> tuple[Hint, ...]:
    """The hints of a prefill contract, in the order they are tried."""
    return (_hint_cu_seqlens, _hint_padded, _hint_token_rows, _hint_mask_dtype, hint_width, hint_index_dtype,
            hint_state_strides)
