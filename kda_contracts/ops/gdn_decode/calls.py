"""Random, valid GDN packed-decode calls (re-exported by :mod:`kda_contracts.testing`).

Example::

    call = make_gdn_decode_call(GDNConfig.preset("qwen3-next-80b-a3b", tp_size=2), batch=2, pool=4)
"""

from __future__ import annotations

from typing import Any

import torch

from .._packed.calls import make_decode_call
from .._packed.config import KDAConfig


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
