"""Weights of the Kimi-Linear KDA layer: their names, seeded random ones, and the shard of
whole-layer (TP1) weights that one tensor-parallel rank holds.

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

from ..ops.packed_decode.config import KDAConfig
from .kimi_linear_contracts import layer_dims

__all__ = ["WEIGHT_NAMES", "random_weights", "shard_weights"]

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
    full, loc = layer_dims(config.with_tp(1)), layer_dims(config)
    H, K, V = full["H"], full["K"], full["V"]
    h, hv = loc["H"], loc["HV"]

    def block(t: Tensor, start: int, size: int) -> Tensor:  # rank's block of `size` rows after `start`
        return t[start + rank * size: start + (rank + 1) * size]

    def channels(t: Tensor) -> Tensor:  # q heads | k heads | v heads
        return torch.cat([block(t, 0, h * K), block(t, H * K, h * K), block(t, 2 * H * K, hv * V)])

    w = weights
    return {
        "qkv_proj": channels(w["qkv_proj"]),
        "conv1d": channels(w["conv1d"]),
        "f_a_proj": w["f_a_proj"].clone(),
        "f_b_proj": block(w["f_b_proj"], 0, hv * K).clone(),
        "b_proj": block(w["b_proj"], 0, hv).clone(),
        "A_log": block(w["A_log"], 0, hv).clone(),
        "dt_bias": block(w["dt_bias"], 0, hv * K).clone(),
        "g_a_proj": w["g_a_proj"].clone(),
        "g_b_proj": block(w["g_b_proj"], 0, hv * V).clone(),
        "o_norm": w["o_norm"].clone(),
        "o_proj": w["o_proj"][:, rank * hv * V: (rank + 1) * hv * V].contiguous(),
    }
