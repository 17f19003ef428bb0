"""The fixes a packed op's report gives for the mistakes the packed ops share: an unflattened or
mis-sized width, index dtypes, state strides, a state pool in the other layout, a tensor-parallel
mismatch. Hints read typed facts (``kc.facts``) and the call's bound dims, never message text.

Example::

    hints = (hint_width, hint_index_dtype, hint_state_strides, layout_hint("VK"))
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..._engine import (
    CallContext,
    DtypeError,
    LayoutError,
    ShapeError,
    ValueRangeError,
    Violation,
    config_dim_source,
    config_dims,
)
from ..._engine.facts import DtypeMismatch, LayoutBroken, Unsolvable
from .config import kda_only
from .tp import TPMismatch

Hint = Callable[[Violation, CallContext], str | None]

_LAYOUT_ARGS = ("initial_state", "a", "out", "mixed_qkv", "dt_bias")


def _shape(ctx: CallContext, name: str) -> tuple[int, ...] | None:
    t = ctx.values.get(name)
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def _swapped_layout_fits(ctx: CallContext, declared: str, gate_per_head: bool) -> bool:
    """Would the call be consistent if the state's last two dims meant the other layout?
    ``gate_per_head``: ``a`` is ``[B, HV]`` (GDN), else ``[B, HV*K]`` (KDA)."""
    st, a, out, m = (_shape(ctx, n) for n in ("initial_state", "a", "out", "mixed_qkv"))
    if st is None or a is None or out is None or m is None or len(st) != 4 or len(a) != 2 or len(out) != 4 \
            or len(m) != 2:
        return False
    hv = st[1]
    # the other layout: VK declared but KV given means K = st[2], V = st[3]
    k, v = (st[2], st[3]) if declared == "VK" else (st[3], st[2])
    if k == v or k < 1:
        return False
    gate_width = hv if gate_per_head else hv * k
    fits = a[1] == gate_width and out[3] == v and (m[1] - hv * v) > 0 and (m[1] - hv * v) % (2 * k) == 0
    if ctx.config is not None:
        cd = config_dims(ctx.config)  # any config: a KDAConfig or a plain pydantic model
        fits = fits and cd.get("K", k) == k and cd.get("V", v) == v
    return fits


def layout_hint(declared: str, *, config_name: str = "KDAConfig", gate_per_head: bool = False) -> Hint:
    """The hint for a pool of the other layout than ``declared`` (the contract's own); shared with
    GDN (``config_name="GDNConfig", gate_per_head=True``)."""
    other = "KV" if declared == "VK" else "VK"
    given = "[N, HV, K, V]" if other == "KV" else "[N, HV, V, K]"

    def hint_layout(v: Violation, ctx: CallContext) -> str | None:
        if v.kind is not ShapeError or v.argument not in _LAYOUT_ARGS:
            return None
        first = next((x for x in ctx.violations if x.kind is ShapeError and x.argument in _LAYOUT_ARGS), None)
        if first is not v or not _swapped_layout_fits(ctx, declared, gate_per_head):
            return None
        return (f"initial_state looks like a {other}-layout pool {given}, but this call declares {declared}; "
                f"declare it ({config_name}(state_layout={other!r}) or state_layout={other!r}) or convert the pool "
                f"with initial_state.transpose(-1, -2).contiguous() (a bare transpose view breaks the slot strides)")

    return hint_layout


def tp_renderer(config_name: str) -> Callable[[TPMismatch, CallContext], str | None]:
    """The TP-mismatch hint's text for a config class named ``config_name`` (KDA's or GDN's)."""

    def render(found: TPMismatch, ctx: CallContext) -> str | None:
        witness = found.witness(ctx, first="initial_state")  # name the pool first
        if witness is None:
            return None
        name, sym, got = witness
        want, implied, tp = found.here[sym], found.tp_size, found.config.tp_size
        source = config_dim_source(found.config, sym)
        if [x.argument for x in ctx.violations if x.kind is ShapeError] == ["initial_state"]:  # only the pool is off
            return (f"initial_state carries {sym}={got} heads but the config and every other tensor have {want} per "
                    f"rank ({source}): the pool looks allocated for tp_size={implied}, the rank for tp_size={tp}. "
                    f"Allocate the pool with the rank's heads (cfg.local_num_v_heads = {want}), not the model's")
        return (f"{name} carries {sym}={got} heads but the config expects {want} per rank "
                f"({source}): the tensors look sharded for tp_size={implied}, the "
                f"config for tp_size={tp}. Build the config with tp_size={implied} ({config_name}.from_hf_config("
                f"path, tp_size={implied})) or shard the weights and pools for tp_size={tp}; the other shape "
                "violations follow from this one")

    return render


def hint_width(v: Violation, ctx: CallContext) -> str | None:
    unsolved = v.fact(Unsolvable)
    if v.argument != "mixed_qkv" or v.kind is not ShapeError or unsolved is None or unsolved.symbol != "H":
        return None
    return ("mixed_qkv must be exactly [q heads | k heads | v heads] = 2*H*K + HV*V columns; if it still "
            "carries other projections (gate, beta), slice them off; if q, k, v are separate, torch.cat them on "
            "dim 1; check that HV, V, K (from the state) belong to this layer and TP rank")


def hint_index_dtype(v: Violation, ctx: CallContext) -> str | None:
    fact = v.fact(DtypeMismatch)
    if v.argument != "ssm_state_indices" or v.kind is not DtypeError or fact is None:
        return None
    if len(fact.allowed) != 1:  # not int32/int64 at all: a float or a narrow integer tensor
        got = str(fact.got).removeprefix("torch.")
        return (f"slot indices must be int32 or int64 (kernels turn them into slot offsets), not {got}: build them "
                "with dtype=torch.int32, or cast once when you build the batch metadata: "
                "ssm_state_indices.to(torch.int32)")
    (dt,) = fact.allowed
    return (f"cast the indices once when you build the batch metadata: ssm_state_indices.to({dt}) "
            "(the config pins the index dtype the kernels were built for)")


def hint_state_strides(v: Violation, ctx: CallContext) -> str | None:
    layout = v.fact(LayoutBroken)
    if v.argument == "initial_state" and layout is not None and layout.rule == "disjoint":
        return ("the pool's slots overlap (an .expand()ed pool, or a slot stride smaller than a slot): two "
                "requests would update the same memory and race; allocate one dense slot per index, e.g. "
                "torch.empty(N, HV, V, K)")
    if v.argument == "initial_state" and v.kind is LayoutError:
        return ("each state slot [HV, V, K] must be dense (the pool's slot stride may be anything): a pool made "
                "by .transpose() or by slicing inside a slot is not; allocate it densely or pass "
                "initial_state.contiguous() and copy the result back")
    return None


def hint_kda_config(v: Violation, ctx: CallContext) -> str | None:
    """A GDN op given a KDA layer's config (a bounded gate, ``kda_layers``; its ``config`` fails
    :func:`~kda_contracts.ops._packed.config.fits_gdn`): GDN would run its softplus gate anyway."""
    if v.kind is not ValueRangeError or v.argument != (ctx.spec.config_arg or "config"):
        return None
    what = kda_only(ctx.config)
    if what is None:
        return None
    return (f"the config is a KDA layer's: {what}. GDN runs only its softplus gate, g = -exp(A_log) * "
            "softplus(a + dt_bias), so the call would silently compute another layer's answer. For a GDN "
            "(Qwen3-Next) layer pass a GDNConfig (GDNConfig.from_hf_config(...) or .preset(...)); for a KDA "
            "(Kimi-Linear) layer call kc.packed_decode / kc.packed_prefill")
