"""What the contracts of the linear-attention decode layers (Kimi-Linear KDA, Qwen3-Next GDN) are
made of: the per-rank dims a layer fixes (:func:`layer_dims`), the annotations their public methods
share, their hints (the packed-decode op's one TP-mismatch hint, worded for a layer; the conv
width) and the strict-mode slot checks. A ``GDNConfig`` is a ``KDAConfig``, so both layers read
their dims the same way.

Example::

    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
    def decode(self, x: Hidden, ssm_states: SSMStatePool, ...) -> Float[Tensor, "B D"]: ...
"""

# No `from __future__ import annotations`: the annotations below are evaluated at definition.

from typing import Annotated

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .._engine import CallContext, LayoutError, ShapeError, Spec, ValueRangeError, Violation, Where
from .._engine.facts import AxisMismatch, RankMismatch
from ..ops._packed.config import KDAConfig
from ..ops._packed.dtypes import INDEX_DTYPES, STATE_DTYPES
from ..ops._packed.tp import TPMismatch, tp_mismatch_hint

__all__ = ["HAS_SLOTS", "HINTS", "ConvStatePool", "CuSeqlens", "HasInitialState", "Hidden", "SSMStatePool",
           "SlotIndices", "layer_dims", "slot_value_checks"]

# The annotations the public methods share.
Hidden = Annotated[Float[Tensor, "B D"], Spec(inner_contiguous=1, config_dtype="activation")]
SSMStatePool = Annotated[Float[Tensor, "N HV V K"], Spec(dtypes=STATE_DTYPES, inner_contiguous=3,
                                                         config_dtype="state")]
ConvStatePool = Annotated[Float[Tensor, "N C W"], Spec(inner_contiguous=2, config_dtype="activation")]
SlotIndices = Annotated[Int[Tensor, "B"], Spec(dtypes=INDEX_DTYPES, config_dtype="index")]
CuSeqlens = Annotated[Int[Tensor, "B+1"], Spec(dtypes=(torch.int32,), contiguous=True)]
HasInitialState = Annotated[Bool[Tensor, "B"], Spec(dtypes=(torch.bool,), contiguous=True)]


def layer_dims(config: KDAConfig) -> dict[str, int]:
    """The per-rank dims a linear-attention layer of ``config`` (a KDAConfig or GDNConfig) fixes:
    H, HV, K, V, D, C (the q/k/v conv channels, ``2*H*K + HV*V``), W (``conv_kernel_size - 1``).

    Example::

        >>> cfg = KDAConfig(num_heads=4, head_k_dim=16, hidden_size=64, tp_size=2)
        >>> layer_dims(cfg)
        {'H': 2, 'HV': 2, 'K': 16, 'V': 16, 'D': 64, 'C': 96, 'W': 3}
    """
    if config.hidden_size is None:
        name = type(config).__name__
        raise ValueError(f"a linear-attention layer needs config.hidden_size ({name}.from_hf_config reads it "
                         "from config.json); it sizes the projections")
    if config.conv_kernel_size < 2:
        raise ValueError(f"conv_kernel_size={config.conv_kernel_size}: the short conv needs at least 2 taps "
                         "(its state keeps conv_kernel_size - 1 inputs)")
    d = dict(config.contract_dims())
    d["D"] = config.hidden_size
    d["C"] = 2 * d["H"] * d["K"] + d["HV"] * d["V"]
    d["W"] = config.conv_kernel_size - 1
    return d


# -- hints -----------------------------------------------------------------------------------------
def _render_tp(found: TPMismatch, ctx: CallContext) -> str:
    cfg, bad, differ = found.config, found.tensors, found.differ
    name = type(cfg).__name__
    args = bad[0] if len(bad) == 1 else ", ".join(bad[:-1]) + " and " + bad[-1]
    return (f"TP mismatch: {args} {'is' if len(bad) == 1 else 'are'} sized for tp_size={found.tp_size} "
            f"({', '.join(f'{s}={found.there[s]}' for s in differ)} per rank) but this layer's config is for "
            f"tp_size={cfg.tp_size} ({', '.join(f'{s}={found.here[s]}' for s in differ)}; "
            f"{cfg.contract_dim_source('HV')}). Build the layer, its weights (shard_weights(weights, "
            f"config, rank)) and its pools (layer.new_state_pools(n)) from one {name}, e.g. "
            f"{name}.from_hf_config(path, tp_size={cfg.tp_size}); the other shape violations follow "
            "from this one")


def _hint_conv_width(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is not ShapeError or v.argument not in ("conv_states", "conv1d"):
        return None
    axis = 2 if v.argument == "conv_states" else 1
    if not any(isinstance(f, AxisMismatch) and f.axis == axis for f in v.facts):
        return None
    k = ctx.config.config.conv_kernel_size
    if v.argument == "conv1d":
        return f"the depthwise conv has conv_kernel_size={k} taps per channel: conv1d must be [C, {k}]"
    return (f"a conv-state slot keeps the last W = conv_kernel_size - 1 = {k - 1} inputs of each channel (the "
            f"current token is not stored): allocate [N, C, {k - 1}], e.g. with layer.new_state_pools(n)")


def _hint_kv_pool(v: Violation, ctx: CallContext) -> str | None:
    """A recurrent-state pool in the KV layout ``[N, HV, K, V]`` (fla's, Hugging Face's cache) where the
    layer keeps VK ``[N, HV, V, K]``: by shape when K != V, else a transposed view (by strides)."""
    t = ctx.values.get("ssm_states")
    if v.argument != "ssm_states" or not isinstance(t, torch.Tensor) or t.dim() != 4:
        return None
    d = ctx.config.contract_dims()
    fix = ("convert it once with .transpose(-1, -2).contiguous() (a bare transpose view breaks the slot layout), "
           "or load a Hugging Face cache's states with states_from_hf(layer, recurrent, conv, ssm_states, "
           "conv_states, slots)")
    if v.kind is ShapeError and d["K"] != d["V"] and tuple(t.shape[1:]) == (d["HV"], d["K"], d["V"]):
        return (f"ssm_states looks like a KV-layout pool [N, HV, K, V] = {list(t.shape)} (fla's and Hugging Face's "
                f"recurrent-state layout), but this layer keeps its states as [N, HV, V, K] (VK, sglang's): {fix}")
    if v.kind is LayoutError and t.shape[-1] > 1 and t.stride(-2) == 1 and t.stride(-1) == t.shape[-2]:
        return ("ssm_states is a transposed view (its last dim is strided, the one before it dense): a KV-layout "
                f"pool [N, HV, K, V] .transpose(-1, -2)'d? This layer keeps dense [N, HV, V, K] slots: {fix}")
    return None


def _hint_hf_conv1d(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or v.argument != "conv1d" or rank is None:
        return None
    if len(rank.shape) != 3 or rank.shape[1] != 1:
        return None
    return (f"conv1d looks like nn.Conv1d's weight {list(rank.shape)} ([C, 1, conv_kernel_size], as a Hugging "
            "Face checkpoint stores linear_attn.conv1d.weight): pass conv1d.squeeze(1), or load the checkpoint "
            "with weights_from_hf(state_dict, prefix)")


def _hint_hf_a_log(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or v.argument != "A_log" or rank is None:
        return None
    hv = ctx.config.contract_dims()["HV"]
    if [s for s in rank.shape if s != 1] != [hv] and rank.shape != (1,) * len(rank.shape):
        return None
    return (f"A_log looks like Hugging Face's KimiLinearForgetGate.A_log {list(rank.shape)} ([1, 1, H, 1]): "
            f"the layer takes one decay per value head, [HV] = [{hv}]: pass A_log.reshape(-1), or load the "
            "checkpoint with weights_from_hf(state_dict, prefix), which reshapes it")


HINTS = (tp_mismatch_hint(config_of=lambda ctx: ctx.config.config, dims_at=layer_dims, render=_render_tp),
         _hint_conv_width, _hint_kv_pool, _hint_hf_conv1d, _hint_hf_a_log)
HAS_SLOTS = (Where("N >= 1", hint="the state pools have no slots"),)


def slot_value_checks(ctx: CallContext) -> list[Violation]:
    """Strict mode, before anything is written: slots in range and distinct, and the hidden states
    ``x`` finite (the padded prefill runs the reference step directly, not through the op that would
    refuse a NaN in its inputs)."""
    idx: Tensor = ctx.values["state_indices"]
    n = ctx.dims["N"]
    if idx.is_cuda and torch.cuda.is_current_stream_capturing():
        torch._assert_async((idx < n).all(), "state_indices has an index >= N (the pool size)")
        return []
    out: list[Violation] = []
    x = ctx.values.get("x")
    if isinstance(x, Tensor) and x.numel() and not bool(torch.isfinite(x).all()):
        out.append(Violation(ValueRangeError, "x", "finite values", f"{int((~torch.isfinite(x)).sum())} NaN or Inf",
                             hint="find the layer that produced it (check the previous layer's output)"))
    if idx.numel() and int(idx.max()) >= n:
        out.append(Violation(ValueRangeError, "state_indices", f"< N={n} (or < 0 for padding)",
                             f"{int((idx >= n).sum())} index(es) >= {n}",
                             hint="an index past the pool would read and write another request's state; "
                                  "check the slot allocator and the pools this layer uses"))
    live = idx[idx >= 0]
    dup = live.numel() - torch.unique(live).numel()
    if dup:
        out.append(Violation(ValueRangeError, "state_indices", "distinct non-negative slots",
                             f"{dup} duplicate slot(s)",
                             hint="two requests on one slot race on its states; give each request its own "
                                  "slot and mark padding rows with -1"))
    return out
