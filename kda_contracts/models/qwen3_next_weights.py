"""Weights of the Qwen3-Next GDN layer: their names, seeded random ones, the shard of whole-layer
(TP1) weights that one tensor-parallel rank holds, and the mapping from a Hugging Face checkpoint.

The input projections keep Hugging Face's layout, grouped per key head so that a rank's heads are
one contiguous block of rows: ``in_proj_qkvz`` holds, for each of the H key heads, ``q [K]``,
``k [K]``, then ``v`` and ``z`` of its HV/H value heads (``[HV/H * V]`` each); ``in_proj_ba`` holds,
for each key head, ``b`` then ``a`` of its HV/H value heads.

Example::

    >>> cfg = GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32, tp_size=2)
    >>> tuple(random_weights(cfg, rank=1)["in_proj_qkvz"].shape)   # one key head: 2*8 + 2*2*12 rows
    (64, 32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ..ops.gdn_decode.config import GDNConfig
from .layer_contracts import layer_dims
from .linear_attention import conv_channel_shard, rank_columns, rank_rows

__all__ = ["WEIGHT_NAMES", "random_weights", "shard_weights", "weights_from_hf"]

WEIGHT_NAMES = ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "norm", "out_proj")
"""The keyword arguments of :meth:`Qwen3NextGatedDeltaNet.load_weights`, in order."""


def random_weights(config: GDNConfig, *, seed: int = 0, rank: int = 0,
                   dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Seeded random weights of the whole (TP1) layer, sharded for ``config.tp_size`` and returned
    for ``rank``: every rank draws the same full set and keeps its shard.

    Scales keep activations O(1); ``A`` in [1, 16], ``softplus(dt_bias)`` in [1e-3, 1e-1]. Example::

        >>> cfg = GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32)
        >>> {k: tuple(v.shape) for k, v in random_weights(cfg).items()}["in_proj_ba"]
        (8, 32)
    """
    full = layer_dims(config.with_tp(1))
    D, HV, V, C, W = (full[s] for s in ("D", "HV", "V", "C", "W"))
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, fan_in: int) -> Tensor:
        return torch.randn(*shape, generator=g) / math.sqrt(fan_in)

    dt = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    weights = {
        "in_proj_qkvz": randn(C + HV * V, D, fan_in=D),
        "in_proj_ba": randn(2 * HV, D, fan_in=D),
        "conv1d": randn(C, W + 1, fan_in=W + 1),
        "A_log": torch.empty(HV).uniform_(1.0, 16.0, generator=g).log(),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus^-1(dt)
        "norm": 1.0 + 0.1 * torch.randn(V, generator=g),
        "out_proj": randn(D, HV * V, fan_in=HV * V),
    }
    shard = shard_weights(weights, config, rank)
    return {k: v if k in ("A_log", "dt_bias") else v.to(dtype) for k, v in shard.items()}


def shard_weights(weights: Mapping[str, Tensor], config: GDNConfig, rank: int) -> dict[str, Tensor]:
    """Rank ``rank``'s shard of whole-layer (TP1) ``weights`` for ``config.tp_size``: the input
    projections by key-head groups (contiguous rows in the HF layout), conv channels, ``A_log`` and
    ``dt_bias`` by heads (column-parallel); ``out_proj`` by input columns (row-parallel); ``norm``
    replicated.

    Example::

        layer.load_weights(**shard_weights(full_weights, layer.config, layer.tp_rank))
    """
    if not 0 <= rank < config.tp_size:
        raise ValueError(f"rank={rank} is outside 0..{config.tp_size - 1} (tp_size={config.tp_size})")
    loc = layer_dims(config)
    h, hv, K, V = loc["H"], loc["HV"], loc["K"], loc["V"]
    w = weights
    return {
        "in_proj_qkvz": rank_rows(w["in_proj_qkvz"], rank, 2 * h * K + 2 * hv * V),
        "in_proj_ba": rank_rows(w["in_proj_ba"], rank, 2 * hv),
        "conv1d": conv_channel_shard(w["conv1d"], config, rank),
        "A_log": rank_rows(w["A_log"], rank, hv),
        "dt_bias": rank_rows(w["dt_bias"], rank, hv),
        "norm": w["norm"].clone(),
        "out_proj": rank_columns(w["out_proj"], rank, hv * V),
    }


def weights_from_hf(state_dict: Mapping[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The whole-layer weights of one ``Qwen3NextGatedDeltaNet`` of a Hugging Face checkpoint
    (``prefix`` e.g. ``"model.layers.0.linear_attn."``), as :meth:`load_weights` takes them at TP1
    (shard them with :func:`shard_weights`): ``conv1d.weight [C, 1, k]`` squeezed to ``[C, k]``,
    ``norm.weight`` as ``norm``.

    Example::

        w = weights_from_hf(state_dict, "model.layers.0.linear_attn.")
        layer.load_weights(**shard_weights(w, layer.config, layer.tp_rank))
    """
    def get(name: str) -> Tensor:
        key = prefix + name
        if key not in state_dict:
            raise KeyError(f"{key!r} is not in the state dict; is {prefix!r} the prefix of a Qwen3-Next GDN layer?")
        return state_dict[key]

    return {
        "in_proj_qkvz": get("in_proj_qkvz.weight"),
        "in_proj_ba": get("in_proj_ba.weight"),
        "conv1d": get("conv1d.weight").squeeze(1),
        "A_log": get("A_log"),
        "dt_bias": get("dt_bias"),
        "norm": get("norm.weight"),
        "out_proj": get("out_proj.weight"),
    }
