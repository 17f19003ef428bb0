"""Watch mode (``kc.mode("watch")``): a contract's value rules (``value_rules=``,
:mod:`kda_contracts._engine.rules.values`) checked on the tensors' device without a host sync.

- CUDA, eager: the built-in rules go to watch mode's fused check kernel
  (:mod:`kda_contracts._engine.rules.fused`), one launch on the call's stream, or, for an op whose
  picked backend's kernel checks them itself (the packed decode ops' Triton kernel), to that
  kernel: the op's dispatcher gets the step's :class:`Pending` and hands it on (its ``watched``
  runner) or launches it. Other rules are torch probes folded into the device's flag
  (:mod:`.watch_flag`). The first violation is raised, as the usual ValueRangeError report naming
  the call and what it may have written, by the next watched call on that device whose pinned
  doorbell rang (read without a sync), by :func:`raise_pending` (which waits), or when a ``with
  kc.mode("watch")`` block exits. A call the check cache answers like the last one repeats its
  slots (:meth:`ContractWatch.repeat`).
- CUDA-graph capture: the kernels (or probes) are captured; read the flag after a replay with
  :func:`raise_pending`. The captured call's serial is the one reported.
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
import dataclasses
import itertools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import modes
from ..codegen.check_cache import CachedDims, compared_arguments
from ..compile.marks import mark_constant_result
from ..errors import ContractError, ValueRangeError, Violation, raise_violations
from ..rules import fused
from ..rules.memory import skip_value_checks, without_data
from ..rules.reading import describe, probes, read_rules
from ..rules.values import ValueRule
from .watch_flag import FLAG, CallRecord, Channel, CudaChannel, HostChannel, Watcher, fold

__all__ = ["FLAG", "CallRecord", "Channel", "ContractWatch", "CudaChannel", "HostChannel", "Pending", "Watcher",
           "fold", "poll", "raise_pending", "watcher"]

RECORDS_MAX = 4096  # the calls whose records are kept (a violation of an older one says so)


def _own_order(serial: int) -> Sequence[int]:
    """The kernel check numbers of a call's record in its rules' order (an op kernel's record)."""
    fields = RECORDS.get(serial)
    return fields[6] if fields is not None and len(fields) > 6 and fields[6] else range(fused.CHECKS)


WATCHERS: dict[str, Watcher] = {}
RECORDS: dict[int, tuple[Any, ...]] = {}  # (serial: a CallRecord's fields but the serial)
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


def _record(fields: tuple[Any, ...]) -> int:
    """A new call serial and its record (``fields``: :class:`CallRecord`'s but the serial, made into
    one only when a report needs it), the oldest record dropped past :data:`RECORDS_MAX`; thread-safe."""
    with _LOCK:
        serial = next(_serials) % 0x7FFFFFFE + 1  # (1 .. 2**31 - 1: a kernel's int32 argument)
        RECORDS[serial] = fields
        RECORDS.pop(serial - RECORDS_MAX, None)  # (serials are consecutive: the oldest, at once)
        while len(RECORDS) > RECORDS_MAX:  # (after a wrap, or RECORDS_MAX lowered)
            RECORDS.pop(next(iter(RECORDS)), None)
    return serial


def record_of(serial: int) -> CallRecord | None:
    """The record of call ``serial`` (None when it is gone)."""
    fields = RECORDS.get(serial)
    return None if fields is None else CallRecord(fields[0], serial, *fields[1:])


_CUDA: list[bool] = []  # (whether CUDA is available, asked once: a watched call asks twice)


def _capturing() -> bool:
    if not _CUDA:
        _CUDA.append(torch.cuda.is_available())
    return _CUDA[0] and torch.cuda.is_current_stream_capturing()


def report(w: Watcher, row: Sequence[float]) -> None:
    """Raise the violation a flag recorded (and clear the flag)."""
    serial, r, found = int(row[1]), int(row[2]), list(row[3:7])
    rec = record_of(serial)
    w.clear()  # (the row is read: the flag may record the next violation)
    if rec is None:
        v = Violation(ValueRangeError, "(an earlier call)", "the call's value rules",
                      f"a violation in call #{serial}, whose record is gone (only the last {RECORDS_MAX} are kept)",
                      hint="call kc.raise_pending() more often, or run the call again in strict mode")
        raise_violations(f"(watch, call #{serial} on {w.device})", [v], {}, {})
    assert rec is not None
    v = describe(rec.rules[rec.rows[r]], found, rec.shapes, rec.dims, name=rec.name)
    wrote = (f"that call may have written {', '.join(rec.written)}: do not trust them" if rec.written else
             "that call writes no tensor argument")
    details = (f"found by watch mode in call #{serial} of {rec.name} on {w.device}, after it ran (no rollback)",
               wrote)
    raise_violations(f"{rec.name} (watch, call #{serial})", [dataclasses.replace(v, details=(*v.details, *details))],
                     {k: d for k, d in rec.dims.items() if d is not None}, {})  # (as the CPU path: variadics as is)


def poll() -> None:
    """Raise a violation whose flag copy has arrived on the host (never waits; not during a
    CUDA-graph capture, whose calls report at :func:`raise_pending`)."""
    for w in tuple(WATCHERS.values()):
        if w.rung() and not _capturing():
            row = w.read(False, _own_order)
            if row is not None:
                report(w, row)


def raise_pending() -> None:
    """Wait for every device a watched call ran on, and raise the first violation it recorded
    (nothing pending: returns). After a CUDA-graph replay, or to flush before a checkpoint.

    Example::

        graph.replay()
        kc.raise_pending()
    """
    for w in list(WATCHERS.values()):
        row = w.read(True, _own_order)
        if row is not None:
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
        self.own_last: tuple[Any, Any] = (None, None)  # (the last kernel's checks and own_order's answer)

        def note(device: str, rows: tuple[int, ...]) -> int:
            return self._note(device, rows)

        self.note = mark_constant_result(note)

    def own_order(self, checks: Sequence[ValueRule]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Where each of this contract's rules is among the rules a kernel checks itself (``checks``,
        by check number), and the rule of each check; None when one is not there (:meth:`Pending.hand`
        keeps the last answer)."""
        order = tuple(checks.index(r) if r in checks else -1 for r in self.rules)
        if -1 in order or len(set(order)) != len(order) or len(checks) > fused.CHECKS:
            return None
        by_check = [0] * fused.CHECKS
        for i, c in enumerate(order):
            by_check[c] = i
        return order, tuple(by_check)

    def _note(self, device: str, rows: tuple[int, ...]) -> int:
        """A new call record (at trace time under torch.compile: the traced call's); its serial."""
        watcher(torch.device(device))
        return _record((self.name, self.rules, rows, {}, None, self.written))

    def __call__(self, dims: tuple[Any, ...], *vals: Any) -> None:
        """A contract's watch step, all of it now (the generated wrapper calls it)."""
        pending = self.deferred(dims, *vals)
        if pending is not None:
            pending.launch()

    def deferred(self, dims: tuple[Any, ...], *vals: Any) -> Pending | None:
        """The watch step of an op's call (its dispatcher calls it): everything but the check
        kernel's launch when a kernel launch is all that is left, returned as a :class:`Pending`
        that the dispatcher hands to the backend it picks (whose kernel may check the rules itself)
        or launches."""
        if torch.compiler.is_compiling():  # (a constant under dynamo: only this branch is traced, so no
            self.traced(dict(zip(self.names, vals, strict=False)),  # guard on the eager state below)
                        dict(zip(self.symbols, dims, strict=True)))
            return None
        if dims is self.again[0] and type(dims) is CachedDims:  # (the check cache's entry of the last call)
            return self.repeat(vals)
        return self.eager(dict(zip(self.names, vals, strict=False)), dict(zip(self.symbols, dims, strict=True)), dims)

    def repeat(self, vals: tuple[Any, ...]) -> Pending | None:
        """A call whose every tensor the check cache found with the metadata of the last call's
        (sizes, strides, dtype, device, type) and whose dims are the same: that call's slots, with
        this call's tensors (and its own serial); no plan, no data check, no probes."""
        poll()
        _, key, plan, rows, env, shapes = self.again
        w = WATCHERS.get(key)
        if w is None:  # (the watchers were dropped: the full path makes one again)
            self.again = _NOT_AGAIN
            return self.eager(dict(zip(self.names, vals, strict=False)), dict(env), None)
        return Pending(self, w, plan, rows, env, shapes, vals, None, True, True)

    def traced(self, values: Mapping[str, Any], env: Mapping[str, Any]) -> None:
        found = probes(self.rules, values, env, self.name)
        if found:
            device = found[0][1].device
            serial = self.note(f"{device.type}:{device.index}" if device.index is not None else device.type,
                               tuple(i for i, _ in found))
            flag = WATCHERS[str(device)].flag
            fold(flag, torch.stack([p.to(device) for _, p in found]), serial)

    def eager(self, values: Mapping[str, Any], env: dict[str, Any], dims: Any = None) -> Pending | None:
        self.again = _NOT_AGAIN
        poll()
        read = {a: values.get(a) for a in self.reads}
        blind = without_data(read)
        if blind:
            skip_value_checks(self.name, blind)
            return None
        on_cuda = [_on_cuda(values, r) for r in self.rules]
        if not all(on_cuda):  # not CUDA: read at once, raised before the function runs
            violations, _ = read_rules([r for r, c in zip(self.rules, on_cuda, strict=True) if not c], values, env,
                                        name=self.name)
            if violations:
                self.c.rejections += 1
                raise_violations(self.name, violations, env, self.c.provenance(self.c._config_for(values)))
        later = [i for i, c in enumerate(on_cuda) if c]
        if later:
            return self.enqueue(later, values, env, read, dims)
        return None

    def enqueue(self, later: list[int], values: Mapping[str, Any], env: dict[str, Any],
                read: Mapping[str, Any], dims: Any = None) -> Pending | None:
        """The CUDA rules of an eager call: built-in rules in the fused check kernel (one launch per
        device and :data:`~kda_contracts._engine.rules.fused.SLOTS` rules), any other as torch
        probes folded into the flag; a record per device, no sync. When every rule of the call takes
        a kernel slot on one device, the launch is left to the returned :class:`Pending`."""
        rules = self.rules if len(later) == len(self.rules) else tuple(self.rules[i] for i in later)
        slots, rest = fused.plan(rules, values, env) if fused.usable() else ([], list(range(len(rules))))
        shapes = {a: tuple(t.shape) for a, t in read.items() if isinstance(t, Tensor)}
        if slots and not rest and len({s[2].device for _, s in slots}) == 1:
            w = watcher(slots[0][1][2].device)
            keep = (len(later) == len(self.rules) and type(dims) is CachedDims
                    and set(self.reads) <= compared_arguments(self.c._check))
            return Pending(self, w, [s for _, s in slots], tuple(later[i] for i, _ in slots), env, shapes, values,
                           dims if keep else None, complete=len(later) == len(self.rules))
        found = probes([rules[i] for i in rest], values, env, self.name) if rest else []
        by_device: dict[torch.device, tuple[list[tuple[int, Any]], list[tuple[int, Tensor]]]] = {}
        for i, slot in slots:
            by_device.setdefault(slot[2].device, ([], []))[0].append((later[i], slot))
        for k, p in found:
            by_device.setdefault(p.device, ([], []))[1].append((later[rest[k]], p))
        capturing = _capturing()
        for device, (kernel, probed) in by_device.items():  # (one device, nearly always; a serial each)
            rows = tuple(i for i, _ in kernel) + tuple(i for i, _ in probed)
            serial = _record((self.name, self.rules, rows, env, shapes, self.written))
            w = watcher(device)
            if kernel and not _launch(w, [s for _, s in kernel], serial):
                probed += [(i, p) for i, p in probes([self.rules[i] for i, _ in kernel], values, env, self.name)]
                kernel = []
            if probed:
                fold(w.flag, torch.stack([p for _, p in probed]), serial, base=len(kernel))
                if not capturing:
                    w.channel.send(w.flag)
        return None


class Pending:
    """A watched call's rules, every one in a check-kernel slot on one device, not launched yet: the
    op's dispatcher hands them to the backend it picked (:meth:`hand`) or launches them (:meth:`launch`)."""

    __slots__ = ("complete", "dims", "env", "named", "rows", "shapes", "slots", "values", "w", "watch")

    def __init__(self, watch: ContractWatch, w: Watcher, slots: list[Any], rows: tuple[int, ...],
                 env: dict[str, Any], shapes: dict[str, tuple[int, ...]], values: Any,
                 dims: Any, named: bool = False, complete: bool = True) -> None:
        self.watch, self.w, self.slots, self.rows, self.env, self.shapes = watch, w, slots, rows, env, shapes
        self.values, self.dims = values, dims  # (dims: the check cache's entry, when the call may be repeated)
        # named: a repeated call's slots, naming their tensors, and its values as the wrapper passed
        # them (made into slots and a mapping at launch)
        self.named = named
        self.complete = complete  # (every rule of the call is here: a kernel may take them all)

    def launch(self) -> None:
        """The fused check kernel over the slots, with a new call record; if it cannot run, the
        rules as torch probes (folded into the flag)."""
        watch = self.watch
        serial = _record((watch.name, watch.rules, self.rows, self.env, self.shapes, watch.written))
        w = self.w
        if self.named:
            values = self.values = dict(zip(watch.names, self.values, strict=False))
            slots = [(kind, flags, values[x], values[y], values[z], n, c, s0, lo, hi)
                     for kind, flags, x, y, z, n, c, s0, lo, hi in self.slots]
        else:
            slots = self.slots
        if _launch(w, slots, serial):
            if self.dims is not None:  # (the next call the check cache answers from this entry repeats it)
                self.keep()
            return
        watch.again = _NOT_AGAIN
        probed = probes([watch.rules[i] for i in self.rows], self.values, self.env, watch.name)
        if probed:
            if len(probed) != len(self.rows):  # (the flag's row is the probe's place: a record of those probed)
                serial = _record((watch.name, watch.rules, tuple(self.rows[k] for k, _ in probed), self.env,
                                  self.shapes, watch.written))
            fold(w.flag, torch.stack([p for _, p in probed]), serial)
            if not _capturing():
                w.channel.send(w.flag)

    def hand(self, watched: Any) -> fused.OwnChecks | None:
        """Give the rules to the backend's kernel when it checks them itself (``watched``: its watched
        runner, whose ``rules`` are the rules its kernel checks, by check number) and the call's
        rules are all among them: returns what that kernel records into (with a new call record).
        Otherwise launch the check kernel and return None."""
        watch = self.watch
        if watched is not None and self.complete:
            hit = watch.own_last
            if hit[0] is not watched.rules:
                hit = watch.own_last = (watched.rules, watch.own_order(watched.rules))
            own = hit[1]
            ok = fused._usable["ok"]
            if own is not None and (ok or (ok is None and fused.usable())):
                serial = _record((watch.name, watch.rules, own[1], self.env, self.shapes, watch.written, own[0]))
                if self.dims is not None:
                    self.keep()
                state = self.w.fused
                return fused.OwnChecks(state.own, state.doorbell, serial)
        self.launch()
        return None

    def keep(self) -> None:
        """Keep the slots (naming their tensors) for the next call the check cache answers from this
        call's entry (:meth:`ContractWatch.repeat`)."""
        watch = self.watch
        watch.again = (self.dims, str(self.w.device), [(s[0], s[1], *_names(watch.rules[i], s), *s[5:])
                                                       for i, s in zip(self.rows, self.slots, strict=True)],
                       self.rows, self.env, self.shapes)


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
