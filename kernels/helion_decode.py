"""Helion backend for KDA packed decode (``kernels/INTERFACE.md``).

Design
------
One program per (request, value head, V-tile) with the whole key dim (K) in that tile: it loads
the ``[BLOCK_V, K]`` block of the request's state slot once, decays it, applies the delta-rule
update, reads the output out of the fp32 block and stores it back. The state read + write is
~99% of the traffic, so the only knob that matters is how that block is split over programs
(``block_sizes=[BLOCK_V]``) and warps. The gate, beta and the (l2-normalised) q/k vectors are
K-long and recomputed by each V-tile of a head; that costs reads of a few hundred bytes per tile.

Memory safety lives in the kernel: each program loads its index, and only if
``0 <= index < N`` does it touch the pool; otherwise (padding, or out of range) it writes a zero
output row and nothing else. The slot offset is computed in int64 so large pools cannot wrap.

Layouts: the kernel is written for a ``[N, HV, V, K]`` ("VK") pool and handles any strides. A
"KV" pool is passed as its ``transpose(2, 3)`` view, so the same kernel serves both; the VK path
pays nothing for it (strides are runtime arguments, and Triton specialises the unit stride).
KV is correct but not tuned: on an H200 it ran at ~60-70% of the VK bandwidth (see below).

Measured on an H200 (torch 2.11, Triton 3.6; CUDA-graph replay of 10 calls, pool of 8*B random
slots, H = HV, K = V = 128, bf16 activations), with the pinned configs:

=========================  ==================  ==================  =========
shape                      fp32 state          bf16 state          fp16
=========================  ==================  ==================  =========
B=256, HV=32, VK           279 us (3.89 TB/s)  151 us (3.63 TB/s)  157 us
B=256, HV=32, KV           458 us (2.37 TB/s)  213 us (2.57 TB/s)
B=256, HV=8                74 us               41 us               43 us (*)
B=1, HV=32                 3.3 us              3.0 us              3.0 us
B=1, HV=8                  2.7 us              2.8 us              2.7 us (*)
=========================  ==================  ==================  =========

(*) fp16 at HV=8 was measured with an earlier pin (BLOCK_V=16, 2 warps); bf16 at HV=8 took
42.8 us with that and 41.3 us with the current BLOCK_V=32, 4 warps.

The practical ceiling (device copy, 4.27 TB/s) is ~254 us for B=256 HV=32 fp32.

Pinned configs
--------------
No autotuning ever happens at run time: :func:`packed_decode` picks a ``helion.Config`` from
:data:`PINNED_CONFIGS` by (state dtype, head regime), and each kernel object is built with that
single config and ``force_autotune=False`` (a stray ``HELION_FORCE_AUTOTUNE=1`` cannot turn it
back on). ``static_shapes=False`` keeps B and N symbolic, so a new batch size or pool size does
not recompile (Helion buckets sizes 0/1/2+, so B == 1 compiles once more); K and V are
specialised. ``ref_mode`` is passed explicitly for the same reason as ``force_autotune``:
``HELION_INTERPRET=1`` in the environment must not turn the production path into eager PyTorch.

To re-tune on a GPU, once per state dtype and head regime (``--num-v-heads 8`` for
``few_heads``); it autotunes with Helion and prints the line to paste into
``_PINNED_CONFIG_KWARGS`` (only the keys that hold for every gate/l2norm variant)::

    python -m kda_kernels.helion_decode --state-dtype bfloat16 --num-v-heads 32 --batch 256

Example:
    >>> import torch
    >>> from kda_kernels import helion_decode
    >>> helion_decode.head_regime(num_v_heads=32)
    'many_heads'
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from .interface import DecodeArgs, DecodeBackend, split_qkv, state_as_vk

try:  # is_available() reports why this failed; the kernel entry points re-raise it.
    import helion
    import helion.language as hl
except Exception:  # helion built for another torch can fail with any error, not only ImportError
    pass

if TYPE_CHECKING:
    import helion
    import helion.language as hl

__all__ = [
    "PINNED_CONFIGS",
    "SUPPORTED",
    "decode_kernel",
    "gdn_packed_decode",
    "head_regime",
    "is_available",
    "launch",
    "packed_decode",
    "pinned_config",
]

HeadRegime = Literal["many_heads", "few_heads"]

SUPPORTED: Mapping[str, object] = MappingProxyType(
    {
        "state_layouts": ("VK", "KV"),
        "state_dtypes": (torch.float32, torch.bfloat16, torch.float16),
        "activation_dtypes": (torch.float32, torch.bfloat16, torch.float16),
        "index_dtypes": (torch.int32, torch.int64),
        "gates": ("softplus", "bounded"),
        "gva": True,
        "devices": "CUDA (compiled Triton); CPU only under TRITON_INTERPRET=1 or in eager ref mode",
    }
)
"""What this backend runs. Both layouts use one kernel (KV is passed as a transposed view)."""

# HV at or above this (TP1/TP2 of Kimi-Linear) is "many_heads"; below it (TP4/TP8, small
# Kimi-K3 shards) a request launches fewer programs, which may want its own config.
_MANY_HEADS_MIN = 16

# Keyword arguments of helion.Config per (state dtype, head regime). Kept as plain dicts so
# this module imports without helion; PINNED_CONFIGS turns them into helion.Config objects.
# loop_orders=[[2, 1, 0]] makes the V tile the fastest-varying program id, so neighbouring
# programs stream neighbouring rows of one slot: 8% faster at B=256 than request-fastest.
# Tuned on an H200 (CUDA-graph replay, pool of 8*B random slots, K=V=128, H=HV): the best
# configs came out the same for HV=32 and HV=8, so the regimes currently share them; fp32
# takes BLOCK_V=16 over 32 (equal at B=256, 3.25 vs 3.7 us at B=1).
_LOOP_V_FASTEST = [[2, 1, 0]]
_FP32 = dict(block_sizes=[16], num_warps=4, loop_orders=_LOOP_V_FASTEST)
_HALF = dict(block_sizes=[32], num_warps=4, loop_orders=_LOOP_V_FASTEST)
_PINNED_CONFIG_KWARGS: dict[tuple[torch.dtype, HeadRegime], dict[str, Any]] = {
    (torch.float32, "many_heads"): _FP32,
    (torch.float32, "few_heads"): _FP32,
    (torch.bfloat16, "many_heads"): _HALF,
    (torch.bfloat16, "few_heads"): _HALF,
    (torch.float16, "many_heads"): _HALF,
    (torch.float16, "few_heads"): _HALF,
}


@functools.cache  # the answer cannot change within a process; keeps metadata reads off the hot path
def is_available() -> tuple[bool, str]:
    """Whether helion imports here, and if not, why (a message fit for a skip reason).

    Example:
        >>> ok, why = is_available()
        >>> isinstance(ok, bool) and isinstance(why, str)
        True
    """
    try:
        version = importlib.metadata.version("helion")
    except importlib.metadata.PackageNotFoundError:
        return False, "helion is not installed (pip install 'kda-contracts[helion]')"
    try:
        importlib.import_module("helion")
        importlib.import_module("helion.language")
    except Exception as err:  # any failure means "not usable here"; the message says which
        return False, f"helion {version} does not import with torch {torch.__version__}: {type(err).__name__}: {err}"
    return True, f"helion {version} with torch {torch.__version__}"


def _require_helion() -> None:
    ok, why = is_available()
    if not ok:
        raise RuntimeError(f"the helion decode backend is unavailable: {why}")


def head_regime(num_v_heads: int) -> HeadRegime:
    """The head regime a pinned config is chosen by: ``"many_heads"`` when HV >= 16.

    Example:
        >>> head_regime(32), head_regime(4)
        ('many_heads', 'few_heads')
    """
    return "many_heads" if num_v_heads >= _MANY_HEADS_MIN else "few_heads"


def pinned_config(state_dtype: torch.dtype, num_v_heads: int) -> helion.Config:
    """The ``helion.Config`` :func:`packed_decode` runs for this state dtype and HV.

    Example:
        >>> pinned_config(torch.bfloat16, 32)["block_sizes"]
        [32]
    """
    _require_helion()
    return _config(_pinned_kwargs(state_dtype, head_regime(num_v_heads)))


def _pinned_kwargs(state_dtype: torch.dtype, regime: HeadRegime) -> Mapping[str, Any]:
    try:
        return _PINNED_CONFIG_KWARGS[(state_dtype, regime)]
    except KeyError:
        raise ValueError(
            f"no pinned helion config for state dtype {state_dtype}; supported: "
            f"{sorted({str(d) for d, _ in _PINNED_CONFIG_KWARGS})}"
        ) from None


def _config(kwargs: Mapping[str, Any]) -> helion.Config:
    # A deep copy: Helion may normalise a config's lists in place, and the tables share them.
    return helion.Config(**copy.deepcopy(dict(kwargs)))


class _PinnedConfigs(Mapping[tuple[torch.dtype, HeadRegime], "helion.Config"]):
    """Read-only view of the pinned configs as ``helion.Config`` objects (built on access)."""

    def __getitem__(self, key: tuple[torch.dtype, HeadRegime]) -> helion.Config:
        _require_helion()
        return _config(_PINNED_CONFIG_KWARGS[key])

    def __iter__(self) -> Iterator[tuple[torch.dtype, HeadRegime]]:
        return iter(_PINNED_CONFIG_KWARGS)

    def __len__(self) -> int:
        return len(_PINNED_CONFIG_KWARGS)


PINNED_CONFIGS: Mapping[tuple[torch.dtype, HeadRegime], helion.Config] = _PinnedConfigs()
"""(state dtype, head regime) -> the ``helion.Config`` used for it; see the module docstring."""


def _kda_decode_kernel(
    q: Tensor,  # [B, H, K]
    k: Tensor,  # [B, H, K]
    v: Tensor,  # [B, HV, V]
    a: Tensor,  # [B, HV, K] (KDA) or [B, HV, 1] (GDN: one gate per value head)
    b: Tensor,  # [B, HV]
    A_log: Tensor,  # [HV]
    dt_bias: Tensor,  # [HV, K] (KDA) or [HV, 1] (GDN)
    state: Tensor,  # [N, HV, V, K] (any strides: KV pools arrive transposed)
    out: Tensor,  # [B, HV, V]
    indices: Tensor,  # [B]
    scale: float,
    lower_bound: float,  # read only when bounded
    group: hl.constexpr,  # HV // H
    use_qk_l2norm: hl.constexpr,
    bounded: hl.constexpr,
    gdn: hl.constexpr,  # GDN: a scalar gate per value head, sigmoid(b) rounded to b's dtype as sglang does
) -> None:
    batch = indices.size(0)
    num_slots = state.size(0)
    num_v_heads = state.size(1)
    head_v_dim = hl.specialize(state.size(2))
    hl.specialize(state.size(3))  # K: the full key dim is one tile (the ``:`` below)
    for tile_b, tile_hv, tile_v in hl.tile([batch, num_v_heads, head_v_dim], block_size=[1, 1, None]):
        i_b = tile_b.begin
        i_hv = tile_hv.begin
        i_h = i_hv // group
        # A 0-d load decides the branch. The pool is indexed with the [1]-shaped tile load
        # instead, because Helion 1.4 mis-broadcasts a 0-d tensor used as an index.
        slot_scalar = indices[i_b]
        if (slot_scalar >= 0) & (slot_scalar < num_slots):
            slot = indices[tile_b].to(torch.int64)  # int64: slot * stride(0) may pass 2**31
            if gdn:  # one scalar per value head
                x = a[tile_b, i_hv, 0].to(torch.float32) + dt_bias[i_hv, 0]  # [1]
            else:
                x = a[tile_b, i_hv, :].to(torch.float32) + dt_bias[i_hv, :][None, :]  # [1, K]
            A = torch.exp(A_log[i_hv])
            if bounded:
                g = lower_bound * torch.sigmoid(A * x)
            else:
                # log(1 + exp(x)), not log1p: Triton's interpreter lacks log1p; the difference
                # is below fp32 resolution of g wherever exp(g) is not already ~1. The clamp
                # keeps the branch that torch.where drops from overflowing.
                soft = torch.log(1.0 + torch.exp(torch.clamp(x, max=20.0)))
                g = -A * torch.where(x <= 20.0, soft, x)
            beta = torch.sigmoid(b[tile_b, i_hv].to(torch.float32))  # [1]
            if gdn:
                beta = beta.to(b.dtype).to(torch.float32)
            kk = k[tile_b, i_h, :].to(torch.float32)  # [1, K]
            qq = q[tile_b, i_h, :].to(torch.float32)
            if use_qk_l2norm:
                kk = kk / torch.sqrt(torch.sum(kk * kk, dim=-1, keepdim=True) + 1e-6)
                qq = qq / torch.sqrt(torch.sum(qq * qq, dim=-1, keepdim=True) + 1e-6)
            qq = qq * scale
            S = state[slot, i_hv, tile_v, :].to(torch.float32)  # [1, BLOCK_V, K]
            if gdn:
                S = S * torch.exp(g)[:, None, None]
            else:
                S = S * torch.exp(g)[:, None, :]
            vv = v[tile_b, i_hv, tile_v].to(torch.float32)  # [1, BLOCK_V]
            u = beta[:, None] * (vv - torch.sum(S * kk[:, None, :], dim=-1))
            S = S + u[:, :, None] * kk[:, None, :]
            o = torch.sum(S * qq[:, None, :], dim=-1)  # from the fp32 S, before rounding
            out[tile_b, i_hv, tile_v] = o.to(out.dtype)
            state[slot, i_hv, tile_v, :] = S.to(state.dtype)
        else:
            out[tile_b, i_hv, tile_v] = hl.zeros([tile_b, tile_v], dtype=out.dtype)


@functools.cache
def decode_kernel(config: helion.Config | None = None, *, eager: bool = False) -> helion.Kernel[None]:
    """The Helion kernel object for one config (cached per ``(config, eager)``).

    ``eager=True`` runs the kernel body as PyTorch ops (``helion.RefMode.EAGER``; no Triton,
    any device, ``config`` ignored). Otherwise ``config`` is required: the kernel compiles to
    Triton with exactly that config and never autotunes. Run it with :func:`launch`.

    Example:
        >>> import helion
        >>> kernel = decode_kernel(helion.Config(block_sizes=[16], num_warps=4))
        >>> kernel is decode_kernel(helion.Config(block_sizes=[16], num_warps=4))
        True
    """
    _require_helion()
    if eager:
        return helion.kernel(_kda_decode_kernel, ref_mode=helion.RefMode.EAGER, static_shapes=False)
    if config is None:
        raise ValueError("decode_kernel needs a helion.Config unless eager=True (no run-time autotuning)")
    return helion.kernel(
        _kda_decode_kernel,
        config=config,
        static_shapes=False,
        force_autotune=False,
        ref_mode=helion.RefMode.OFF,
    )


@functools.cache
def _pinned_kernel(state_dtype: torch.dtype, regime: HeadRegime) -> helion.Kernel[None]:
    # Cached per (dtype, regime): the hot path does one dict lookup, not a Config build + hash.
    _require_helion()
    return decode_kernel(_config(_pinned_kwargs(state_dtype, regime)))


@DecodeBackend
def launch(call: DecodeArgs, *, kernel: Callable[..., None], gdn: bool = False) -> None:
    """Run ``kernel`` (from :func:`decode_kernel`) on the interface's inputs, in place.

    Same arguments and effects as :func:`packed_decode`, plus the keyword ``kernel``: the kernel
    object is chosen by the caller (tests use it for eager ref mode and explicit configs).
    ``kernel`` receives the kernel's own arguments: per-head views of the inputs and the pool as
    ``[N, HV, V, K]``. ``gdn=True`` runs GDN's gate (``a`` ``[B, HV]``, ``dt_bias`` ``[HV]``, passed
    with a trailing dim of 1): one gate value per value head.

    Example:
        >>> kernel = decode_kernel(eager=True)
        >>> # launch(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices,
        >>> #        num_heads=H, use_qk_l2norm=True, lower_bound=None, kernel=kernel)
    """
    batch, num_heads, num_v_heads, head_k_dim, head_v_dim, _ = call.dims
    q, k, v = split_qkv(call.mixed_qkv, num_heads, num_v_heads, head_k_dim, head_v_dim)
    if gdn:
        if call.lower_bound is not None:
            raise ValueError("GDN has no bounded gate: lower_bound must be None")
        gate, bias = call.a.unsqueeze(-1), call.dt_bias.unsqueeze(-1)
    else:
        gate = call.a.unflatten(1, (num_v_heads, head_k_dim))
        bias = call.dt_bias.view(num_v_heads, head_k_dim)
    kernel(
        q,
        k,
        v,
        gate,
        call.b,
        call.A_log,
        bias,
        state_as_vk(call.state, call.state_layout),  # a KV pool as its transposed view
        call.out.view(batch, num_v_heads, head_v_dim),
        call.indices,
        float(call.scale),
        0.0 if call.lower_bound is None else float(call.lower_bound),
        num_v_heads // num_heads,
        bool(call.use_qk_l2norm),
        call.lower_bound is not None,
        gdn,
    )


@DecodeBackend
def packed_decode(call: DecodeArgs) -> None:
    """One KDA decode step with the Helion kernel; writes ``out`` and the used slots in place.

    Arguments, shapes and semantics are those of ``kernels/INTERFACE.md``. The config is the
    pinned one for ``(state.dtype, head_regime(HV))``; nothing is autotuned. Indices ``< 0`` or
    ``>= N`` give a zero output row and never touch the pool; ``B == 0`` is a no-op.

    Example:
        >>> # packed_decode(mixed_qkv, a, b, A_log, dt_bias, K**-0.5, state, out, indices,
        >>> #               num_heads=32, use_qk_l2norm=True, lower_bound=None)
    """
    launch.run(call, kernel=_pinned_kernel(call.state.dtype, head_regime(call.dims.num_v_heads)))


@DecodeBackend
def gdn_packed_decode(call: DecodeArgs) -> None:
    """One GDN (Gated DeltaNet, Qwen3-Next) decode step with the Helion kernel, in place.

    The KDA kernel and pinned configs with GDN's gate: ``a`` ``[B, HV]``, ``dt_bias`` ``[HV]``
    (``docs/semantics.md``); ``lower_bound`` must be None. Same memory safety as
    :func:`packed_decode`.

    Example:
        >>> # gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, K**-0.5, state, out, indices,
        >>> #                   num_heads=16, use_qk_l2norm=True, lower_bound=None)
    """
    launch.run(call, kernel=_pinned_kernel(call.state.dtype, head_regime(call.dims.num_v_heads)), gdn=True)


def _retune(argv: Sequence[str] | None = None) -> None:
    """Autotune on the current CUDA device and print the config to pin (see module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m kda_kernels.helion_decode", description=_retune.__doc__)
    parser.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--act-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--num-heads", type=int, default=None, help="H (default: HV)")
    parser.add_argument("--num-v-heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128, help="K = V")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--effort", default="full", choices=["quick", "full"])
    args = parser.parse_args(argv)
    _require_helion()
    if not torch.cuda.is_available():
        parser.error("re-tuning benchmarks candidate configs and needs a CUDA GPU")
    state_dtype = getattr(torch, args.state_dtype)
    act = getattr(torch, args.act_dtype)
    HV, D, B = args.num_v_heads, args.head_dim, args.batch
    H = args.num_heads or HV
    dev = torch.device("cuda")
    N = 8 * B  # a pool much larger than the batch, so the state is not L2-resident
    mixed_qkv = torch.randn(B, 2 * H * D + HV * D, device=dev, dtype=act)
    a = torch.randn(B, HV * D, device=dev, dtype=act)
    b = torch.randn(B, HV, device=dev, dtype=act)
    A_log = torch.rand(HV, device=dev).mul(15).add(1).log()
    dt_bias = torch.randn(HV * D, device=dev)
    state = torch.randn(N, HV, D, D, device=dev).mul(0.1).to(state_dtype)
    out = torch.empty(B, 1, HV, D, device=dev, dtype=act)
    indices = torch.randperm(N, device=dev)[:B].to(torch.int32)
    tuner = helion.kernel(_kda_decode_kernel, static_shapes=False, autotune_effort=args.effort)
    found: list[helion.Config] = []

    def autotune(*kernel_args: object) -> None:
        found.append(tuner.autotune(kernel_args, force=True))

    launch(mixed_qkv, a, b, A_log, dt_bias, D**-0.5, state, out, indices,
           num_heads=H, use_qk_l2norm=True, lower_bound=None, kernel=autotune)
    best = dict(found[0])
    # Per-load/per-op lists (indexing, eviction policies) have one entry per memory op of the
    # traced variant, which differs with the gate/l2norm flags: pin only the portable keys.
    portable = {k: best[k] for k in _PORTABLE_CONFIG_KEYS if k in best}
    print(f"# full autotuned config: {found[0]!r}")
    fields = ", ".join(f"{k}={v!r}" for k, v in portable.items())
    print(f"(torch.{args.state_dtype}, {head_regime(HV)!r}): dict({fields}),")


_PORTABLE_CONFIG_KEYS = ("block_sizes", "num_warps", "num_stages", "loop_orders", "pid_type", "l2_groupings")


if __name__ == "__main__":
    _retune()
