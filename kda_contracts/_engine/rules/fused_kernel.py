"""The Triton kernel of watch mode's fused check (:mod:`kda_contracts._engine.rules.fused`): every
built-in value rule of one call, in one launch. Imported only when a watched call runs on a CUDA
device (or by the tests, on the CPU under ``TRITON_INTERPRET=1``); ``import kda_contracts`` never
imports triton.

A grid of ``[blocks, slots]`` programs works through up to :data:`SLOTS` rule slots side by side
(axis 1 is the slot, so their memory latencies overlap), each a grid-stride loop over its elements
(``FINITE_ROWS``: over chunks of the pool rows its index tensor names).
Each program folds what it found into the slot's scratch with atomics (first bad position: min;
count: add; the largest bad value of ``IN_RANGE``: max) and takes a ticket; the last program
(ticket == grid - 1) reads every slot back (resetting the scratch for the next call), computes
the first bad element's value and the rule's extra, records the first rule that found something
into the device flag unless it already holds a violation, and copies a recorded flag into the
host buffer (pinned memory: the host reads it without a sync or a copy of its own).

Scratch, int64, one row per stream (made before any capture, so never zeroed by a graph):
``[ticket, dirty, 3 per slot: first, count, worst, then 128 per slot: FINITE_ROWS' bitmap of the
positions found]``, left as found by the last program. The
claim, int64: 0 until a violation is recorded (a compare-and-swap: two streams never both record).
Flag, float64: ``[recorded, call serial, slot, element, value, count, extra]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

SLOTS = 8
NONE, IN_RANGE, DISTINCT, FINITE, FINITE_ROWS, STARTS_AT, ENDS_AT, NON_DECREASING = range(8)
HAS_LOW, HAS_HIGH, IGNORE_NEGATIVE, HAS_ONLY = 1, 2, 4, 8
BIG = 1 << 62
BLOCK = 1024
DB = 64  # the tile of the pairwise compare of DISTINCT
DISTINCT_MAX = 8192  # above this many elements DISTINCT is left to the torch probe (sort-based)


@triton.jit
def _scan(pid, P, X, Y, Z, n, c, s0, lo, hi, S, BM, DIRTY, KIND: tl.constexpr, FLAGS: tl.constexpr,
          BLOCK: tl.constexpr, DB: tl.constexpr):
    """One program's share of one slot, folded into its scratch ``S`` (first, count, worst; relaxed
    atomics, ordered by the ticket), ``BM`` (FINITE_ROWS: the positions found, so a row counts once)
    and ``DIRTY`` (set when anything was found: the last program reads the slots only then)."""
    big: tl.constexpr = 1 << 62
    first = tl.full([], big, tl.int64)
    count = tl.full([], 0, tl.int64)
    worst = tl.full([], -big, tl.int64)
    if KIND == 1 or KIND == 7:  # IN_RANGE, NON_DECREASING
        first, count, worst = _scan_flat(pid, P, X, n, lo, hi, first, count, worst, KIND, FLAGS, BLOCK)
    if KIND == 2:  # DISTINCT
        first, count = _scan_distinct(pid, P, X, n, first, count, FLAGS, DB)
    if KIND == 3:  # FINITE over x viewed [n // c, c], rows s0 apart
        for blk in range(pid, tl.cdiv(n, BLOCK), P):
            offs = (blk * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
            live = offs < n
            x = tl.load(X + (offs // c) * s0 + offs % c, mask=live, other=0)
            if X.dtype.element_ty != tl.float64:  # (16-bit floats compared as fp32: exact, NaN and Inf kept)
                x = x.to(tl.float32)
            bad = live & ((x != x) | (tl.abs(x) == float("inf")))
            first = tl.minimum(first, tl.min(tl.where(bad, offs, big), axis=0))
            count += tl.sum(bad.to(tl.int64), axis=0)
    if KIND == 4:  # FINITE_ROWS
        first, count = _scan_rows(pid, P, X, Y, Z, n, c, s0, hi, BM, first, count, FLAGS, BLOCK)
    if KIND == 5 or KIND == 6:  # STARTS_AT, ENDS_AT (program 0)
        if (pid == 0) & (n > 0):
            at = n - 1
            if KIND == 5:
                at = at * 0
            x = tl.load(X + at).to(tl.int64)
            if x != lo:
                first = tl.zeros([], tl.int64) + at
                count += 1
    if count > 0:
        tl.atomic_min(S, first, sem="relaxed")
        tl.atomic_add(S + 1, count, sem="relaxed")
        if KIND == 1:
            tl.atomic_max(S + 2, worst, sem="relaxed")
        tl.atomic_or(DIRTY, 1, sem="relaxed")


@triton.jit
def _scan_if(which, s: tl.constexpr, pid, P, X, Y, Z, n, c, s0, lo, hi, SCRATCH, KIND: tl.constexpr,
             FLAGS: tl.constexpr, BLOCK: tl.constexpr, DB: tl.constexpr):
    """Slot ``s``'s share for a program of the slot axis ``which`` (its scratch: stats, bitmap, dirty)."""
    if which == s:
        _scan(pid, P, X, Y, Z, n, c, s0, lo, hi, SCRATCH + 2 + 3 * s, SCRATCH + 26 + 128 * s, SCRATCH + 1, KIND, FLAGS,
              BLOCK, DB)


@triton.jit
def _scan_flat(pid, P, X, n, lo, hi, first, count, worst, KIND: tl.constexpr, FLAGS: tl.constexpr,
               BLOCK: tl.constexpr):
    """IN_RANGE (values outside [lo, hi), negatives kept or not) and NON_DECREASING (x[j] < x[j-1])."""
    big: tl.constexpr = 1 << 62
    for blk in range(pid, tl.cdiv(n, BLOCK), P):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        if KIND == 1:
            x = tl.load(X + offs, mask=live, other=0).to(tl.int64)
            bad = live & (x != x)  # (all False)
            if FLAGS & 2:
                bad = bad | (x >= hi)
            if FLAGS & 1:
                bad = bad | (x < lo)
            if FLAGS & 4:
                bad = bad & (x >= 0)
            bad = bad & live
            worst = tl.maximum(worst, tl.max(tl.where(bad, x, -big), axis=0))
        else:
            live = live & (offs >= 1)
            x = tl.load(X + offs, mask=live, other=0)
            before = tl.load(X + offs - 1, mask=live, other=0)
            bad = live & (x < before)
        first = tl.minimum(first, tl.min(tl.where(bad, offs.to(tl.int64), big), axis=0))
        count += tl.sum(bad.to(tl.int64), axis=0)
    return first, count, worst


@triton.jit
def _scan_distinct(pid, P, X, n, first, count, FLAGS: tl.constexpr, DB: tl.constexpr):
    """DISTINCT: position j is bad when an earlier position holds its value (tiles of DB x DB)."""
    big: tl.constexpr = 1 << 62
    for jb in range(pid, tl.cdiv(n, DB), P):
        oj = jb * DB + tl.arange(0, DB)
        mj = oj < n
        xj = tl.load(X + oj, mask=mj, other=0).to(tl.int64)
        dup = tl.zeros([DB], dtype=tl.int32)
        for ib in range(0, jb + 1):
            oi = ib * DB + tl.arange(0, DB)
            xi = tl.load(X + oi, mask=oi < n, other=0).to(tl.int64)
            eq = (xj[:, None] == xi[None, :]) & (oi[None, :] < oj[:, None])
            dup = tl.maximum(dup, tl.max(eq.to(tl.int32), axis=1))
        bad = mj & (dup > 0)
        if FLAGS & 4:
            bad = bad & (xj >= 0)
        first = tl.minimum(first, tl.min(tl.where(bad, oj.to(tl.int64), big), axis=0))
        count += tl.sum(bad.to(tl.int64), axis=0)
    return first, count


@triton.jit
def _scan_rows(pid, P, X, Y, Z, n, c, s0, hi, BM, first, count, FLAGS: tl.constexpr, BLOCK: tl.constexpr):
    """FINITE_ROWS: the pool X's row Y[j] (c elements, rows s0 apart) for j < n, where 0 <= Y[j] < hi
    (and Z[j], with HAS_ONLY), in chunks of 8 blocks (a row of a decode pool is ~0.5M elements: many
    programs share it); a position counts once (its bit in BM)."""
    nchunk = tl.cdiv(c, 8 * BLOCK)
    for u in range(pid, n * nchunk, P):
        j = tl.zeros([], tl.int64) + u // nchunk
        chunk = u % nchunk
        slot = tl.load(Y + j).to(tl.int64)
        used = (slot >= 0) & (slot < hi)
        if FLAGS & 8:
            used = used & (tl.load(Z + j).to(tl.int32) != 0)
        nonfinite = tl.full([], 0, tl.int32)
        if used:
            for blk in tl.static_range(8):
                offs = chunk * (8 * BLOCK) + blk * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(X + slot * s0 + offs, mask=offs < c, other=0)
                if X.dtype.element_ty != tl.float64:
                    x = x.to(tl.float32)
                nonfinite = tl.maximum(nonfinite, tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32),
                                                         axis=0))
        if nonfinite > 0:
            bit = tl.full([], 1, tl.int64) << (j % 64)
            old = tl.atomic_or(BM + j // 64, bit, sem="relaxed")
            first = tl.minimum(first, j)
            count += ((old & bit) == 0).to(tl.int64)
    return first, count


@triton.jit
def _report(X, Y, n, c, s0, S, BM, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """The last program: a slot's (count, first, value, extra), its scratch reset."""
    big: tl.constexpr = 1 << 62
    first = tl.atomic_xchg(S, big, sem="relaxed")
    count = tl.atomic_xchg(S + 1, 0, sem="relaxed")
    worst = tl.atomic_xchg(S + 2, -big, sem="relaxed")
    if KIND == 4:
        if count > 0:  # (the positions' bits back to 0)
            for w in range(0, tl.cdiv(n, 64), BLOCK):
                offs = w + tl.arange(0, BLOCK)
                tl.atomic_xchg(BM + offs, tl.zeros([BLOCK], tl.int64), mask=offs < tl.cdiv(n, 64), sem="relaxed")
    at = tl.where(count > 0, first, 0)
    value = tl.full([], 0.0, tl.float64)
    extra = tl.full([], 0.0, tl.float64)
    if KIND == 1 or KIND == 2 or KIND == 5 or KIND == 6 or KIND == 7:
        value = tl.load(X + at, mask=count > 0, other=0).to(tl.float64)
    if KIND == 1:
        extra = worst.to(tl.float64)
    if KIND == 7:
        extra = tl.load(X + at - 1, mask=count > 0, other=0).to(tl.float64)
    if KIND == 2:  # where the value first occurs
        if count > 0:
            v = tl.load(X + at).to(tl.int64)
            earliest = tl.full([], big, tl.int64)
            for blk in range(0, tl.cdiv(n, BLOCK)):
                offs = blk * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(X + offs, mask=offs < n, other=0).to(tl.int64)
                earliest = tl.minimum(earliest, tl.min(tl.where((offs < n) & (x == v), offs.to(tl.int64), big),
                                                       axis=0))
            extra = earliest.to(tl.float64)
    if KIND == 3:
        value = tl.load(X + (at // c) * s0 + at % c, mask=count > 0, other=0).to(tl.float64)
    if KIND == 4:  # the row's largest magnitude (NaN when it holds one); extra: the row
        if count > 0:
            slot = tl.load(Y + at).to(tl.int64)
            nan = tl.full([], 0, tl.int32)
            big_abs = tl.full([], 0.0, tl.float64)
            for blk in range(0, tl.cdiv(c, BLOCK)):
                offs = blk * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(X + slot * s0 + offs, mask=offs < c, other=0).to(tl.float64)
                nan = tl.maximum(nan, tl.max((x != x).to(tl.int32), axis=0))
                big_abs = tl.maximum(big_abs, tl.max(tl.where(x != x, 0.0, tl.abs(x)), axis=0))
            value = tl.where(nan > 0, float("nan"), big_abs.to(tl.float64))
            extra = slot.to(tl.float64)
    return count, first, value, extra


@triton.jit
def _report_take(X, Y, n, c, s0, S, BM, KIND: tl.constexpr, BLOCK: tl.constexpr, s, r_slot, r_at, r_value,
                 r_count, r_extra, taken):
    count, first, value, extra = _report(X, Y, n, c, s0, S, BM, KIND, BLOCK)
    return _take(r_slot, r_at, r_value, r_count, r_extra, taken, s, count, first, value, extra)


@triton.jit
def _take(r_slot, r_at, r_value, r_count, r_extra, taken, s, count, first, value, extra):
    """Fold slot ``s``'s report into the running record (slot, element, value, count, extra, taken):
    the first slot that found something, unless one did before (``taken``)."""
    take = (taken == 0) & (count > 0)
    return (tl.where(take, s, r_slot), tl.where(take, first.to(tl.float64), r_at), tl.where(take, value, r_value),
            tl.where(take, count.to(tl.float64), r_count), tl.where(take, extra, r_extra), taken + take.to(tl.int32))


@triton.jit(do_not_specialize=["n0", "c0", "s0_0", "lo0", "hi0", "n1", "c1", "s0_1", "lo1", "hi1",
                               "n2", "c2", "s0_2", "lo2", "hi2", "n3", "c3", "s0_3", "lo3", "hi3",
                               "n4", "c4", "s0_4", "lo4", "hi4", "n5", "c5", "s0_5", "lo5", "hi5",
                               "n6", "c6", "s0_6", "lo6", "hi6", "n7", "c7", "s0_7", "lo7", "hi7", "serial", "base"])
def watch_check_kernel(
    FLAG, HOST, CLAIM, SCRATCH, serial, base,
    X0, Y0, Z0, n0, c0, s0_0, lo0, hi0, X1, Y1, Z1, n1, c1, s0_1, lo1, hi1,
    X2, Y2, Z2, n2, c2, s0_2, lo2, hi2, X3, Y3, Z3, n3, c3, s0_3, lo3, hi3,
    X4, Y4, Z4, n4, c4, s0_4, lo4, hi4, X5, Y5, Z5, n5, c5, s0_5, lo5, hi5,
    X6, Y6, Z6, n6, c6, s0_6, lo6, hi6, X7, Y7, Z7, n7, c7, s0_7, lo7, hi7,
    K0: tl.constexpr, F0: tl.constexpr, K1: tl.constexpr, F1: tl.constexpr, K2: tl.constexpr, F2: tl.constexpr,
    K3: tl.constexpr, F3: tl.constexpr, K4: tl.constexpr, F4: tl.constexpr, K5: tl.constexpr, F5: tl.constexpr,
    K6: tl.constexpr, F6: tl.constexpr, K7: tl.constexpr, F7: tl.constexpr, BLOCK: tl.constexpr, DB: tl.constexpr,
    HOST_COPY: tl.constexpr,
):
    pid, which = tl.program_id(0), tl.program_id(1)  # (a block of the slot ``which``: slots side by side)
    P = tl.num_programs(0)
    if K0 != 0:
        _scan_if(which, 0, pid, P, X0, Y0, Z0, n0, c0, s0_0, lo0, hi0, SCRATCH, K0, F0, BLOCK, DB)
    if K1 != 0:
        _scan_if(which, 1, pid, P, X1, Y1, Z1, n1, c1, s0_1, lo1, hi1, SCRATCH, K1, F1, BLOCK, DB)
    if K2 != 0:
        _scan_if(which, 2, pid, P, X2, Y2, Z2, n2, c2, s0_2, lo2, hi2, SCRATCH, K2, F2, BLOCK, DB)
    if K3 != 0:
        _scan_if(which, 3, pid, P, X3, Y3, Z3, n3, c3, s0_3, lo3, hi3, SCRATCH, K3, F3, BLOCK, DB)
    if K4 != 0:
        _scan_if(which, 4, pid, P, X4, Y4, Z4, n4, c4, s0_4, lo4, hi4, SCRATCH, K4, F4, BLOCK, DB)
    if K5 != 0:
        _scan_if(which, 5, pid, P, X5, Y5, Z5, n5, c5, s0_5, lo5, hi5, SCRATCH, K5, F5, BLOCK, DB)
    if K6 != 0:
        _scan_if(which, 6, pid, P, X6, Y6, Z6, n6, c6, s0_6, lo6, hi6, SCRATCH, K6, F6, BLOCK, DB)
    if K7 != 0:
        _scan_if(which, 7, pid, P, X7, Y7, Z7, n7, c7, s0_7, lo7, hi7, SCRATCH, K7, F7, BLOCK, DB)
    ticket = tl.atomic_add(SCRATCH, 1)
    if ticket == P * tl.num_programs(1) - 1:
        tl.atomic_xchg(SCRATCH, 0, sem="relaxed")
        r_slot, taken = tl.full([], 0, tl.int32), tl.zeros([], tl.int32)
        r_at, r_value, r_count, r_extra = (tl.full([], 0.0, tl.float64), tl.full([], 0.0, tl.float64),
                                           tl.full([], 0.0, tl.float64), tl.full([], 0.0, tl.float64))
        dirty = tl.atomic_xchg(SCRATCH + 1, 0, sem="relaxed")
        if dirty != 0:  # (nothing found by any program: every slot's scratch is as it was)
            if K0 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X0, Y0, n0, c0, s0_0, SCRATCH + 2, SCRATCH + 26, K0, BLOCK, 0,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K1 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X1, Y1, n1, c1, s0_1, SCRATCH + 5, SCRATCH + 154, K1, BLOCK, 1,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K2 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X2, Y2, n2, c2, s0_2, SCRATCH + 8, SCRATCH + 282, K2, BLOCK, 2,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K3 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X3, Y3, n3, c3, s0_3, SCRATCH + 11, SCRATCH + 410, K3, BLOCK, 3,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K4 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X4, Y4, n4, c4, s0_4, SCRATCH + 14, SCRATCH + 538, K4, BLOCK, 4,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K5 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X5, Y5, n5, c5, s0_5, SCRATCH + 17, SCRATCH + 666, K5, BLOCK, 5,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K6 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X6, Y6, n6, c6, s0_6, SCRATCH + 20, SCRATCH + 794, K6, BLOCK, 6,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
            if K7 != 0:
                r_slot, r_at, r_value, r_count, r_extra, taken = _report_take(
                    X7, Y7, n7, c7, s0_7, SCRATCH + 23, SCRATCH + 922, K7, BLOCK, 7,
                    r_slot, r_at, r_value, r_count, r_extra, taken)
        _record(FLAG, HOST, CLAIM, serial, base, r_slot, r_at, r_value, r_count, r_extra, taken, HOST_COPY)


@triton.jit
def _record(FLAG, HOST, CLAIM, serial, base, r_slot, r_at, r_value, r_count, r_extra, taken,
            HOST_COPY: tl.constexpr):
    """The last program: the call's first violation into the flag, unless one is recorded (the
    claim decides between streams), and a recorded flag into the host buffer."""
    recorded = tl.load(FLAG) != 0
    won = tl.zeros([], tl.int32)
    if (taken > 0) & (recorded == 0):  # the device's first violation: claim it (other streams race)
        # (claimed with the serial, as an op's own kernel claims it: each sees whose the claim is)
        won = (tl.atomic_cas(CLAIM, tl.zeros([], tl.int64), tl.zeros([], tl.int64) + serial) == 0).to(tl.int32)
    if won > 0:
        tl.store(FLAG + 1, serial.to(tl.float64))
        tl.store(FLAG + 2, (r_slot + base).to(tl.float64))
        tl.store(FLAG + 3, r_at)
        tl.store(FLAG + 4, r_value)
        tl.store(FLAG + 5, r_count)
        tl.store(FLAG + 6, r_extra)
        tl.debug_barrier()
        tl.store(FLAG, 1.0)
    if HOST_COPY:
        if (won > 0) | recorded:  # (recorded now, or before: the host sees it without a copy)
            for k in tl.static_range(1, 7):
                tl.store(HOST + k, tl.load(FLAG + k))
            tl.store(HOST, 1.0)
