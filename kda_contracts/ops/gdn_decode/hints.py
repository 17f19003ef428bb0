"""Hints of the GDN packed-decode contract: a fix for each known mistake. GDN's own: a KDA-shaped
gate (``a`` ``[B, HV*K]``, ``dt_bias`` ``[HV*K]``, or ``a`` ``[B, HV, K]``), K and V head dims swapped
(with GVA ``HV = 2H`` the width ``2*H*K + HV*V = 2H(K+V)`` cannot tell them apart: only the config
can), unflattened gate tensors. Shared with KDA: layout, TP mismatch, width, index dtype, strides.
Hints read typed facts and bound dims, never message text.

Example::

    hints = hints_for("VK")   # the hints of the VK variant, in the order they are tried
"""

from __future__ import annotations

from collections.abc import Callable

from ... import _engine as kc
from ..._engine import ShapeError, config_dims
from ..._engine.facts import AxisMismatch, RankMismatch
from .._packed.hints import (
    hint_index_dtype,
    hint_kda_config,
    hint_state_strides,
    hint_width,
    layout_hint,
    tp_renderer,
)
from .._packed.tp import fits, tp_mismatch_hint
from .config import GDNConfig

Hint = Callable[["kc.Violation", "kc.CallContext"], "str | None"]


def _first_shape_violation(ctx: kc.CallContext) -> kc.Violation | None:
    return next((x for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors), None)


def _hint_kda_gate(v: kc.Violation, ctx: kc.CallContext) -> str | None:
    """``a``/``dt_bias`` with KDA's per-key-channel widths."""
    if v.kind is not ShapeError or v.argument not in ("a", "dt_bias"):
        return None
    hv, k = ctx.dims.get("HV"), ctx.dims.get("K")
    axis, rank = v.fact(AxisMismatch), v.fact(RankMismatch)
    kda_wide = axis is not None and hv is not None and k is not None and k > 1 and axis.got == hv * k \
        and axis.axis == (1 if v.argument == "a" else 0)
    kda_3d = v.argument == "a" and rank is not None and len(rank.shape) == 3 and rank.shape[1:] == (hv, k)
    if not (kda_wide or kda_3d):
        return None
    want = "[B, HV]" if v.argument == "a" else "[HV]"
    got = "[B, HV*K]" if kda_wide and v.argument == "a" else "[HV*K]" if kda_wide else "[B, HV, K]"
    return (f"`{v.argument}` has KDA's per-key-channel gate shape {got} (HV={hv}, K={k}); GDN's gate is one "
            f"scalar per value head, {want}. If this is a KDA (Kimi-Linear) layer call kc.packed_decode; if "
            "it is a GDN (Qwen3-Next) layer, the tensor comes from the wrong projection (GDN's a_proj/dt_bias "
            "have HV outputs)")


def _hint_unflattened(v: kc.Violation, ctx: kc.CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or rank is None:
        return None
    shape, hv = rank.shape, ctx.dims.get("HV")
    if v.argument in ("a", "b") and len(shape) == 3 and hv is not None and shape[1] * shape[2] == hv:
        return f"`{v.argument}` looks unflattened ({list(shape)}); pass {v.argument}.reshape({shape[0]}, {hv})"
    if v.argument in ("A_log", "dt_bias") and len(shape) == 2 and hv is not None and shape[0] * shape[1] == hv:
        return f"`{v.argument}` looks unflattened ({list(shape)}); pass {v.argument}.flatten()"
    if v.argument == "out" and len(shape) == 3:
        return f"`out` must be [B, 1, HV, V] (one decode token per request); pass out.unsqueeze(1) ({list(shape)})"
    if v.argument == "mixed_qkv" and len(shape) == 3:
        return ("mixed_qkv must be flat per request, [B, 2*H*K + HV*V] (q heads | k heads | v heads); "
                f"got {list(shape)}: pass mixed_qkv.flatten(1)")
    return None


def _hint_swapped_head_dims(v: kc.Violation, ctx: kc.CallContext) -> str | None:
    """The tensors fit the config with K and V exchanged (GVA HV = 2H hides it in the width)."""
    if v is not _first_shape_violation(ctx) or ctx.config is None:
        return None
    cd = config_dims(ctx.config)
    k, vdim = cd.get("K"), cd.get("V")
    if k is None or vdim is None or k == vdim:
        return None
    bad = [x.argument for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors]
    swapped = {**ctx.dims, **cd, "K": vdim, "V": k}
    if not all(fits(ctx, name, swapped) for name in bad):
        return None
    return (f"the tensors fit K={vdim}, V={k}, the config says K={k} (head_k_dim), V={vdim} (head_v_dim): the key "
            "and value head dims are swapped. With HV = 2H the width of mixed_qkv, 2*H*K + HV*V = 2H(K+V), is "
            "the same either way, so only the state and out shapes show it; build q/k heads of head_k_dim and v "
            "heads, out and the state's V axis of head_v_dim")


_hint_tp = tp_mismatch_hint(config_of=lambda ctx: ctx.config if isinstance(ctx.config, GDNConfig) else None,
                            dims_at=GDNConfig.contract_dims, render=tp_renderer("GDNConfig"))


def hints_for(layout: str) -> tuple[Hint, ...]:
    """The hints of the GDN contract for state layout ``layout``, in the order they are tried."""
    return (hint_kda_config, _hint_kda_gate, _hint_unflattened,
            layout_hint(layout, config_name="GDNConfig", gate_per_head=True),
            _hint_tp, _hint_swapped_head_dims, hint_width, hint_index_dtype, hint_state_strides)
