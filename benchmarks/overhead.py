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
  (``Contract.wrap()``, what ``@kc.contract`` returns) and through ``kc.validate_packed_decode``:

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

Timing is ``timeit``-style: the garbage collector is off while a loop runs, each loop calls the
path on a prepared list of argument tuples (the same loop for every path), and the timer is the
process's CPU time (``time.process_time``; ``--timer wall`` for ``perf_counter``), so time spent
descheduled by other load on a shared machine is not counted. Rounds interleave the paths (each
round runs every path back to back); each path reports the median over rounds (µs per call) and
its interquartile range. Each target of issue 4 is the median over rounds of the ratio of two
paths within a round.

    python benchmarks/overhead.py                           # print the table
    python benchmarks/overhead.py --out docs/benchmarks.md  # also write/replace its section there
"""

# No `from __future__ import annotations`: jaxtyping_decode's annotations must be real objects.

import argparse
import datetime
import gc
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from beartype import beartype
from jaxtyping import Float, Float32, Int, jaxtyped
from torch import Tensor

import kda_contracts as kc
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

    packed_decode.__annotations__ = {k: v for k, v in contract.fn.__annotations__.items() if k != "config"}
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
    checked = contract.wrap()  # what @kc.contract returns for this contract (follows kc.mode)
    sig = signature_function(contract)
    with kc.mode("off"):
        off_identity = kc.contract(where=["HV % H == 0"], bind_first=("initial_state", "mixed_qkv"),
                                   register=False)(sig)
    assert off_identity is sig, "a contract decorated while off must be the function itself"

    # Every path must accept the valid call before it is timed.
    no_check(*args)
    hand_written_validator(*args)
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
    vals = (*ctx["args"], None)  # every checked parameter, config last

    pieces = [
        TimedPath("mode", "mode read (`kc.modes.current_mode()`)", kc.modes.current_mode, ()),
        TimedPath("types", "beartype type shim (`Contract.check_types`)", c.check_types, vals),
        TimedPath("checker", "generated checker (`Contract.check`)", c.check, vals, kwargs={"_cfg": None}),
        TimedPath("checker_cfg", "generated checker with the KDAConfig (`Contract.check(..., _cfg=cfg)`)", c.check,
                  vals, kwargs={"_cfg": ctx["cfg"]}),
        TimedPath("enforce", "`Contract.enforce` (calls + types + checker)", c.enforce, (vals, None)),
        TimedPath("wrapper", "whole wrapper (`Contract.wrap()`), check mode", ctx["checked"], vals, mode="check"),
    ]
    measure(pieces, repeats, target_s)
    return pieces


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


def targets(by: dict[str, TimedPath]) -> list[tuple[str, str, bool]]:
    rows = []
    r = paired_ratio(by["check"], by["hand"])
    rows.append(("check, repeat calls ≤ 1.0× hand-written", f"{r:.2f}×", r <= 1.0))
    r = paired_ratio(by["jax"], by["check"])
    rows.append(("check, repeat calls ≥ 25× faster than jaxtyping + beartype", f"{r:.1f}× faster", r >= 25))
    r = paired_ratio(by["off"], by["none"])
    rows.append(("off (decorated while off: `is` the function) within 5% of no check",
                 f"{r:.3f}× ({100 * (r - 1):+.1f}%)", r <= 1.05))
    r = paired_ratio(by["first"], by["hand"])
    rows.append(("check, first call of a new shape ≤ 3× hand-written", f"{r:.2f}×", r <= 3.0))
    return rows


def _iqr(p: TimedPath) -> str:
    q1, _, q3 = statistics.quantiles(p.samples, n=4)
    return f"{q1 * 1e6:.2f}–{q3 * 1e6:.2f}"


def render(paths: list[TimedPath], pieces: list[TimedPath], repeats: int, command: str, timer: str) -> str:
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
        lines.append(f"| {name} | {got} | {'PASS' if ok else 'MISS'} |")
    lines += ["", "Where check mode's time goes (each piece timed alone on the same call, µs/call):", "",
              "| piece | µs/call | IQR µs |", "|---|---|---|"]
    lines += [f"| {p.label} | {p.median_us:.2f} | {_iqr(p)} |" for p in pieces]
    return "\n".join(lines) + "\n"


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
    args = p.parse_args(argv)
    if args.repeats < 7:
        p.error("--repeats must be >= 7")
    global TIMER
    TIMER = TIMERS[args.timer]
    command = " ".join(["python benchmarks/overhead.py", *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    paths, ctx = build_paths(args.repeats)
    measure(paths, args.repeats, args.target_ms / 1e3)
    pieces = breakdown(ctx, args.repeats, args.target_ms / 2e3)
    text = render(paths, pieces, args.repeats, command, args.timer)
    print(text)
    print(f"(measured in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if args.out:
        replace_section(Path(args.out), text)
        print(f"wrote the '{SECTION}' section of {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
