"""``KDAConfig``: the frozen description of one KDA layer as one tensor-parallel rank sees it.

Contracts bind dims from it (``H``, ``HV``, ``K``, ``V`` are the *per-rank* head counts and the
head dims), so a tensor sharded for another TP degree is caught with a message that names the
config field it disagrees with.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator
from typing_extensions import Self

from ..._engine import ConfigError
from .config_errors import config_errors
from .dtypes import DTYPES_BY_NAME

DtypeName = Literal["float32", "bfloat16", "float16"]
IndexDtypeName = Literal["int32", "int64"]


def _plain_int(value: Any) -> Any:
    """A numpy (or other) integer as a Python int; a bool, a str, a float are left to be refused."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _plain_bool(value: Any) -> Any:
    """A numpy bool as a Python bool; anything else but a bool is left to be refused."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    return bool(value) if numpy_bool else value


def _from_string(value: Any) -> Any:
    """A str as the number or bool it spells ("4", "0.25", "true"), else as given (a list item-wise)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_from_string(v) for v in value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return value


# Strict: True is not 1, "4" is not 4, "no" is not False (a numpy integer or bool is fine).
ConfigInt = Annotated[int, Strict(), BeforeValidator(_plain_int)]
ConfigBool = Annotated[bool, Strict(), BeforeValidator(_plain_bool)]
ConfigFloat = Annotated[float, Strict()]  # (an int is a float)


def read_hf_json(source: Any) -> tuple[Mapping[str, Any], str]:
    """A Hugging Face config as a mapping, and where it came from for messages. ``source`` is a
    ``config.json`` path, a mapping (returned as is), or a config object: anything with a
    ``to_dict()`` (a ``transformers.PretrainedConfig``; transformers is never imported) or plain
    attributes (``vars()``, e.g. a ``SimpleNamespace``). A file that is missing or not a JSON
    object, or anything else, is a :class:`~kda_contracts.ConfigError` naming it.

    Example::

        >>> read_hf_json({"hidden_size": 8})
        ({'hidden_size': 8}, 'the config dict')
        >>> from types import SimpleNamespace
        >>> read_hf_json(SimpleNamespace(hidden_size=8))
        ({'hidden_size': 8}, 'the SimpleNamespace')
    """
    if isinstance(source, Mapping):
        return source, "the config dict"
    if isinstance(source, (str, Path)):
        try:
            with open(source, encoding="utf-8") as fh:
                raw = json.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"no Hugging Face config file at {str(source)!r}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the Hugging Face config file {str(source)!r}: {exc}") from exc
        except ValueError as exc:  # json.JSONDecodeError
            raise ConfigError(f"the Hugging Face config file {str(source)!r} is not JSON: {exc}") from exc
        if not isinstance(raw, Mapping):
            raise ConfigError(f"the Hugging Face config file {str(source)!r} holds a JSON {type(raw).__name__}, "
                              "not an object")
        return raw, str(source)
    to_dict = getattr(source, "to_dict", None) if not isinstance(source, type) else None
    try:
        got = to_dict() if callable(to_dict) else getattr(source, "__dict__", None)
    except Exception as exc:
        raise ConfigError(f"{type(source).__name__}.to_dict() raised {type(exc).__name__}: {exc}") from exc
    if isinstance(source, type) or not isinstance(got, Mapping):
        what = f"the class {source.__name__}" if isinstance(source, type) else type(source).__name__
        raise ConfigError(f"a Hugging Face config is a config.json path, a dict or a config object (with to_dict() "
                          f"or attributes), not {what}")
    return dict(got), f"the {type(source).__name__}"


class KDAConfig(BaseModel):
    """One KDA layer's decode shapes and conventions, as seen by one tensor-parallel rank.

    Head counts are the model's totals; ``tp_size`` divides them into per-rank counts
    (:attr:`local_num_heads`, :attr:`local_num_v_heads`), which are what the tensors of one rank
    carry and what the contract dims ``H``/``HV`` bind to.

    Example::

        >>> cfg = KDAConfig(num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128, tp_size=2)
        >>> cfg.local_num_heads, cfg.scale == 128 ** -0.5
        (16, True)
        >>> KDAConfig.model_validate_json(cfg.model_dump_json()) == cfg
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    num_heads: ConfigInt = Field(gt=0, description="q/k heads of the whole model layer (H at TP1)")
    num_v_heads: ConfigInt | None = Field(
        default=None, gt=0, description="value heads of the whole layer (HV at TP1); defaults to num_heads"
    )
    head_k_dim: ConfigInt = Field(gt=0, description="K, the key head dim")
    head_v_dim: ConfigInt | None = Field(default=None, gt=0, description="V, the value head dim; defaults to K")
    tp_size: ConfigInt = Field(default=1, gt=0, description="tensor-parallel degree the heads are sharded over")
    state_dtype: DtypeName | None = Field(
        default=None, description="dtype of the recurrent state pool; None accepts fp32/bf16/fp16"
    )
    activation_dtype: DtypeName | None = Field(
        default=None, description="dtype of mixed_qkv, a, b and out; None accepts fp32/bf16/fp16"
    )
    index_dtype: IndexDtypeName | None = Field(
        default=None, description="dtype of ssm_state_indices; None accepts int32/int64"
    )
    gate: Literal["softplus", "bounded"] = Field(default="softplus", description="forget-gate activation")
    lower_bound: ConfigFloat | None = Field(
        default=None, description="bounded gate only: g = lower_bound * sigmoid(A * x); must be < 0"
    )
    state_layout: Literal["VK", "KV"] = Field(
        default="VK", description="per-head state matrix layout: VK = [V, K] (sglang), KV = [K, V] (fla)"
    )
    use_qk_l2norm: ConfigBool = Field(default=True, description="l2-normalise q and k inside the kernel")
    scale: ConfigFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="q scale; defaults to head_k_dim ** -0.5"
    )
    # Model-level facts (used by model layers and docs; not by the decode contract itself).
    hidden_size: ConfigInt | None = Field(default=None, gt=0)
    conv_kernel_size: ConfigInt = Field(default=4, gt=0, description="short causal conv width")
    kda_layers: tuple[ConfigInt, ...] = Field(default=(), description="1-based indices of the KDA layers")

    # -- made, copied and assigned only through validation; a bad config is a kc.ConfigError ------
    def __init__(self, /, **data: Any) -> None:
        with config_errors(type(self).__name__):
            super().__init__(**data)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        with config_errors(cls.__name__):
            return super().model_validate(obj, *args, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        with config_errors(cls.__name__):
            return super().model_validate_json(json_data, *args, **kwargs)

    @classmethod
    def model_validate_strings(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        """Fields given as strs (a command line, an environment): numbers and ``true``/``false``
        read as such, then validated as :meth:`model_validate` does (the fields are strict, and
        pydantic's own strings mode would not reach them through this class's ``__init__``)."""
        if not isinstance(obj, Mapping):
            raise ConfigError(f"{cls.__name__}.model_validate_strings takes a mapping of field names to strs, "
                              f"got {obj!r}")
        return cls.model_validate({k: _from_string(v) for k, v in obj.items()}, *args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in type(self).model_fields:
            raise ConfigError(f"{type(self).__name__} has no field {name!r} (and a config is frozen)")
        with config_errors(type(self).__name__):
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        with config_errors(type(self).__name__):
            super().__delattr__(name)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, the config of this one's given fields and ``update``, validated
        afresh (what was derived, ``num_v_heads``, ``head_v_dim``, ``scale``, is derived again unless
        it was given), so a bad update is a :class:`~kda_contracts.ConfigError` and the dims follow.

        Example::

            >>> KDAConfig(num_heads=2, head_k_dim=8).model_copy(update={"num_heads": 4}).contract_dims()
            {'H': 4, 'HV': 4, 'K': 8, 'V': 8}
        """
        if not update:
            return super().model_copy(deep=deep)
        # a derived value is derived again, also where it counts as given (a config read back from
        # JSON or a checkpoint gives every field): given equal to its derivation, it follows the update
        derived = {"num_v_heads": self.num_heads, "head_v_dim": self.head_k_dim, "scale": self.head_k_dim ** -0.5}
        given = {name: getattr(self, name) for name in self.model_fields_set
                 if name not in derived or getattr(self, name) != derived[name]}
        return self.model_validate({**given, **update})

    @field_validator("kda_layers")
    @classmethod
    def _layer_indices(cls, layers: tuple[int, ...]) -> tuple[int, ...]:
        return check_layer_indices(layers)

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        # what is not given is derived (and not counted as given: model_copy derives it again)
        derived = {"num_v_heads": self.num_heads, "head_v_dim": self.head_k_dim, "scale": self.head_k_dim ** -0.5}
        for name, value in derived.items():
            if getattr(self, name) is None:
                self.__dict__[name] = value
        hv = self.num_v_heads or self.num_heads  # (derived above; "or" for the type)
        if hv % self.num_heads:
            raise ValueError(
                f"num_v_heads={hv} must be a multiple of num_heads={self.num_heads} "
                "(grouped value attention shares each q/k head among HV/H value heads)"
            )
        for field, total in (("num_heads", self.num_heads), ("num_v_heads", hv)):
            if total % self.tp_size:
                raise ValueError(
                    f"{field}={total} is not divisible by tp_size={self.tp_size}; "
                    f"heads are sharded evenly over ranks (valid tp_size: "
                    f"{', '.join(str(t) for t in range(1, total + 1) if total % t == 0)})"
                )
        if self.gate == "softplus" and self.lower_bound is not None:
            raise ValueError(
                f"lower_bound={self.lower_bound} is only used by the bounded gate; "
                "set gate='bounded' or drop lower_bound"
            )
        if self.gate == "bounded":
            if self.lower_bound is None:
                raise ValueError("gate='bounded' needs lower_bound (a float < 0, e.g. -5.0)")
            if not (self.lower_bound < 0 and math.isfinite(self.lower_bound)):
                raise ValueError(f"lower_bound must be a finite float < 0, got {self.lower_bound}")
        return self

    # -- what contracts read (computed from the fields) ----------------------------------------
    def contract_dims(self) -> dict[str, int]:
        """Per-rank dims this config fixes: ``{"H", "HV", "K", "V"}``."""
        return {"H": self.num_heads // self.tp_size, "HV": (self.num_v_heads or self.num_heads) // self.tp_size,
                "K": self.head_k_dim, "V": self.head_v_dim or self.head_k_dim}

    def contract_dim_source(self, symbol: str) -> str:
        """Where a dim comes from, for error messages (``"num_v_heads=32 / tp_size=2"``); a symbol
        the config does not fix is a :class:`~kda_contracts.ConfigError`."""
        tp = f" / tp_size={self.tp_size}" if self.tp_size != 1 else ""
        dims = self.contract_dims()
        sources = {"H": f"num_heads={self.num_heads}{tp}", "HV": f"num_v_heads={dims['HV'] * self.tp_size}{tp}",
                   "K": f"head_k_dim={self.head_k_dim}", "V": f"head_v_dim={dims['V']}"}
        if not isinstance(symbol, str) or symbol not in sources:
            raise ConfigError(f"{type(self).__name__} fixes no dim {symbol!r}; it fixes {', '.join(sources)}")
        return sources[symbol]

    def contract_dtypes(self) -> dict[str, torch.dtype]:
        """Dtypes this config pins, by role: ``"state"``, ``"activation"``, ``"index"``."""
        return {
            role: DTYPES_BY_NAME[name]
            for role, name in (
                ("state", self.state_dtype),
                ("activation", self.activation_dtype),
                ("index", self.index_dtype),
            )
            if name is not None
        }

    @property
    def local_num_heads(self) -> int:
        """H on one rank."""
        return self.num_heads // self.tp_size

    @property
    def local_num_v_heads(self) -> int:
        """HV on one rank."""
        return (self.num_v_heads or self.num_heads) // self.tp_size

    @property
    def head_k(self) -> int:
        return self.head_k_dim

    @property
    def head_v(self) -> int:
        return self.head_v_dim or self.head_k_dim

    @property
    def effective_lower_bound(self) -> float | None:
        """The ``lower_bound`` argument the kernels take: None for softplus."""
        return self.lower_bound if self.gate == "bounded" else None

    def tp_sizes(self) -> list[int]:
        """Every tensor-parallel degree the head counts allow (each divides both), ascending.

        Example::

            >>> KDAConfig(num_heads=6, head_k_dim=8).tp_sizes()
            [1, 2, 3, 6]
        """
        hv = self.num_v_heads or self.num_heads
        return [t for t in range(1, max(self.num_heads, hv) + 1) if self.num_heads % t == 0 and hv % t == 0]

    def with_tp(self, tp_size: int) -> Self:
        """The same layer sharded over ``tp_size`` ranks (a ConfigError when it does not divide the heads)."""
        return self.model_copy(update={"tp_size": tp_size})

    def revalidate(self) -> Self:
        """This config validated afresh from its given fields (what it derived is derived again)."""
        return self.model_validate({name: getattr(self, name) for name in self.model_fields_set})

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, source: Any, tp_size: int = 1, **overrides: Any) -> Self:
        """Read a Kimi-Linear config: a ``config.json`` path, its dict, or a ``KimiLinearConfig``
        (any object with ``to_dict()`` or attributes). The checkpoint's ``linear_attn_config``
        block (``num_heads``, ``head_dim``, ``short_conv_kernel_size``, ``kda_layers``) is read
        where present, else transformers' top-level fields (``linear_num_heads``,
        ``linear_head_dim``, ``linear_conv_kernel_dim``, ``layer_types``). A config that cannot be
        read or makes no valid KDAConfig is a :class:`~kda_contracts.ConfigError`.

        Example::

            cfg = KDAConfig.from_hf_config("Kimi-Linear-48B-A3B-Instruct/config.json", tp_size=2)
            cfg = KDAConfig.from_hf_config(model.config)   # a transformers KimiLinearConfig
        """
        with config_errors(cls.__name__):
            raw, origin = read_hf_json(source)
            fields = {**_kimi_fields(raw, origin), "tp_size": tp_size, "hidden_size": raw.get("hidden_size")}
        return cls(**{**fields, **overrides})

    @classmethod
    def preset(cls, name: str, tp_size: int = 1, **overrides: Any) -> Self:
        """A named preset (see :data:`PRESETS`), sharded over ``tp_size`` ranks.

        Example::

            >>> KDAConfig.preset("kimi-linear-48b-a3b", tp_size=4).local_num_heads
            8
        """
        presets = cls.presets()
        base = presets.get(name) if isinstance(name, str) else None
        if base is None:
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(sorted(presets))}")
        return cls(**{**base, "tp_size": tp_size, **overrides})

    @classmethod
    def presets(cls) -> Mapping[str, Mapping[str, Any]]:
        """The named presets of this config class (:data:`PRESETS`; a subclass names its own)."""
        return PRESETS


def check_layer_indices(layers: tuple[int, ...]) -> tuple[int, ...]:
    """1-based layer indices: each >= 1, none twice (a ValueError naming the offenders).

    Example::

        >>> check_layer_indices((1, 2, 4))
        (1, 2, 4)
    """
    low = [i for i in layers if i < 1]
    if low:
        raise ValueError(f"layer indices are 1-based (>= 1), got {', '.join(map(str, low))}")
    twice = sorted({i for i in layers if layers.count(i) > 1})
    if twice:
        raise ValueError(f"layer {', '.join(map(str, twice))} listed more than once")
    return layers


def kda_only(config: Any) -> str | None:
    """What makes ``config`` a KDA layer's and not one GDN's ops can run, worded for a message: a
    bounded gate (GDN has only its softplus gate) or ``kda_layers``; None when nothing does (None,
    a GDNConfig, a softplus KDAConfig without ``kda_layers``, a plain config of dims).

    Example::

        >>> kda_only(KDAConfig.preset("kimi-k3-like"))
        "gate='bounded' (lower_bound=-5.0), KDA's bounded gate"
        >>> kda_only(KDAConfig(num_heads=2, head_k_dim=8)) is None
        True
    """
    if config is None or isinstance(config, type):
        return None
    gate, lower_bound = getattr(config, "gate", "softplus"), getattr(config, "lower_bound", None)
    if gate != "softplus" or lower_bound is not None:
        return f"gate={gate!r} (lower_bound={lower_bound!r}), KDA's bounded gate"
    layers = getattr(config, "kda_layers", ())
    if layers:
        return f"kda_layers={tuple(layers)!r}, the layers of a KDA model"
    return None


def fits_gdn(config: Any) -> bool:
    """Whether GDN's ops may take ``config`` (see :func:`kda_only`); a GDN contract's predicate on
    its ``config`` argument (pure: the check cache may keep its verdict, per frozen config)."""
    return kda_only(config) is None


fits_gdn.__kda_contracts_pure__ = True  # type: ignore[attr-defined]


def _kimi_fields(raw: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """KDAConfig's fields from a Kimi-Linear config's ``linear_attn_config`` block, or from the
    top-level ``linear_*`` fields of transformers' ``KimiLinearConfig`` (where both are present
    they must agree)."""
    lac = raw.get("linear_attn_config")
    lac = lac if isinstance(lac, Mapping) else {}
    top = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
           "short_conv_kernel_size": "linear_conv_kernel_dim"}
    merged = dict(lac)
    for key, name in top.items():
        if raw.get(name) is None:
            continue
        if key in lac and lac[key] != raw[name]:
            raise ValueError(f"{origin}: linear_attn_config.{key}={lac[key]} disagrees with {name}={raw[name]}")
        merged.setdefault(key, raw[name])
    if not lac and not any(raw.get(name) is not None for name in top.values()):
        raise ValueError(f"{origin} has no 'linear_attn_config' object; is it a Kimi-Linear config.json? "
                         f"(model_type={raw.get('model_type')!r}) Nor has it transformers' KimiLinearConfig "
                         "fields linear_num_heads and linear_head_dim")
    missing = [key for key in ("num_heads", "head_dim") if key not in merged]
    if missing:
        raise ValueError(f"{origin}: linear_attn_config lacks {', '.join(missing)} (nor has "
                         f"{', '.join(top[k] for k in missing)})")
    head = merged["head_dim"]
    fields: dict[str, Any] = {
        "num_heads": merged["num_heads"],
        "head_k_dim": merged.get("head_k_dim", head),
        "conv_kernel_size": merged.get("short_conv_kernel_size", 4),
        "kda_layers": merged["kda_layers"] if "kda_layers" in merged else linear_layers(raw),
    }
    # (left out, num_v_heads is num_heads and head_v_dim head_k_dim: the config derives them)
    if "num_v_heads" in merged:
        fields["num_v_heads"] = merged["num_v_heads"]
    if "head_v_dim" in merged or "head_k_dim" in merged:
        fields["head_v_dim"] = merged.get("head_v_dim", head)
    if merged.get("lower_bound") is not None:
        fields["gate"] = "bounded"
        fields["lower_bound"] = merged["lower_bound"]
    return fields


def linear_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """1-based linear-attention layers of a config: from ``layer_types`` (transformers'), else every
    layer but each ``full_attention_interval``-th (Qwen3-Next's config.json), else none known.

    Example::

        >>> linear_layers({"layer_types": ["linear_attention", "full_attention", "linear_attention"]})
        (1, 3)
    """
    types = raw.get("layer_types")
    if isinstance(types, (list, tuple)):
        return tuple(i + 1 for i, t in enumerate(types) if t == "linear_attention")
    n, every = raw.get("num_hidden_layers"), raw.get("full_attention_interval")
    if isinstance(n, int) and isinstance(every, int) and every > 0:
        return tuple(i for i in range(1, n + 1) if i % every != 0)
    return ()


# Public field values of the released models (per whole layer, TP1).
PRESETS: dict[str, dict[str, Any]] = {
    "kimi-linear-48b-a3b": {
        "num_heads": 32,
        "num_v_heads": 32,
        "head_k_dim": 128,
        "head_v_dim": 128,
        "gate": "softplus",
        "hidden_size": 2304,
        "conv_kernel_size": 4,
        "use_qk_l2norm": True,
        # 27 layers; MLA at 4, 8, ..., 24 and 27: the other twenty (1-based) are KDA.
        "kda_layers": tuple(i for i in range(1, 27) if i % 4 != 0),
    },
    # A Kimi-K3-like layer: bounded gate; 96 heads so that TP1..TP8 give 96..12 local heads.
    "kimi-k3-like": {
        "num_heads": 96,
        "num_v_heads": 96,
        "head_k_dim": 128,
        "head_v_dim": 128,
        "gate": "bounded",
        "lower_bound": -5.0,
        "conv_kernel_size": 4,
        "use_qk_l2norm": True,
    },
}
