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

from ... import _engine as kc
from .._packed.calls import dims_on_trust, output_checks, written_by_call
from .._packed.checks import VALUE_RULES, value_checks
from .contract import SYMBOLS, VARIANTS, WHERE, resolve_layout
from .hints import hints_for


# The call shape is KDA's (the gate aside): the same dims on trust, outputs checks and written parts.
@kc.op(name="gdn_packed_decode", namespace="kda_contracts", returns=("out", "initial_state"), after=output_checks,
       written=written_by_call,
       variants={layout: (fn, {"hints": hints_for(layout)}) for layout, fn in VARIANTS.items()},
       variant=resolve_layout, unchecked_dims=dims_on_trust, config_arg="config", where=WHERE,
       bind_first=("initial_state", "mixed_qkv"), value_checks=value_checks,
       value_rules=VALUE_RULES)
def gdn_packed_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,  # type: ignore[no-untyped-def]
    use_qk_l2norm_in_kernel=False, *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None,
):
    """PyTorch reference: vectorised over the batch, every dtype and layout"""
    from kda_kernels.gdn_reference import gdn_packed_decode as reference

    layout = resolve_layout(config, state_layout)
    d = dims_on_trust(layout, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state)
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
