"""``GDNConfig``: one Gated DeltaNet (Qwen3-Next) layer as one tensor-parallel rank sees it.

The linear-attention config family is shared with KDA: a ``GDNConfig`` *is* a
:class:`~kda_contracts.KDAConfig` (same per-rank dims ``H``, ``HV``, ``K``, ``V``, dtype pins, state
layout, scale and TP sharding, so the shared hints — TP mismatch, layout, index dtype — read it as
they read a KDA config) whose gate is always GDN's scalar softplus gate. It reads a Qwen3-Next
``config.json`` (``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
``linear_value_head_dim``).

Example::

    >>> cfg = GDNConfig.preset("qwen3-next-80b-a3b", tp_size=2)
    >>> cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k
    (8, 16, 128)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator
from typing_extensions import Self

from .._packed.config import ConfigInt, KDAConfig, check_layer_indices, linear_layers, read_hf_json
from .._packed.config_errors import config_errors


class GDNConfig(KDAConfig):
    """One GDN layer's decode shapes and conventions on one TP rank (a softplus-gated
    :class:`~kda_contracts.KDAConfig`; ``gdn_layers`` lists the 1-based linear-attention layers).

    Example::

        >>> GDNConfig(num_heads=16, num_v_heads=32, head_k_dim=128).contract_dims()
        {'H': 16, 'HV': 32, 'K': 128, 'V': 128}
    """

    gdn_layers: tuple[ConfigInt, ...] = Field(default=(), description="1-based indices of the GDN layers")

    @field_validator("gdn_layers")
    @classmethod
    def _gdn_layer_indices(cls, layers: tuple[int, ...]) -> tuple[int, ...]:
        return check_layer_indices(layers)

    @model_validator(mode="after")
    def _gdn_gate(self) -> Self:
        if self.gate != "softplus" or self.lower_bound is not None:
            raise ValueError("GDN has only the softplus gate g = -exp(A_log) * softplus(a + dt_bias); "
                             "drop gate=/lower_bound (the bounded gate is KDA's)")
        if self.kda_layers:
            raise ValueError("kda_layers is KDA's field; a GDN config lists its layers in gdn_layers")
        return self

    @classmethod
    def from_hf_config(cls, source: Any, tp_size: int = 1, **overrides: Any) -> Self:
        """Read a Qwen3-Next config (its ``linear_*`` fields): a ``config.json`` path, its dict, or a
        ``Qwen3NextConfig`` (any object with ``to_dict()`` or attributes); heads per rank for ``tp_size``.

        Example::

            cfg = GDNConfig.from_hf_config("Qwen3-Next-80B-A3B-Instruct/config.json", tp_size=4)
            cfg = GDNConfig.from_hf_config(model.config)   # a transformers Qwen3NextConfig
        """
        with config_errors(cls.__name__):
            raw, origin = read_hf_json(source)
            needed = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
            missing = [k for k in needed if k not in raw]
            if missing:
                raise ValueError(f"{origin} lacks {', '.join(missing)}; is it a Qwen3-Next config.json? "
                                 f"(model_type={raw.get('model_type')!r})")
        fields: dict[str, Any] = {
            "num_heads": raw["linear_num_key_heads"],
            "num_v_heads": raw["linear_num_value_heads"],
            "head_k_dim": raw["linear_key_head_dim"],
            "head_v_dim": raw["linear_value_head_dim"],
            "tp_size": tp_size,
            "conv_kernel_size": raw.get("linear_conv_kernel_dim", 4),
            "hidden_size": raw.get("hidden_size"),
            "gdn_layers": linear_layers(raw),
        }
        return cls(**{**fields, **overrides})

    @classmethod
    def presets(cls) -> Mapping[str, Mapping[str, Any]]:
        """GDN's presets, :data:`GDN_PRESETS` (``GDNConfig.preset(name, tp_size)`` is KDAConfig's).

        Example::

            >>> GDNConfig.preset("qwen3-next-80b-a3b", tp_size=8).local_num_v_heads
            4
        """
        return GDN_PRESETS


# Public field values of the released models (per whole layer, TP1).
GDN_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-next-80b-a3b": {
        "num_heads": 16,
        "num_v_heads": 32,
        "head_k_dim": 128,
        "head_v_dim": 128,
        "hidden_size": 2048,
        "conv_kernel_size": 4,
        "use_qk_l2norm": True,
        # 48 layers, full attention every 4th: the other 36 (1-based) are GDN.
        "gdn_layers": tuple(i for i in range(1, 49) if i % 4 != 0),
    },
}
