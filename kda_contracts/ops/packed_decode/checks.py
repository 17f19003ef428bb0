"""Strict-mode checks of packed decode that read tensor contents (and so may sync the device):
before the kernel, aliasing, index range, duplicate slots and finiteness (:func:`value_checks`,
the contract's ``value_checks``); after it, the promises the outputs must keep
(:func:`check_outputs`). Both skip whatever would sync during CUDA-graph capture.

Example::

    with kc.mode("strict"):
        kc.packed_decode(...)   # runs value_checks before the kernel, check_outputs after it
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...errors import ValueRangeError, Violation, raise_violations
from ...spec import CallContext

__all__ = ["check_outputs", "output_violations", "value_checks"]

_TENSOR_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")


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


def _index_checks(idx: Tensor, n: int) -> list[Violation]:
    out: list[Violation] = []
    if not idx.numel():
        return out
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
    return out


def value_checks(ctx: CallContext) -> list[Violation]:
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
    idx = vals["ssm_state_indices"]
    n = ctx.dims["N"]
    if vals["initial_state"].is_cuda and torch.cuda.is_current_stream_capturing():
        # No sync during CUDA-graph capture: the range check becomes a device-side assert.
        torch._assert_async((idx < n).all(), "ssm_state_indices has an index >= N (the pool size)")
        return out
    out += _index_checks(idx, n)
    if not out:  # the used slots are known good: they must hold finite state before the kernel
        state = vals["initial_state"]
        used = idx[idx >= 0].long()
        if used.numel() and not bool(torch.isfinite(state.index_select(0, used)).all()):
            out.append(Violation(ValueRangeError, "initial_state", "finite values in the slots this call uses",
                                 "NaN or Inf in a used slot",
                                 hint="the state of that request is already corrupt (an earlier step overflowed, "
                                      "or the slot was never initialised); reset the slot before decoding"))
    for name in ("mixed_qkv", "a", "b", "A_log", "dt_bias"):
        t = vals[name]
        if t.numel() and not bool(torch.isfinite(t).all()):
            out.append(Violation(ValueRangeError, name, "finite values", "NaN or Inf present",
                                 hint="find the op that produced it (torch.autograd.detect_anomaly, or "
                                      "check the previous layer's output)"))
    return out


def output_violations(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> list[Violation]:
    """Strict mode, after the kernel: the outputs still meet the contract's promises — finite
    output and updated slots, all-zero rows for padding. Skipped during CUDA-graph capture."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return []
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
    return violations


def check_outputs(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> None:
    """:func:`output_violations`, raised as one report."""
    violations = output_violations(backend, out, state, idx)
    if violations:
        raise_violations(f"packed_decode (after backend {backend!r})", violations, {}, {})
