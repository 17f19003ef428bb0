"""The value checks of packed prefill, declared as the decode ops declare theirs: before the
kernel, :data:`PREFILL_VALUE_RULES` (``cu_seqlens`` starts at 0, never decreases and ends at ``T``,
the rows of ``mixed_qkv``; the slot indices are below ``N`` and the live ones distinct, a negative
index being a padding sequence; the inputs and the used slots are finite), read by strict mode in
one read and checked on the device without a sync by watch mode; after it, strict mode only,
:func:`prefill_output_checks` (the output and the updated slots are finite). Both are skipped for
tensors without data and, but for a device-side assert of the index range, during CUDA-graph capture.

Example::

    with kc.mode("strict"):
        kc.packed_prefill(...)   # PREFILL_VALUE_RULES before the kernel, prefill_output_checks after it
"""

from __future__ import annotations

import math

from ..._engine import (
    CallContext,
    Distinct,
    EndsAt,
    Finite,
    FiniteRows,
    InRange,
    NonDecreasing,
    StartsAt,
    ValueRangeError,
    Violation,
)
from .calls import _host_indices
from .checks import _read_back, _row_probes, outputs_unreadable, slot_probes, used_slots_finite, value_checks

_INPUTS = ("mixed_qkv", "a", "b", "A_log", "dt_bias")

#: what a prefill call's values must hold before the kernel, declared once (strict reads them in
#: one read, the indices with them; watch checks them on the device)
PREFILL_VALUE_RULES = (
    StartsAt("cu_seqlens", 0, hint="cu_seqlens are offsets into the packed tokens, [0, len0, len0+len1, ...]; a batch "
                                   "sliced out of a larger one must subtract its first offset (cu - cu[0])"),
    NonDecreasing("cu_seqlens", hint="pass cumulative offsets, not the lengths: torch.cat([zeros(1), "
                                     "lengths.cumsum(0)])"),
    EndsAt("cu_seqlens", "T", hint="the last offset is the number of packed tokens: every row of mixed_qkv belongs to "
                                   "one sequence (drop unused rows, or add them to a padding sequence with slot -1)"),
    InRange("ssm_state_indices", high="N", ignore_negative=True,
            hint="an index past the pool would read and write another sequence's state; check the slot allocator"),
    Distinct("ssm_state_indices", hint="two sequences on one slot race on its state (a lost update); give each its "
                                       "own slot, mark padding with -1"),
    FiniteRows("initial_state", "ssm_state_indices", only="has_initial_state",
               hint="a sequence that continues (has_initial_state) from a corrupt slot; reset it"),
    *(Finite(name, hint="find the op that produced it (check the previous layer's output)") for name in _INPUTS),
)


#: strict mode, beside the rules: during CUDA-graph capture the index range as a device-side assert
#: as well (decode's own: the same arguments, ``ssm_state_indices`` below ``N``)
prefill_value_checks = value_checks


def prefill_output_checks(ctx: CallContext, backend: str) -> list[Violation]:
    """Strict mode, after the kernel: a finite output and finite updated slots (one host read)."""
    v = ctx.values
    out, state, idx = v["out"], v["initial_state"], v["ssm_state_indices"]
    if outputs_unreadable(ctx.spec.name, backend, out, state, idx):
        return []
    n = state.shape[0]
    rows = _row_probes(out).to(state.device)
    (host_rows, probes), read = _read_back([rows, slot_probes(state, idx, n)], idx, tensors=False)
    assert isinstance(host_rows, list) and read is not None
    host = _host_indices(ctx)
    indices = read if host is None else host
    violations = []
    if not all(math.isfinite(r) for r in host_rows):
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if not used_slots_finite(probes, indices, n):
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    return violations
