"""Strict-mode checks of packed prefill that read tensor contents, declared as the decode ops
declare theirs (the op's ``value_checks=`` and ``after=``), with one host read before the kernel
and one after it.

Before (:func:`prefill_value_checks`): ``cu_seqlens`` starts at 0, never decreases and ends at
``T`` (the rows of ``mixed_qkv``); the slot indices are below ``N`` and the live ones distinct (a
negative index is a padding sequence); the inputs and the used slots are finite. After
(:func:`prefill_output_checks`): the output and the updated slots are finite. Both are skipped for
tensors without data and, but for a device-side assert of the index range, during CUDA-graph capture.

Example::

    with kc.mode("strict"):
        kc.packed_prefill(...)   # prefill_value_checks before the kernel, prefill_output_checks after it
"""

from __future__ import annotations

import math

import torch

from ..._engine import CallContext, ValueRangeError, Violation, skip_value_checks, without_data
from .checks import Host, _index_checks, _probe, _read_back, _row_probes, slot_probes, used_slots_finite

_TENSORS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "cu_seqlens", "ssm_state_indices",
            "has_initial_state")
_INPUTS = ("mixed_qkv", "a", "b", "A_log", "dt_bias")


def cu_seqlens_violations(cu: list[int], total: int) -> list[Violation]:
    """The rules of ``cu_seqlens`` (a host copy) for ``total`` tokens: starts at 0, non-decreasing,
    ends at ``total``.

    Example::

        >>> [v.expected for v in cu_seqlens_violations([1, 3, 2], 2)]
        ['cu_seqlens[0] == 0', 'non-decreasing offsets (each sequence has >= 0 tokens)']
    """
    out: list[Violation] = []
    if not cu:
        return out
    if cu[0] != 0:
        out.append(Violation(ValueRangeError, "cu_seqlens", "cu_seqlens[0] == 0", f"cu_seqlens[0] = {cu[0]}",
                             hint="cu_seqlens are offsets into the packed tokens, [0, len0, len0+len1, ...]; a batch "
                                  "sliced out of a larger one must subtract its first offset (cu - cu[0])"))
    drops = [i for i in range(1, len(cu)) if cu[i] < cu[i - 1]]
    if drops:
        i = drops[0]
        out.append(Violation(ValueRangeError, "cu_seqlens", "non-decreasing offsets (each sequence has >= 0 tokens)",
                             f"{len(drops)} decrease(s), first cu_seqlens[{i}] = {cu[i]} < cu_seqlens[{i - 1}] = "
                             f"{cu[i - 1]}",
                             hint="pass cumulative offsets, not the lengths: torch.cat([zeros(1), lengths.cumsum(0)])"))
    if cu[-1] != total:
        out.append(Violation(ValueRangeError, "cu_seqlens", f"cu_seqlens[-1] == T = {total} (the tokens of mixed_qkv)",
                             f"cu_seqlens[-1] = {cu[-1]}",
                             hint="the last offset is the number of packed tokens: every row of mixed_qkv belongs to "
                                  "one sequence (drop unused rows, or add them to a padding sequence with slot -1)"))
    return out


def prefill_value_checks(ctx: CallContext) -> list[Violation]:
    """Strict mode, before the kernel, with one host read: ``cu_seqlens`` (:func:`cu_seqlens_violations`),
    the slot range and duplicates, finite inputs and used slots. The host copy of the indices is
    left in ``ctx.memo["indices"]`` (what :func:`~.calls.written_by_call` reads)."""
    vals = ctx.values
    blind = without_data({name: vals[name] for name in _TENSORS})
    if blind:
        skip_value_checks(ctx.spec.name, blind)
        return []
    idx, cu, state = vals["ssm_state_indices"], vals["cu_seqlens"], vals["initial_state"]
    n, total, B = ctx.dims["N"], ctx.dims["T"], ctx.dims["B"]
    if state.is_cuda and torch.cuda.is_current_stream_capturing():
        torch._assert_async((idx < n).all(), "ssm_state_indices has an index >= N (the pool size)")
        return []
    inputs = torch.stack([_probe(vals[name]).to(state.device) for name in _INPUTS])
    both = torch.cat([idx.to(torch.int64), cu.to(torch.int64).to(idx.device)])
    (head, probes), host = _read_back([inputs, slot_probes(state, idx, n)], both, tensors=False)
    assert isinstance(host, list) and isinstance(head, list)
    indices: Host = host[:B]
    ctx.memo["indices"] = indices
    out = cu_seqlens_violations(host[B:], total) + _index_checks(indices, n)
    if not out and not used_slots_finite(probes, indices, n):
        out.append(Violation(ValueRangeError, "initial_state", "finite values in the slots this call uses",
                             "NaN or Inf in a used slot",
                             hint="a sequence that continues (has_initial_state) from a corrupt slot; reset it"))
    for name, probe in zip(_INPUTS, head, strict=True):
        if not math.isfinite(probe):
            out.append(Violation(ValueRangeError, name, "finite values", "NaN or Inf present",
                                 hint="find the op that produced it (check the previous layer's output)"))
    return out


def prefill_output_checks(ctx: CallContext, backend: str) -> list[Violation]:
    """Strict mode, after the kernel: a finite output and finite updated slots (one host read)."""
    v = ctx.values
    out, state, idx = v["out"], v["initial_state"], v["ssm_state_indices"]
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return []
    blind = without_data({"out": out, "initial_state": state, "ssm_state_indices": idx})
    if blind:
        skip_value_checks(f"{ctx.spec.name} (after backend {backend!r})", blind)
        return []
    n = state.shape[0]
    rows = _row_probes(out).to(state.device)
    (host_rows, probes), read = _read_back([rows, slot_probes(state, idx, n)], idx, tensors=False)
    assert isinstance(host_rows, list) and read is not None
    indices = ctx.memo.get("indices", read)
    violations = []
    if not all(math.isfinite(r) for r in host_rows):
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if not used_slots_finite(probes, indices, n):
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    return violations
