"""Weights of the Kimi-Linear KDA layer: their names, seeded random ones, the shard of
whole-layer (TP1) weights that one tensor-parallel rank holds, and the mapping from a Hugging Face
checkpoint (:func:`weights_from_hf`).

Example::

    >>> w = random_weights(KDAConfig(num_heads=4, head_k_dim=16, hidden_size=64, tp_size=2), rank=1)
    >>> tuple(w["qkv_proj"].shape)
    (96, 64)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ..ops._packed.config import KDAConfig
from .layer_contracts import layer_dims
from .linear_attention import conv_channel_shard, rank_columns, rank_rows

__all__ = ["WEIGHT_NAMES", "random_weights", "shard_weights", "weights_from_hf"]

WEIGHT_NAMES = ("qkv_proj", "conv1d", "f_a_proj", "f_b_proj", "b_proj", "A_log", "dt_bias", "g_a_proj",
                "g_b_proj", "o_norm", "o_proj")
"""The keyword arguments of :meth:`KimiDeltaAttention.load_weights`, in order."""


def random_weights(config: KDAConfig, *, seed: int = 0, rank: int = 0,
                   dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Seeded random weights of the whole (TP1) layer, sharded for ``config.tp_size`` and returned
    for ``rank``: every rank draws the same full set and keeps its shard.

    Scales keep activations O(1); ``A_log`` and ``dt_bias`` follow the usual KDA/Mamba init
    (``A`` in [1, 16], ``softplus(dt_bias)`` in [1e-3, 1e-1]). Example::

        >>> w = random_weights(KDAConfig(num_heads=4, head_k_dim=16, hidden_size=64, tp_size=2), rank=1)
        >>> tuple(w["qkv_proj"].shape), tuple(w["o_proj"].shape)
        ((96, 64), (64, 32))
    """
    full = layer_dims(config.with_tp(1))
    D, HV, K, V, C, W = (full[s] for s in ("D", "HV", "K", "V", "C", "W"))
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, fan_in: int) -> Tensor:
        return torch.randn(*shape, generator=g) / math.sqrt(fan_in)

    dt = torch.exp(torch.empty(HV * K).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    weights = {
        "qkv_proj": randn(C, D, fan_in=D),
        "conv1d": randn(C, W + 1, fan_in=W + 1),
        "f_a_proj": randn(K, D, fan_in=D),
        "f_b_proj": randn(HV * K, K, fan_in=K),
        "b_proj": randn(HV, D, fan_in=D),
        "A_log": torch.empty(HV).uniform_(1.0, 16.0, generator=g).log(),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus^-1(dt)
        "g_a_proj": randn(V, D, fan_in=D),
        "g_b_proj": randn(HV * V, V, fan_in=V),
        "o_norm": 1.0 + 0.1 * torch.randn(V, generator=g),
        "o_proj": randn(D, HV * V, fan_in=HV * V),
    }
    shard = shard_weights(weights, config, rank)
    return {k: v if k in ("A_log", "dt_bias") else v.to(dtype) for k, v in shard.items()}


def shard_weights(weights: Mapping[str, Tensor], config: KDAConfig, rank: int) -> dict[str, Tensor]:
    """Rank ``rank``'s shard of whole-layer (TP1) ``weights`` for ``config.tp_size``: q/k/v rows,
    conv channels, ``f_b``/``b``/``g_b`` rows, ``A_log`` and ``dt_bias`` by heads; ``o_proj`` by input
    columns; ``f_a``, ``g_a`` and ``o_norm`` replicated.

    Example::

        layer.load_weights(**shard_weights(full_weights, layer.config, layer.tp_rank))
    """
    if not 0 <= rank < config.tp_size:
        raise ValueError(f"rank={rank} is outside 0..{config.tp_size - 1} (tp_size={config.tp_size})")
    loc = layer_dims(config)
    hv, K, V = loc["HV"], loc["K"], loc["V"]
    w = weights
    return {
        "qkv_proj": conv_channel_shard(w["qkv_proj"], config, rank),
        "conv1d": conv_channel_shard(w["conv1d"], config, rank),
        "f_a_proj": w["f_a_proj"].clone(),
        "f_b_proj": rank_rows(w["f_b_proj"], rank, hv * K),
        "b_proj": rank_rows(w["b_proj"], rank, hv),
        "A_log": rank_rows(w["A_log"], rank, hv),
        "dt_bias": rank_rows(w["dt_bias"], rank, hv * K),
        "g_a_proj": w["g_a_proj"].clone(),
        "g_b_proj": rank_rows(w["g_b_proj"], rank, hv * V),
        "o_norm": w["o_norm"].clone(),
        "o_proj": rank_columns(w["o_proj"], rank, hv * V),
    }


# Our weight <- the names it has in transformers' KimiLinearDeltaAttention, then in the checkpoint
# files (fla's layer: the forget gate's weights on the attention, one conv per q/k/v).
_HF_NAMES: dict[str, tuple[tuple[str, ...], ...]] = {
    "qkv_proj": (("q_proj.weight", "k_proj.weight", "v_proj.weight"),),
    "conv1d": (("conv1d.weight",), ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")),
    "f_a_proj": (("forget_gate.f_a_proj.weight",), ("f_a_proj.weight",)),
    "f_b_proj": (("forget_gate.f_b_proj.weight",), ("f_b_proj.weight",)),
    "b_proj": (("b_proj.weight",),),
    "A_log": (("forget_gate.A_log",), ("A_log",)),
    "dt_bias": (("forget_gate.dt_bias",), ("dt_bias",)),
    "g_a_proj": (("g_a_proj.weight",),),
    "g_b_proj": (("g_b_proj.weight",),),
    "o_norm": (("o_norm.weight",),),
    "o_proj": (("o_proj.weight",),),
}


def weights_from_hf(state_dict: Mapping[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The whole-layer weights of one Kimi-Linear KDA layer of a Hugging Face state dict, as
    :meth:`KimiDeltaAttention.load_weights` takes them at TP1 (shard them with :func:`shard_weights`).

    Reads transformers' ``KimiLinearDeltaAttention`` names (``prefix`` e.g.
    ``"model.layers.0.self_attn."``; ``forget_gate.*``, one ``conv1d``) or the checkpoint files'
    (``f_a_proj``, ``A_log``, ... on the attention, ``q_conv1d``/``k_conv1d``/``v_conv1d``):
    ``q_proj``/``k_proj``/``v_proj`` are stacked into ``qkv_proj``, the conv ``[C, 1, k]`` squeezed to
    ``[C, k]``, ``A_log [1, 1, H, 1]`` flattened to ``[H]``, ``o_norm.weight`` taken as ``o_norm``.

    Example::

        w = weights_from_hf(hf_layer.state_dict())               # a KimiLinearDeltaAttention module
        w = weights_from_hf(state_dict, "model.layers.0.self_attn.")
        layer.load_weights(**shard_weights(w, layer.config, layer.tp_rank))
    """
    out: dict[str, Tensor] = {}
    for ours, choices in _HF_NAMES.items():
        found = next((names for names in choices if all(prefix + n in state_dict for n in names)), None)
        if found is None:
            tried = " or ".join("+".join(repr(prefix + n) for n in names) for names in choices)
            raise KeyError(f"{tried} is not in the state dict; is {prefix!r} the prefix of a Kimi-Linear KDA layer "
                           f"(e.g. 'model.layers.0.self_attn.')?")
        parts = [state_dict[prefix + n] for n in found]
        t = parts[0] if len(parts) == 1 else torch.cat(parts)
        out[ours] = t.squeeze(1) if ours == "conv1d" and t.dim() == 3 else t
    out["A_log"] = out["A_log"].reshape(-1)  # transformers keeps it as [1, 1, H, 1]
    out["dt_bias"] = out["dt_bias"].reshape(-1)
    return out
