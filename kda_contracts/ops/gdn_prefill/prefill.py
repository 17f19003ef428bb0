"""GDN (Gated DeltaNet, Qwen3-Next) packed (varlen) prefill as a ``kc.op``: ``gdn_packed_prefill``
(backends ``torch`` — the op's body, the chunked reference —, ``loop``, the token loop, and ``fla``,
flash-linear-attention's ``chunk_gated_delta_rule`` on CUDA) and ``validate_gdn_packed_prefill``. KDA's
prefill call but for the gate: ``a [T, HV]``, ``dt_bias [HV]``, no ``lower_bound``; beta rounded to
``b``'s dtype, as in GDN decode. ``docs/prefill.md`` describes it.

Example::

    out, state = kc.gdn_packed_prefill(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, cu_seqlens, slots,
                                       has_initial_state, True, config=cfg)
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor

from ..._engine import Dims, get_mode, op
from .._packed.calls import written_by_call
from .._packed.hints import hint_kda_config
from .._packed.layouts import layout_resolver
from .._packed.prefill import PREFILL_SYMBOLS, PREFILL_WHERE, prefill_dims_on_trust, prefill_signatures
from .._packed.prefill_checks import PREFILL_VALUE_RULES, prefill_output_checks, prefill_value_checks
from .._packed.prefill_hints import prefill_hints

resolve_layout = layout_resolver("gdn_packed_prefill")
VARIANTS = prefill_signatures("gdn_packed_prefill", gate_per_head=True)


@op(name="gdn_packed_prefill", namespace="kda_contracts", returns=("out", "initial_state"),
    after=prefill_output_checks, written=written_by_call,
    variants={layout: (fn, {"hints": (hint_kda_config, *prefill_hints())}) for layout, fn in VARIANTS.items()},
    variant=resolve_layout, unchecked_dims=prefill_dims_on_trust, config_arg="config", where=PREFILL_WHERE,
    bind_first=("initial_state", "mixed_qkv"), value_checks=prefill_value_checks,
    value_rules=PREFILL_VALUE_RULES)
def gdn_packed_prefill(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens,  # type: ignore[no-untyped-def]
    ssm_state_indices, has_initial_state, use_qk_l2norm_in_kernel=False, *, config: Any = None,
    state_layout: Literal["VK", "KV"] | None = None,
):
    """PyTorch reference: the chunked (WY) form, 64-token chunks, fp32 state along the sequence"""
    from kda_kernels.prefill_reference import gdn_packed_prefill as reference

    layout = resolve_layout(config, state_layout)
    d = prefill_dims_on_trust(layout, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens,
                              ssm_state_indices)
    reference(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens, ssm_state_indices,
              has_initial_state, num_heads=d[PREFILL_SYMBOLS.index("H")], use_qk_l2norm=use_qk_l2norm_in_kernel,
              state_layout=layout)


def validate_gdn_packed_prefill(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float, initial_state: Tensor,
    out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor, has_initial_state: Tensor,
    use_qk_l2norm_in_kernel: bool = False, *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None,
    strict: bool | None = None,
) -> Dims:
    """Check a GDN packed-prefill call without running it; return the bound dims T, H, HV, K, V, N, B
    (value checks with ``strict=True``, or unset under mode ``strict``).

    Example::

        dims = kc.validate_gdn_packed_prefill(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, cu_seqlens,
                                              slots, has_initial_state, True, config=cfg)
    """
    values = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "scale": scale,
              "initial_state": initial_state, "out": out, "cu_seqlens": cu_seqlens,
              "ssm_state_indices": ssm_state_indices, "has_initial_state": has_initial_state,
              "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "config": config, "state_layout": state_layout}
    return gdn_packed_prefill.validate_values(values, strict=get_mode() == "strict" if strict is None else strict)
