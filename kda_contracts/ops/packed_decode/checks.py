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
from ...memory import FINITE_CHUNK, finite_flag, skip_value_checks, without_data
from ...spec import CallContext

__all__ = ["check_outputs", "output_violations", "slots_finite", "value_checks"]

_TENSOR_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")


def _index_checks(idx: list[int], n: int) -> list[Violation]:
    """The range and duplicate checks, on the host copy of the indices."""
    out: list[Violation] = []
    if not idx:
        return out
    hi = max(idx)
    if hi >= n:
        bad = sum(1 for i in idx if i >= n)
        out.append(Violation(ValueRangeError, "ssm_state_indices", f"< N={n} (or < 0 for padding)",
                             f"{bad} index(es) >= {n} (max {hi})",
                             hint="an index past the pool would read and write another request's memory; "
                                  "check the slot allocator and the pool this layer uses"))
    live = [i for i in idx if i >= 0]
    dup = len(live) - len(set(live))
    if dup:
        out.append(Violation(ValueRangeError, "ssm_state_indices", "distinct non-negative slots",
                             f"{dup} duplicate slot(s)",
                             hint="two requests on one slot race on its state (a lost update); give each "
                                  "request its own slot, mark padding with -1"))
    return out


def _finite_rows(x: Tensor) -> Tensor:
    """``[rows]`` bool: whether each row (dim 0) of ``x`` is all finite. For 16- and 32-bit floats,
    by a float64 sum per row: finite exactly when every element is (a NaN or an infinity
    propagates; |x| < 2^128 cannot overflow a float64 sum), and no mask of ``x``'s size is made."""
    if x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.isfinite(x.flatten(1).sum(1, dtype=torch.float64))
    return torch.isfinite(x).flatten(1).all(1)


def slots_finite(state: Tensor, idx: Tensor, n: int) -> Tensor:
    """A 0-dim bool tensor on the device: whether the slots the valid indices (``0 <= i < n``) name
    hold finite values. No sync. Reads min(B, N) slots, in chunks of at most ``FINITE_CHUNK``
    elements: the named slots gathered (B < N), or the pool itself, slice by slice, counting the
    slots no valid index names as fine (B >= N: no gather). Beyond a gather, allocates one float64
    per slot."""
    if n == 0 or idx.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=state.device)
    valid = (idx >= 0) & (idx < n)
    step = max(1, FINITE_CHUNK // max(1, state[0].numel()))
    flags = []
    if idx.numel() >= n:  # more rows than slots: mark the used slots, scan the pool
        used = torch.zeros(n, dtype=torch.int32, device=state.device).index_add_(
            0, torch.where(valid, idx, 0).long(), valid.int()) > 0
        for i in range(0, n, step):
            flags.append((_finite_rows(state[i:i + step]) | ~used[i:i + step]).all())
    else:
        slots = torch.where(valid, idx, 0).long()
        for i in range(0, slots.numel(), step):
            rows = state.index_select(0, slots[i:i + step])
            flags.append((_finite_rows(rows) | ~valid[i:i + step]).all())
    return flags[0] if len(flags) == 1 else torch.stack(flags).all()


_INPUTS = ("mixed_qkv", "a", "b", "A_log", "dt_bias")


def value_checks(ctx: CallContext) -> list[Violation]:
    """Strict mode: the checks that read tensor contents, with one host sync. The device computes
    a finiteness flag per input and one for the used slots; the flags and the indices come back
    in a single read, and the range and duplicate checks run on that host copy of the indices
    (left in ``ctx.memo["indices"]`` for :func:`~.decode.written_by_call`)."""
    vals = ctx.values
    blind = without_data({name: vals[name] for name in _TENSOR_ARGS})
    if blind:  # shapes without data (meta tensors, FakeTensorMode)
        skip_value_checks("packed_decode", blind)
        return []
    idx = vals["ssm_state_indices"]
    n = ctx.dims["N"]
    state = vals["initial_state"]
    if state.is_cuda and torch.cuda.is_current_stream_capturing():
        # No sync during CUDA-graph capture: the range check becomes a device-side assert.
        torch._assert_async((idx < n).all(), "ssm_state_indices has an index >= N (the pool size)")
        return []
    # (aliasing: the op's own check, from what it writes — see decode.written_by_call)
    flags = [finite_flag(vals[name]) for name in _INPUTS]
    flags.append(slots_finite(state, idx, n))
    host = torch.cat([torch.stack(flags).to(device=idx.device, dtype=torch.int64), idx.long()]).tolist()
    finite, indices = host[:len(flags)], host[len(flags):]
    ctx.memo["indices"] = indices
    out = _index_checks(indices, n)
    if not out and not finite[-1]:  # the used slots must hold finite state before the kernel
        out.append(Violation(ValueRangeError, "initial_state", "finite values in the slots this call uses",
                             "NaN or Inf in a used slot",
                             hint="the state of that request is already corrupt (an earlier step overflowed, "
                                  "or the slot was never initialised); reset the slot before decoding"))
    for name, ok in zip(_INPUTS, finite, strict=False):
        if not ok:
            out.append(Violation(ValueRangeError, name, "finite values", "NaN or Inf present",
                                 hint="find the op that produced it (torch.autograd.detect_anomaly, or "
                                      "check the previous layer's output)"))
    return out


def output_violations(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> list[Violation]:
    """Strict mode, after the kernel: the outputs still meet the contract's promises — finite
    output and updated slots, all-zero rows for padding — with one host sync (three flags
    computed on the device, read at once). Skipped during CUDA-graph capture."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return []
    blind = without_data({"out": out, "initial_state": state, "ssm_state_indices": idx})
    if blind:
        skip_value_checks(f"packed_decode (after backend {backend!r})", blind)
        return []
    n = state.shape[0]
    live = (idx >= 0) & (idx < n)
    padding_zero = ~(out.flatten(1).ne(0).any(1) & ~live).any() if out.shape[0] else torch.ones((), dtype=torch.bool)
    ok_out, ok_pad, ok_state = torch.stack([finite_flag(out), padding_zero.to(out.device),
                                            slots_finite(state, idx, n).to(out.device)]).tolist()
    violations = []
    if not ok_out:
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if not ok_pad:
        violations.append(Violation(ValueRangeError, "out", "zero rows for padding and out-of-range indices",
                                    "non-zero rows", hint=f"backend {backend!r} broke the padding rule"))
    if not ok_state:
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    return violations


def check_outputs(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> None:
    """:func:`output_violations`, raised as one report."""
    violations = output_violations(backend, out, state, idx)
    if violations:
        raise_violations(f"packed_decode (after backend {backend!r})", violations, {}, {})
