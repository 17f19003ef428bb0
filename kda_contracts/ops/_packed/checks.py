"""The value checks of packed decode: before the kernel, :data:`VALUE_RULES` (index range,
distinct slots, finite inputs and used state slots, declared once: strict mode reads them in one
read, watch mode checks them on the device without a sync) and, strict mode only, aliasing; after
it, the promises the outputs must keep (:func:`check_outputs`, strict mode only). Both skip
whatever would sync during CUDA-graph capture (:func:`value_checks` then asserts the range on the
device), and skip with a :class:`~kda_contracts._engine.rules.memory.ValueChecksSkipped` warning
for tensors that hold no data (meta, FakeTensorMode).

Aliasing (:func:`kda_contracts._engine.rules.memory.alias_violations`, exact, by address, across storages): the
call writes ``out`` whole and the pool's *used* slots (``ssm_state_indices`` in ``[0, N)``). So
``out`` must share no byte with any other argument, the pool's unused slots included (writing it
would change them); an input may lie in an unused slot (the kernel neither reads nor writes it)
but not in a used one. During CUDA-graph capture the slots cannot be read: only ``out`` is checked.

Value checks read each broadcast (stride-0) value once (:func:`kda_contracts._engine.rules.memory.distinct_elements`),
so an ``.expand()``-ed activation of any logical size costs what it occupies. Each rule, and each
output row and used slot after the kernel, is reduced on the device to a probe, and the probes
come back (with the indices) in one read before the kernel and one after it.

Example::

    with kc.mode("strict"):
        kc.packed_decode(...)   # reads VALUE_RULES before the kernel, check_outputs after it
"""

from __future__ import annotations

import math
import struct

import torch
from torch import Tensor

from ..._engine import (
    FINITE_CHUNK,
    CallContext,
    Distinct,
    Finite,
    FiniteRows,
    InRange,
    ValueRangeError,
    Violation,
    raise_violations,
    skip_value_checks,
    without_data,
)

_TENSOR_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")


Host = list | Tensor  # a host copy: a list for small reads, a CPU tensor for large ones (see _read_back)
_HOST_LIST_MAX = 1 << 16  # values a read returns as Python lists; beyond, CPU tensors (bounded memory)


def _read_back(floats: list[Tensor], indices: Tensor | None = None, *,
               tensors: bool | None = None) -> tuple[list[Host], Host | None]:
    """The strict checks' one device-to-host read: the float tensors ``floats`` (promoted, never
    narrowed, then widened to float64) and ``indices`` (as int64, exact) packed into one int64
    tensor and read at once. Returns the float parts and the indices, as lists or as CPU tensors:
    tensors when ``tensors`` says so, else when the read holds more than ``_HOST_LIST_MAX`` values."""
    fl = torch.cat([f.reshape(-1) for f in floats]).to(torch.float64)
    parts = [fl.view(torch.int64)] + ([indices.to(torch.int64)] if indices is not None else [])
    packed = torch.cat(parts) if len(parts) > 1 else parts[0]
    n, sizes = fl.numel(), [f.numel() for f in floats]
    if not (packed.numel() > _HOST_LIST_MAX if tensors is None else tensors):
        ints = packed.tolist()
        values = list(struct.unpack(f"={n}d", struct.pack(f"={n}q", *ints[:n])))  # the float64 bits back
        out, i = list[Host](), 0
        for size in sizes:
            out.append(values[i:i + size])
            i += size
        return out, (ints[n:] if indices is not None else None)
    host = packed.cpu()
    return list(host[:n].view(torch.float64).split(sizes)), (host[n:] if indices is not None else None)


def _as_tensors(probes: Host, indices: Host) -> tuple[Tensor, Tensor]:
    p = probes if isinstance(probes, Tensor) else torch.tensor(probes, dtype=torch.float64)
    i = indices if isinstance(indices, Tensor) else torch.tensor(indices, dtype=torch.int64)
    return p, i


def _all_finite(values: Host) -> bool:
    if isinstance(values, Tensor):
        return bool(torch.isfinite(values).all())
    return all(math.isfinite(v) for v in values)


def _row_probes(x: Tensor) -> Tensor:
    """``[rows]``: per row of ``x`` (dim 0), its largest magnitude (finite exactly when the row is;
    0 exactly when the row is all zeros)."""
    if x.dim() < 2 or x.numel() == 0 or not (x.dtype.is_floating_point or x.dtype.is_complex):
        return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    return torch.linalg.vector_norm(x.flatten(1), ord=math.inf, dim=1)


def slot_probes(state: Tensor, idx: Tensor, n: int) -> Tensor:
    """Per-slot finiteness probes (no sync) for the slots a call names: ``[B]``, row ``i``
    for slot ``clamp(idx[i], 0, N-1)`` when B < N (gathered a bounded number of slots at a time), or
    ``[N]``, one per slot of the pool (read slice by slice, no gather) when B >= N. Read them with
    :func:`used_slots_finite` on the host copy of the indices."""
    if n == 0 or idx.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=state.device)
    step = max(1, FINITE_CHUNK // max(1, state[0].numel()))
    if idx.numel() >= n:
        parts = [_row_probes(state[i:i + step]) for i in range(0, n, step)]
    else:
        slots = idx.clamp(0, n - 1)
        parts = [_row_probes(state.index_select(0, slots[i:i + step])) for i in range(0, slots.numel(), step)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def used_slots_finite(probes: Host, indices: Host, n: int) -> bool:
    """Whether every slot a valid index (``0 <= i < n``) names read finite in :func:`slot_probes`
    (host copies of both, as :func:`_read_back` returns them)."""
    per_row = len(probes) == len(indices) and len(indices) < n  # one probe per row, else one per slot
    if isinstance(indices, Tensor) or isinstance(probes, Tensor):
        probes, indices = _as_tensors(probes, indices)
        valid = (indices >= 0) & (indices < n)
        return _all_finite(probes[valid] if per_row else probes[indices[valid]])
    if per_row:
        return all(math.isfinite(p) for p, i in zip(probes, indices, strict=True) if 0 <= i < n)
    return all(math.isfinite(probes[i]) for i in {i for i in indices if 0 <= i < n})


def slots_finite(state: Tensor, idx: Tensor, n: int) -> bool:
    """Whether the slots the valid indices of ``idx`` name hold finite values (one sync)."""
    (probes,), host_idx = _read_back([slot_probes(state, idx, n)], idx)
    assert host_idx is not None
    return used_slots_finite(probes, host_idx, n)


_INPUTS = ("mixed_qkv", "a", "b", "A_log", "dt_bias")

#: what a call's values must hold before the kernel, declared once: strict mode reads every probe
#: in one read (and the indices with them, for :func:`~.calls.written_by_call` and the checks after
#: the kernel); watch mode checks them on the device without a sync
VALUE_RULES = (
    InRange("ssm_state_indices", high="N", ignore_negative=True,
            hint="an index past the pool would read and write another request's memory; check the slot allocator "
                 "and the pool this layer uses"),
    Distinct("ssm_state_indices", hint="two requests on one slot race on its state (a lost update); give each "
                                       "request its own slot, mark padding with -1"),
    FiniteRows("initial_state", "ssm_state_indices",
               hint="the state of that request is already corrupt (an earlier step overflowed, or the slot was never "
                    "initialised); reset the slot before decoding"),
    *(Finite(name, hint="find the op that produced it (torch.autograd.detect_anomaly, or check the previous "
                        "layer's output)") for name in _INPUTS),
)


def value_checks(ctx: CallContext) -> list[Violation]:
    """Strict mode, beside the op's value rules (which the engine reads before this runs): during
    CUDA-graph capture, where nothing can be read, the range check as a device-side assert as
    well (the rules themselves are captured into watch mode's flag, read with
    ``kc.raise_pending()``). Otherwise nothing more."""
    vals = ctx.values
    idx, state = vals["ssm_state_indices"], vals["initial_state"]
    if isinstance(state, Tensor) and state.is_cuda and torch.cuda.is_current_stream_capturing():
        torch._assert_async((idx < ctx.dims["N"]).all(), "ssm_state_indices has an index >= N (the pool size)")
    return []


def outputs_unreadable(op: str, backend: str, out: Tensor, state: Tensor, idx: Tensor) -> bool:
    """Whether strict mode's checks after the kernel must be skipped: during CUDA-graph capture
    (nothing can be read), or for tensors without data (said with a ValueChecksSkipped warning)."""
    if out.is_cuda and torch.cuda.is_current_stream_capturing():
        return True
    blind = without_data({"out": out, "initial_state": state, "ssm_state_indices": idx})
    if blind:
        skip_value_checks(f"{op} (after backend {backend!r})", blind)
    return bool(blind)


def output_violations(backend: str, out: Tensor, state: Tensor, idx: Tensor,
                      host_indices: Host | None = None, *, op: str = "packed_decode") -> list[Violation]:
    """Strict mode, after the kernel: the outputs still meet the contract's promises — finite
    output and updated slots, all-zero rows for padding — with one host sync: the largest
    magnitude of each output row and a probe per used slot, read at once (``host_indices``: the
    host copy of ``idx`` the value checks read, else it comes back in the same read; ``op`` names
    the op in the warning for tensors without data). Skipped during CUDA-graph capture."""
    if outputs_unreadable(op, backend, out, state, idx):
        return []
    n = state.shape[0]
    rows = _row_probes(out if out.dim() > 1 else out.unsqueeze(1))  # one reduction: finite, and 0 for a zero row
    probes = slot_probes(state, idx, n).to(rows.device)
    if host_indices is not None:  # the same kind of host copy as the indices the value checks read
        (host_rows, host_probes), _ = _read_back([rows, probes], tensors=isinstance(host_indices, Tensor))
        indices: Host = host_indices
    else:
        (host_rows, host_probes), read = _read_back([rows, probes], idx)
        assert read is not None
        indices = read
    violations = []
    if not _all_finite(host_rows):
        violations.append(Violation(ValueRangeError, "out", "finite values after the kernel", "NaN or Inf",
                                    hint=f"the inputs were finite: report this against backend {backend!r}"))
    if isinstance(indices, Tensor) or isinstance(host_rows, Tensor):
        r, ix = _as_tensors(host_rows, indices)
        nonzero_padding = bool((r[~((ix >= 0) & (ix < n))] != 0).any())
    else:
        nonzero_padding = any(r != 0 for r, i in zip(host_rows, indices, strict=True) if not 0 <= i < n)
    if nonzero_padding:
        violations.append(Violation(ValueRangeError, "out", "zero rows for padding and out-of-range indices",
                                    "non-zero rows", hint=f"backend {backend!r} broke the padding rule"))
    if not used_slots_finite(host_probes, indices, n):
        violations.append(Violation(ValueRangeError, "initial_state", "finite updated slots", "NaN or Inf",
                                    hint="a decay or beta far out of range can overflow a low-precision state"))
    return violations


def check_outputs(backend: str, out: Tensor, state: Tensor, idx: Tensor) -> None:
    """:func:`output_violations`, raised as one report."""
    violations = output_violations(backend, out, state, idx)
    if violations:
        raise_violations(f"packed_decode (after backend {backend!r})", violations, {}, {})
