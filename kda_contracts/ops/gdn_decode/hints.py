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
from typing import Any

import torch

from ...errors import ShapeError
from ...facts import AxisMismatch, RankMismatch
from ...markers import config_dims
from ..packed_decode.hints import _hint_index_dtype, _hint_state_strides, _hint_width
from ..packed_decode.tp import TPMismatch, _fits, tp_mismatch_hint
from .config import GDNConfig

__all__ = ["hints_for"]

Hint = Callable[[Any, Any], "str | None"]
_LAYOUT_ARGS = ("initial_state", "a", "out", "mixed_qkv", "dt_bias")


def _shape(ctx: Any, name: str) -> tuple[int, ...] | None:
    t = ctx.values.get(name)
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def _first_shape_violation(ctx: Any) -> Any:
    return next((x for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors), None)


def _hint_kda_gate(v: Any, ctx: Any) -> str | None:
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


def _hint_unflattened(v: Any, ctx: Any) -> str | None:
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


def _hint_swapped_head_dims(v: Any, ctx: Any) -> str | None:
    """The tensors fit the config with K and V exchanged (GVA HV = 2H hides it in the width)."""
    if v is not _first_shape_violation(ctx) or ctx.config is None:
        return None
    cd = config_dims(ctx.config)
    k, vdim = cd.get("K"), cd.get("V")
    if k is None or vdim is None or k == vdim:
        return None
    bad = [x.argument for x in ctx.violations if x.kind is ShapeError and x.argument in ctx.spec.tensors]
    swapped = {**ctx.dims, **cd, "K": vdim, "V": k}
    if not all(_fits(ctx, name, swapped) for name in bad):
        return None
    return (f"the tensors fit K={vdim}, V={k}, the config says K={k} (head_k_dim), V={vdim} (head_v_dim): the key "
            "and value head dims are swapped. With HV = 2H the width of mixed_qkv, 2*H*K + HV*V = 2H(K+V), is "
            "the same either way, so only the state and out shapes show it; build q/k heads of head_k_dim and v "
            "heads, out and the state's V axis of head_v_dim")


def _swapped_layout_fits(ctx: Any, declared: str) -> bool:
    st, a, out, m = (_shape(ctx, n) for n in ("initial_state", "a", "out", "mixed_qkv"))
    if st is None or a is None or out is None or m is None or len(st) != 4 or len(a) != 2 or len(out) != 4 \
            or len(m) != 2:
        return False
    hv = st[1]
    k, v = (st[2], st[3]) if declared == "VK" else (st[3], st[2])
    if k == v or k < 1:
        return False
    fits = a[1] == hv and out[3] == v and (m[1] - hv * v) > 0 and (m[1] - hv * v) % (2 * k) == 0
    if ctx.config is not None:
        cd = config_dims(ctx.config)
        fits = fits and cd.get("K", k) == k and cd.get("V", v) == v
    return fits


def _layout_hint(declared: str) -> Hint:
    other = "KV" if declared == "VK" else "VK"
    given = "[N, HV, K, V]" if other == "KV" else "[N, HV, V, K]"

    def hint_layout(v: Any, ctx: Any) -> str | None:
        if v.kind is not ShapeError or v.argument not in _LAYOUT_ARGS:
            return None
        first = next((x for x in ctx.violations if x.kind is ShapeError and x.argument in _LAYOUT_ARGS), None)
        if first is not v or not _swapped_layout_fits(ctx, declared):
            return None
        return (f"initial_state looks like a {other}-layout pool {given}, but this call declares {declared}; "
                f"declare it (GDNConfig(state_layout={other!r}) or state_layout={other!r}) or convert the pool "
                f"with initial_state.transpose(-1, -2).contiguous() (a bare transpose view breaks the slot strides)")

    return hint_layout


def _render_tp(found: TPMismatch, ctx: Any) -> str | None:
    witness = found.witness(ctx, first="initial_state")
    if witness is None:
        return None
    name, sym, got = witness
    want, implied, tp = found.here[sym], found.tp_size, found.config.tp_size
    source = found.config.contract_dim_source(sym)
    if [x.argument for x in ctx.violations if x.kind is ShapeError] == ["initial_state"]:  # only the pool is off
        return (f"initial_state carries {sym}={got} heads but the config and every other tensor have {want} per rank "
                f"({source}): the pool looks allocated for tp_size={implied}, the rank for tp_size={tp}. Allocate "
                f"the pool with the rank's heads (cfg.local_num_v_heads = {want}), not the model's")
    return (f"{name} carries {sym}={got} heads but the config expects {want} per rank ({source}): the tensors "
            f"look sharded for tp_size={implied}, the config for tp_size={tp}. Build the config with "
            f"tp_size={implied} (GDNConfig.from_hf_config(path, tp_size={implied})) or shard the weights and pools "
            f"for tp_size={tp}; the other shape violations follow from this one")


_hint_tp = tp_mismatch_hint(config_of=lambda ctx: ctx.config if isinstance(ctx.config, GDNConfig) else None,
                            dims_at=GDNConfig.contract_dims, render=_render_tp)


def hints_for(layout: str) -> tuple[Hint, ...]:
    """The hints of the GDN contract for state layout ``layout``, in the order they are tried."""
    return (_hint_kda_gate, _hint_unflattened, _layout_hint(layout), _hint_tp, _hint_swapped_head_dims,
            _hint_width, _hint_index_dtype, _hint_state_strides)
