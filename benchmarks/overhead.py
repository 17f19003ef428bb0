"""Per-call cost of validating a KDA packed-decode call, every path side by side in one CPU run.

The call is the 9-tensor packed-decode signature in sglang's argument order (``mixed_qkv, a, b,
A_log, dt_bias, scale, initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel,
lower_bound``) with Kimi-Linear-48B-A3B TP1 shapes at B = 1 (H = HV = 32, K = V = 128, bf16
activations, fp32 state, int32 indices, a pool of 8 slots). Every "kernel" here returns at once:
what is timed is validation plus the Python call, not a kernel.

Paths:

- ``no check``: a plain function of the same signature that returns immediately.
- ``hand-written``: :func:`hand_written_validator`, our own validator equivalent to the checks
  sglang's packed decode makes (its docstring lists and counts them); raises ``ValueError``.
- ``jaxtyping + beartype``: :func:`jaxtyping_decode`, ``@jaxtyped(typechecker=beartype)`` on the
  same annotations, state first (binder-first order: jaxtyping evaluates ``B HV*K`` only once HV
  and K are bound, so the state must come before ``a``). jaxtyping cannot solve ``H`` from
  ``B 2*H*K+HV*V``, so ``mixed_qkv`` is ``B QKV`` and the body checks H (see its docstring).
- ``kda-contracts``: ``kc.packed_decode_contract("VK")`` driven through its decorated wrapper
  (``build_wrapper(contract)``, what ``@kc.contract`` returns) and through ``kc.validate_packed_decode``:

  - ``off, decorated while off``: ``@kc.contract`` applied under ``kc.mode("off")`` returns the
    function itself (identity), so this costs exactly an undecorated call;
  - ``off at run time``: the check-mode wrapper called under ``with kc.mode("off")`` (one mode read);
  - ``check, repeat calls``: the same arguments every call;
  - ``check, first call of a new shape``: every timed call has a (B, N) pair never seen before in
    the run (B >= 2 requests, a pool of N <= 16 slots), its tensors fresh slice views of buffers
    allocated up front (so no allocation is timed and every tensor object is new). There is no
    shape cache in the library yet, so this is the generated checker on never-seen metadata: it
    measures what a cache miss would cost (cold-ish: the checker's code is warm, the tensors'
    metadata is not); when a cache keyed by the metadata signature lands, this row is its miss
    path and the repeat row its hit path. The hand-written validator is timed on the same kind
    of calls for reference (the target compares with its repeat-call row);
  - ``check + KDAConfig``: ``config=cfg`` on every call, adding config agreement (dims, dtypes,
    scale, l2norm, gate);
  - ``strict``: check mode plus the value checks (index range, duplicate slots, ``out`` aliasing,
    finiteness of the activations). These read tensor values (on a GPU: a device sync).
- user functions (section "User functions"): ``lin2`` (2 tensors), ``lin2_batch`` (``*batch``),
  ``attn6`` (6 tensors, attention-ish, one expression dim) and ``attn6_batch``, each as no check, a
  hand-written validator making exactly the contract's checks, jaxtyping + beartype, the
  ``@kc.contract`` wrapper in check mode and its generated checker alone.
- "Where the time goes": primitive operations the generated checker performs (``t.shape``,
  ``t.device``, ``t.stride()``, ...), timed alone on the call's tensors, and every top-level statement
  of the generated packed-decode checker and of the hand-written validators timed alone, summed by
  operation kind (:data:`LINE_KINDS`).

Timing is ``timeit``-style: the garbage collector is off while a loop runs, each loop calls the
path on a prepared list of argument tuples (the same loop for every path), and the timer is the
process's CPU time (``time.process_time``; ``--timer wall`` for ``perf_counter``), so time spent
descheduled by other load on a shared machine is not counted. Rounds interleave the paths (each
round runs every path back to back); each path reports the median over rounds (µs per call) and
its interquartile range. Each target of issue 4 is the median over rounds of the ratio of two
paths within a round.

    python benchmarks/overhead.py                           # print the table
    python benchmarks/overhead.py --out docs/benchmarks.md  # also write/replace its section there
    python benchmarks/overhead.py --quick                   # a dry run in seconds (numbers meaningless)
"""

# No `from __future__ import annotations`: jaxtyping_decode's annotations must be real objects.

import argparse
import ast
import contextvars
import datetime
import gc
import importlib.metadata
import inspect
import os
import platform
import re
import statistics
import sys
import textwrap
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from beartype import beartype
from jaxtyping import Bool, Float, Float32, Int, jaxtyped
from torch import Tensor

import kda_contracts as kc
from kda_contracts._engine import modes
from kda_contracts._engine.contract.wrapping import build_wrapper
from kda_contracts.testing import make_decode_call

SECTION = "## Contract overhead (CPU)"
ARG_ORDER = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices",
             "use_qk_l2norm_in_kernel", "lower_bound")
BATCH, POOL = 1, 8
FRESH_CALLS = 300  # calls per round on the new-shape paths
TIMERS = {"process": time.process_time, "wall": time.perf_counter}
TIMER = time.process_time  # CPU time of this process: time spent descheduled by other load is not counted

_INDEX_DTYPES = (torch.int32, torch.int64)


# -- 1. no check -------------------------------------------------------------------------------------
def no_check(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
             use_qk_l2norm_in_kernel=False, lower_bound=None):
    """The baseline: same signature, returns at once."""
    return None


# -- 2. hand-written ---------------------------------------------------------------------------------
def hand_written_validator(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                           use_qk_l2norm_in_kernel=False, lower_bound=None):
    """What a careful engineer writes by hand for the packed-decode call (our own code, modelled on
    the checks sglang's packed decode makes). Raises ``ValueError`` at the first failure.

    Dims: ``B`` from ``mixed_qkv``; ``N, HV, V, K`` from the state ([N, HV, V, K], VK layout);
    ``H`` from the width of ``mixed_qkv``. 27 checks, in order:

    1-8.   rank of each tensor: mixed_qkv 2, a 2, b 2, A_log 1, dt_bias 1, initial_state 4, out 4,
           ssm_state_indices 1 (8 checks)
    9.     state inner dims: HV, V and K all >= 1 (guards the division below)
    10.    H derived from the width: ``width - HV*V`` positive and divisible by ``2*K``
    11.    ``HV % H == 0``
    12-15. batch agreement: a, b, out, ssm_state_indices have ``shape[0] == B`` (4 checks)
    16.    ``a.shape[1] == HV*K``
    17.    ``b.shape[1] == HV``
    18.    ``A_log.shape == (HV,)``
    19.    ``dt_bias.shape == (HV*K,)``
    20.    ``out.shape[1:] == (1, HV, V)``
    21.    ``A_log.dtype == float32``
    22.    ``dt_bias.dtype == float32``
    23.    ``ssm_state_indices.dtype`` is int32 or int64
    24-27. last dim has stride 1: mixed_qkv, a, b, initial_state (4 checks)

    Not checked (kda-contracts' check mode does check these): Tensor-ness, activation and state
    dtypes, ``out`` dtype == ``mixed_qkv`` dtype, devices, full contiguity of A_log/dt_bias/out,
    the inner strides of each state slot, N >= 1, the scalars (scale > 0, bool, lower_bound < 0).
    """
    if mixed_qkv.ndim != 2:
        raise ValueError(f"mixed_qkv must be 2-D [B, 2*H*K + HV*V], got shape {tuple(mixed_qkv.shape)}")
    if a.ndim != 2:
        raise ValueError(f"a must be 2-D [B, HV*K], got shape {tuple(a.shape)}")
    if b.ndim != 2:
        raise ValueError(f"b must be 2-D [B, HV], got shape {tuple(b.shape)}")
    if A_log.ndim != 1:
        raise ValueError(f"A_log must be 1-D [HV], got shape {tuple(A_log.shape)}")
    if dt_bias.ndim != 1:
        raise ValueError(f"dt_bias must be 1-D [HV*K], got shape {tuple(dt_bias.shape)}")
    if initial_state.ndim != 4:
        raise ValueError(f"initial_state must be 4-D [N, HV, V, K], got shape {tuple(initial_state.shape)}")
    if out.ndim != 4:
        raise ValueError(f"out must be 4-D [B, 1, HV, V], got shape {tuple(out.shape)}")
    if ssm_state_indices.ndim != 1:
        raise ValueError(f"ssm_state_indices must be 1-D [B], got shape {tuple(ssm_state_indices.shape)}")
    B, width = mixed_qkv.shape
    _N, HV, V, K = initial_state.shape
    if HV < 1 or V < 1 or K < 1:
        raise ValueError(f"initial_state has an empty head dim: HV={HV}, V={V}, K={K}")
    qk = width - HV * V
    if qk <= 0 or qk % (2 * K):
        raise ValueError(f"mixed_qkv width {width} - HV*V ({HV * V}) is not a positive multiple of 2*K ({2 * K})")
    H = qk // (2 * K)
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    if a.shape[0] != B:
        raise ValueError(f"a has batch {a.shape[0]}, mixed_qkv has {B}")
    if b.shape[0] != B:
        raise ValueError(f"b has batch {b.shape[0]}, mixed_qkv has {B}")
    if out.shape[0] != B:
        raise ValueError(f"out has batch {out.shape[0]}, mixed_qkv has {B}")
    if ssm_state_indices.shape[0] != B:
        raise ValueError(f"ssm_state_indices has {ssm_state_indices.shape[0]} entries, batch is {B}")
    if a.shape[1] != HV * K:
        raise ValueError(f"a must be [B, HV*K] = [{B}, {HV * K}], got {tuple(a.shape)}")
    if b.shape[1] != HV:
        raise ValueError(f"b must be [B, HV] = [{B}, {HV}], got {tuple(b.shape)}")
    if A_log.shape[0] != HV:
        raise ValueError(f"A_log must be [HV] = [{HV}], got {tuple(A_log.shape)}")
    if dt_bias.shape[0] != HV * K:
        raise ValueError(f"dt_bias must be [HV*K] = [{HV * K}], got {tuple(dt_bias.shape)}")
    if out.shape[1] != 1 or out.shape[2] != HV or out.shape[3] != V:
        raise ValueError(f"out must be [B, 1, HV, V] = [{B}, 1, {HV}, {V}], got {tuple(out.shape)}")
    if A_log.dtype != torch.float32:
        raise ValueError(f"A_log must be float32, got {A_log.dtype}")
    if dt_bias.dtype != torch.float32:
        raise ValueError(f"dt_bias must be float32, got {dt_bias.dtype}")
    if ssm_state_indices.dtype not in _INDEX_DTYPES:
        raise ValueError(f"ssm_state_indices must be int32 or int64, got {ssm_state_indices.dtype}")
    if mixed_qkv.stride(-1) != 1:
        raise ValueError("mixed_qkv must have a contiguous last dim")
    if a.stride(-1) != 1:
        raise ValueError("a must have a contiguous last dim")
    if b.stride(-1) != 1:
        raise ValueError("b must have a contiguous last dim")
    if initial_state.stride(-1) != 1:
        raise ValueError("initial_state must have a contiguous last dim")
    return None


HAND_WRITTEN_CHECKS = 27


_ACT_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
_FLOAT32 = torch.float32
_NUMBER = (int, float)


def hand_written_full(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                      use_qk_l2norm_in_kernel=False, lower_bound=None):
    """Hand-written, every check kda-contracts' check mode makes on the packed-decode call (no
    config), written for speed: each tensor attribute read once, whole-shape tuple compares,
    unpacked shapes and strides, dtypes compared by identity (torch dtypes are singletons), one
    kind of check per statement. Also a prototype of what the generated checker could look like
    (same verdict as ``packed_decode_contract("VK")._check``: tests/test_overhead_benchmark.py).
    Raises ``ValueError``. 52 checks:

    1-11.  types: the 8 tensors are Tensors, ``scale`` int/float, the flag a bool, ``lower_bound``
           None or int/float (11)
    12-13. ranks: mixed_qkv 2, initial_state 4 (2; the others' ranks come with their whole shapes)
    14.    H from the width: ``width - HV*V`` a positive multiple of ``2*K`` (so H >= 1)
    15-20. whole shapes: a (B, HV*K), b (B, HV), A_log (HV,), dt_bias (HV*K,), out (B, 1, HV, V),
           ssm_state_indices (B,) (6)
    21-25. ``HV % H == 0``; HV, K, V, N >= 1 (5)
    26-34. dtypes: mixed_qkv, a, b, state, out in bf16/fp16/fp32; A_log, dt_bias fp32; indices
           int32/int64 (8); out's dtype is mixed_qkv's (1)
    35-41. devices: the other 7 tensors on mixed_qkv's device (7)
    42-44. last dim has stride 1 (or size 1): mixed_qkv, a, b (3)
    45-48. contiguous: A_log, dt_bias, out, ssm_state_indices (4)
    49-50. state: each slot a dense [HV, V, K] block; slot stride >= HV*V*K when N > 1 (2)
    51-52. ``scale`` > 0 (not NaN); ``lower_bound`` < 0 when given (2)
    """
    if (not isinstance(mixed_qkv, Tensor) or not isinstance(a, Tensor) or not isinstance(b, Tensor)
            or not isinstance(A_log, Tensor) or not isinstance(dt_bias, Tensor)
            or not isinstance(initial_state, Tensor) or not isinstance(out, Tensor)
            or not isinstance(ssm_state_indices, Tensor) or not isinstance(scale, _NUMBER)
            or not isinstance(use_qk_l2norm_in_kernel, bool)
            or (lower_bound is not None and not isinstance(lower_bound, _NUMBER))):
        raise ValueError("tensors, a number scale, a bool flag and a number (or None) lower_bound expected")
    s0, s6 = mixed_qkv.shape, initial_state.shape
    if len(s0) != 2 or len(s6) != 4:
        raise ValueError(f"mixed_qkv must be 2-D and initial_state 4-D, got {tuple(s0)} and {tuple(s6)}")
    B, width = s0
    N, HV, V, K = s6
    if K == 0:
        raise ValueError("initial_state has K = 0")
    rest = width - HV * V
    if rest % (2 * K) or rest // (2 * K) < 1:
        raise ValueError(f"mixed_qkv width {width} - HV*V ({HV * V}) is not a positive multiple of 2*K ({2 * K})")
    H = rest // (2 * K)
    HVK = HV * K
    if (a.shape != (B, HVK) or b.shape != (B, HV) or A_log.shape != (HV,) or dt_bias.shape != (HVK,)
            or out.shape != (B, 1, HV, V) or ssm_state_indices.shape != (B,)):
        raise ValueError("a, b, A_log, dt_bias, out or ssm_state_indices has the wrong shape")
    if HV % H or HV < 1 or K < 1 or V < 1 or N < 1:
        raise ValueError(f"HV={HV} must be a multiple of H={H}; HV, K, V, N >= 1")
    dt0 = mixed_qkv.dtype
    if (dt0 not in _ACT_DTYPES or a.dtype not in _ACT_DTYPES or b.dtype not in _ACT_DTYPES
            or A_log.dtype is not _FLOAT32 or dt_bias.dtype is not _FLOAT32
            or initial_state.dtype not in _ACT_DTYPES or out.dtype is not dt0
            or ssm_state_indices.dtype not in _INDEX_DTYPES):
        raise ValueError("activations, state and out must be bf16/fp16/fp32 (out as mixed_qkv), A_log and "
                         "dt_bias fp32, indices int32/int64")
    dev = mixed_qkv.device
    if (a.device != dev or b.device != dev or A_log.device != dev or dt_bias.device != dev
            or initial_state.device != dev or out.device != dev or ssm_state_indices.device != dev):
        raise ValueError(f"every tensor must be on mixed_qkv's device {dev}")
    if ((width != 1 and mixed_qkv.stride()[1] != 1) or (HVK != 1 and a.stride()[1] != 1)
            or (HV != 1 and b.stride()[1] != 1)):
        raise ValueError("mixed_qkv, a and b must have a contiguous last dim")
    t0, t1, t2, t3 = initial_state.stride()
    if (K != 1 and t3 != 1) or (V != 1 and t2 != K) or (HV != 1 and t1 != K * V) or (N > 1 and t0 < HV * V * K):
        raise ValueError("initial_state: each slot must be a dense [HV, V, K] block")
    if (not A_log.is_contiguous() or not dt_bias.is_contiguous() or not out.is_contiguous()
            or not ssm_state_indices.is_contiguous()):
        raise ValueError("A_log, dt_bias, out and ssm_state_indices must be contiguous")
    if not (scale == scale and scale > 0):
        raise ValueError(f"scale must be > 0, got {scale}")
    if lower_bound is not None and not (lower_bound == lower_bound and lower_bound < 0):
        raise ValueError(f"lower_bound must be < 0, got {lower_bound}")
    return None


HAND_WRITTEN_FULL_CHECKS = 52


# -- 3. jaxtyping + beartype -------------------------------------------------------------------------
@jaxtyped(typechecker=beartype)
def jaxtyping_decode(
    initial_state: Float[Tensor, "N HV V K"],  # first: binds N, HV, V, K for the arithmetic dims below
    mixed_qkv: Float[Tensor, "B QKV"],  # "B 2*H*K+HV*V" cannot run: jaxtyping cannot solve H
    a: Float[Tensor, "B HV*K"],
    b: Float[Tensor, "B HV"],
    A_log: Float32[Tensor, "HV"],
    dt_bias: Float32[Tensor, "HV*K"],
    scale: float,
    out: Float[Tensor, "B 1 HV V"],
    ssm_state_indices: Int[Tensor, "B"],
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> None:
    """The generic route: jaxtyping shapes/dtypes, beartype for the scalars. jaxtyping evaluates
    arithmetic dims from names already bound but cannot solve an unknown, so ``H`` (hidden in the
    width of ``mixed_qkv``) is checked in the body, as one would with jaxtyping. It does not
    check strides."""
    _N, HV, V, K = initial_state.shape
    qk = mixed_qkv.shape[1] - HV * V
    if qk <= 0 or qk % (2 * K) or HV % (qk // (2 * K)):
        raise ValueError("mixed_qkv width does not give an H with HV % H == 0")


def jaxtyping_args(call: dict[str, Any]) -> tuple[Any, ...]:
    """A call's arguments in :func:`jaxtyping_decode`'s (binder-first) order."""
    order = ("initial_state", *(n for n in ARG_ORDER if n != "initial_state"))
    return tuple(call[n] for n in order)


# -- setup ----------------------------------------------------------------------------------------------
def config() -> kc.KDAConfig:
    """Kimi-Linear-48B-A3B at TP1, pinned to the dtypes :func:`make_decode_call` builds."""
    return kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=1, index_dtype="int32", activation_dtype="bfloat16",
                               state_dtype="float32")


def signature_function(contract: kc.Contract) -> Callable[..., Any]:
    """A no-op function of the sglang signature carrying the packed-decode contract's annotations
    (those of ``contract.fn`` minus its ``config`` parameter), for ``@kc.contract`` to decorate."""
    def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                      use_qk_l2norm_in_kernel=False, lower_bound=None):
        return None

    packed_decode.__annotations__ = {k: v for k, v in contract.fn.__annotations__.items()
                                     if k not in ("config", "state_layout")}
    return packed_decode


def sglang_args(call: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(call[n] for n in ARG_ORDER)


class FreshShapes:
    """Argument tuples whose shapes were never seen before: call k gets batch ``B`` and pool size
    ``N`` from an enumeration of the pairs (B >= 2, 1 <= N <= max_pool), as slices of
    preallocated buffers, so every tensor is a fresh view object and no memory is allocated per
    call. Valid for check mode (indices are in range only for the pool they were built for, and
    check mode does not read values). ``capacity`` bounds the number of calls :meth:`take` gives."""

    def __init__(self, call: dict[str, Any], capacity: int, max_pool: int = 16) -> None:
        self.call, self.max_pool, self.k = call, max_pool, 0
        b_max = 2 + -(-capacity // max_pool)
        self.capacity = capacity

        def grow(t: Tensor, rows: int) -> Tensor:
            return torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)

        self.base = {n: grow(call[n], b_max) for n in ("mixed_qkv", "a", "b", "out")}
        self.base["ssm_state_indices"] = torch.arange(b_max, dtype=call["ssm_state_indices"].dtype)
        self.base["initial_state"] = grow(call["initial_state"], max_pool)

    def shape_of(self, k: int) -> tuple[int, int]:
        """(B, N) of the k-th call."""
        return 2 + k // self.max_pool, 1 + k % self.max_pool

    def take(self, count: int) -> list[tuple[Any, ...]]:
        if self.k + count > self.capacity:
            raise RuntimeError(f"FreshShapes: capacity {self.capacity} exhausted")
        c, base = self.call, self.base
        out = []
        for k in range(self.k, self.k + count):
            B, N = self.shape_of(k)
            out.append((base["mixed_qkv"][:B], base["a"][:B], base["b"][:B], c["A_log"].view(-1),
                        c["dt_bias"].view(-1), c["scale"], base["initial_state"][:N], base["out"][:B],
                        base["ssm_state_indices"][:B], c["use_qk_l2norm_in_kernel"], c["lower_bound"]))
        self.k += count
        return out


def _loop(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], kwargs: dict[str, Any]) -> float:
    """Seconds for one pass of ``fn`` over ``calls`` (gc off, as timeit does)."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        if kwargs:
            t0 = TIMER()
            for args in calls:
                fn(*args, **kwargs)
            return TIMER() - t0
        t0 = TIMER()
        for args in calls:
            fn(*args)
        return TIMER() - t0
    finally:
        if gc_was:
            gc.enable()


class TimedPath:
    """One timed path: a function, how to get its argument tuples, and the mode to run under."""

    def __init__(self, key: str, label: str, fn: Callable[..., Any], args: tuple[Any, ...] | None = None, *,
                 mode: str | None = None, kwargs: dict[str, Any] | None = None,
                 fresh: FreshShapes | None = None, fixed_n: int | None = None) -> None:
        self.key, self.label, self.fn, self.args, self.mode = key, label, fn, args, mode
        self.kwargs = kwargs or {}
        self.fresh = fresh
        self.n = fixed_n or 0
        self.samples: list[float] = []

    def calls(self, n: int) -> list[tuple[Any, ...]]:
        if self.fresh is not None:
            return self.fresh.take(n)
        assert self.args is not None
        return [self.args] * n

    def run(self, calls: Sequence[tuple[Any, ...]]) -> float:
        if self.mode is None:
            return _loop(self.fn, calls, self.kwargs)
        with kc.mode(self.mode):  # type: ignore[arg-type]
            return _loop(self.fn, calls, self.kwargs)

    def calibrate(self, target_s: float) -> None:
        n = 16
        while True:
            dt = self.run(self.calls(n))
            if dt >= target_s / 10 or n >= 1 << 20:
                break
            n *= 4
        self.n = max(16, int(n * target_s / max(dt, 1e-9)))

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples) * 1e6


def measure(paths: list[TimedPath], repeats: int, target_s: float) -> None:
    """Calibrate each path to ~target_s per repeat, then interleave ``repeats`` timed passes."""
    for p in paths:
        if not p.n:
            p.calibrate(target_s)
    for _ in range(repeats):
        for p in paths:
            calls = p.calls(p.n)  # built outside the timed loop
            p.samples.append(p.run(calls) / p.n)


def build_paths(repeats: int = 41) -> tuple[list[TimedPath], dict[str, Any]]:
    cfg = config()
    call = make_decode_call(cfg, BATCH, POOL)
    args = sglang_args(call)
    contract = kc.packed_decode_contract("VK")
    checked = build_wrapper(contract, None)  # what @kc.contract returns for this contract (follows kc.mode)
    sig = signature_function(contract)
    with kc.mode("off"):
        off_identity = kc.contract(config=cfg, where=["HV % H == 0"], bind_first=("initial_state", "mixed_qkv"),
                                   register=False)(sig)
    assert off_identity is sig, "a contract decorated while off must be the function itself"

    # Every path must accept the valid call before it is timed.
    no_check(*args)
    hand_written_validator(*args)
    hand_written_full(*args)
    jaxtyping_decode(*jaxtyping_args(call))
    checked(*args)
    checked(*args, config=cfg)
    with kc.mode("strict"):
        checked(*args)
    kc.validate_packed_decode(*args)

    # New-shape paths take FRESH_CALLS calls per round (no calibration: every call uses up a shape).
    fresh = FreshShapes(call, capacity=2 * FRESH_CALLS * repeats)
    paths = [
        TimedPath("none", "no check (plain function, same signature)", no_check, args),
        TimedPath("hand", f"hand-written validator ({HAND_WRITTEN_CHECKS} checks)", hand_written_validator, args),
        TimedPath("hand_full", f"hand-written validator, every check the contract makes ({HAND_WRITTEN_FULL_CHECKS} "
                  "checks)", hand_written_full, args),
        TimedPath("jax", "jaxtyping + beartype (binder-first order)", jaxtyping_decode, jaxtyping_args(call)),
        TimedPath("off", "kda-contracts off, decorated while off (identity)", off_identity, args),
        TimedPath("off_rt", "kda-contracts off at run time (`with kc.mode(\"off\")`)", checked, args, mode="off"),
        TimedPath("check", "kda-contracts check, repeat calls", checked, args, mode="check"),
        TimedPath("first", "kda-contracts check, first call of a new shape", checked, mode="check", fresh=fresh,
                  fixed_n=FRESH_CALLS),
        TimedPath("hand_fresh", "hand-written validator on new-shape calls (reference)",
                  hand_written_validator, fresh=fresh, fixed_n=FRESH_CALLS),
        TimedPath("config", "kda-contracts check + KDAConfig, repeat calls", checked, args, mode="check",
                  kwargs={"config": cfg}),
        TimedPath("strict", "kda-contracts strict, repeat calls (reads values)", checked, args, mode="strict"),
        TimedPath("validate", "`kc.validate_packed_decode`, check, repeat calls", kc.validate_packed_decode, args,
                  mode="check"),
    ]
    return paths, {"cfg": cfg, "call": call, "args": args, "contract": contract, "checked": checked}


def breakdown(ctx: dict[str, Any], repeats: int, target_s: float) -> list[TimedPath]:
    """Where the check-mode time goes: each piece of the wrapper's hot path timed alone."""
    c = ctx["contract"]
    vals = (*ctx["args"], None, None)  # every checked parameter, config and state_layout last

    pieces = [
        TimedPath("mode", "mode read (`modes.current_mode()`)", modes.current_mode, ()),
        TimedPath("types", "beartype type shim (`Contract.check_types`)", c.check_types, vals),
        TimedPath("checker", "generated checker (`Contract.check`)", c.check, vals, kwargs={"_cfg": None}),
        TimedPath("checker_direct", "generated checker called directly (`Contract._check_uncached(*args, None, None)`)",
                  c._check_uncached, (*vals, None)),
        TimedPath("checker_cached", "the checker behind its eager cache, a repeated call (`Contract._check`)",
                  c._check, (*vals, None)),
        TimedPath("checker_cfg", "generated checker with the KDAConfig (`Contract.check(..., _cfg=cfg)`)", c.check,
                  vals, kwargs={"_cfg": ctx["cfg"]}),
        TimedPath("enforce", "`Contract.enforce` (calls + types + checker)", c.enforce, (vals, None)),
        TimedPath("wrapper", "whole wrapper (what `@kc.contract` returns), check mode", ctx["checked"], ctx["args"],
                  mode="check"),
    ]
    measure(pieces, repeats, target_s)
    return pieces


# -- 4. user functions: 2 and 6 tensors, with and without *batch -------------------------------------
# jaxtyping's ``Float`` dtypes as kda-contracts reads them (tests/test_overhead_benchmark.py pins it to
# the set the generated checker uses). ``dtype.is_floating_point`` is *not* the same set: it also
# accepts float8_e8m0fnu and float4_e2m1fn_x2, so a validator making the same checks spells it out.
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
                          torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz})


def lin2(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]):
    """(a) 2 tensors: a matmul-like signature."""
    return None


def lin2_batch(x: Float[Tensor, "*batch D"], w: Float[Tensor, "D E"]):
    """(b) 2 tensors, ``x`` with leading ``*batch`` dims."""
    return None


def attn6(q: Float[Tensor, "B H S D"], k: Float[Tensor, "B G T D"], v: Float[Tensor, "B G T D"],
          mask: Bool[Tensor, "B 1 S T"], bias: Float[Tensor, "H S T"], out: Float[Tensor, "B S H*D"]):
    """(c) 6 tensors: attention-ish (GQA k/v with G heads, a bool mask, a per-head bias, the output with
    heads merged: one expression dim ``H*D``)."""
    return None


def attn6_batch(q: Float[Tensor, "*batch H S D"], k: Float[Tensor, "*batch G T D"],
                v: Float[Tensor, "*batch G T D"], mask: Bool[Tensor, "*batch 1 S T"], bias: Float[Tensor, "H S T"],
                out: Float[Tensor, "*batch S H*D"]):
    """(d) (c) with ``*batch`` leading dims on every tensor but ``bias``."""
    return None


def hand_lin2(x, w):
    """Hand-written, the same checks as kda-contracts' check mode on :func:`lin2` (9): x and w are
    Tensors (2); x is 2-D, w is 2-D (2); ``w.shape[0] == x.shape[1]`` (1); both dtypes in
    ``FLOAT_DTYPES`` (2); ``w`` on ``x``'s device (1). Raises ``ValueError``."""
    if not isinstance(x, Tensor) or not isinstance(w, Tensor):
        raise ValueError("x and w must be tensors")
    xs, ws = x.shape, w.shape
    if len(xs) != 2 or len(ws) != 2:
        raise ValueError(f"x must be [B, D] and w [D, E], got {tuple(xs)} and {tuple(ws)}")
    if ws[0] != xs[1]:
        raise ValueError(f"w.shape[0] = {ws[0]} must equal D = {xs[1]}")
    if x.dtype not in FLOAT_DTYPES or w.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x and w must be floating, got {x.dtype} and {w.dtype}")
    if w.device != x.device:
        raise ValueError(f"w is on {w.device}, x on {x.device}")


def hand_lin2_batch(x, w):
    """Hand-written, the same checks as kda-contracts' check mode on :func:`lin2_batch` (9): as
    :func:`hand_lin2` but x has rank >= 1 (``*batch D``) and D is its last dim."""
    if not isinstance(x, Tensor) or not isinstance(w, Tensor):
        raise ValueError("x and w must be tensors")
    xs, ws = x.shape, w.shape
    if len(xs) < 1 or len(ws) != 2:
        raise ValueError(f"x must be [*batch, D] and w [D, E], got {tuple(xs)} and {tuple(ws)}")
    if ws[0] != xs[-1]:
        raise ValueError(f"w.shape[0] = {ws[0]} must equal D = {xs[-1]}")
    if x.dtype not in FLOAT_DTYPES or w.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x and w must be floating, got {x.dtype} and {w.dtype}")
    if w.device != x.device:
        raise ValueError(f"w is on {w.device}, x on {x.device}")


def hand_attn6(q, k, v, mask, bias, out):
    """Hand-written, the same checks as kda-contracts' check mode on :func:`attn6` (25): all six are
    Tensors (6); ranks q 4, k 4 (2); B, H, S, D from q and G, T from k; ``k`` matches (B, D) and
    ``v``, ``mask``, ``bias``, ``out`` equal (B, G, T, D), (B, 1, S, T), (H, S, T), (B, S, H*D) as
    whole shapes (rank included) (5); dtypes: mask bool, the others in ``FLOAT_DTYPES`` (6);
    k, v, mask, bias, out on q's device (5). Raises ``ValueError``."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor) and isinstance(mask, Tensor)
            and isinstance(bias, Tensor) and isinstance(out, Tensor)):
        raise ValueError("q, k, v, mask, bias, out must be tensors")
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4:
        raise ValueError(f"q must be [B, H, S, D] and k [B, G, T, D], got {tuple(qs)} and {tuple(ks)}")
    B, H, S, D = qs
    _, _G, T, _ = ks
    if ks[0] != B or ks[3] != D:
        raise ValueError(f"k must be [B, G, T, D] with B={B}, D={D}, got {tuple(ks)}")
    if v.shape != ks:
        raise ValueError(f"v must be [B, G, T, D] = {tuple(ks)}, got {tuple(v.shape)}")
    if mask.shape != (B, 1, S, T):
        raise ValueError(f"mask must be [B, 1, S, T] = {(B, 1, S, T)}, got {tuple(mask.shape)}")
    if bias.shape != (H, S, T):
        raise ValueError(f"bias must be [H, S, T] = {(H, S, T)}, got {tuple(bias.shape)}")
    if out.shape != (B, S, H * D):
        raise ValueError(f"out must be [B, S, H*D] = {(B, S, H * D)}, got {tuple(out.shape)}")
    if (q.dtype not in FLOAT_DTYPES or k.dtype not in FLOAT_DTYPES or v.dtype not in FLOAT_DTYPES
            or bias.dtype not in FLOAT_DTYPES or out.dtype not in FLOAT_DTYPES):
        raise ValueError("q, k, v, bias, out must be floating")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    dev = q.device
    if k.device != dev or v.device != dev or mask.device != dev or bias.device != dev or out.device != dev:
        raise ValueError(f"every tensor must be on q's device {dev}")


def hand_attn6_batch(q, k, v, mask, bias, out):
    """Hand-written, the same checks as kda-contracts' check mode on :func:`attn6_batch` (25): as
    :func:`hand_attn6` with ``batch = q.shape[:-3]`` (rank >= 3) shared by k, v, mask and out
    (``out`` rank >= 2); ``bias`` has no batch."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor) and isinstance(mask, Tensor)
            and isinstance(bias, Tensor) and isinstance(out, Tensor)):
        raise ValueError("q, k, v, mask, bias, out must be tensors")
    qs, ks = q.shape, k.shape
    if len(qs) < 3 or len(ks) < 3:
        raise ValueError(f"q must be [*batch, H, S, D] and k [*batch, G, T, D], got {tuple(qs)} and {tuple(ks)}")
    batch = qs[:-3]
    H, S, D = qs[-3:]
    _G, T, _ = ks[-3:]
    if ks[:-3] != batch or ks[-1] != D:
        raise ValueError(f"k must be [*batch, G, T, D] with batch={tuple(batch)}, D={D}, got {tuple(ks)}")
    if v.shape != ks:
        raise ValueError(f"v must be [*batch, G, T, D] = {tuple(ks)}, got {tuple(v.shape)}")
    if mask.shape != (*batch, 1, S, T):
        raise ValueError(f"mask must be [*batch, 1, S, T] = {(*batch, 1, S, T)}, got {tuple(mask.shape)}")
    if bias.shape != (H, S, T):
        raise ValueError(f"bias must be [H, S, T] = {(H, S, T)}, got {tuple(bias.shape)}")
    if out.shape != (*batch, S, H * D):
        raise ValueError(f"out must be [*batch, S, H*D] = {(*batch, S, H * D)}, got {tuple(out.shape)}")
    if (q.dtype not in FLOAT_DTYPES or k.dtype not in FLOAT_DTYPES or v.dtype not in FLOAT_DTYPES
            or bias.dtype not in FLOAT_DTYPES or out.dtype not in FLOAT_DTYPES):
        raise ValueError("q, k, v, bias, out must be floating")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    dev = q.device
    if k.device != dev or v.device != dev or mask.device != dev or bias.device != dev or out.device != dev:
        raise ValueError(f"every tensor must be on q's device {dev}")


def user_calls(device: str = "cpu") -> dict[str, tuple[Any, ...]]:
    """Valid arguments for each user function: B = 4, D = 1024, E = 4096 for the linear ones
    (``*batch`` = (4, 8)); decode-time attention for the 6-tensor ones (B = 4, H = 8, G = 2, S = 1,
    T = 256, D = 64, ``*batch`` = (2, 2)), bf16 activations, fp32 bias, bool mask."""
    def f(*shape: int, dtype: torch.dtype = torch.bfloat16) -> Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    def attn(*batch: int) -> tuple[Tensor, ...]:
        H, G, S, T, D = 8, 2, 1, 256, 64
        return (f(*batch, H, S, D), f(*batch, G, T, D), f(*batch, G, T, D), f(*batch, 1, S, T, dtype=torch.bool),
                f(H, S, T, dtype=torch.float32), f(*batch, S, H * D))

    return {"lin2": (f(4, 1024), f(1024, 4096)), "lin2_batch": (f(4, 8, 1024), f(1024, 4096)),
            "attn6": attn(4), "attn6_batch": attn(2, 2)}


USER_CASES = (  # key, label, annotated function, hand-written validator
    ("lin2", '(a) 2 tensors `x: "B D", w: "D E"`', lin2, hand_lin2),
    ("lin2_batch", '(b) 2 tensors, `x: "*batch D"`', lin2_batch, hand_lin2_batch),
    ("attn6", '(c) 6 tensors (q, k, v, mask, bias, out; `H*D`)', attn6, hand_attn6),
    ("attn6_batch", "(d) 6 tensors with `*batch`", attn6_batch, hand_attn6_batch),
)


class Contracted(Protocol):
    """What ``kc.contract`` returns outside mode "off": the wrapper, carrying its compiled contract (its
    declared return type, the function's own, does not show ``__kda_contract__``)."""

    __kda_contract__: kc.Contract

    def __call__(self, *args: Any) -> Any: ...


def user_paths() -> list[tuple[str, list["TimedPath"]]]:
    """For each user function: no check, hand-written, jaxtyping + beartype, kda-contracts check (the
    ``@kc.contract`` wrapper), its generated checker called directly (``_check_uncached(*args, None)``)
    and behind its eager cache (``_check``)."""
    calls = user_calls()
    out = []
    for key, label, fn, hand in USER_CASES:
        args = calls[key]
        with kc.mode("check"):
            checked = cast(Contracted, kc.contract(register=False)(fn))
        jax = jaxtyped(typechecker=beartype)(fn)
        plain = fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn
        for f in (plain, hand, jax):
            f(*args)
        with kc.mode("check"):
            checked(*args)
        out.append((label, [
            TimedPath(f"{key}:none", "no check", plain, args),
            TimedPath(f"{key}:hand", "hand-written", hand, args),
            TimedPath(f"{key}:jax", "jaxtyping + beartype", jax, args),
            TimedPath(f"{key}:check", "kda-contracts check", checked, args, mode="check"),
            TimedPath(f"{key}:checker", "generated checker alone", checked.__kda_contract__._check_uncached,
                      (*args, None)),
            TimedPath(f"{key}:cached", "generated checker behind its eager cache", checked.__kda_contract__._check,
                      (*args, None)),
        ]))
    return out


# -- 5. where the time goes: primitives and the generated checker line by line -------------------------
# Each primitive is one statement on the packed-decode call's tensors (x: mixed_qkv [1, 8192] bf16,
# y: a [1, 4096] bf16, z: the state pool [8, 32, 128, 128] fp32; locals, as in the generated checker),
# timed timeit-style with the statement unrolled 10 times, minus the same loop over `pass`.
PRIMITIVE_SETUP = """\
x, y, z = _X, _Y, _Z
sx, sz = x.shape, z.shape
stz = z.stride()
dev, dev2, dt = x.device, y.device, x.dtype
idx = x.get_device()
T = (torch.Tensor,)
Tensor = torch.Tensor
FS = frozenset({torch.bfloat16, torch.float32, torch.float16})
e0, e1, e2, e3 = sz
tz = tuple(sz)
A12 = (x,) * 12
cm, cv = _CM, _CV
class Counter:
    calls = 0
ctr = Counter()
def f12(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11):
    return None
"""
PRIMITIVES = (  # (kind, label, statement)
    ("baseline", "`pass` (subtracted from every row)", "pass"),
    ("tensor attribute", "`t.shape` (a new torch.Size)", "x.shape"),
    ("tensor attribute", "`t.dtype` (a cached object)", "x.dtype"),
    ("tensor attribute", "`t.device` (a new torch.device)", "x.device"),
    ("tensor attribute", "`t.ndim`", "x.ndim"),
    ("tensor attribute", "`t.is_cuda` / `t.is_cpu` (bool)", "x.is_cpu"),
    ("tensor attribute", "`t.get_device()` (int; -1 for cpu *and* meta)", "x.get_device()"),
    ("tensor attribute", "`t.stride()` (a new tuple)", "z.stride()"),
    ("tensor attribute", "`t.stride(-1)` (argument parsing)", "x.stride(-1)"),
    ("tensor attribute", "`t.size(-1)`", "x.size(-1)"),
    ("tensor attribute", "`t.is_contiguous()`", "z.is_contiguous()"),
    ("python", "`isinstance(t, (Tensor,))` (a 1-tuple, as generated)", "isinstance(x, T)"),
    ("python", "`isinstance(t, Tensor)`", "isinstance(x, Tensor)"),
    ("python", "`len(shape) != 2`", "len(sx) != 2"),
    ("python", "`shape[0]` (one subscript)", "sx[0]"),
    ("python", "`shape[-1] != 1 and stride[-1] != 1`", "sx[-1] != 1 and stz[-1] != 1"),
    ("python", "4 indexed compares `s[0] != d0 or ... s[3] != d3`",
     "sz[0] != e0 or sz[1] != e1 or sz[2] != e2 or sz[3] != e3"),
    ("python", "one tuple compare `s != (d0, d1, d2, d3)` (rank included)", "sz != (e0, e1, e2, e3)"),
    ("python", "`t.shape != (d0, d1, d2, d3)` (read + compare)", "z.shape != (e0, e1, e2, e3)"),
    ("python", "`s = t.shape; d0 = s[0]; ... d3 = s[3]`", "s = z.shape; a = s[0]; b = s[1]; c = s[2]; d = s[3]"),
    ("python", "`d0, d1, d2, d3 = t.shape` (unpack)", "a, b, c, d = z.shape"),
    ("python", "`st = t.stride(); st[0] ... st[3]`", "s = z.stride(); a = s[0]; b = s[1]; c = s[2]; d = s[3]"),
    ("python", "`st0, st1, st2, st3 = t.stride()` (unpack)", "a, b, c, d = z.stride()"),
    ("python", "`s[0:len(s) - 3]` on a torch.Size (`*batch`, as generated)", "sz[0:len(sz) - 3]"),
    ("python", "`s[:-3]` on a torch.Size (a new torch.Size)", "sz[:-3]"),
    ("python", "`tuple(s)` (torch.Size to tuple)", "tuple(sz)"),
    ("python", "`ts[:-3]` on a plain tuple", "tz[:-3]"),
    ("python", "`dev != dev2` (two torch.device objects)", "dev != dev2"),
    ("python", "`u.device != dev` (read + compare)", "y.device != dev"),
    ("python", "`u.is_cuda and u.get_device() == idx` (exact for a cuda ref)", "y.is_cuda and y.get_device() == idx"),
    ("python", "`dev.type` (a new str)", "dev.type"),
    ("python", "`dtype in frozenset` (3 dtypes)", "dt in FS"),
    ("python", "`t.dtype == torch.float32` (module attribute)", "x.dtype == torch.float32"),
    ("python", "call of a 12-parameter function, 12 positional args", "f12(x, x, x, x, x, x, x, x, x, x, x, x)"),
    ("python", "the same call as `f12(*args)`", "f12(*A12)"),
    ("wrapper", "`modes.current_mode()` (the wrapper's mode read)", "cm()"),
    ("wrapper", "`ContextVar.get()` inlined", "cv.get()"),
    ("wrapper", "`contract.calls += 1` (the call counter)", "ctr.calls += 1"),
)


class TimedStmt:
    """One statement timed timeit-style (unrolled ``unroll`` times); samples are ns per statement."""

    def __init__(self, label: str, stmt: str, setup: str, glb: dict[str, Any], unroll: int = 10) -> None:
        self.label, self.stmt = label, stmt
        self.timer = timeit.Timer("\n".join([stmt] * unroll), setup, timer=lambda: TIMER(), globals=glb)
        self.unroll = unroll
        self.samples: list[float] = []

    def run(self, n: int) -> None:
        self.samples.append(self.timer.timeit(n) / (n * self.unroll) * 1e9)

    @property
    def median_ns(self) -> float:
        return statistics.median(self.samples)


def time_stmts(stmts: Sequence[TimedStmt], base: TimedStmt, rounds: int, n: int) -> dict[str, float]:
    """Interleaved rounds; each statement's median ns minus the baseline's median."""
    for _ in range(rounds):
        base.run(n)
        for s in stmts:
            s.run(n)
    b = base.median_ns
    return {s.label: s.median_ns - b for s in stmts}


def primitives(ctx: dict[str, Any], rounds: int, n: int) -> list[tuple[str, str, float]]:
    call = ctx["call"]
    glb = {"torch": torch, "_X": call["mixed_qkv"], "_Y": call["a"], "_Z": call["initial_state"],
           "_CM": modes.current_mode, "_CV": contextvars.ContextVar("bench", default=None)}
    base, *rest = [TimedStmt(label, stmt, PRIMITIVE_SETUP, glb) for _, label, stmt in PRIMITIVES]
    got = time_stmts(rest, base, rounds, n)
    return [(kind, label, got[label]) for kind, label, _ in PRIMITIVES[1:]]


class _ReturnToRaise(ast.NodeTransformer):
    def visit_Return(self, node: ast.Return) -> ast.Raise:
        return ast.Raise(exc=ast.Name("AssertionError", ast.Load()), cause=None)


def source_lines(src: str, params: Sequence[str]) -> list[tuple[str, str, str]]:
    """Split a straight-line validator into its top-level statements (inside its ``try``): for each,
    (the statement's first line, what to time, the setup that runs every earlier statement). An
    ``if`` is timed by its test (the call is valid: the body never runs), a ``return`` by its value."""
    fdef = ast.parse(textwrap.dedent(src)).body[0]
    assert isinstance(fdef, ast.FunctionDef)
    body = fdef.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    if len(body) == 1 and isinstance(body[0], ast.Try):
        body = body[0].body
    pre = [f"{', '.join(params)}, = _ARGS"]
    out = []
    for st in body:
        if isinstance(st, ast.If):
            code = ast.unparse(st.test)
        elif isinstance(st, ast.Return):
            code = ast.unparse(st.value) if st.value is not None else "None"
        else:
            code = ast.unparse(st)
        out.append((ast.unparse(st).splitlines()[0], code, "\n".join(pre)))
        pre.append(ast.unparse(ast.fix_missing_locations(_ReturnToRaise().visit(st))))
    return out


LINE_KINDS = (  # (kind, pattern): the first pattern found in a line names its kind
    ("isinstance (Tensor-ness, scalar types)", r"isinstance\("),
    ("device: read + compare", r"\.device\b"),
    ("strides: `stride()` + compares", r"\.stride\(|_kc_st\d"),
    ("contiguity: `is_contiguous()`", r"\.is_contiguous\("),
    ("shape reads (`.shape`, with the compares on the same line)", r"\.shape\b"),
    ("`*batch`: shape slices + compares", r"\[0:len\(|\[:-\d+\]|\[-\d+:\]"),
    ("rank: `.ndim` / `len(shape)`", r"\.ndim\b|\blen\("),
    ("dtype: `.dtype` read + set/equality", r"\.dtype\b|_kc_dt\d"),
    ("config plumbing (`_kc_cfg`/`_kc_cmatch`, no config passed)", r"_kc_cfg|_kc_cmatch|_kc_cdtypes"),
    ("scalars (scale > 0, lower_bound < 0)", r"_kc_a5\b|_kc_a10\b"),
    ("return of the bound dims", r"^return"),
    ("dims: subscripts, arithmetic, compares", r"."),
)


def line_kind(line: str) -> str:
    return next(kind for kind, pat in LINE_KINDS if re.search(pat, line))


def line_costs(src: str, glb: dict[str, Any], params: Sequence[str], values: tuple[Any, ...], rounds: int,
               n: int) -> list[tuple[str, float]]:
    """ns of each top-level statement of ``src`` on the valid call ``values`` (in its own locals)."""
    glb = {**glb, "_ARGS": values}
    items = source_lines(src, params)
    stmts = [TimedStmt(f"{i}", code, setup, glb, unroll=1) for i, (_, code, setup) in enumerate(items)]
    base = TimedStmt("base", "pass", items[0][2], glb, unroll=1)
    got = time_stmts(stmts, base, rounds, n)
    return [(line, got[f"{i}"]) for i, (line, _, _) in enumerate(items)]


def where_time_goes(ctx: dict[str, Any], rounds: int, n: int) -> dict[str, Any]:
    """Per-statement cost of the generated packed-decode checker and of the 27-check hand-written
    validator on the same valid call, plus both whole functions called directly."""
    c = ctx["contract"]
    args = ctx["args"]
    gen_params = [f"_kc_a{i}" for i in range(len(args) + 2)] + ["_kc_cfg"]
    gen = line_costs(c.checker_source, c._check_uncached.__globals__, gen_params, (*args, None, None, None), rounds, n)
    hand_params = list(inspect.signature(hand_written_validator).parameters)
    hand = line_costs(inspect.getsource(hand_written_validator), hand_written_validator.__globals__, hand_params,
                      args, rounds, n)
    full = line_costs(inspect.getsource(hand_written_full), hand_written_full.__globals__, hand_params, args,
                      rounds, n)
    whole_glb = {"_gen": c._check_uncached, "_hand": hand_written_validator, "_full": hand_written_full, "_ARGS": args,
                 "_ARGS_GEN": (*args, None, None)}
    base = TimedStmt("base", "pass", "", whole_glb)
    whole = time_stmts([TimedStmt("gen", "_gen(*_ARGS_GEN)", "", whole_glb),
                        TimedStmt("hand", "_hand(*_ARGS)", "", whole_glb),
                        TimedStmt("full", "_full(*_ARGS)", "", whole_glb)], base, rounds, max(n // 10, 10))
    return {"gen": gen, "hand": hand, "full": full, "whole": whole}


# -- report ---------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> str:
    def v(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "?"
    return (f"Python {platform.python_version()} · torch {torch.__version__} · jaxtyping {v('jaxtyping')} · "
            f"beartype {v('beartype')} · kda-contracts {kc.__version__}")


def paired_ratio(num: TimedPath, den: TimedPath) -> float:
    """Median over rounds of ``num / den`` timed in the same round (every round runs all paths
    back to back), which cancels most of the drift a shared machine adds."""
    return statistics.median(x / y for x, y in zip(num.samples, den.samples, strict=True))


def targets(by: dict[str, TimedPath]) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    r = paired_ratio(by["check"], by["hand"])
    rows.append(("check, repeat calls ≤ 1.0× hand-written", f"{r:.2f}×", r <= 1.0))
    r = paired_ratio(by["jax"], by["check"])
    rows.append(("check, repeat calls ≥ 25× faster than jaxtyping + beartype", f"{r:.1f}× faster", r >= 25))
    r = paired_ratio(by["off"], by["none"])
    rows.append(("off (decorated while off: `is` the function) within 5% of no check",
                 f"{r:.3f}× ({100 * (r - 1):+.1f}%)", r <= 1.05))
    r = paired_ratio(by["first"], by["hand"])
    rows.append(("check, first call of a new shape ≤ 3× hand-written", f"{r:.2f}×", r <= 3.0))
    r = paired_ratio(by["check"], by["hand_full"])
    rows.append(("(reference, no target) check, repeat calls ÷ hand-written making every check the contract makes",
                 f"{r:.2f}×", None))
    return rows


def _iqr(p: TimedPath) -> str:
    q1, _, q3 = statistics.quantiles(p.samples, n=4)
    return f"{q1 * 1e6:.2f}–{q3 * 1e6:.2f}"


def render(paths: list[TimedPath], pieces: list[TimedPath], repeats: int, command: str, timer: str,
           cases: list[tuple[str, list[TimedPath]]] | None = None, where: dict[str, Any] | None = None,
           prims: list[tuple[str, str, float]] | None = None,
           user_lines: list[tuple[str, list[tuple[str, float]], list[tuple[str, float]]]] | None = None) -> str:
    by = {p.key: p for p in paths}
    hand = by["hand"].median_us
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    timer_text = ("`time.process_time`, the process's CPU time, so time spent descheduled by other load is not "
                  "counted" if timer == "process" else "`time.perf_counter`, wall clock")
    lines = [
        SECTION,
        "",
        f"{datetime.date.today().isoformat()} · CPU: {cpu_model()} ({os.cpu_count()} logical cores; load average "
        f"{load} at the end of the run) · {versions()}",
        "",
        f"Command: `{command}`",
        "",
        "Packed-decode call in sglang's argument order (9 tensors + 2 flags), Kimi-Linear-48B-A3B TP1 shapes at "
        "B = 1 (H = HV = 32, K = V = 128, bf16 activations, fp32 state pool of 8 slots, int32 indices); every "
        "path returns without running a kernel, so this is validation + call cost. µs per call: median (and "
        f"interquartile range) of {repeats} rounds of a timeit-style loop (gc off; timer: {timer_text}); "
        "each round runs every path "
        f"back to back, {min(p.n for p in paths):,}–{max(p.n for p in paths):,} calls per path per round. "
        f"First call of a new shape: {FRESH_CALLS} calls per round, each with a (B, N) pair never seen before "
        "(B >= 2, N <= 16; tensors are fresh slice views of preallocated buffers); there is no shape cache yet, "
        "so this is the checker on new metadata. Strict reads tensor values.",
        "",
        "| path | µs/call | IQR µs | × hand-written |",
        "|---|---|---|---|",
    ]
    for p in paths:
        lines.append(f"| {p.label} | {p.median_us:.2f} | {_iqr(p)} | {p.median_us / hand:.2f} |")
    lines += ["", "Targets of issue 4 (each ratio: median over rounds of the ratio within a round):", "",
              "| target | measured | verdict |", "|---|---|---|"]
    for name, got, ok in targets(by):
        lines.append(f"| {name} | {got} | {'—' if ok is None else 'PASS' if ok else 'MISS'} |")
    lines += ["", "Where check mode's time goes (each piece timed alone on the same call, µs/call):", "",
              "| piece | µs/call | IQR µs |", "|---|---|---|"]
    lines += [f"| {p.label} | {p.median_us:.2f} | {_iqr(p)} |" for p in pieces]
    if cases:
        lines += render_user(cases)
    if user_lines:
        lines += render_user_lines(user_lines)
    if where is not None and prims is not None:
        pc = {p.key: p for p in pieces}
        wrapper_us = pc["wrapper"].median_us - pc["checker_cached"].median_us if pc else None
        lines += render_where(where, prims, wrapper_us)
    return "\n".join(lines) + "\n"


# -- report: user functions and where the time goes ---------------------------------------------------
def _cell(p: TimedPath) -> str:
    q1, _, q3 = statistics.quantiles(p.samples, n=4)
    return f"{p.median_us:.2f} ({q1 * 1e6:.2f}–{q3 * 1e6:.2f})"


def render_user(cases: list[tuple[str, list[TimedPath]]]) -> list[str]:
    lines = ["", "### User functions: 2 and 6 tensors, with and without `*batch`", "",
             "Plain annotated functions (`benchmarks/overhead.py`: `lin2`, `lin2_batch`, `attn6`, `attn6_batch`) "
             "on CPU tensors, timed in the same rounds as the table above. The hand-written validators make "
             "exactly the checks kda-contracts' check mode makes (Tensor-ness, ranks, dims, dtypes, devices; "
             "their docstrings list them); `jaxtyped(typechecker=beartype)` checks shapes and dtypes, not "
             "devices. µs per call, median (interquartile range); ratios are medians over rounds of the "
             "ratio within a round.", "",
             "| function | no check | hand-written | jaxtyping + beartype | kda-contracts check | "
             "generated checker alone | the checker behind its eager cache | check ÷ hand-written | "
             "jaxtyping ÷ check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, (none, hand, jax, check, checker, cached) in cases:
        lines.append(f"| {label} | {_cell(none)} | {_cell(hand)} | {_cell(jax)} | {_cell(check)} | "
                     f"{_cell(checker)} | {_cell(cached)} | {paired_ratio(check, hand):.2f}× | "
                     f"{paired_ratio(jax, check):.1f}× |")
    return lines


def kind_totals(lines: Sequence[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """Statements and ns per operation kind (:data:`LINE_KINDS`)."""
    out: dict[str, tuple[int, float]] = {}
    for line, ns in lines:
        n, t = out.get(line_kind(line), (0, 0.0))
        out[line_kind(line)] = (n + 1, t + ns)
    return out


def user_line_costs(rounds: int, n: int) -> list[tuple[str, list[tuple[str, float]], list[tuple[str, float]]]]:
    """Per-statement ns of each user function's generated checker and hand-written validator."""
    calls = user_calls()
    out = []
    for key, label, fn, hand in USER_CASES:
        args = calls[key]
        with kc.mode("check"):
            c = cast(Contracted, kc.contract(register=False)(fn)).__kda_contract__
        gen = line_costs(c.checker_source, c._check_uncached.__globals__,
                         [f"_kc_a{i}" for i in range(len(args))] + ["_kc_cfg"], (*args, None), rounds, n)
        hp = list(inspect.signature(hand).parameters)
        out.append((label, gen, line_costs(inspect.getsource(hand), hand.__globals__, hp, args, rounds, n)))
    return out


def render_user_lines(rows: list[tuple[str, list[tuple[str, float]], list[tuple[str, float]]]]) -> list[str]:
    totals = [(kind_totals(g), kind_totals(h)) for _, g, h in rows]
    head = " | ".join(label.split(" ", 1)[0] for label, _, _ in rows)
    lines = ["", "Where the user functions' checks spend their time: each top-level statement of the generated "
             "checker and of the hand-written validator timed alone (as below for packed decode), summed by "
             "kind; ns, generated / hand-written:", "",
             f"| operation kind | {head} |", "|---|" + "---|" * len(rows)]
    for k, _ in LINE_KINDS:
        cells = []
        for g, h in totals:
            gn, hn = g.get(k, (0, 0.0))[1], h.get(k, (0, 0.0))[1]
            cells.append(f"{gn:.0f} / {hn:.0f}" if (k in g or k in h) else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {k} | {' | '.join(cells)} |")
    cells = [f"{sum(ns for _, ns in g):.0f} / {sum(ns for _, ns in h):.0f}" for _, g, h in rows]
    lines.append(f"| **sum** | {' | '.join(cells)} |")
    return lines


def _short(line: str, width: int = 110) -> str:
    line = line.replace("|", "\\|")
    return line if len(line) <= width else line[: width - 1] + "…"


def render_where(where: dict[str, Any], prims: list[tuple[str, str, float]], wrapper_us: float | None = None
                 ) -> list[str]:
    gen, hand, full, whole = where["gen"], where["hand"], where["full"], where["whole"]
    kinds = [k for k, _ in LINE_KINDS]
    tg, th, tf = kind_totals(gen), kind_totals(hand), kind_totals(full)
    p = {label: ns for _, label, ns in prims}
    dev_read, dev_cmp = p["`t.device` (a new torch.device)"], p["`u.device != dev` (read + compare)"]
    lines = ["", "### Where the time goes, statement by statement (packed decode, check mode)", "",
             "The generated checker (`kc.packed_decode_contract(\"VK\")._check_uncached(*args, None, None)`, "
             "13 positional "
             "arguments), the 27-check hand-written validator and the hand-written validator making every check "
             "the contract makes (`hand_written_full`), called directly on the repeat call: "
             f"**{whole['gen'] / 1e3:.2f} µs**, **{whole['hand'] / 1e3:.2f} µs** and "
             f"**{whole['full'] / 1e3:.2f} µs** (generated ÷ 27-check {whole['gen'] / whole['hand']:.2f}×, "
             f"÷ every-check {whole['gen'] / whole['full']:.2f}×). Each top-level statement timed alone (in its "
             "own locals, every earlier statement run in the setup; an `if` by its test), summed by kind "
             "(statements, ns); the sums miss the call and the cache effects of running the statements "
             "together.", "",
             "| operation kind | generated | hand-written, 27 checks | hand-written, every check |",
             "|---|---|---|---|"]
    for k in [*kinds, "**sum**"]:
        cells = []
        for t, src in ((tg, gen), (th, hand), (tf, full)):
            cnt, ns = (len(src), sum(x for _, x in src)) if k == "**sum**" else t.get(k, (0, 0.0))
            cells.append(f"{cnt}, {ns:.0f}" if cnt else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {k} | {' | '.join(cells)} |")
    lines += ["", "Primitive operations (ns each, on the call's tensors, `pass` subtracted):", "",
              "| operation | ns |", "|---|---|"]
    lines += [f"| {label} | {ns:.1f} |" for _, label, ns in prims]
    lines += ["", "Costliest statements of the generated checker (ns, timed alone):", "",
              "| ns | statement |", "|---|---|"]
    lines += [f"| {ns:.0f} | `{_short(line)}` |" for line, ns in sorted(gen, key=lambda r: -r[1])[:14]]
    attr_floor = (8 * p["`t.shape` (a new torch.Size)"] + 8 * p["`t.dtype` (a cached object)"]
                  + dev_read + 7 * dev_cmp + 4 * p["`t.stride()` (a new tuple)"] + 4 * p["`t.is_contiguous()`"])
    full_us, hand_us = whole["full"] / 1e3, whole["hand"] / 1e3
    mode_read = p["`modes.current_mode()` (the wrapper's mode read)"]
    lines += [
        "", f"Is the limit attribute access? The hand-written validator making every check the contract makes, "
        f"written for speed, costs {full_us:.2f} µs called directly, {full_us / hand_us:.2f}× the 27-check one "
        f"({hand_us:.2f} µs); about {attr_floor / 1e3:.2f} µs of it is the tensor-attribute reads (and device "
        "compares) those checks need (below), which no Python spelling of the same checks avoids. So check "
        "mode at ≤ 1.0× the 27-check validator needs the generated code to beat a careful hand-written "
        "validator making the same checks, "
        "and the wrapper on top"
        + (f" ({wrapper_us:.2f} µs)" if wrapper_us else "")
        + ". Recommendations 1-3 and 5 below are what `hand_written_full` does (it has the generated checker's verdict "
        "on every test call): they bring the checker to about that validator's cost, not below the 27-check "
        "one. What would go further: fewer reads (no device read where no kernel needs it), or reading the "
        "metadata in C. The latter is what the eager cache in front of the checker does for a repeat call "
        "(kda_contracts/_engine/codegen/check_cache.py): the call's tensors are compared with an accepted "
        "call's in one C++ call "
        "(torch's TensorGuards), see the \"checker behind its eager cache\" rows above.",
    ]
    lines += [
        "", "Reading: the checker's tensor-attribute reads alone (8 `.shape`, 8 `.dtype`, 8 `.device` with 7 "
        f"compares, 4 `stride()`, 4 `is_contiguous()`) cost ≈ {attr_floor / 1e3:.2f} µs with these primitives; "
        "each C-level tensor attribute costs ≈ 40 ns however little it returns (`t.dtype`, `t.is_cpu`), "
        "more when it allocates (`t.shape`, `t.stride()`, `t.device`). The 27-check validator pays "
        "for redundant reads instead (13 `.shape`, 8 `.ndim`, 4 `stride(-1)`) but checks no device, "
        "Tensor-ness, activation dtype or state stride. Recommendations for the generator, each keeping the "
        "verdict (the generator now does 1, 2 for shapes, and 3 for the sizes; 4, 5 and the stride unpack "
        "are not done):", "",
        f"1. Whole-shape tuple compares for tensors whose dims are all bound: `s != (d0, 1, d2, d4)` "
        f"({p['one tuple compare `s != (d0, d1, d2, d3)` (rank included)']:.0f} ns) instead of four indexed "
        f"compares ({p['4 indexed compares `s[0] != d0 or ... s[3] != d3`']:.0f} ns); it includes the rank "
        "check, so that tensor's `len(s) != n` goes too.",
        f"2. Unpack to bind: `d0, d1, d2, d3 = s` / `st0, st1, st2, st3 = t.stride()` "
        f"({p['`d0, d1, d2, d3 = t.shape` (unpack)']:.0f} / {p['`st0, st1, st2, st3 = t.stride()` (unpack)']:.0f}"
        f" ns) instead of subscripts ({p['`s = t.shape; d0 = s[0]; ... d3 = s[3]`']:.0f} / "
        f"{p['`st = t.stride(); st[0] ... st[3]`']:.0f} ns), once the rank is known.",
        "3. State stride rules: use the bound dim locals (`_kc_d3` for `_kc_s6[-1]`) and drop `(x or 1)` when "
        "the rule runs after the `>= 1` constraints; unpack the stride tuple. Before the generator used the "
        "bound dims, the two state-stride lines were the costliest non-attribute statements.",
        f"4. Devices: `u.device != dev` is {dev_cmp:.0f} ns per tensor ({dev_read:.0f} ns of it the read, "
        f"which allocates a torch.device; `dev != dev2` alone {p['`dev != dev2` (two torch.device objects)']:.0f}"
        " ns). No cheaper single read keeps the verdict: `t.get_device()` is -1 for both cpu and meta and "
        "the same index for cuda:0 and another backend's :0; `t.is_cuda and t.get_device() == idx` is exact "
        f"for a cuda reference but two reads ({p['`u.is_cuda and u.get_device() == idx` (exact for a cuda ref)']:.0f}"
        " ns here, short-circuited on cpu); `dev.type` allocates a str "
        f"({p['`dev.type` (a new str)']:.0f} ns). For a cpu (or meta) reference `t.is_cpu` (`t.is_meta`) is "
        f"exact ({p['`t.is_cuda` / `t.is_cpu` (bool)']:.0f} ns; a cpu tensor's device never has an index), so "
        "a checker that branches once on `a0.is_cpu` saves the difference per tensor on cpu calls only; on "
        "cuda the exact test needs type and index, i.e. `t.device` or two reads. What would remove the cost: "
        "one C-level call comparing all the devices (none public in torch), or fewer device reads (a "
        "contract that does not need every tensor's device).",
        "5. No config passed: a checker specialised for `_kc_cfg is None` drops every "
        "`(_kc_cdtypes[i] is not None and ...)` and `_kc_cmatch` test; `_kc_dt0 is not None` is always "
        "true for a tensor's dtype; `isinstance(t, Tensor)` "
        f"({p['`isinstance(t, Tensor)`']:.1f} ns) instead of the 1-tuple "
        f"({p['`isinstance(t, (Tensor,))` (a 1-tuple, as generated)']:.1f} ns).",
        f"6. `*batch`: a torch.Size slice costs {p['`s[:-3]` on a torch.Size (a new torch.Size)']:.0f} ns "
        f"({p['`s[0:len(s) - 3]` on a torch.Size (`*batch`, as generated)']:.0f} ns as generated, "
        f"`[0:len(s) - 3]`) against {p['`ts[:-3]` on a plain tuple']:.0f} ns on a plain tuple "
        f"(`tuple(s)`: {p['`tuple(s)` (torch.Size to tuple)']:.0f} ns): write `s[:-3]`, and where a tensor's "
        "shape is sliced more than once or several batch slices are compared, convert once or compare the "
        "batch dims element by element after a length check.",
        "7. The wrapper around the checker costs "
        + (f"{wrapper_us:.2f} µs here (whole wrapper minus the cached checker called directly): " if wrapper_us else "")
        + f"the mode read {mode_read:.0f} ns "
        f"(a Python call around `ContextVar.get()`, {p['`ContextVar.get()` inlined']:.0f} ns inlined), the call "
        f"counter {p['`contract.calls += 1` (the call counter)']:.0f} ns, and passing the arguments twice "
        "(wrapper, then checker).",
        f"8. Keep: `len(s)` ({p['`len(shape) != 2`']:.0f} ns) over `t.ndim` ({p['`t.ndim`']:.0f} ns), "
        f"`t.stride()` + subscript over `t.stride(-1)` ({p['`t.stride(-1)` (argument parsing)']:.0f} ns), "
        f"dtype set membership ({p['`dtype in frozenset` (3 dtypes)']:.0f} ns) over "
        f"`t.dtype == torch.float32` ({p['`t.dtype == torch.float32` (module attribute)']:.0f} ns incl. the read). "
        f"The call itself is cheap: {p['call of a 12-parameter function, 12 positional args']:.0f} ns for 12 "
        "positional arguments.",
    ]
    return lines


def replace_section(path: Path, section: str) -> None:
    """Write this script's section into ``path``, leaving the other sections as they are."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from markdown_sections import replace_section as replace

    replace(path, SECTION, section)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help=f"write the table into this Markdown file, replacing its '{SECTION}' section")
    p.add_argument("--timer", choices=sorted(TIMERS), default="process",
                   help="process: CPU time of this process (robust to other load); wall: time.perf_counter")
    p.add_argument("--repeats", type=int, default=41, help="rounds (median reported; >= 7)")
    p.add_argument("--target-ms", type=float, default=8.0, help="approximate duration of one path in one round")
    p.add_argument("--stmt-rounds", type=int, default=21,
                   help="rounds for the primitive and per-statement timings (median reported)")
    p.add_argument("--quick", action="store_true",
                   help="a fast dry run for the tests: 7 rounds, tiny loops (numbers are not meaningful)")
    args = p.parse_args(argv)
    if args.repeats < 7:
        p.error("--repeats must be >= 7")
    stmt_n = 5000
    if args.quick:
        args.repeats, args.target_ms, args.stmt_rounds, stmt_n = 7, 0.2, 3, 20
    global TIMER
    TIMER = TIMERS[args.timer]
    command = " ".join(["python benchmarks/overhead.py", *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    paths, ctx = build_paths(args.repeats)
    cases = user_paths()
    measure([*paths, *(q for _, ps in cases for q in ps)], args.repeats, args.target_ms / 1e3)
    pieces = breakdown(ctx, args.repeats, args.target_ms / 2e3)
    prims = primitives(ctx, args.stmt_rounds, stmt_n)
    where = where_time_goes(ctx, args.stmt_rounds, stmt_n)
    user_lines = user_line_costs(args.stmt_rounds, stmt_n)
    text = render(paths, pieces, args.repeats, command, args.timer, cases, where, prims, user_lines)
    print(text)
    print(f"(measured in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if args.out:
        replace_section(Path(args.out), text)
        print(f"wrote the '{SECTION}' section of {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
