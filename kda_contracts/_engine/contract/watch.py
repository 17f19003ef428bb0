"""Watch mode (``kc.mode("watch")``): a contract's value rules (``value_rules=``,
:mod:`kda_contracts._engine.rules.values`) checked on the tensors' device without a host sync.

- CUDA, eager: each rule's probe is enqueued on the call's current stream and folded into a small
  per-device float64 flag, :data:`FLAG` long, that records the *first* violation only
  (``torch.where`` on "nothing recorded yet"): the call's serial, the rule, the element, its
  value; then a non-blocking copy of the flag into pinned host memory and a CUDA event
  (:class:`CudaChannel`). A recorded violation is raised, as the usual ValueRangeError report
  naming the call and what it may have written, by the next watched call on that device whose
  copy has arrived (``event.query()``: never waits), by :func:`raise_pending` (which waits), or
  when a ``with kc.mode("watch")`` block exits.
- CUDA-graph capture: the probes and the fold are captured (no copy, no event); read the flag
  after a replay with :func:`raise_pending`. The captured call's serial is the one reported.
- torch.compile (any device): the probes and the fold trace into the graph (the flag is a
  global buffer the graph mutates; no graph break); the call named is the one traced. Read it
  with :func:`raise_pending`, the block's exit or the next eager watched call.
- CPU (and any device but CUDA), eager: the rules run at once and a violation is raised before
  the function runs (as strict mode's read, without its snapshot).

Example::

    with kc.mode("watch"):
        for batch in batches:
            kc.packed_decode(**batch)     # a bad slot index of step k is raised at a later step
    # ... or here, at the latest
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from .. import modes
from ..codegen.check_cache import CachedDims, compared_arguments
from ..compile.marks import mark_constant_result
from ..errors import ContractError, ValueRangeError, Violation, raise_violations
from ..rules import fused
from ..rules.memory import skip_value_checks, without_data
from ..rules.values import ValueRule, probes, read_rules

FLAG = 7  # (recorded, call serial, stacked row, element index, value, count, extra)
RECORDS_MAX = 4096  # the calls whose records are kept (a violation of an older one says so)
_F64 = torch.float64


@dataclass(frozen=True)
class CallRecord:
    """What a report says of a watched call: its op, serial, rules (``rows``: the rule of each
    stacked probe), dims and argument shapes (None under torch.compile) and what it may write."""

    name: str
    serial: int
    rules: tuple[ValueRule, ...]
    rows: tuple[int, ...]
    dims: dict[str, Any]
    shapes: dict[str, tuple[int, ...]] | None
    written: tuple[str, ...]


class Channel(Protocol):
    """How a device's flag reaches the host: :class:`CudaChannel`, or a stand-in in tests."""

    def send(self, flag: Tensor) -> None: ...  # enqueue a copy of the flag (no sync)
    def arrived(self, flag: Tensor) -> list[float] | None: ...  # the newest copy that has arrived, never waiting
    def wait(self, flag: Tensor) -> list[float]: ...  # the flag as it is once the device is done (waits)
    def reset(self) -> None: ...  # forget every copy sent so far (the flag was cleared)


class HostChannel:
    """The flag of a CPU tensor (code compiled on the CPU): already in host memory."""

    def send(self, flag: Tensor) -> None:
        pass

    def arrived(self, flag: Tensor) -> list[float] | None:
        return flag.tolist()  # type: ignore[no-any-return]

    def wait(self, flag: Tensor) -> list[float]:
        return flag.tolist()  # type: ignore[no-any-return]

    def reset(self) -> None:
        pass


class CudaChannel:
    """The flag's pinned host copy, written by the fused check kernel itself when it records a
    violation (and by :meth:`send`, a non-blocking copy, after probes folded with torch ops).
    :meth:`arrived` reads it without waiting; a recorded row may be caught mid-write, so it is
    then read again from the device after a sync (only on the way to an error)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host = torch.zeros(FLAG, dtype=_F64, pin_memory=True)
        self.recorded = ctypes.c_double.from_address(self.host.data_ptr())  # (its first element, read in ~0.1 µs)

    def send(self, flag: Tensor) -> None:
        self.host.copy_(flag, non_blocking=True)

    def arrived(self, flag: Tensor) -> list[float] | None:
        if not self.recorded.value:
            return None
        return self.wait(flag)

    def wait(self, flag: Tensor) -> list[float]:
        torch.cuda.synchronize(flag.device)
        return flag.cpu().tolist()  # type: ignore[no-any-return]

    def reset(self) -> None:
        self.host.zero_()


class Watcher:
    """One device's flag and the channel that brings it to the host."""

    def __init__(self, device: torch.device, channel: Channel) -> None:
        self.device = device
        self.flag = torch.zeros(FLAG, dtype=_F64, device=device)
        self.channel = channel
        # the fused check kernel's buffers (made with the flag, never during a capture); on CUDA the
        # kernel copies a recorded flag into the channel's pinned buffer itself
        self.fused = fused.FusedState(device, self.flag, channel.host if isinstance(channel, CudaChannel) else None)

    def clear(self) -> None:
        self.flag.zero_()
        self.channel.reset()
        if self.fused is not None:
            self.fused.clear()


def fold(flag: Tensor, found: Tensor, serial: int, base: int = 0) -> None:
    """Record in ``flag`` the first bad probe of ``found`` (``[rows, 4]``) for call ``serial`` (its
    row as ``base`` + the row), unless the flag already holds a violation. Device ops only (no
    sync, nothing copied from the host: capturable and traceable)."""
    bad = found[:, 0] >= 0
    r = bad.to(torch.uint8).argmax()
    row = found.index_select(0, r.reshape(1)).reshape(4)
    head = torch.full((2,), float(serial), dtype=_F64, device=flag.device)
    head.narrow(0, 0, 1).fill_(1.0)
    new = torch.cat([head, (r.reshape(1) + base).to(_F64), row])
    flag.copy_(torch.where((flag[0] == 0) & bad.any(), new, flag))


WATCHERS: dict[str, Watcher] = {}
RECORDS: dict[int, CallRecord] = {}
_serials = itertools.count(1)
_LOCK = threading.Lock()  # (serials, records and watchers are shared by every thread)


def channel_for(device: torch.device) -> Channel:
    return CudaChannel(device) if device.type == "cuda" else HostChannel()


def watcher(device: torch.device) -> Watcher:
    """The device's watcher, made on the first watched or strict call there. Not during CUDA-graph
    capture: its flag and pinned buffers would be made by the graph (each replay zeroing the flag)."""
    key = str(device)
    w = WATCHERS.get(key)
    if w is None:
        if _capturing():
            raise_violations("watch mode", [Violation(
                ContractError, "(capture)", f"a watched or strict call on {device} before the CUDA-graph capture",
                "the first such call is being captured",
                hint="run the call once eagerly first (a warm-up call before torch.cuda.graph does it)")], {}, {})
        with _LOCK:
            w = WATCHERS.get(key) or Watcher(device, channel_for(device))
            WATCHERS[key] = w
    return w


def _record(make: Callable[[int], CallRecord]) -> int:
    """A new call serial and its record (``make(serial)``), the oldest record dropped past
    :data:`RECORDS_MAX`; thread-safe."""
    with _LOCK:
        serial = next(_serials)
        RECORDS[serial] = make(serial)
        while len(RECORDS) > RECORDS_MAX:
            RECORDS.pop(next(iter(RECORDS)), None)
    return serial


_CUDA: list[bool] = []  # (whether CUDA is available, asked once: a watched call asks twice)


def _capturing() -> bool:
    if not _CUDA:
        _CUDA.append(torch.cuda.is_available())
    return _CUDA[0] and torch.cuda.is_current_stream_capturing()


def report(w: Watcher, row: Sequence[float]) -> None:
    """Raise the violation a flag recorded (and clear the flag)."""
    serial, r, found = int(row[1]), int(row[2]), list(row[3:7])
    rec = RECORDS.get(serial)
    w.clear()  # (the row is read: the flag may record the next violation)
    if rec is None:
        v = Violation(ValueRangeError, "(an earlier call)", "the call's value rules",
                      f"a violation in call #{serial}, whose record is gone (only the last {RECORDS_MAX} are kept)",
                      hint="call kc.raise_pending() more often, or run the call again in strict mode")
        raise_violations(f"(watch, call #{serial} on {w.device})", [v], {}, {})
    assert rec is not None
    v = rec.rules[rec.rows[r]].violation(found, rec.shapes, rec.dims)
    wrote = (f"that call may have written {', '.join(rec.written)}: do not trust them" if rec.written else
             "that call writes no tensor argument")
    details = (f"found by watch mode in call #{serial} of {rec.name} on {w.device}, after it ran (no rollback)",
               wrote)
    raise_violations(f"{rec.name} (watch, call #{serial})", [dataclasses.replace(v, details=(*v.details, *details))],
                     {k: d for k, d in rec.dims.items() if d is not None}, {})  # (as the CPU path: variadics as is)


def poll() -> None:
    """Raise a violation whose flag copy has arrived on the host (never waits)."""
    if _capturing():
        return
    for w in list(WATCHERS.values()):
        row = w.channel.arrived(w.flag)
        if row is not None and row[0]:
            report(w, row)


def raise_pending() -> None:
    """Wait for every device a watched call ran on, and raise the first violation it recorded
    (nothing pending: returns). After a CUDA-graph replay, or to flush before a checkpoint.

    Example::

        graph.replay()
        kc.raise_pending()
    """
    for w in list(WATCHERS.values()):
        row = w.channel.wait(w.flag)
        if row[0]:
            report(w, row)


modes.ON_WATCH_EXIT.append(raise_pending)


class ContractWatch:
    """A contract's watch step: the generated wrapper calls it (``watch(dims, *values)``) in watch mode."""

    def __init__(self, c: Any, rules: Sequence[ValueRule], written: Sequence[str]) -> None:
        self.c, self.name, self.rules, self.written = c, c.name, tuple(rules), tuple(written)
        self.names, self.symbols = c._param_names, c.spec.symbols
        self.reads = tuple(dict.fromkeys(a for r in self.rules for a in r.args))  # (every argument a rule reads)
        # the last eager call's slots, kept when the check cache answered it (its dims object) and
        # compares the metadata of every argument a rule reads: a call answered by the same entry repeats them
        self.again: tuple[Any, ...] = _NOT_AGAIN

        def note(device: str, rows: tuple[int, ...]) -> int:
            return self._note(device, rows)

        self.note = mark_constant_result(note)

    def _note(self, device: str, rows: tuple[int, ...]) -> int:
        """A new call record (at trace time under torch.compile: the traced call's); its serial."""
        watcher(torch.device(device))
        return _record(lambda serial: CallRecord(self.name, serial, self.rules, rows, {}, None, self.written))

    def __call__(self, dims: tuple[Any, ...], *vals: Any) -> None:
        values = dict(zip(self.names, vals, strict=False))
        if torch.compiler.is_compiling():  # (a constant under dynamo: only this branch is traced, so no
            self.traced(values, dict(zip(self.symbols, dims, strict=True)))  # guard on the eager state below)
        elif dims is self.again[0] and type(dims) is CachedDims:  # (the check cache's entry of the last call)
            self.repeat(values)
        else:
            self.eager(values, dict(zip(self.symbols, dims, strict=True)), dims)

    def repeat(self, values: Mapping[str, Any]) -> None:
        """A call whose every tensor the check cache found with the metadata of the last call's
        (sizes, strides, dtype, device, type) and whose dims are the same: that call's slots, with
        this call's tensors (and its own serial); no plan, no data check, no probes."""
        poll()
        _, key, plan, rows, env, shapes = self.again
        w = WATCHERS.get(key)
        if w is None:  # (the watchers were dropped: the full path makes one again)
            self.again = _NOT_AGAIN
            self.eager(values, dict(env), None)
            return
        slots = [(kind, flags, values[x], values[y], values[z], n, c, s0, lo, hi)
                 for kind, flags, x, y, z, n, c, s0, lo, hi in plan]
        serial = _record(lambda serial: CallRecord(self.name, serial, self.rules, rows, env, shapes, self.written))
        if not _launch(w, slots, serial):  # (the kernel is off now: this call's rules as torch probes)
            self.again = _NOT_AGAIN
            self.eager(values, dict(env), None)

    def traced(self, values: Mapping[str, Any], env: Mapping[str, Any]) -> None:
        found = probes(self.rules, values, env)
        if found:
            device = found[0][1].device
            serial = self.note(f"{device.type}:{device.index}" if device.index is not None else device.type,
                               tuple(i for i, _ in found))
            flag = WATCHERS[str(device)].flag
            fold(flag, torch.stack([p.to(device) for _, p in found]), serial)

    def eager(self, values: Mapping[str, Any], env: dict[str, Any], dims: Any = None) -> None:
        self.again = _NOT_AGAIN
        poll()
        read = {a: values.get(a) for a in self.reads}
        blind = without_data(read)
        if blind:
            skip_value_checks(self.name, blind)
            return
        on_cuda = [_on_cuda(values, r) for r in self.rules]
        if not all(on_cuda):  # not CUDA: read at once, raised before the function runs
            violations, _ = read_rules([r for r, c in zip(self.rules, on_cuda, strict=True) if not c], values, env)
            if violations:
                self.c.rejections += 1
                raise_violations(self.name, violations, env, self.c.provenance(self.c._config_for(values)))
        later = [i for i, c in enumerate(on_cuda) if c]
        if later:
            self.enqueue(later, values, env, read, dims)

    def enqueue(self, later: list[int], values: Mapping[str, Any], env: dict[str, Any],
                read: Mapping[str, Any], dims: Any = None) -> None:
        """The CUDA rules of an eager call: built-in rules in the fused check kernel (one launch per
        device and :data:`~kda_contracts._engine.rules.fused.SLOTS` rules), any other as torch
        probes folded into the flag; a record per device, no sync."""
        rules = self.rules if len(later) == len(self.rules) else tuple(self.rules[i] for i in later)
        slots, rest = fused.plan(rules, values, env) if fused.usable() else ([], list(range(len(rules))))
        found = probes([rules[i] for i in rest], values, env) if rest else []
        by_device: dict[torch.device, tuple[list[tuple[int, Any]], list[tuple[int, Tensor]]]] = {}
        for i, slot in slots:
            by_device.setdefault(slot[2].device, ([], []))[0].append((later[i], slot))
        for k, p in found:
            by_device.setdefault(p.device, ([], []))[1].append((later[rest[k]], p))
        shapes = {a: tuple(t.shape) for a, t in read.items() if isinstance(t, Tensor)}
        capturing = _capturing()
        for device, (kernel, probed) in by_device.items():  # (one device, nearly always; a serial each)
            rows = tuple(i for i, _ in kernel) + tuple(i for i, _ in probed)
            serial = _record(lambda serial: CallRecord(self.name, serial, self.rules, rows, env, shapes,  # noqa: B023
                                                       self.written))
            w = watcher(device)
            if kernel and not _launch(w, [s for _, s in kernel], serial):
                probed += [(i, p) for i, p in probes([self.rules[i] for i, _ in kernel], values, env)]
                kernel = []
            if probed:
                fold(w.flag, torch.stack([p for _, p in probed]), serial, base=len(kernel))
                if not capturing:
                    w.channel.send(w.flag)
            elif len(by_device) == 1 and len(later) == len(self.rules) and type(dims) is CachedDims \
                    and set(self.reads) <= compared_arguments(self.c._check):  # (all in the kernel: kept)
                self.again = (dims, str(device), [(s[0], s[1], *_names(self.rules[i], s), *s[5:]) for i, s in kernel],
                              rows, env, shapes)


def _launch(w: Watcher, slots: list[Any], serial: int) -> bool:
    """The fused check kernel over ``slots`` on ``w``'s device and its current stream. False when the
    kernel cannot run here (it is then off for the process, with a warning; torch probes instead)."""
    try:
        if w.device.type != "cuda":  # (the CPU under the interpreter: the tests)
            fused.launch(w.fused, slots, serial)
        else:
            current = torch.cuda.current_device()
            index = w.device.index if w.device.index is not None else current
            with torch.cuda.device(index) if index != current else contextlib.nullcontext():
                fused.launch(w.fused, slots, serial, _raw_stream(index))
    except Exception as exc:  # (a missing or broken triton: never silent, never a crash)
        fused.disable(f"{type(exc).__name__}: {exc}")
        return False
    if w.fused.host is None and not _capturing():  # (the kernel copied nothing to the host itself)
        w.channel.send(w.flag)
    return True


_NOT_AGAIN: tuple[Any, ...] = (object(),)


def _names(rule: ValueRule, slot: Any) -> tuple[str, str, str]:
    """The arguments a kernel slot of ``rule`` reads, as X, Y, Z."""
    if slot[0] == fused.FINITE_ROWS:
        return rule.args[0], rule.args[1], rule.args[2] if len(rule.args) > 2 else rule.args[1]
    return rule.args[0], rule.args[0], rule.args[0]


def _raw_stream(index: int) -> int:
    """The current stream's handle on GPU ``index`` (the key of its scratch row)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(get(index)) if get is not None else torch.cuda.current_stream(index).cuda_stream


def _on_cuda(values: Mapping[str, Any], rule: ValueRule) -> bool:
    t = values.get(rule.args[0])
    return isinstance(t, Tensor) and t.is_cuda
