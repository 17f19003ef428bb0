"""KDA packed decode as a :class:`kc.Op <kda_contracts.Op>`, in sglang's argument order:
``packed_decode`` (check per the mode, pick a backend, run it; backends ``torch`` — the op's
body —, ``triton``, ``helion``, ``fla``), ``validate_packed_decode`` (check a call) and
``explain_backends`` (which backend ``backend="auto"`` picks, and why). Semantics:
``kernels/INTERFACE.md``; the contract (one variant per state layout) is in :mod:`.contract`.

Example::

    out, state = kc.packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                  use_qk_l2norm_in_kernel=True, config=cfg)
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor

from ..._engine import AnnotationError, Contract, Dims, get_mode, op
from .._packed.calls import dims_on_trust, output_checks, written_by_call
from .._packed.layouts import SYMBOLS, Layout
from . import adapters
from .contract import OPTIONS, VARIANTS, resolve_layout
from .hints import hints_for

assert SYMBOLS == ("B", "H", "HV", "K", "V", "N")


@op(name="packed_decode", namespace="kda_contracts", returns=("out", "initial_state"), after=output_checks,
    written=written_by_call,
    variants={layout: (fn, {"hints": hints_for(layout)}) for layout, fn in VARIANTS.items()},
    variant=resolve_layout, unchecked_dims=dims_on_trust, **OPTIONS)  # type: ignore[arg-type]
def packed_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,  # type: ignore[no-untyped-def]
    use_qk_l2norm_in_kernel=False, lower_bound=None, *, config: Any = None,
    state_layout: Literal["VK", "KV"] | None = None,
):
    """PyTorch reference: vectorised over the batch, every dtype, layout and gate"""
    from kda_kernels.reference import packed_decode as reference

    layout = resolve_layout(config, state_layout)
    d = dims_on_trust(layout, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state)
    reference(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
              num_heads=d[SYMBOLS.index("H")], use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound,
              state_layout=layout)


adapters.bind(packed_decode)
for _ad in adapters.shipped():
    packed_decode.register_backend(_ad, replace=True)
packed_decode.table.plugin_loader = adapters.load_all  # also the older kda_contracts.adapters group


def validate_packed_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None,
    *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None, strict: bool | None = None,
) -> Dims:
    """Check a packed-decode call without running it; return the bound dims B, H, HV, K, V, N.

    Runs whatever the mode; the value checks run with ``strict=True``, or when ``strict`` is
    left unset and the mode in force is ``strict``. Raises a :class:`~kda_contracts.ContractError`
    listing every violation, with fixes.

    Example::

        >>> dims = kc.validate_packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5,
        ...                                  state, out, idx, True, config=cfg)
        >>> dims.H, dims.provenance["H"]
        (32, 'from config (num_heads=32)')
    """
    values = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "scale": scale,
              "initial_state": initial_state, "out": out, "ssm_state_indices": ssm_state_indices,
              "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "lower_bound": lower_bound, "config": config,
              "state_layout": state_layout}
    if strict is None:
        strict = get_mode() == "strict"
    return packed_decode.validate_values(values, strict=strict)


def explain_backends(*args: Any, **kwargs: Any) -> str:
    """Say, for each registered backend, whether ``backend="auto"`` would pick it for this call
    and why (or why not). Validates the call first. An alias of ``kc.packed_decode.explain_backends``.

    Example::

        print(kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx))
    """
    return packed_decode.explain_backends(*args, **kwargs)


def packed_decode_contract(state_layout: Layout = "VK") -> Contract:
    """The compiled packed-decode contract for a state layout (for docs, CLIs and tests).

    Example::

        >>> packed_decode_contract().spec.symbols
        ('B', 'H', 'HV', 'K', 'V', 'N')
    """
    if state_layout not in ("VK", "KV"):
        raise AnnotationError(f"packed_decode_contract: state_layout is 'VK' or 'KV', got {state_layout!r}")
    return packed_decode.contracts[state_layout]
