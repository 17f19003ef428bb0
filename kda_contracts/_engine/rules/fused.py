"""Watch mode's fused check: the built-in value rules of one call on a CUDA device, evaluated by one
Triton kernel launch (:mod:`kda_contracts._engine.rules.fused_kernel`) instead of ~10 torch ops
per rule, with the first violation recorded into the device's flag and copied by the kernel
itself into pinned host memory (no copy, no event, no sync on the host's side).

A rule takes a kernel slot when its tensors allow it (:func:`slot_of`): ``InRange``,
``StartsAt``, ``EndsAt`` over a contiguous integer tensor; ``NonDecreasing`` over a contiguous
integer or floating tensor; ``Distinct`` over a contiguous integer tensor of at most
:data:`DISTINCT_MAX` elements (a pairwise compare); ``Finite`` over a floating tensor whose
elements form rows of a constant stride (any contiguous tensor, a row slice of a wider one);
``FiniteRows`` over a pool whose rows are each contiguous, with contiguous indices. Any other rule
(a user's ``ValueRule``, complex tensors, other layouts) is probed with torch ops as before
(:func:`~kda_contracts._engine.rules.reading.probes`), and nothing is lost either way: the
kernel's verdict equals the probe's (``tests/test_watch_fused.py`` holds them side by side).

The launch goes, after the first of each specialization, straight to the compiled kernel's
launcher (Triton's ``kernel[grid]`` costs ~25 µs of host time a call; this, ~3). Only CUDA
tensors use it; the tests run the kernel on the CPU under ``TRITON_INTERPRET=1``.

Example::

    state = FusedState(torch.device("cuda"))
    slots, rest = plan(rules, values, dims)          # kernel slots, and rules left to torch probes
    launch(state, [s for _, s in slots], serial=7)   # one launch per 8 rules, no sync
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .values import Distinct, EndsAt, Finite, FiniteRows, InRange, NonDecreasing, StartsAt, ValueRule

SLOTS = 8  # rule slots per launch (more rules: more launches)
# The record of a kernel that checks a call's rules itself (an op's own kernel, handed the scratch
# below and the call's serial; ``kda_kernels.interface`` states the same layout): int64 words, the
# claim (0 or the serial whose findings these are; shared with this module's kernel, which claims
# with its serial too), a lock, then per check (at most CHECKS) the first finding's key (element * 2
# + a tie-break), the count, the largest bad value, the first finding's value and extra (float64
# bits), then a bitmap of the row positions counted (at most OWN_ROWS_MAX). At the scratch's start.
CHECKS = 8
OWN_CLAIM, OWN_LOCK, OWN_FIRST, OWN_COUNT, OWN_WORST, OWN_VALUE, OWN_EXTRA, OWN_BITMAP = 0, 1, 2, 10, 18, 26, 34, 42
OWN_ROWS_MAX = 128 * 64
OWN_WORDS = OWN_BITMAP + OWN_ROWS_MAX // 64
STREAMS = 16  # scratch rows per device: one per stream that runs watched calls (more share the last)
ROW = 2 + 3 * 8 + 128 * 8  # int64 per scratch row: ticket, dirty, 3 per slot, a 128-word bitmap per slot
ROWS_MAX = 128 * 64  # positions FiniteRows takes in the kernel (its bitmap); more: a torch probe
BIG = 1 << 62
BLOCK, DB = 1024, 64
DISTINCT_MAX = 8192
GRID_MAX = 512
IN_RANGE, DISTINCT, FINITE, FINITE_ROWS, STARTS_AT, ENDS_AT, NON_DECREASING = range(1, 8)
_INT = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})
_FLOAT = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
SKIP: tuple[()] = ()  # a rule with nothing to check in this call (no elements, an integer tensor's Finite)
Slot = tuple[int, int, Tensor, Tensor, Tensor, int, int, int, int, int]  # kind, flags, X, Y, Z, n, c, s0, lo, hi


def _small(v: Any) -> bool:
    return isinstance(v, int) and -BIG < v < BIG


def _in_range(r: InRange, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    x = values[r.args[0]]
    if x.dtype not in _INT or not x.is_contiguous():
        return None
    if x.numel() == 0:
        return SKIP
    lo = r.resolve(r.low, dims) if r.low is not None else 0
    hi = r.resolve(r.high, dims) if r.high is not None else 0
    if not (_small(lo) and _small(hi)):
        return None
    flags = (r.low is not None) | (r.high is not None) << 1 | r.ignore_negative << 2
    return (IN_RANGE, flags, x, x, x, x.numel(), 1, 0, lo, hi)


def _distinct(r: Distinct, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    x = values[r.args[0]]
    if x.dtype not in _INT or not x.is_contiguous() or x.numel() > DISTINCT_MAX:
        return None
    return SKIP if x.numel() < 2 else (DISTINCT, r.ignore_negative << 2, x, x, x, x.numel(), 1, 0, 0, 0)


def _rows(x: Tensor) -> tuple[int, int] | None:
    """``(c, s0)`` when ``x``'s elements in order are rows of ``c`` contiguous elements ``s0`` apart."""
    if x.dim() == 0:
        return 1, 1
    shape, strides = x.shape, x.stride()
    c = shape[-1]
    if c != 1 and strides[-1] != 1:
        return (1, strides[-1]) if x.dim() == 1 else None
    s0, expect = None, None
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1]), strict=True):
        if size == 1:
            continue
        if s0 is None:
            s0, expect = stride, stride * size
        elif stride != expect:
            return None
        else:
            expect = stride * size
    return c, (s0 if s0 is not None else c)


def _finite(r: Finite, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    x = values[r.args[0]]
    if x.dtype not in _FLOAT:
        return SKIP if x.dtype in _INT or x.dtype == torch.bool else None
    n = x.numel()
    if n == 0:
        return SKIP
    if x.is_contiguous():  # (one row of n elements)
        return (FINITE, 0, x, x, x, n, n, n, 0, 0)
    rows = _rows(x)
    return None if rows is None else (FINITE, 0, x, x, x, n, rows[0], rows[1], 0, 0)


def _finite_rows(r: FiniteRows, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    pool, idx = values[r.args[0]], values[r.args[1]]
    only = values.get(r.args[2]) if len(r.args) > 2 else None
    if (pool.dtype not in _FLOAT or idx.dtype not in _INT or not idx.is_contiguous() or pool.dim() == 0
            or idx.numel() > ROWS_MAX):
        return None
    if only is not None and (not isinstance(only, Tensor) or only.dtype != torch.bool or not only.is_contiguous()
                             or only.numel() != idx.numel()):
        return None
    n_rows = pool.shape[0]
    if idx.numel() == 0 or n_rows == 0 or pool.numel() == 0:
        return SKIP
    c = pool.numel() // n_rows
    if not (pool.is_contiguous() or pool[0].is_contiguous()):
        return None
    z = only if only is not None else idx
    return (FINITE_ROWS, 8 if only is not None else 0, pool, idx, z, idx.numel(), c, pool.stride(0), 0, n_rows)


def _ends(r: StartsAt, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    x = values[r.args[0]]
    value = r.resolve(r.value, dims)
    if x.dtype not in _INT or not x.is_contiguous() or not _small(value):
        return None
    if x.numel() == 0:
        return SKIP
    return (ENDS_AT if isinstance(r, EndsAt) else STARTS_AT, 0, x, x, x, x.numel(), 1, 0, value, 0)


def _non_decreasing(r: NonDecreasing, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    x = values[r.args[0]]
    if not (x.dtype in _INT or x.dtype in _FLOAT) or not x.is_contiguous():
        return None
    return SKIP if x.numel() < 2 else (NON_DECREASING, 0, x, x, x, x.numel(), 1, 0, 0, 0)


_SLOT_OF: dict[type, Any] = {InRange: _in_range, Distinct: _distinct, Finite: _finite, FiniteRows: _finite_rows,
                             StartsAt: _ends, EndsAt: _ends, NonDecreasing: _non_decreasing}


def slot_of(rule: ValueRule, values: Mapping[str, Any], dims: Mapping[str, Any]) -> Slot | tuple[()] | None:
    """The kernel slot of one rule in one call, :data:`SKIP` (nothing to check) or None (probe it
    with torch ops). Only for a rule whose tensors are all present (``rule.probe`` would run)."""
    make = _SLOT_OF.get(type(rule))
    return None if make is None else make(rule, values, dims)


_PREPARED: dict[int, tuple[Sequence[ValueRule], list[tuple[Any, ValueRule, tuple[str, ...], tuple[str, ...]]]]] = {}


def _prepared(rules: Sequence[ValueRule]) -> list[tuple[Any, ValueRule, tuple[str, ...], tuple[str, ...]]]:
    """Per rule: its slot function (None: torch probe), the rule, the tensors it needs, its dim bounds."""
    hit = _PREPARED.get(id(rules))
    if hit is not None and hit[0] is rules:
        return hit[1]
    prep = [(_SLOT_OF.get(type(r)), r, r.args[:2], tuple(b for b in r.bounds() if isinstance(b, str)))
            for r in rules]
    if isinstance(rules, tuple):  # (a contract's own rules: kept, as the contract is)
        _PREPARED[id(rules)] = (rules, prep)
    return prep


def plan(rules: Sequence[ValueRule], values: Mapping[str, Any],
         dims: Mapping[str, Any]) -> tuple[list[tuple[int, Slot]], list[int]]:
    """``(kernel slots with their rule's position, positions of rules left to torch probes)``;
    rules with an argument None, an unbound bound, or nothing to check are in neither."""
    slots, rest = [], []
    for i, (make, r, needs, bounds) in enumerate(_prepared(rules)):
        if not isinstance(values.get(needs[0]), Tensor) or (len(needs) > 1 and not isinstance(values.get(needs[1]),
                                                                                               Tensor)):
            continue
        if bounds and any(dims.get(b) is None for b in bounds):
            continue
        s = None if make is None else make(r, values, dims)
        if s is None:
            rest.append(i)
        elif s:
            slots.append((i, s))
    return slots, rest


def grid_of(slots: Sequence[Slot]) -> int:
    """The programs one launch needs: the most blocks any slot has, at most :data:`GRID_MAX`."""
    units = 1
    for kind, _, _, _, _, n, c, _, _, _ in slots:
        units = max(units, n * -(-c // (8 * BLOCK)) if kind == FINITE_ROWS else -(-n // DB) if kind == DISTINCT else
                    1 if kind in (STARTS_AT, ENDS_AT) else -(-n // BLOCK))
    return min(units, GRID_MAX)


class OwnChecks(NamedTuple):
    """What an op's kernel that checks a call's rules itself records into: the scratch (its first
    :data:`OWN_WORDS`), a doorbell (a float64 tensor in host memory, pinned for CUDA: element 0 set
    to 1.0 on a finding) and the call's serial."""

    scratch: Tensor
    host: Tensor
    serial: int


def _fresh_own() -> Tensor:
    own = torch.zeros(OWN_WORDS, dtype=torch.int64)
    own[OWN_FIRST:OWN_FIRST + CHECKS] = BIG
    own[OWN_WORST:OWN_WORST + CHECKS] = -BIG
    return own


class FusedState:
    """One device's buffers for the kernel: the claim and the record of a kernel that checks rules
    itself (:data:`OWN_WORDS`, first), the per-stream scratch rows (made eagerly, before any
    capture), and the host buffer the kernel copies a recorded flag into (on the CPU: a doorbell
    of its own, for an op's kernel run under the interpreter)."""

    def __init__(self, device: torch.device, flag: Tensor, host: Tensor | None) -> None:
        self.device, self.flag, self.host = device, flag, host
        scratch = torch.zeros(OWN_WORDS + STREAMS * ROW, dtype=torch.int64)
        scratch[:OWN_WORDS] = _fresh_own()
        rows = scratch[OWN_WORDS:].view(STREAMS, ROW)
        rows[:, 2:2 + 3 * SLOTS:3] = BIG
        rows[:, 4:2 + 3 * SLOTS:3] = -BIG
        self.scratch = scratch.to(device)
        self.claim = self.scratch[:1]
        self.own = self.scratch[:OWN_WORDS]  # (an op kernel's record)
        self.own_fresh = _fresh_own().to(device)
        self.doorbell = host if host is not None else torch.zeros(1, dtype=torch.float64)
        self.flag_ptr, self.claim_ptr = flag.data_ptr(), self.claim.data_ptr()  # (device addresses)
        self.rows: dict[int, Tensor] = {}
        self.lock = threading.Lock()

    def own_row(self, order_of: Callable[[int], Sequence[int]]) -> list[float] | None:
        """The flag row (``[1, serial, check, element, value, count, extra]``) of what an op's kernel
        recorded, its check the first of ``order_of(serial)`` (the kernel's check numbers in the
        record's rule order) that found something; None when nothing is recorded. Reads the device:
        after a sync (an error's way)."""
        own = self.own.cpu()
        serial = int(own[OWN_CLAIM])
        if not serial:
            return None
        counts = own[OWN_COUNT:OWN_COUNT + CHECKS].tolist()
        found = [c for c in order_of(serial) if counts[c] > 0]
        if not found:
            return None
        c = found[0]
        value, extra = own[OWN_VALUE:OWN_EXTRA + CHECKS].view(torch.float64).tolist()[c::CHECKS]
        worst = int(own[OWN_WORST + c])  # (set by a range check only: its extra is the largest bad value)
        return [1.0, float(serial), float(c), float(int(own[OWN_FIRST + c]) // 2), value, float(counts[c]),
                float(worst) if worst > -BIG else extra]

    def row(self, stream: int) -> Tensor:
        """The scratch row of a stream (a new stream takes the next; past :data:`STREAMS`, the last is shared)."""
        r = self.rows.get(stream)
        if r is None:
            with self.lock:
                k = min(len(self.rows), STREAMS - 1)
                r = self.rows.setdefault(stream, self.scratch[OWN_WORDS + k * ROW:OWN_WORDS + (k + 1) * ROW])
        return r

    def clear(self) -> None:
        self.own.copy_(self.own_fresh)  # (the claim with it)
        if self.host is None:
            self.doorbell.zero_()


_usable: dict[str, Any] = {"ok": None}


def usable() -> bool:
    """Whether the kernel can be used (triton importable, not disabled after a failure)."""
    ok = _usable["ok"]
    if ok is None:
        import importlib.util

        ok = _usable["ok"] = importlib.util.find_spec("triton") is not None
    return bool(ok)


def disable(why: str) -> None:
    """Turn the kernel off for the process (torch probes from now on), with a warning."""
    if _usable["ok"] is not False:
        _usable["ok"] = False
        warnings.warn(f"watch mode's fused check kernel is off, value rules run as torch probes (slower): {why}",
                      RuntimeWarning, stacklevel=3)


_launch_cache: dict[tuple, tuple] = {}
_fast: dict[str, Any] = {"enabled": os.environ.get("KDA_TRITON_FAST_LAUNCH", "1") not in ("", "0"), "env": None}


def _kernel() -> Any:
    from .fused_kernel import watch_check_kernel

    return watch_check_kernel


def launch(state: FusedState, slots: Sequence[Slot], serial: int, stream: int = 0) -> None:
    """The kernel over ``slots`` on the current device and ``stream`` (its scratch row): one launch
    per :data:`SLOTS` of them; the flag records the slot's position in ``slots``."""
    for base in range(0, len(slots), SLOTS):
        _launch_one(state, slots[base:base + SLOTS], serial, base, stream)


def _launch_one(state: FusedState, slots: Sequence[Slot], serial: int, base: int, stream: int) -> None:
    """One launch over at most :data:`SLOTS` slots; the flag records ``base`` + the slot."""
    flag = state.flag
    row = state.row(stream)
    args: list[Any] = [flag, state.host if state.host is not None else flag, state.claim, row, serial, base]
    # the same arguments with every tensor as its address, for the compiled launcher (an int is taken
    # as the address as is; a tensor costs an attribute call and a driver query per argument)
    # (the host buffer stays a tensor: its device address is the driver's to give, one query)
    fast: list[Any] = [state.flag_ptr, args[1], state.claim_ptr, row.data_ptr(), serial, base]
    consts: list[Any] = []
    spec: list[Any] = []
    wide = not (-0x80000000 <= serial <= 0x7FFFFFFF)
    for kind, flags, x, y, z, n, c, s0, lo, hi in slots:
        xp, yp, zp = x.data_ptr(), y.data_ptr(), z.data_ptr()
        args += (x, y, z, n, c, s0, lo, hi)
        fast += (xp, yp, zp, n, c, s0, lo, hi)
        consts += (kind, flags)
        spec += (x.dtype, y.dtype, z.dtype, (xp | yp | zp) & 15 == 0 or (xp & 15, yp & 15, zp & 15))
        wide = wide or max(n, c, s0, lo, hi) > 0x7FFFFFFF or min(lo, s0) < -0x80000000
    for _ in range(SLOTS - len(slots)):
        args += (flag, flag, flag, 0, 0, 0, 0, 0)
        fast += (state.flag_ptr, state.flag_ptr, state.flag_ptr, 0, 0, 0, 0, 0)
        consts += (0, 0)
    consts += (BLOCK, DB, state.host is not None)
    grid = (grid_of(slots), max(len(slots), 1), 1)
    # the key: what Triton specializes on (the constexprs, the pointers' dtypes and alignment; our own
    # buffers are always aligned) and, when an int leaves i32, every int's class
    key: tuple | None = None
    if _fast["enabled"] and flag.is_cuda:
        env = _fast["env"] or _bind()
        if env is not None:
            key = (env[0](), tuple(consts), tuple(spec), _wide(args) if wide else None)
    if key is not None:
        entry = _launch_cache.get(key)
        if entry is not None:
            run, function, packed, get_stream = entry
            try:
                run(*grid, get_stream(key[0]), function, packed, None, None, None, *fast, *consts)
                return
            except Exception as exc:  # the normal launch below runs, and the fast one is off
                _fast["enabled"] = False
                warnings.warn(f"watch mode's check kernel: fast launch disabled ({exc!r})", RuntimeWarning,
                              stacklevel=3)
                key = None
    names = [f"{k}{i}" for i in range(SLOTS) for k in ("K", "F")] + ["BLOCK", "DB", "HOST_COPY"]
    compiled = _kernel()[grid](*args, **dict(zip(names, consts, strict=True)))
    if key is not None:
        _remember(key, compiled)


def _wide(args: Sequence[Any]) -> tuple:
    """Where the ints are i64 or u64 in the kernel's signature (not i32)."""
    return tuple((i, a > 0x7FFFFFFFFFFFFFFF) for i, a in enumerate(args)
                 if type(a) is int and not -0x80000000 <= a <= 0x7FFFFFFF)


def _bind() -> tuple | None:
    try:
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction

        if not isinstance(_kernel(), JITFunction):
            _fast["enabled"] = False
            return None
        env = _fast["env"] = (driver.active.get_current_device, driver.active.get_current_stream)
        return env
    except Exception:
        _fast["enabled"] = False
        return None


def _remember(key: tuple, compiled: Any) -> None:
    try:
        entry = (compiled.run, compiled.function, compiled.packed_metadata, _fast["env"][1])  # type: ignore[index]
    except Exception:
        _fast["enabled"] = False
        return
    if callable(entry[0]) and entry[1] is not None:
        _launch_cache[key] = entry
