"""What a packed decode call is, shared by the packed ops: its dims taken on trust in mode ``off``
(:func:`dims_on_trust`), what it writes (:func:`written_by_call`, for strict mode's transaction),
its after-kernel checks (:func:`output_checks`), and random valid calls for tests
(:func:`make_decode_call`, re-exported by :mod:`kda_contracts.testing`).

Example::

    call = make_decode_call(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), batch=2, pool=4)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._engine import CallContext
from .checks import output_violations
from .config import KDAConfig


def dims_on_trust(layout: str, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                    scale: float, initial_state: Tensor, *rest: Any) -> tuple[int, ...]:
    """The dims of a call taken on trust (mode ``off``), in the contract's symbol order
    (B, H, HV, K, V, N). B is the number of indices (``rest[1]``, as the kernel interface defines
    it: a kernel handed these dims launches B requests), else the rows of ``mixed_qkv``."""
    N, HV, X, Y = initial_state.shape
    V, K = (X, Y) if layout == "VK" else (Y, X)
    W = mixed_qkv.shape[-1]
    B = rest[1].shape[0] if len(rest) > 1 else mixed_qkv.shape[0]
    return B, (W - HV * V) // (2 * K), HV, K, V, N


def output_checks(ctx: CallContext, backend: str) -> list:
    """Strict mode, after the kernel: finite output and updated slots, all-zero output rows for
    padding and out-of-range indices (skipped during CUDA-graph capture)."""
    v = ctx.values
    return output_violations(backend, v["out"], v["initial_state"], v["ssm_state_indices"], _host_indices(ctx),
                             op=ctx.spec.name)


def _host_indices(ctx: CallContext) -> list[int] | Tensor | None:
    """The host copy of the indices strict mode's one read brought back (None: not read)."""
    host = ctx.memo.get("host")
    return host.get("ssm_state_indices") if host else None


def written_by_call(ctx: CallContext) -> dict[str, Any]:
    """What a call writes: all of ``out``, and the pool slots its valid indices name (strict mode
    copies just these before the kernel, and restores them if the call is rejected after it)."""
    idx = ctx.values["ssm_state_indices"]
    n = ctx.dims["N"]
    host = _host_indices(ctx)  # what the value rules read in their one sync
    if isinstance(host, Tensor):
        return {"out": None, "initial_state": host[(host >= 0) & (host < n)]}
    if host is not None:
        return {"out": None, "initial_state": torch.tensor([i for i in host if 0 <= i < n], dtype=torch.long)}
    if idx.is_cuda and torch.cuda.is_current_stream_capturing():
        return {"out": None}  # the used slots cannot be read without a sync while capturing
    return {"out": None, "initial_state": idx[(idx >= 0) & (idx < n)]}


def make_decode_call(
    cfg: KDAConfig,
    batch: int,
    pool: int,
    *,
    activation_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """Random, valid packed-decode arguments for one TP rank of ``cfg`` (by name, sglang order).

    Example::

        >>> call = make_decode_call(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), batch=2, pool=4)
        >>> tuple(call["initial_state"].shape)
        (4, 4, 128, 128)
    """
    g = torch.Generator().manual_seed(seed)
    H, HV, K, V = cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v

    def rnd(*shape: int, dtype: torch.dtype = activation_dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    state_shape = (pool, HV, V, K) if cfg.state_layout == "VK" else (pool, HV, K, V)
    return {
        "mixed_qkv": rnd(batch, 2 * H * K + HV * V),
        "a": rnd(batch, HV * K),
        "b": rnd(batch, HV),
        "A_log": rnd(HV, dtype=torch.float32),
        "dt_bias": rnd(HV * K, dtype=torch.float32),
        "scale": cfg.scale,
        "initial_state": (0.1 * rnd(*state_shape, dtype=torch.float32)).to(state_dtype),
        "out": torch.zeros(batch, 1, HV, V, dtype=activation_dtype, device=device),
        "ssm_state_indices": torch.randperm(pool, generator=g)[:batch].to(dtype=index_dtype, device=device),
        "use_qk_l2norm_in_kernel": cfg.use_qk_l2norm,
        "lower_bound": cfg.effective_lower_bound,
    }
