"""Public helpers for tests of code that uses kda-contracts: random, valid calls for each shipped op.

Example::

    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call, make_gdn_decode_call
    call = make_decode_call(kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), batch=2, pool=4)
    out, state = kc.packed_decode(**call, backend="torch")
    gdn = make_gdn_decode_call(kc.GDNConfig.preset("qwen3-next-80b-a3b", tp_size=8), batch=2, pool=4)
    out, state = kc.gdn_packed_decode(**gdn, backend="torch")
"""

from __future__ import annotations

from typing import Any

import torch

from .ops.packed_decode.config import KDAConfig

__all__ = ["make_decode_call", "make_gdn_decode_call"]


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


def make_gdn_decode_call(
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
    """Random, valid GDN packed-decode arguments for one TP rank of ``cfg`` (a ``GDNConfig``):
    :func:`make_decode_call`'s, with GDN's gate (``a`` ``[B, HV]``, ``dt_bias`` ``[HV]``) and no
    ``lower_bound``.

    Example::

        >>> from kda_contracts import GDNConfig
        >>> call = make_gdn_decode_call(GDNConfig.preset("qwen3-next-80b-a3b", tp_size=2), batch=2, pool=4)
        >>> tuple(call["a"].shape), tuple(call["dt_bias"].shape)
        ((2, 16), (16,))
    """
    call = make_decode_call(cfg, batch, pool, activation_dtype=activation_dtype, state_dtype=state_dtype,
                            index_dtype=index_dtype, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    HV = cfg.local_num_v_heads
    call["a"] = torch.randn(batch, HV, generator=g).to(dtype=activation_dtype, device=device)
    call["dt_bias"] = torch.randn(HV, generator=g).to(device=device)
    del call["lower_bound"]
    return call
