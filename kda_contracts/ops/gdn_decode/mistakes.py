"""The catalogue of known GDN packed-decode mistakes (Qwen3-Next), each one reproducible.

Built like KDA's (:mod:`kda_contracts.ops.packed_decode.mistakes`, whose :class:`Mistake`,
:class:`Attempt` and :class:`Reproduction` it reuses): every entry builds the wrong call from a
valid one for a :class:`~kda_contracts.GDNConfig` and names the fix; :func:`reproduce` runs it
through ``validate_gdn_packed_decode`` and returns the error the library really raises. GDN's own
mistakes come first (a KDA-shaped gate, K/V swapped under GVA, ``a`` left per key-head group),
then the ones it shares with KDA. Keys start with ``gdn-``: both catalogues share ``errors.md``.

Example::

    >>> from kda_contracts import GDNConfig
    >>> r = reproduce(MISTAKES[0], GDNConfig.preset("qwen3-next-80b-a3b"))
    >>> r.error, r.message.splitlines()[1]
    ('ShapeError', '  [1] a: ShapeError')
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..._engine import DtypeError, ShapeError, ValueRangeError
from .._packed.config import KDAConfig
from .._packed.mistakes import BATCH, POOL, Attempt, Mistake, Reproduction
from .._packed.mistakes import reproduce as _reproduce
from .calls import make_gdn_decode_call
from .decode import validate_gdn_packed_decode


@functools.lru_cache(maxsize=8)
def _valid_call(cfg: KDAConfig) -> dict[str, Any]:
    return make_gdn_decode_call(cfg, BATCH, POOL)


def _call(cfg: KDAConfig) -> dict[str, Any]:
    # Built once per config; mistakes replace arguments, never mutate them.
    return dict(_valid_call(cfg))


def _kda_shaped_a(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, a=c["a"].new_zeros(BATCH, cfg.local_num_v_heads * cfg.head_k)), cfg)


def _kda_shaped_dt_bias(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, dt_bias=c["dt_bias"].new_zeros(cfg.local_num_v_heads * cfg.head_k)), cfg)


def _per_key_head_a(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    H, HV = cfg.local_num_heads, cfg.local_num_v_heads
    return Attempt(dict(c, a=c["a"].view(BATCH, H, HV // H)), cfg)


def _swapped_head_dims(cfg: KDAConfig) -> Attempt:
    # K and V differ only in a variant of the config: V = 2K; the tensors are built with them exchanged.
    K = cfg.head_k
    wide = cfg.model_copy(update={"head_v_dim": 2 * K}).revalidate()
    swapped = cfg.model_copy(update={"head_k_dim": 2 * K, "head_v_dim": K}).revalidate()
    return Attempt(dict(_call(swapped), scale=wide.scale), wide,
                   notes=[f"V = 2K = {2 * K} here: the Qwen3-Next preset has K == V, where the swap is harmless"])


def _tp_pool(cfg: KDAConfig) -> tuple[KDAConfig, KDAConfig]:
    """(the config of the call, the config the pool was sized for): a rank of TP > 1, a TP1 pool."""
    tp = cfg.tp_size if cfg.tp_size > 1 else next((t for t in cfg.tp_sizes() if t > 1), None)
    if tp is None:
        raise ValueError(f"the heads of {cfg!r} allow no tp_size > 1")
    return cfg.with_tp(tp), cfg.with_tp(1)


def _tp1_pool(cfg: KDAConfig) -> Attempt:
    rank, whole = _tp_pool(cfg)
    return Attempt(dict(_call(rank), initial_state=_call(whole)["initial_state"]), rank,
                   notes=[f"config and tensors for tp_size={rank.tp_size}, the pool for tp_size=1"])


def _kv_for_vk(cfg: KDAConfig) -> Attempt:
    # Shapes show the layout only when K != V: use V = 2K for this entry.
    wide = cfg.model_copy(update={"head_v_dim": 2 * cfg.head_k}).revalidate()
    kv = wide.model_copy(update={"state_layout": "KV"}).revalidate()
    return Attempt(_call(kv), wide, notes=[f"V = 2K = {2 * cfg.head_k} here: when K == V (the Qwen3-Next preset) "
                                           "the shapes of both layouts agree and only the declared layout can tell "
                                           "them apart"])


def _int16_indices(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, ssm_state_indices=c["ssm_state_indices"].to(torch.int16)), cfg)


def _float_indices(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, ssm_state_indices=c["ssm_state_indices"].float()), cfg)


def _padding_past_pool(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    idx = c["ssm_state_indices"].clone()
    idx[-1] = POOL
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode; the last row is padding"])


def _duplicate_slots(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    idx = c["ssm_state_indices"].clone()
    idx[1] = idx[0]
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode"])


MISTAKES: tuple[Mistake, ...] = (
    Mistake("gdn-kda-shaped-a", "GDN: `a` with KDA's shape [B, HV*K]",
            "a = gate_buffer[:B]  # sized for Kimi-Linear's per-channel gate, [B, HV*K]",
            "a kernel reads a[b, hv] at row stride HV*K: the first HV logits of each row, silently wrong decays",
            "pass GDN's gate, one logit per value head: [B, HV] (GDN's a projection has HV outputs); for a KDA "
            "layer call `kc.packed_decode`", ShapeError, _kda_shaped_a),
    Mistake("gdn-kda-shaped-dt-bias", "GDN: `dt_bias` with KDA's shape [HV*K]",
            "dt_bias = kda_layer.dt_bias  # [HV*K]", "the kernel reads the first HV entries: silently wrong decays",
            "pass the GDN layer's `dt_bias`, [HV] in float32", ShapeError, _kda_shaped_dt_bias),
    Mistake("gdn-a-per-key-head", "GDN: `a` left per key-head group, [B, H, HV/H]",
            "b, a = torch.split(ba.view(B, H, 2 * HV // H), HV // H, dim=-1)  # not reshaped to [B, HV]",
            "a kernel indexing a[b, hv] with the wrong rank reads another head's gate, or faults",
            "`a.reshape(B, HV)` (and `b`): value head hv = h * (HV / H) + j, the order the kernel reads",
            ShapeError, _per_key_head_a),
    Mistake("gdn-swapped-head-dims", "GDN: K and V head dims swapped under GVA (HV = 2H)",
            "K, V = cfg['linear_value_head_dim'], cfg['linear_key_head_dim']",
            "with HV = 2H the width 2*H*K + HV*V = 2H(K+V) is the same either way: q/k/v split at the wrong columns, "
            "silently wrong outputs",
            "size q/k heads by `linear_key_head_dim` and v heads, `out` and the state's V axis by "
            "`linear_value_head_dim` (`GDNConfig.from_hf_config` reads both)", ShapeError, _swapped_head_dims),
    Mistake("gdn-tp1-pool", "GDN: a TP1 state pool on a rank of TP2",
            "pool = torch.zeros(N, hf['linear_num_value_heads'], V, K)  # the whole model's heads",
            "the kernel strides slots by the rank's HV*V*K: it reads and writes the wrong heads of the wrong slots",
            "size the pool by the rank's heads: `cfg.local_num_v_heads` (`GDNConfig.from_hf_config(path, "
            "tp_size=...)`)", ShapeError, _tp1_pool),
    Mistake("gdn-kv-for-vk", "GDN: a KV pool [N, HV, K, V] where VK is declared",
            "state = fla_cache.recurrent_state  # fla's [N, HV, K, V]",
            "silently wrong results (transposed state) when K == V; garbage when K != V",
            "declare the layout: `GDNConfig(state_layout='KV')` or `state_layout='KV'`", ShapeError, _kv_for_vk),
    Mistake("gdn-int16-indices", "GDN: int16 slot indices", "ssm_state_indices = slots.to(torch.int16)",
            "slot ids wrap past 32767, and a kernel built for int32/int64 pointers reads the wrong slots",
            "int32 (or int64) indices: `ssm_state_indices.to(torch.int32)`", DtypeError, _int16_indices),
    Mistake("gdn-float-indices", "GDN: float slot indices",
            "ssm_state_indices = torch.tensor(slots, dtype=torch.float)",
            "float bits read as integer offsets: wild slots", "build the indices with `dtype=torch.int32`",
            DtypeError, _float_indices),
    Mistake("gdn-padding-past-pool", "GDN: padding marked with N, not -1 (strict mode)",
            "ssm_state_indices[n_live:] = N  # pad with the pool size",
            "public GDN kernels have no bounds guard: an out-of-bounds read and write past the pool",
            "mark padding with -1 (any negative index: a zero output row, no state touched)", ValueRangeError,
            _padding_past_pool),
    Mistake("gdn-duplicate-slots", "GDN: two requests on one slot (strict mode)",
            "ssm_state_indices[1] = ssm_state_indices[0]",
            "two programs race on one state slot: a lost update", "give every live request its own slot; -1 pads",
            ValueRangeError, _duplicate_slots),
)


def reproduce(mistake: Mistake, cfg: KDAConfig) -> Reproduction:
    """Make ``mistake`` on a valid GDN call for ``cfg`` and capture the error the library raises.

    Raises ``AssertionError`` when the mistake is not caught, or caught as another kind.
    """
    return _reproduce(mistake, cfg, validate=validate_gdn_packed_decode)
