"""Hints of the packed-decode contract: a fix for each known mistake (the catalogue in
:mod:`.mistakes` makes each one). The public ones (width, index dtype, strides, layout, TP text)
serve GDN's contract too, which shares those shapes. Hints read typed facts (``kc.facts``), the
call's bound dims and, for the state layout, the layout the contract was built for; never message text.

Example::

    spec = build_spec(fn, config_arg="config", hints=hints_for("VK"))
"""

from __future__ import annotations

from ..._engine import CallContext, ShapeError, Violation
from ..._engine.facts import AxisMismatch, RankMismatch
from .._packed.config import KDAConfig
from .._packed.hints import Hint, hint_index_dtype, hint_state_strides, hint_width, layout_hint, tp_renderer
from .._packed.tp import tp_mismatch_hint


def _hint_unflattened(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or v.argument not in ("a", "dt_bias") or rank is None:
        return None
    shape = rank.shape
    if v.argument == "a" and len(shape) == 3:
        return (f"`a` looks unflattened ([B, HV, K] = {list(shape)}); the kernel indexes it as hv*K + k: pass "
                "a.flatten(1) (or a.reshape(B, HV*K))")
    if v.argument == "dt_bias" and len(shape) == 2:
        return f"`dt_bias` looks unflattened ([HV, K] = {list(shape)}); pass dt_bias.flatten()"
    return None


def _hint_gdn_gate(v: Violation, ctx: CallContext) -> str | None:
    """A GDN-shaped gate (one logit per value head) given to KDA."""
    axis, hv, k = v.fact(AxisMismatch), ctx.dims.get("HV"), ctx.dims.get("K")
    if v.kind is not ShapeError or v.argument not in ("a", "dt_bias") or axis is None or hv is None or k is None \
            or k == 1 or axis.got != hv or axis.axis != (1 if v.argument == "a" else 0):
        return None
    shape = "[B, HV]" if v.argument == "a" else "[HV]"
    return (f"`{v.argument}` has GDN's per-value-head gate shape {shape} (HV={hv}); KDA's gate has one logit per "
            f"key channel, {shape[:-1]}*K] with K={k}. If this is a GDN (Qwen3-Next) layer call "
            "kc.gdn_packed_decode; if it is a KDA layer, the tensor comes from the wrong projection")


_hint_tp = tp_mismatch_hint(config_of=lambda ctx: ctx.config if isinstance(ctx.config, KDAConfig) else None,
                            dims_at=KDAConfig.contract_dims, render=tp_renderer("KDAConfig"))


def hints_for(layout: str) -> tuple[Hint, ...]:
    """The hints of the contract for state layout ``layout`` ("VK" or "KV"), in the order they are tried."""
    return (_hint_gdn_gate, _hint_unflattened, layout_hint(layout), _hint_tp, hint_width, hint_index_dtype,
            hint_state_strides)
