"""The catalogue of known packed-decode mistakes, each one reproducible.

Every :class:`Mistake` builds the wrong call from a valid one and names the fix; running it
through :func:`reproduce` gives the error the library really raises today. ``kda-contracts docs``
renders the catalogue (``docs/generated/errors.md``) from these runs, so the documented
messages cannot drift from the code.

Example::

    >>> from kda_contracts import KDAConfig
    >>> r = reproduce(MISTAKES[0], KDAConfig.preset("kimi-linear-48b-a3b"))
    >>> r.error, r.message.splitlines()[0]
    ('ShapeError', 'packed_decode(): 1 contract violation')
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..._engine import DeviceError, DtypeError, LayoutError, ShapeError, ValueRangeError
from .._packed.calls import make_decode_call
from .._packed.config import KDAConfig
from .._packed.mistakes import BATCH, POOL, Attempt, Mistake, Reproduction
from .._packed.mistakes import reproduce as _reproduce


@functools.lru_cache(maxsize=8)
def _valid_call(cfg: KDAConfig, state_dtype: torch.dtype) -> dict[str, Any]:
    return make_decode_call(cfg, BATCH, POOL, state_dtype=state_dtype)


def _call(cfg: KDAConfig, state_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    # Built once per config (random pools are the slow part); mistakes replace arguments, never mutate them.
    return dict(_valid_call(cfg, state_dtype))


def _other_tp(cfg: KDAConfig) -> int | None:
    """A tensor-parallel degree, other than the config's, that its head counts allow."""
    ok = [t for t in (2, 4, 8, 1, 16) if t != cfg.tp_size and t in cfg.tp_sizes()]
    bigger = [t for t in ok if t > cfg.tp_size]
    return (bigger or ok)[0] if (bigger or ok) else None


def _unflattened_a(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, a=c["a"].view(BATCH, cfg.local_num_v_heads, cfg.head_k)), cfg)


def _unflattened_dt_bias(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, dt_bias=c["dt_bias"].view(cfg.local_num_v_heads, cfg.head_k)), cfg)


def _gdn_shaped_a(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, a=c["a"].new_zeros(BATCH, cfg.local_num_v_heads)), cfg)


def _tp_mismatch(cfg: KDAConfig) -> Attempt:
    tp = _other_tp(cfg)
    if tp is None:
        raise ValueError(f"no other tp_size divides the heads of {cfg!r}")
    return Attempt(_call(cfg.with_tp(tp)), cfg, notes=[f"tensors sharded for tp_size={tp}, config for "
                                                       f"tp_size={cfg.tp_size}"])


def _kv_for_vk(cfg: KDAConfig) -> Attempt:
    # Shapes show the layout only when K != V: use V = 2K for this entry.
    wide = cfg.model_copy(update={"head_v_dim": 2 * cfg.head_k}).revalidate()
    kv = wide.model_copy(update={"state_layout": "KV"}).revalidate()
    return Attempt(_call(kv), wide, notes=[f"V = 2K = {2 * cfg.head_k} here: when K == V the shapes of both "
                                           "layouts agree and only the declared layout can tell them apart"])


def _int64_indices(cfg: KDAConfig) -> Attempt:
    pinned = cfg.model_copy(update={"index_dtype": "int32"}).revalidate()
    c = _call(pinned)
    return Attempt(dict(c, ssm_state_indices=c["ssm_state_indices"].long()), pinned,
                   notes=["config with index_dtype='int32'"])


def _strided_state(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    pool = c["initial_state"]
    # Same shape, column-major slots: what a bare .transpose(-1, -2) of the other layout gives.
    view = pool.transpose(-1, -2).contiguous().transpose(-1, -2)
    return Attempt(dict(c, initial_state=view), cfg)


def _overlapping_slots(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, initial_state=c["initial_state"][:1].expand(POOL, -1, -1, -1)), cfg)


def _bad_width(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    HV, K = cfg.local_num_v_heads, cfg.head_k
    # The beta columns left in; one more when HV alone would still solve to a whole H.
    extra = c["mixed_qkv"].new_zeros(BATCH, HV + (1 if HV % (2 * K) == 0 else 0))
    return Attempt(dict(c, mixed_qkv=torch.cat([c["mixed_qkv"], extra], dim=1)), None,
                   notes=["no config: H is solved from the width"])


def _fp16_alog(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, A_log=c["A_log"].to(torch.bfloat16)), cfg)


def _out_dtype(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, out=c["out"].float()), cfg)


def _device(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, out=c["out"].to("meta")), cfg,
                   notes=["generated on a CPU-only machine: the `meta` device stands in for a second device"])


def _scale(cfg: KDAConfig) -> Attempt:
    return Attempt(dict(_call(cfg), scale=cfg.head_k ** 0.5), cfg)


def _l2norm(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    return Attempt(dict(c, use_qk_l2norm_in_kernel=not c["use_qk_l2norm_in_kernel"]), cfg)


def _lower_bound(cfg: KDAConfig) -> Attempt:
    return Attempt(dict(_call(cfg), lower_bound=5.0), None, notes=["no config"])


def _duplicate_slots(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    idx = c["ssm_state_indices"].clone()
    idx[1] = idx[0]
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode"])


def _index_out_of_pool(cfg: KDAConfig) -> Attempt:
    c = _call(cfg)
    idx = c["ssm_state_indices"].clone()
    idx[0] = POOL
    return Attempt(dict(c, ssm_state_indices=idx), cfg, strict=True, notes=["strict mode"])


MISTAKES: tuple[Mistake, ...] = (
    Mistake("unflattened-a", "`a` passed as [B, HV, K]", "a = a_proj(x).view(B, HV, K)",
            "the kernel indexes `a` as hv*K + k: with the wrong rank a kernel reads garbage or faults",
            "pass `a.flatten(1)` (shape [B, HV*K])", ShapeError, _unflattened_a),
    Mistake("unflattened-dt-bias", "`dt_bias` passed as [HV, K]", "dt_bias = layer.dt_bias  # a [HV, K] parameter",
            "same indexing hazard as `a`", "pass `dt_bias.flatten()`", ShapeError, _unflattened_dt_bias),
    Mistake("gate-per-value-head", "`a` with GDN's shape [B, HV]", "a = gdn_layer.a_proj(x)  # Qwen3-Next's [B, HV]",
            "the kernel reads a[b, hv*K + k] far past each row's HV values: other requests' gates, or out of bounds",
            "pass KDA's gate, one logit per key channel: [B, HV*K]; for a GDN (Qwen3-Next) layer call "
            "`kc.gdn_packed_decode`", ShapeError, _gdn_shaped_a),
    Mistake("tp-mismatch", "tensors for one TP degree, config for another",
            "cfg = KDAConfig.from_hf_config(path)  # tp_size forgotten: 1",
            "head counts off by the TP factor: wrong heads read, out-of-bounds state slots",
            "build the config with the rank's `tp_size` (`KDAConfig.from_hf_config(path, tp_size=...)`)",
            ShapeError, _tp_mismatch),
    Mistake("kv-for-vk", "a KV pool [N, HV, K, V] where VK is declared",
            "state = fla_cache.recurrent_state  # [N, HV, K, V]",
            "silently wrong results (transposed state) when K == V; garbage when K != V",
            "declare the layout: `KDAConfig(state_layout='KV')` or `state_layout='KV'`", ShapeError, _kv_for_vk),
    Mistake("int64-indices", "int64 indices where the config pins int32",
            "ssm_state_indices = torch.tensor(slots)  # int64 by default",
            "a kernel compiled for int32 pointers reads the wrong slots",
            "cast once when building the batch metadata: `ssm_state_indices.to(torch.int32)`",
            DtypeError, _int64_indices),
    Mistake("strided-state", "a state pool with non-dense slots", "state = kv_pool.transpose(-1, -2)  # a view",
            "a kernel that assumes dense slots reads the wrong elements",
            "allocate the pool densely in the declared layout (or `.contiguous()` and copy back)",
            LayoutError, _strided_state),
    Mistake("overlapping-slots", "a state pool whose slots share memory",
            "state = zero_state.expand(N, HV, V, K)  # one slot, N views",
            "every request updates the same memory: a race, and every request sees the others' state",
            "allocate one dense slot per index: `torch.zeros(N, HV, V, K)`", LayoutError, _overlapping_slots),
    Mistake("bad-width", "`mixed_qkv` with extra columns", "mixed_qkv = in_proj(x)  # still carries beta/gate",
            "q, k, v offsets shift: every head reads its neighbour's data",
            "slice `mixed_qkv` to exactly 2*H*K + HV*V columns (q | k | v)", ShapeError, _bad_width),
    Mistake("alog-dtype", "`A_log` in the model dtype", "A_log = layer.A_log.to(torch.bfloat16)",
            "the decay exp(A_log) loses precision every step", "keep `A_log` and `dt_bias` in float32",
            DtypeError, _fp16_alog),
    Mistake("out-dtype", "`out` in a different dtype than `mixed_qkv`",
            "out = torch.empty(B, 1, HV, V)  # float32, activations bf16",
            "the kernel writes bf16 bits into a float32 buffer",
            "allocate `out` with `dtype=mixed_qkv.dtype`", DtypeError, _out_dtype),
    Mistake("device", "a tensor on another device", "out = torch.zeros(B, 1, HV, V)  # on the CPU",
            "an illegal memory access, or a silent host round-trip", "allocate every tensor on the state's device",
            DeviceError, _device),
    Mistake("scale", "`scale` = sqrt(K) instead of 1/sqrt(K)", "scale = head_k_dim ** 0.5",
            "attention logits off by a factor K: silently wrong outputs",
            "pass `cfg.scale` (K ** -0.5 unless the model says otherwise)", ValueRangeError, _scale),
    Mistake("l2norm", "`use_qk_l2norm_in_kernel` disagrees with the config",
            "kc.packed_decode(..., use_qk_l2norm_in_kernel=False)",
            "q and k un-normalised: silently wrong outputs", "pass `cfg.use_qk_l2norm`", ValueRangeError, _l2norm),
    Mistake("lower-bound", "a positive `lower_bound`", "lower_bound = 5.0",
            "the gate grows the state instead of decaying it", "pass a negative bound (e.g. -5.0) or None",
            ValueRangeError, _lower_bound),
    Mistake("duplicate-slots", "two requests on one slot (strict mode)", "ssm_state_indices[1] = ssm_state_indices[0]",
            "two programs race on one state slot: a lost update", "give every live request its own slot; -1 pads",
            ValueRangeError, _duplicate_slots),
    Mistake("index-past-pool", "an index >= N (strict mode)", "ssm_state_indices[0] = N",
            "out-of-bounds read and write of another request's memory in kernels without guards",
            "fix the slot allocator; mark padding with -1", ValueRangeError, _index_out_of_pool),
)


def reproduce(mistake: Mistake, cfg: KDAConfig) -> Reproduction:
    """Make ``mistake`` on a valid call for ``cfg``; the error ``validate_packed_decode`` raises."""
    from .decode import validate_packed_decode

    return _reproduce(mistake, cfg, validate=validate_packed_decode)
