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

import torch
from torch import Tensor

from ..._engine import CallContext, Dims, op
from . import adapters
from .checks import output_violations
from .contract import OPTIONS, SYMBOLS, VARIANTS, resolve_layout
from .hints import hints_for

__all__ = ["dims_on_trust", "explain_backends", "output_checks", "packed_decode", "validate_packed_decode",
           "written_by_call"]


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


assert SYMBOLS == ("B", "H", "HV", "K", "V", "N")


def output_checks(ctx: CallContext, backend: str) -> list:
    """Strict mode, after the kernel: finite output and updated slots, all-zero output rows for
    padding and out-of-range indices (skipped during CUDA-graph capture)."""
    v = ctx.values
    return output_violations(backend, v["out"], v["initial_state"], v["ssm_state_indices"], ctx.memo.get("indices"),
                             op=ctx.spec.name)


def written_by_call(ctx: CallContext) -> dict[str, Any]:
    """What a call writes: all of ``out``, and the pool slots its valid indices name (strict mode
    copies just these before the kernel, and restores them if the call is rejected after it)."""
    idx = ctx.values["ssm_state_indices"]
    n = ctx.dims["N"]
    host = ctx.memo.get("indices")  # what the value checks read in their one sync
    if isinstance(host, Tensor):
        return {"out": None, "initial_state": host[(host >= 0) & (host < n)]}
    if host is not None:
        return {"out": None, "initial_state": torch.tensor([i for i in host if 0 <= i < n], dtype=torch.long)}
    if idx.is_cuda and torch.cuda.is_current_stream_capturing():
        return {"out": None}  # the used slots cannot be read without a sync while capturing
    return {"out": None, "initial_state": idx[(idx >= 0) & (idx < n)]}


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
    from ..._engine import modes

    values = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "scale": scale,
              "initial_state": initial_state, "out": out, "ssm_state_indices": ssm_state_indices,
              "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "lower_bound": lower_bound, "config": config,
              "state_layout": state_layout}
    if strict is None:
        strict = modes.current_mode() == modes.STRICT
    return packed_decode.validate_values(values, strict=strict)


def explain_backends(*args: Any, **kwargs: Any) -> str:
    """Say, for each registered backend, whether ``backend="auto"`` would pick it for this call
    and why (or why not). Validates the call first. An alias of ``kc.packed_decode.explain_backends``.

    Example::

        print(kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx))
    """
    return packed_decode.explain_backends(*args, **kwargs)
