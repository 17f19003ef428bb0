"""GDN (Gated DeltaNet, Qwen3-Next) packed decode as a ``kc.op``, in sglang's argument order:
``gdn_packed_decode`` (check per the mode, pick a backend, run it; backend ``torch`` is the op's
body — kernels register with ``gdn_packed_decode.backend(...)`` / ``register_backend``) and
``validate_gdn_packed_decode`` (check a call, return its bound dims).

Example::

    cfg = kc.GDNConfig.preset("qwen3-next-80b-a3b", tp_size=2)
    out, state = kc.gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                      True, config=cfg)
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor

import kda_contracts as kc

from ..packed_decode.checks import output_violations, value_checks
from .contract import SYMBOLS, VARIANTS, WHERE, resolve_layout
from .hints import hints_for

__all__ = ["gdn_packed_decode", "validate_gdn_packed_decode"]


def _dims_unchecked(layout: str, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                    scale: float, initial_state: Tensor, *rest: Any) -> tuple[int, ...]:
    """The dims of a call taken on trust (mode ``off``), in SYMBOLS order (B, H, HV, K, V, N)."""
    N, HV, X, Y = initial_state.shape
    V, K = (X, Y) if layout == "VK" else (Y, X)
    B, W = mixed_qkv.shape
    return B, (W - HV * V) // (2 * K), HV, K, V, N


assert SYMBOLS == ("B", "H", "HV", "K", "V", "N")


def _after(ctx: Any, backend: str) -> list:
    v = ctx.values
    return output_violations(backend, v["out"], v["initial_state"], v["ssm_state_indices"])


def _written(ctx: Any) -> dict[str, Any]:
    """All of ``out`` and the pool slots the valid indices name."""
    idx = ctx.values["ssm_state_indices"]
    return {"out": None, "initial_state": idx[(idx >= 0) & (idx < ctx.dims["N"])]}


@kc.op(name="gdn_packed_decode", namespace="kda_contracts", returns=("out", "initial_state"), after=_after,
       written=_written, variants={layout: (fn, {"hints": hints_for(layout)}) for layout, fn in VARIANTS.items()},
       variant=resolve_layout, unchecked_dims=_dims_unchecked, config_arg="config", where=WHERE,
       bind_first=("initial_state", "mixed_qkv"), value_checks=value_checks)
def gdn_packed_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,  # type: ignore[no-untyped-def]
    use_qk_l2norm_in_kernel=False, *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None,
):
    """PyTorch reference: vectorised over the batch, every dtype and layout"""
    from kda_kernels.gdn_reference import gdn_packed_decode as reference

    layout = resolve_layout(config, state_layout)
    d = _dims_unchecked(layout, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state)
    reference(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
              num_heads=d[SYMBOLS.index("H")], use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout=layout)


def validate_gdn_packed_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor, use_qk_l2norm_in_kernel: bool = False,
    *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None, strict: bool | None = None,
) -> kc.Dims:
    """Check a GDN packed-decode call without running it; return the bound dims B, H, HV, K, V, N.

    The value checks (index range, duplicate slots, finiteness) run with ``strict=True``, or when
    ``strict`` is unset and the mode in force is ``strict``. Raises a ContractError listing every
    violation, with fixes.

    Example::

        >>> dims = kc.validate_gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5,
        ...                                      state, out, idx, True, config=cfg)
        >>> dims.H, dims.HV
        (16, 32)
    """
    values = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "scale": scale,
              "initial_state": initial_state, "out": out, "ssm_state_indices": ssm_state_indices,
              "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "config": config, "state_layout": state_layout}
    if strict is None:
        strict = kc.get_mode() == "strict"
    return gdn_packed_decode.validate_values(values, strict=strict)
