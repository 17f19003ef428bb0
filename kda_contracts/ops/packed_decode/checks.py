"""Strict-mode checks of packed decode that read tensor contents (and so may sync the device):
before the kernel, aliasing, index range, duplicate slots and finiteness (:func:`value_checks`,
the contract's ``value_checks``); after it, the promises the outputs must keep
(:func:`check_outputs`). Both skip whatever would sync during CUDA-graph capture, and skip with a
:class:`~kda_contracts.memory.ValueChecksSkipped` warning for tensors that hold no data (meta,
FakeTensorMode).

Aliasing (:func:`kda_contracts.memory.alias_violations`, exact, by address, across storages): the
call writes ``out`` whole and the pool's *used* slots (``ssm_state_indices`` in ``[0, N)``). So
``out`` must share no byte with any other argument, the pool's unused slots included (writing it
would change them); an input may lie in an unused slot (the kernel neither reads nor writes it)
but not in a used one. During CUDA-graph capture the slots cannot be read: only ``out`` is checked.

Value checks read each broadcast (stride-0) value once (:func:`kda_contracts.memory.all_finite`),
so an ``.expand()``-ed activation of any logical size costs what it occupies.

Example::

    with kc.mode("strict"):
        kc.packed_decode(...)   # runs value_checks before the kernel, check_outputs after it
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...errors import ValueRangeError, Violation, raise_violations
from ...memory import all_finite, skip_value_checks, without_data
from ...spec import CallContext

__all__ = ["check_outputs", "output_violations", "value_checks"]

_TENSOR_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")


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
    blind = without_data({name: vals[name] for name in _TENSOR_ARGS})
    if blind:  # shapes without data (meta tensors, FakeTensorMode)
        skip_value_checks("packed_decode", blind)
        return []
    idx = vals["ssm_state_indices"]
    n = ctx.dims["N"]
    if vals["initial_state"].is_cuda and torch.cuda.is_current_stream_capturing():
        # No sync during CUDA-graph capture: the range check becomes a device-side assert.
        torch._assert_async((idx < n).all(), "ssm_state_indices has an index >= N (the pool size)")
        return []
    # (aliasing: the op's own check, from what it writes — see decode._written)
    out = _index_checks(idx, n)
    if not out:  # the used slots are known good: they must hold finite state before the kernel
        state = vals["initial_state"]
        used = idx[idx >= 0].long()
        if used.numel() and not bool(torch.isfinite(state.index_select(0, used)).all()):
            out.append(Violation(ValueRangeError, "initial_state", "finite values in the slots this call uses",
                                 "NaN or Inf in a used slot",
                                 hint="the state of that request is already corrupt (an earlier step overflowed, "
                                      "or the slot was never initialised); reset the slot before decoding"))
    for name in ("mixed_qkv", "a", "b", "A_log", "dt_bias"):
        if not all_finite(vals[name]):
            out.append(Violation(ValueRangeError, name, "finite values", "NaN or Inf present",
                                 hint="find the op that produced it (torch.autograd.detect_anomaly, or "
                                      "check the previous layer's output)"))
    return out


def output_violations(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> list[Violation]:
    """Strict mode, after the kernel: the outputs still meet the contract's promises — finite
    output and updated slots, all-zero rows for padding. Skipped during CUDA-graph capture."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return []
    blind = without_data({"out": out, "initial_state": state, "ssm_state_indices": idx})
    if blind:
        skip_value_checks(f"packed_decode (after backend {backend!r})", blind)
        return []
    n = state.shape[0]
    live = (idx >= 0) & (idx < n)
    violations = []
    if not all_finite(out):
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if bool((~live).any()) and bool(out[~live].ne(0).any()):
        violations.append(Violation(ValueRangeError, "out", "zero rows for padding and out-of-range indices",
                                    "non-zero rows", hint=f"backend {backend!r} broke the padding rule"))
    slots = idx[live].long()
    if slots.numel() and not all_finite(state[slots]):
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    return violations


def check_outputs(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> None:
    """:func:`output_violations`, raised as one report."""
    violations = output_violations(backend, out, state, idx)
    if violations:
        raise_violations(f"packed_decode (after backend {backend!r})", violations, {}, {})
