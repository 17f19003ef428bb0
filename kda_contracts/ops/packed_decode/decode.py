"""The entry points of KDA packed decode, in sglang's argument order: ``validate_packed_decode``
(check a call), ``packed_decode`` (check per the mode, pick a backend, run it) and
``explain_backends`` (which backend ``backend="auto"`` picks, and why). Semantics:
``kernels/INTERFACE.md``; the contract itself is in :mod:`.contract`.

Example::

    out, state = kc.packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                  use_qk_l2norm_in_kernel=True, config=cfg)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from torch import Tensor

from ... import modes
from ...decorator import _outside_compile, eager_value_checks
from ...errors import Violation, raise_violations
from ...spec import Dims
from . import adapters
from .checks import check_outputs
from .contract import CONTRACTS, SYMBOLS, resolve_layout

__all__ = ["decode_call", "explain_backends", "packed_decode", "validate_packed_decode"]

_H = SYMBOLS.index("H")


def validate_packed_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None,
    *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None, strict: bool = False,
) -> Dims:
    """Check a packed-decode call without running it; return the bound dims B, H, HV, K, V, N.

    Runs whatever the mode (``strict=True`` adds the value checks). Raises a
    :class:`~kda_contracts.ContractError` listing every violation, with fixes.

    Example::

        >>> dims = kc.validate_packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5,
        ...                                  state, out, idx, True, config=cfg)
        >>> dims.H, dims.provenance["H"]
        (32, 'from config (num_heads=32)')
    """
    c = CONTRACTS[resolve_layout(config, state_layout)]
    values = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "scale": scale,
              "initial_state": initial_state, "out": out, "ssm_state_indices": ssm_state_indices,
              "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "lower_bound": lower_bound, "config": config}
    return c.validate_values(values, config, strict=strict)


def decode_call(mixed_qkv: Tensor, initial_state: Tensor, ssm_state_indices: Tensor, layout: str,
                lower_bound: float | None, dims: dict[str, int]) -> adapters.DecodeCall:
    """What the backends are told of a validated call (see ``kc.adapters.verdicts``)."""
    return adapters.DecodeCall(
        device_type=initial_state.device.type, state_dtype=initial_state.dtype,
        activation_dtype=mixed_qkv.dtype, index_dtype=ssm_state_indices.dtype, layout=layout,
        gate="softplus" if lower_bound is None else "bounded", dims=dims)


def _dims_unchecked(mixed_qkv: Tensor, initial_state: Tensor, layout: str) -> tuple[int, ...]:
    """The dims of a call taken on trust (mode ``off``), in the contract's symbol order."""
    N, HV = initial_state.shape[0], initial_state.shape[1]
    V, K = (initial_state.shape[2], initial_state.shape[3]) if layout == "VK" else \
        (initial_state.shape[3], initial_state.shape[2])
    found = {"B": mixed_qkv.shape[0], "H": (mixed_qkv.shape[1] - HV * V) // (2 * K), "HV": HV, "K": K, "V": V,
             "N": N}
    return tuple(found[s] for s in SYMBOLS)


_check_outputs = eager_value_checks(check_outputs, "packed_decode")  # strict mode, after the kernel


# -- backend selection, in eager code and under torch.compile -------------------------------------
class _Chosen:
    """A selected backend as compiled code sees it: its name, and ``load()`` giving its kernel,
    as an :class:`~adapters.Adapter` has. The kernel is read from ``_CHOSEN`` by name, because
    a function cannot be a constant of a trace."""

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self) -> Callable[..., None]:
        return _CHOSEN[self.name]


_CHOSEN: dict[str, Callable[..., None]] = {}  # backend name -> kernel, filled when tracing


def _call_of(key: tuple[Any, ...]) -> adapters.DecodeCall:
    """The :class:`DecodeCall` a selection key stands for (no dims when they are None)."""
    _, device_type, state_dtype, activation_dtype, index_dtype, layout, softplus, d = key
    return adapters.DecodeCall(
        device_type=device_type, state_dtype=state_dtype, activation_dtype=activation_dtype,
        index_dtype=index_dtype, layout=layout, gate="softplus" if softplus else "bounded",
        dims={} if d is None else dict(zip(SYMBOLS, d, strict=True)))


def _select(key: tuple[Any, ...], backend: str) -> adapters.Adapter:
    """The backend for a validated call; ``key`` = (backend, device type, state, activation and
    index dtypes, layout, softplus gate?, dims). One dict lookup once the key has been seen."""
    return adapters.select_cached(key, backend, lambda: _call_of(key))


def _select_traced(key: tuple[Any, ...], backend: str) -> _Chosen:
    """What torch.compile traces in place of :func:`_select`: the selection runs once, at trace
    time (:func:`_select_static`), on everything but the dims (which may be dynamic there), so
    compiled code holds no selection cache that dynamo would guard on."""
    return _Chosen(_select_static((*key[:-1], None), backend))


def _select_static_impl(key: tuple[Any, ...], backend: str) -> str:
    call = _call_of(key)
    ranked = [(adapters.get(backend), [])] if backend != "auto" else adapters.verdicts(call)
    for ad, reasons in ranked:
        if reasons:
            continue
        if ad.where:  # never silent: it would be judged on the sizes seen when tracing, run on any
            raise_violations("packed_decode", [Violation(
                adapters.BackendError, "backend", "a backend whose support does not depend on the dims, under "
                "torch.compile", f"{ad.name!r}, which needs {', '.join(ad.where)}",
                hint="call packed_decode outside the compiled region, or pass a backend= without where= constraints")],
                {}, {})
        break
    ad = adapters.select_cached(key, backend, lambda: call)
    _CHOSEN[ad.name] = ad.load()
    return ad.name


_select_static = _outside_compile(_select_static_impl)  # run at trace time, never traced

# dynamo inlines _select_traced wherever compiled code calls _select (its own mechanism for
# inlining compiled functions); eager calls pay nothing for it
_select._torchdynamo_inline = _select_traced  # type: ignore[attr-defined]


def packed_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None,
    *, config: Any = None, backend: str = "auto", state_layout: Literal["VK", "KV"] | None = None,
) -> tuple[Tensor, Tensor]:
    """Drop-in for sglang's packed decode: validate (per the mode), then run a backend.

    Writes ``out`` and the used slots of ``initial_state`` in place and returns those same two
    objects. A rejected call raises before any tensor is touched.

    Example::

        out, state = kc.packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                      use_qk_l2norm_in_kernel=True, config=cfg, backend="torch")
    """
    layout = "VK" if config is None and state_layout is None else resolve_layout(config, state_layout)
    c = CONTRACTS[layout]
    m = c.enter()  # the mode, counting the call (once per trace under torch.compile)
    if m:
        d = c.run_checks((mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                          ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound, config), config, m)
    else:
        d = _dims_unchecked(mixed_qkv, initial_state, layout)
    adapter = _select((backend, initial_state.device.type, initial_state.dtype, mixed_qkv.dtype,
                       ssm_state_indices.dtype, layout, lower_bound is None, d), backend)
    adapter.load()(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   num_heads=d[_H], use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound,
                   state_layout=layout)
    if m == modes.STRICT:
        _check_outputs(adapter.name, out, initial_state, ssm_state_indices)
    return out, initial_state


def explain_backends(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None,
    *, config: Any = None, state_layout: Literal["VK", "KV"] | None = None,
) -> str:
    """Say, for each registered backend, whether ``backend="auto"`` would pick it for this call
    and why (or why not). Validates the call first.

    Example::

        print(kc.explain_backends(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx))
    """
    layout = resolve_layout(config, state_layout)
    dims = validate_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                                  use_qk_l2norm_in_kernel, lower_bound, config=config, state_layout=layout)
    call = decode_call(mixed_qkv, initial_state, ssm_state_indices, layout, lower_bound, dict(dims))
    lines, chosen = [], None
    for ad, reasons in adapters.verdicts(call):
        if not reasons and chosen is None:
            chosen = ad.name
            lines.append(f"{ad.name:>8}: chosen (priority {ad.priority}, the highest that supports this call)")
        elif not reasons:
            lines.append(f"{ad.name:>8}: supports this call, but {chosen} has a higher priority")
        else:
            lines.append(f"{ad.name:>8}: not chosen: {'; '.join(reasons)}")
    return "\n".join(lines)
