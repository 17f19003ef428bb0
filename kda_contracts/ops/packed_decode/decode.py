"""The KDA packed-decode contract and its entry points, ``validate_packed_decode`` and
``packed_decode`` (sglang's argument order; see ``shared/SPEC-kda-decode.md``).

The contract is written once, as annotations, for each state layout (the layout cannot be told
from shapes when K == V, so it is declared, never guessed). Everything else — binding H from
the width of ``mixed_qkv``, agreement with a ``KDAConfig``, the error report — is the engine's.
"""

# No `from __future__ import annotations` here: the contract annotations below are built from
# local values and must be evaluated when the functions are defined.

from collections.abc import Callable
from typing import Annotated, Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ... import modes
from ...decorator import Contract, register_contract
from ...errors import (
    LayoutError,
    ShapeError,
    ValueRangeError,
    Violation,
    raise_violations,
)
from ...facts import DtypeMismatch, LayoutBroken, RankMismatch, Unsolvable
from ...markers import MatchConfig, Range, Spec, Where, config_dim_source, config_dims
from ...spec import CallContext, Dims, build_spec
from . import adapters

__all__ = ["PACKED_DECODE_ARGS", "decode_call", "explain_backends", "packed_decode", "packed_decode_contract",
           "resolve_layout", "validate_packed_decode"]

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)

PACKED_DECODE_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
                      "ssm_state_indices", "use_qk_l2norm_in_kernel", "lower_bound")
_TENSOR_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")

_WHERE = (
    Where("HV % H == 0", hint="value heads HV must be a multiple of the q/k heads H (each q/k head serves "
          "HV/H value heads); check num_heads/num_v_heads and the width of mixed_qkv"),
    Where("HV >= 1"), Where("K >= 1"), Where("V >= 1"),
    Where("N >= 1", hint="the state pool has no slots"),
)


def _make_signature(layout: str) -> Callable[..., Any]:
    state_dims = "N HV V K" if layout == "VK" else "N HV K V"

    def packed_decode(
        mixed_qkv: Annotated[Float[Tensor, "B 2*H*K+HV*V"],
                             Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        a: Annotated[Float[Tensor, "B HV*K"],
                     Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        b: Annotated[Float[Tensor, "B HV"],
                     Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        A_log: Annotated[Float[Tensor, "HV"], Spec(dtypes=(torch.float32,), contiguous=True)],
        dt_bias: Annotated[Float[Tensor, "HV*K"], Spec(dtypes=(torch.float32,), contiguous=True)],
        scale: Annotated[float, Range(gt=0), MatchConfig("scale", rel_tol=1e-6)],
        initial_state: Annotated[Float[Tensor, state_dims],
                                 Spec(dtypes=STATE_DTYPES, inner_contiguous=3, config_dtype="state", disjoint=True)],
        out: Annotated[Float[Tensor, "B 1 HV V"],
                       Spec(dtypes=ACTIVATION_DTYPES, contiguous=True, same_dtype_as="mixed_qkv")],
        ssm_state_indices: Annotated[Int[Tensor, "B"],
                                     Spec(dtypes=INDEX_DTYPES, config_dtype="index", contiguous=True)],
        use_qk_l2norm_in_kernel: Annotated[bool, MatchConfig("use_qk_l2norm")] = False,
        lower_bound: Annotated[float | None, Range(lt=0), MatchConfig("effective_lower_bound")] = None,
        config: Any = None,
    ) -> None:
        """KDA packed decode."""

    packed_decode.__qualname__ = "packed_decode"
    return packed_decode


# -- hints for the mistakes SPEC-kda-decode.md lists -----------------------------------------------
def _shape(ctx: CallContext, name: str) -> tuple[int, ...] | None:
    t = ctx.values.get(name)
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def _layout_of(ctx: CallContext) -> str:
    return "KV" if "N HV K V" in ctx.spec.tensors["initial_state"].dim_str else "VK"


def _hint_unflattened(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or v.argument not in ("a", "dt_bias") or rank is None:
        return None
    shape = rank.shape
    if v.argument == "a" and len(shape) == 3:
        return (f"`a` looks unflattened ([B, HV, K] = {list(shape)}); the kernel indexes it as hv*K + k: pass "
                "a.flatten(1) (or a.reshape(B, HV*K))")
    if v.argument == "dt_bias" and len(shape) == 2:
        return f"`dt_bias` looks unflattened ([HV, K] = {list(shape)}); pass dt_bias.flatten()"
    return None


def _swapped_layout_fits(ctx: CallContext) -> bool:
    """Would the call be consistent if the state's last two dims meant the other layout?"""
    st, a, out, m = (_shape(ctx, n) for n in ("initial_state", "a", "out", "mixed_qkv"))
    if st is None or a is None or out is None or m is None or len(st) != 4 or len(a) != 2 or len(out) != 4 \
            or len(m) != 2:
        return False
    hv = st[1]
    declared = _layout_of(ctx)
    # the other layout: VK declared but KV given means K = st[2], V = st[3]
    k, v = (st[2], st[3]) if declared == "VK" else (st[3], st[2])
    if k == v or k < 1:
        return False
    fits = a[1] == hv * k and out[3] == v and (m[1] - hv * v) > 0 and (m[1] - hv * v) % (2 * k) == 0
    if ctx.config is not None:
        cd = config_dims(ctx.config)  # any config: a KDAConfig or a plain pydantic model
        fits = fits and cd.get("K", k) == k and cd.get("V", v) == v
    return fits


def _hint_layout(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is not ShapeError or v.argument not in ("initial_state", "a", "out", "mixed_qkv", "dt_bias"):
        return None
    first = next((x for x in ctx.violations if x.kind is ShapeError
                  and x.argument in ("initial_state", "a", "out", "mixed_qkv", "dt_bias")), None)
    if first is not v or not _swapped_layout_fits(ctx):
        return None
    declared = _layout_of(ctx)
    other = "KV" if declared == "VK" else "VK"
    given = "[N, HV, K, V]" if other == "KV" else "[N, HV, V, K]"
    return (f"initial_state looks like a {other}-layout pool {given}, but this call declares {declared}; "
            f"declare it (KDAConfig(state_layout={other!r}) or state_layout={other!r}) or convert the pool with "
            f"initial_state.transpose(-1, -2).contiguous() (a bare transpose view breaks the slot strides)")


def _implied_tp(ctx: CallContext) -> tuple[str, str, int, int, int] | None:
    """If a tensor carries a per-rank head count that another TP degree explains, say which:
    (argument, symbol, heads it carries, heads the config expects, implied tp_size)."""
    cfg = ctx.config
    tp = getattr(cfg, "tp_size", None)
    if tp is None:
        return None
    cfg_dims = config_dims(cfg)
    for name in sorted(ctx.spec.tensors, key=lambda n: n != "initial_state"):  # name the pool first
        tparam = ctx.spec.tensors[name]
        shape = _shape(ctx, name)
        if shape is None or len(shape) != tparam.rank:
            continue
        for axis, d in enumerate(tparam.dims):
            sym = str(d)
            if sym in ("H", "HV") and sym in cfg_dims and shape[axis] != cfg_dims[sym] and shape[axis] > 0:
                total = cfg_dims[sym] * tp
                if total % shape[axis] == 0:
                    return name, sym, shape[axis], cfg_dims[sym], total // shape[axis]
    return None


def _hint_tp(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is not ShapeError:
        return None
    first = next((x for x in ctx.violations if x.kind is ShapeError), None)
    found = _implied_tp(ctx) if first is v else None
    if found is None:
        return None
    name, sym, got, want, implied = found
    tp = ctx.config.tp_size
    return (f"{name} carries {sym}={got} heads but the config expects {want} per rank "
            f"({config_dim_source(ctx.config, sym)}): the tensors look sharded for tp_size={implied}, the config "
            f"for tp_size={tp}. Build the config with tp_size={implied} (KDAConfig.from_hf_config(path, "
            f"tp_size={implied})) or shard the weights and pools for tp_size={tp}; the other shape violations "
            "follow from this one")


def _hint_width(v: Violation, ctx: CallContext) -> str | None:
    unsolved = v.fact(Unsolvable)
    if v.argument != "mixed_qkv" or v.kind is not ShapeError or unsolved is None or unsolved.symbol != "H":
        return None
    return ("mixed_qkv must be exactly [q heads | k heads | v heads] = 2*H*K + HV*V columns; if it still "
            "carries other projections (gate, beta), slice them off; if q, k, v are separate, torch.cat them on "
            "dim 1; check that HV, V, K (from the state) belong to this layer and TP rank")


def _hint_index_dtype(v: Violation, ctx: CallContext) -> str | None:
    if v.argument == "ssm_state_indices" and v.kind.kind_name == "DtypeError":
        fact = v.fact(DtypeMismatch)
        if fact is not None and len(fact.allowed) == 1:
            (dt,) = fact.allowed
            return (f"cast the indices once when you build the batch metadata: ssm_state_indices.to({dt}) "
                    "(the config pins the index dtype the kernels were built for)")
    return None


def _hint_state_strides(v: Violation, ctx: CallContext) -> str | None:
    layout = v.fact(LayoutBroken)
    if v.argument == "initial_state" and layout is not None and layout.rule == "disjoint":
        return ("the pool's slots overlap (an .expand()ed pool, or a slot stride smaller than a slot): two "
                "requests would update the same memory and race; allocate one dense slot per index, e.g. "
                "torch.empty(N, HV, V, K)")
    if v.argument == "initial_state" and v.kind is LayoutError:
        return ("each state slot [HV, V, K] must be dense (the pool's slot stride may be anything): a pool made "
                "by .transpose() or by slicing inside a slot is not; allocate it densely or pass "
                "initial_state.contiguous() and copy the result back")
    return None


_HINTS = (_hint_unflattened, _hint_layout, _hint_tp, _hint_width, _hint_index_dtype, _hint_state_strides)


# -- strict mode -----------------------------------------------------------------------------------
def _overlaps(x: Tensor, y: Tensor) -> bool:
    if x.device != y.device or x.numel() == 0 or y.numel() == 0:
        return False
    xs, ys = x.untyped_storage(), y.untyped_storage()
    if xs.data_ptr() != ys.data_ptr():
        return False
    def span(t: Tensor) -> tuple[int, int]:
        lo = int(t.storage_offset())
        hi = lo + sum((int(s) - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
        return lo * t.element_size(), (hi + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(x), span(y)
    return a0 < b1 and b0 < a1


def _value_checks(ctx: CallContext) -> list[Violation]:
    """Strict mode: the checks that read tensor contents (and so may sync the device)."""
    vals = ctx.values
    out: list[Violation] = []
    if vals["initial_state"].is_meta:  # shapes without data (all tensors share the device here)
        return out
    out_t = vals["out"]
    for name in _TENSOR_ARGS:
        if name != "out" and _overlaps(out_t, vals[name]):
            out.append(Violation(ValueRangeError, "out", f"a buffer of its own (not overlapping {name})",
                                 f"overlaps {name}", hint=f"allocate out separately from {name}"))
    capturing = vals["initial_state"].is_cuda and torch.cuda.is_current_stream_capturing()
    idx = vals["ssm_state_indices"]
    n = ctx.dims["N"]
    if capturing:
        # No sync during CUDA-graph capture: the range check becomes a device-side assert.
        torch._assert_async((idx < n).all(), "ssm_state_indices has an index >= N (the pool size)")
        return out
    if idx.numel():
        hi = int(idx.max())
        if hi >= n:
            bad = int((idx >= n).sum())
            out.append(Violation(ValueRangeError, "ssm_state_indices", f"< N={n} (or < 0 for padding)",
                                 f"{bad} index(es) >= {n} (max {hi})",
                                 hint="an index past the pool would read and write another request's memory; "
                                      "check the slot allocator and the pool this layer uses"))
        live = idx[idx >= 0]
        if live.numel() != torch.unique(live).numel():
            dup = live.numel() - torch.unique(live).numel()
            out.append(Violation(ValueRangeError, "ssm_state_indices", "distinct non-negative slots",
                                 f"{dup} duplicate slot(s)",
                                 hint="two requests on one slot race on its state (a lost update); give each "
                                      "request its own slot, mark padding with -1"))
    for name in ("mixed_qkv", "a", "b", "A_log", "dt_bias"):
        t = vals[name]
        if t.numel() and not bool(torch.isfinite(t).all()):
            out.append(Violation(ValueRangeError, name, "finite values", "NaN or Inf present",
                                 hint="find the op that produced it (torch.autograd.detect_anomaly, or "
                                      "check the previous layer's output)"))
    return out


def _build(layout: str) -> Contract:
    fn = _make_signature(layout)
    spec = build_spec(fn, name="packed_decode", config_arg="config", where=_WHERE,
                      bind_first=("initial_state", "mixed_qkv"), hints=_HINTS, value_checks=_value_checks)
    return register_contract(f"packed_decode[{layout}]", Contract(spec, fn))


_CONTRACTS: dict[str, Contract] = {"VK": _build("VK"), "KV": _build("KV")}


def packed_decode_contract(state_layout: Literal["VK", "KV"] = "VK") -> Contract:
    """The compiled packed-decode contract for a state layout (for docs, CLIs and tests)."""
    return _CONTRACTS[state_layout]


def resolve_layout(config: Any, state_layout: str | None) -> str:
    """The declared state layout of a call: ``state_layout=``, else the config's, else "VK"; a
    keyword that contradicts the config is a LayoutError."""
    cfg_layout = getattr(config, "state_layout", None)
    if state_layout is None:
        return cfg_layout or "VK"
    if state_layout not in _CONTRACTS:
        raise ValueError(f"state_layout must be 'VK' or 'KV', got {state_layout!r}")
    if cfg_layout is not None and cfg_layout != state_layout:
        raise_violations("packed_decode", [Violation(
            LayoutError, "state_layout", f"{cfg_layout!r} (config state_layout)", repr(state_layout),
            hint="pass one source of truth: drop state_layout= or fix the config")], {}, {})
    return state_layout


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
    c = _CONTRACTS[resolve_layout(config, state_layout)]
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


_SYMBOLS = _CONTRACTS["VK"].spec.symbols  # the same for both layouts
assert _SYMBOLS == _CONTRACTS["KV"].spec.symbols
_H = _SYMBOLS.index("H")


def _dims_unchecked(mixed_qkv: Tensor, initial_state: Tensor, layout: str) -> tuple[int, ...]:
    """The dims of a call taken on trust (mode ``off``), in the contract's symbol order."""
    N, HV = initial_state.shape[0], initial_state.shape[1]
    V, K = (initial_state.shape[2], initial_state.shape[3]) if layout == "VK" else \
        (initial_state.shape[3], initial_state.shape[2])
    found = {"B": mixed_qkv.shape[0], "H": (mixed_qkv.shape[1] - HV * V) // (2 * K), "HV": HV, "K": K, "V": V,
             "N": N}
    return tuple(found[s] for s in _SYMBOLS)


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
    m = modes.current_mode()
    if m:
        d = _CONTRACTS[layout].enforce((mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                        ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound, config), config, m)
    else:
        d = _dims_unchecked(mixed_qkv, initial_state, layout)
    key = (backend, initial_state.device.type, initial_state.dtype, mixed_qkv.dtype, ssm_state_indices.dtype,
           layout, lower_bound is None, d)
    adapter = adapters.select_cached(key, backend, lambda: decode_call(
        mixed_qkv, initial_state, ssm_state_indices, layout, lower_bound, dict(zip(_SYMBOLS, d, strict=True))))
    adapter.load()(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   num_heads=d[_H], use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound,
                   state_layout=layout)
    if m == modes.STRICT:
        _check_outputs(adapter.name, out, initial_state, ssm_state_indices)
    return out, initial_state


def _check_outputs(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> None:
    """Strict mode, after the kernel: the outputs still meet the contract's promises — finite
    output and updated slots, all-zero rows for padding. Skipped during CUDA-graph capture."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    n = state.shape[0]
    live = (idx >= 0) & (idx < n)
    violations = []
    if out.numel() and not bool(torch.isfinite(out).all()):
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if bool((~live).any()) and bool(out[~live].ne(0).any()):
        violations.append(Violation(ValueRangeError, "out", "zero rows for padding and out-of-range indices",
                                    "non-zero rows", hint=f"backend {backend!r} broke the padding rule"))
    slots = idx[live].long()
    if slots.numel() and not bool(torch.isfinite(state[slots]).all()):
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    if violations:
        raise_violations(f"packed_decode (after backend {backend!r})", violations, {}, {})


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
    layout: Literal["VK", "KV"] = resolve_layout(config, state_layout)  # type: ignore[assignment]
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

