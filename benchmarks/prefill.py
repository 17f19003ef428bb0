"""Packed prefill on flash-linear-attention's chunk kernels: what the op adds over the bare kernel,
and the chunked prefill against the token loop.

For each op, KDA (``kc.packed_prefill``, Kimi-Linear-48B-A3B at TP1) and GDN
(``kc.gdn_packed_prefill``, Qwen3-Next-80B-A3B at TP2), sizes from ``KDAConfig.preset`` /
``GDNConfig.preset``, and T tokens split into equal sequences (bf16 activations, fp32 VK pool,
half the sequences continuing from their slot), in check mode. Each row times its calls in
``--repeats`` rounds, the calls in a shuffled order each round, 10 calls issued back to back per call
and round (as a forward issues its layers: a call then takes whichever is longer, the host's work for
it or the device's), CUDA events around them; ``ms`` is the median over the rounds, ``op ÷ planned``
the median (and quartiles) of the two's ratio within each round. ``device`` is the device's time per
call, its kernels' durations summed from the profiler (what a call costs when the host keeps ahead,
as under a CUDA graph or behind a slower device). At T = 4096 fla's chunk call is host-bound: its
Python and launches take longer than its kernels. The heap is frozen after the warm-up calls
(``gc.freeze()``, as a server does after start-up), so that the garbage collector's passes over the
long-lived objects of torch, Triton and fla do not land in the timed calls.

- ``op``: ``kc.*packed_prefill(..., backend="fla")`` in check mode (the contract's checks, the slots
  gathered into a dense initial state, fla's kernel with its fused gate and beta, ``out`` written,
  the final states scattered back);
- ``bare``: the direct fla call a user of fla writes on the same raw inputs: q/k/v as views of
  ``mixed_qkv`` (fla's input guard copies them), the raw gate logits with ``use_gate_in_kernel``
  (``A_log``, ``dt_bias``, ``lower_bound``), KDA's raw beta with ``use_beta_sigmoid_in_kernel``,
  GDN's ``b.sigmoid()``, ``cu_seqlens.long()``; only the dense initial state (fla's input, the
  gathered slots) is prepared beforehand. fla then plans its chunks from ``cu_seqlens`` read on the
  host (a sync each call). Where FlashQLA may take GDN (``flash_qla`` installed), both use the torch
  gate instead, which FlashQLA needs (``kda_kernels.fla_prefill.gdn_gate_in_kernel``);
- ``planned``: the same direct call given the chunk plan the op's backend makes on the device (KDA:
  ``use_graph=True, max_num_seqs=B``; GDN: ``chunk_indices=chunk_plan(...)``), so that neither syncs:
  the baseline of ``overhead`` = op / planned - 1 (issue 31's target: at most 5 % at T >= 4096);
- ``prepared``: fla's kernel alone with q/k/v made contiguous, the gate and beta computed in torch and
  ``cu_seqlens`` int64 all beforehand, the same tensors every call (so what fla derives from
  ``cu_seqlens``, cached by the tensor's identity, is reused): a floor, not a call anyone makes;
- ``loop``: ``backend="loop"`` (decode's reference once per token), at the smallest T only.

``|Δo|`` is the largest output difference between the op and the bare or planned call (the same kernel
on the same inputs; the op takes the q/k l2 norm in its own copy, whose sum may run in another order
than fla's kernel: expect bf16 rounding, not 0), ``vs loop`` the op's against the token loop (bf16
rounding).

Usage::

    python benchmarks/prefill.py                                   # the sweep (a CUDA device)
    python benchmarks/prefill.py --ops kda --T 4096 --seqs 4 --out prefill.md
    python benchmarks/prefill.py --ops kda --T 4096 --seqs 16 --no-loop --host   # + the op's host time by piece
    python benchmarks/prefill.py --smoke    # tiny sizes; on a CPU under the Triton interpreter

Without CUDA and without ``--smoke`` it prints "needs CUDA" and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PRESETS = {"kda": ("kimi-linear-48b-a3b", 1), "gdn": ("qwen3-next-80b-a3b", 2)}
TOKENS, SEQUENCES = (4096, 16384, 65536), (1, 4, 16)
SMOKE_DIMS = (1, 2, 16, 16)  # H, HV, K, V


@dataclass
class Case:
    op: str
    dims: tuple[int, int, int, int]
    lower_bound: float | None
    scale: float
    T: int
    seqs: int
    device: torch.device
    dtype: torch.dtype


def make_call(c: Case, seed: int = 0) -> dict[str, Any]:
    """The op's keyword arguments (the pool has 2 slots per sequence; sequences use every other one)."""
    H, HV, K, V = c.dims
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths = [c.T // c.seqs + (i < c.T % c.seqs) for i in range(c.seqs)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    def rnd(*shape: int, scale: float = 1.0, dtype: torch.dtype = c.dtype) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=g)).to(dtype).to(c.device)

    gate_width = HV * K if c.op == "kda" else HV
    call = dict(mixed_qkv=rnd(c.T, 2 * H * K + HV * V), a=rnd(c.T, gate_width), b=rnd(c.T, HV),
                A_log=rnd(HV, scale=0.5, dtype=torch.float32), dt_bias=rnd(gate_width, dtype=torch.float32),
                scale=c.scale, initial_state=rnd(2 * c.seqs, HV, V, K, scale=0.1, dtype=torch.float32),
                out=torch.empty(c.T, HV, V, dtype=c.dtype, device=c.device), cu_seqlens=cu.to(c.device),
                ssm_state_indices=torch.arange(0, 2 * c.seqs, 2, dtype=torch.int32, device=c.device),
                has_initial_state=(torch.arange(c.seqs) % 2 == 0).to(c.device), use_qk_l2norm_in_kernel=True)
    if c.op == "kda":
        call["lower_bound"] = c.lower_bound
    return call


def _interpreted(c: Case, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` inside the interpreter's shims on the CPU (kda_kernels.fla_prefill), as is on CUDA."""
    from kda_kernels.fla_prefill import launch_context

    def run() -> Any:
        with launch_context(c.device):
            return fn()

    return run if c.device.type == "cpu" else fn


def _dense_h0(call: dict[str, Any]) -> torch.Tensor:
    """fla's initial state: each sequence's slot, zero where it starts fresh."""
    keep = call["has_initial_state"].view(-1, 1, 1, 1)
    return torch.where(keep, call["initial_state"][call["ssm_state_indices"].long()], 0.0).contiguous()


def bare_kernel(c: Case, call: dict[str, Any], device_plan: bool = False
                ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The direct fla call on the raw inputs (see the module), as a no-argument callable; with
    ``device_plan``, given the chunk plan the op's backend makes on the device (no host sync)."""
    from kda_kernels.fla_prefill import gdn_gate_in_kernel, gdn_plan, kda_plan
    from kda_kernels.gdn_reference import gdn_gate
    from kda_kernels.interface import split_qkv

    H, HV, K, V = c.dims
    x, a, b, A_log, dt_bias = (call[n] for n in ("mixed_qkv", "a", "b", "A_log", "dt_bias"))
    h0 = _dense_h0(call)
    fused = c.op == "kda" or gdn_gate_in_kernel(c.device)
    if c.op == "kda":
        from fla.ops.kda import chunk_kda as kernel
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as kernel

    def call_kernel() -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = (t.unsqueeze(0) for t in split_qkv(x, H, HV, K, V))
        gate: dict[str, Any] = {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias} if fused else {}
        if c.op == "kda":
            g, beta = a.unflatten(-1, (HV, K)), b
            gate.update(lower_bound=c.lower_bound, use_beta_sigmoid_in_kernel=True)
        else:
            g, beta = (a if fused else gdn_gate(a, dt_bias, A_log)), b.sigmoid()
        cu = call["cu_seqlens"].long()
        if device_plan:
            gate.update((kda_plan if c.op == "kda" else gdn_plan)(cu, x.shape[0], cu.shape[0] - 1))
        o, ht = kernel(q=q, k=k, v=v, g=g.unsqueeze(0), beta=beta.unsqueeze(0), scale=c.scale, initial_state=h0,
                       output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True, cu_seqlens=cu,
                       **gate)
        return o[0], ht

    return _interpreted(c, call_kernel)


def prepared_kernel(c: Case, call: dict[str, Any]) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """fla's kernel alone on inputs prepared once from ``call`` (the same tensors every call)."""
    from kda_kernels.gdn_reference import gdn_gate
    from kda_kernels.interface import split_qkv
    from kda_kernels.reference import kda_gate

    H, HV, K, V = c.dims
    a, b = call["a"], call["b"]
    if c.op == "kda":
        from fla.ops.kda import chunk_kda as kernel

        g, beta = kda_gate(a, call["dt_bias"], call["A_log"], c.lower_bound), torch.sigmoid(b.float())
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as kernel

        g, beta = gdn_gate(a, call["dt_bias"], call["A_log"]), torch.sigmoid(b)
    q, k, v = (x.unsqueeze(0).contiguous() for x in split_qkv(call["mixed_qkv"], H, HV, K, V))
    g, beta = g.unsqueeze(0).contiguous(), beta.unsqueeze(0).contiguous()
    h0, cu = _dense_h0(call), call["cu_seqlens"].long()

    def call_kernel() -> tuple[torch.Tensor, torch.Tensor]:
        o, ht = kernel(q=q, k=k, v=v, g=g, beta=beta, scale=c.scale, initial_state=h0, output_final_state=True,
                       use_qk_l2norm_in_kernel=True, state_v_first=True, cu_seqlens=cu)
        return o[0], ht

    return _interpreted(c, call_kernel)


def time_ms(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``fn()`` (CUDA events on a GPU, the wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def interleaved_ms(fns: dict[str, Callable[[], Any]], device: torch.device, calls: int, rounds: int,
                   seed: int = 0) -> dict[str, list[float]]:
    """Milliseconds per call of each of ``fns`` in every round: ``calls`` calls issued back to back (as
    a forward issues its layers; the host's work for one call overlaps the device's for the ones
    before, and the call's time is whichever of the two is longer), the functions in a shuffled order
    each round, so that a host that drifts from minute to minute moves all of them alike."""
    rng = random.Random(seed)
    got: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)
        for name in order:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fns[name]()
                end.record()
                torch.cuda.synchronize(device)
                got[name].append(start.elapsed_time(end) / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fns[name]()
                got[name].append(1e3 * (time.perf_counter() - t0) / calls)
    return got


def device_ms(fn: Callable[[], Any], calls: int = 5) -> float | None:
    """The device's time per call of ``fn``: the durations of its kernels (and copies) summed, from
    the profiler (CUDA only; None elsewhere): what the call costs once the host is off the path."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA") / calls / 1e3


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``xs``."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return q1, q2, q3


def op_call(c: Case, call: dict[str, Any], backend: str) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    import kda_contracts as kc

    op = kc.packed_prefill if c.op == "kda" else kc.gdn_packed_prefill

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return op(**call, state_layout="VK", backend=backend)  # (the mode: check, set around the row)

    return run


def measure(c: Case, warmup: int, repeats: int, loop: bool) -> dict[str, Any]:
    """One row: the op, the bare kernel and (``loop``) the token loop on the same inputs, in check
    mode (set around the row, as a serving loop sets it, not per call)."""
    import kda_contracts as kc

    with kc.mode("check"):
        return _measure(c, warmup, repeats, loop)


def _measure(c: Case, warmup: int, repeats: int, loop: bool) -> dict[str, Any]:
    call = make_call(c)
    fresh = call["initial_state"].clone()
    bare, prepared = bare_kernel(c, call), prepared_kernel(c, call)
    planned = bare_kernel(c, call, device_plan=True)
    o_bare = bare()[0].clone()
    fla = op_call(c, call, "fla")
    o_op = fla()[0].clone()  # (from the same pool as the bare kernel: the first call)
    o_planned = planned()[0]
    row: dict[str, Any] = {"op": c.op, "T": c.T, "seqs": c.seqs,
                           "diff": max((o_op.float() - o.float()).abs().max().item() for o in (o_bare, o_planned))}
    fns = {"op": fla, "planned": planned, "bare": bare, "prepared": prepared}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    gc.collect()
    gc.freeze()  # (as a server does after start-up: no full collection of the long-lived heap in a call's time)
    try:
        got = interleaved_ms(fns, c.device, calls=10 if c.device.type == "cuda" else 1, rounds=repeats)
    finally:
        gc.unfreeze()
    for name, times in got.items():
        row[f"{name}_ms"] = statistics.median(times)
    row["ratio"] = quartiles([o / p for o, p in zip(got["op"], got["planned"], strict=True)])
    row["op_dev_ms"], row["planned_dev_ms"] = device_ms(fla), device_ms(planned)
    if loop:
        call["initial_state"].copy_(fresh)
        loop_call, loop_out = op_call(c, call, "loop"), []
        row["loop_ms"] = time_ms(lambda: loop_out.append(loop_call()[0]), c.device, 0, 1)  # (once: it is slow)
        row["vs_loop"] = (o_op.float() - loop_out[0].float()).abs().max().item()
    return row


HOST_PIECES = ("call", "outside _run", "prepare", "fla", "finish", "rest of _run")


def host_breakdown(c: Case, call: dict[str, Any], rounds: int, calls: int = 10) -> dict[str, float]:
    """The op's host time per call (µs) split into its pieces, measured in place: each piece wrapped in
    ``perf_counter`` with fla's real call between them (a stub in fla's place leaves the CPU caches
    warm for the op's code and shows less). ``call``: issuing one call (``calls`` back to back, before
    the device is waited for); ``outside _run``: the contract, the dispatch and the backend's gate
    views; ``prepare`` / ``finish``: the launches before and after fla's call
    (``kda_kernels.prefill_slots``); ``fla``: fla's call; ``rest of _run``: the backend's own code."""
    from kda_kernels import fla_prefill, prefill_slots

    import kda_contracts as kc

    if c.op == "kda":
        import fla.ops.kda as module

        name = "chunk_kda"
    else:
        import fla.ops.gated_delta_rule as module

        name = "chunk_gated_delta_rule"
    # each wrapped function and the piece its time goes to
    originals = {"prepare": (prefill_slots, "prepare"), "finish": (prefill_slots, "finish"),
                 "_run": (fla_prefill, "_run"), "fla": (module, name)}
    spent: dict[str, float] = dict.fromkeys(originals, 0.0)
    saved = {piece: getattr(obj, attr) for piece, (obj, attr) in originals.items()}

    def timed(fn: Callable[..., Any], piece: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[piece] += time.perf_counter() - t0

        return run

    for piece, (obj, attr) in originals.items():
        setattr(obj, attr, timed(saved[piece], piece))
    got: dict[str, list[float]] = {piece: [] for piece in HOST_PIECES}
    op = op_call(c, call, "fla")
    try:
        with kc.mode("check"):
            for _ in range(3):
                op()
            gc.collect()
            gc.freeze()
            for _ in range(rounds):
                if c.device.type == "cuda":
                    torch.cuda.synchronize(c.device)
                spent.update(dict.fromkeys(spent, 0.0))
                t0 = time.perf_counter()
                for _ in range(calls):
                    op()
                total = time.perf_counter() - t0
                per = {k: 1e6 * v / calls for k, v in spent.items()}
                got["call"].append(1e6 * total / calls)
                got["outside _run"].append(got["call"][-1] - per["_run"])
                for piece in ("prepare", "fla", "finish"):
                    got[piece].append(per[piece])
                got["rest of _run"].append(per["_run"] - per["prepare"] - per["fla"] - per["finish"])
    finally:
        gc.unfreeze()
        for piece, (obj, attr) in originals.items():
            setattr(obj, attr, saved[piece])
    return {piece: statistics.median(xs) for piece, xs in got.items()}


def host_table(rows: list[dict[str, Any]]) -> str:
    out = ["", "Host time per call of the op, in place (µs, median over the rounds; see host_breakdown):", "",
           "| op | T | seqs | " + " | ".join(HOST_PIECES) + " |", "|" + "---|" * (3 + len(HOST_PIECES))]
    for r in rows:
        cells = [r["op"], r["T"], r["seqs"], *(f"{r['host'][piece]:.1f}" for piece in HOST_PIECES)]
        out.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(out) + "\n"


def table(rows: list[dict[str, Any]], header: list[str]) -> str:
    out = [*header, "", "| op | T | seqs | op (ms) | planned (ms) | op ÷ planned (IQR) | bare (ms) | op, device (ms) "
           "| planned, device (ms) | op ÷ planned, device | prepared (ms) | op tokens/s | loop (ms) | loop ÷ op "
           "| \\|Δo\\| op-bare | \\|Δo\\| vs loop |", "|" + "---|" * 16]
    for r in rows:
        tps = r["T"] / (r["op_ms"] / 1e3)
        loop = r.get("loop_ms")
        q1, q2, q3 = r["ratio"]
        dev = r["op_dev_ms"] is not None
        cells = [r["op"], r["T"], r["seqs"], f"{r['op_ms']:.3f}", f"{r['planned_ms']:.3f}",
                 f"{100 * (q2 - 1):+.1f} % ({100 * (q1 - 1):+.1f} to {100 * (q3 - 1):+.1f})", f"{r['bare_ms']:.3f}",
                 f"{r['op_dev_ms']:.3f}" if dev else "—", f"{r['planned_dev_ms']:.3f}" if dev else "—",
                 f"{100 * (r['op_dev_ms'] / r['planned_dev_ms'] - 1):+.1f} %" if dev else "—",
                 f"{r['prepared_ms']:.3f}", f"{tps:,.0f}", f"{loop:.1f}" if loop else "—",
                 f"{loop / r['op_ms']:,.1f}×" if loop else "—", f"{r['diff']:.1e}",
                 f"{r['vs_loop']:.1e}" if loop else "—"]
        out.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(out) + "\n"


def cases(args: argparse.Namespace, device: torch.device) -> list[Case]:
    import kda_contracts as kc

    out = []
    for op in args.ops:
        name, tp = PRESETS[op]
        cfg = (kc.KDAConfig if op == "kda" else kc.GDNConfig).preset(name, tp_size=tp)
        dims = (cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v)
        lb = cfg.lower_bound if op == "kda" else None
        if args.smoke:
            dims, lb = SMOKE_DIMS, None
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16  # (the interpreter's bf16 dot is wrong)
        out += [Case(op, dims, lb, dims[2] ** -0.5, T, s, device, dtype) for T in args.T for s in args.seqs]
    return out


def header(args: argparse.Namespace, device: torch.device, argv: list[str]) -> list[str]:
    import fla
    import triton

    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"
    lines = [f"card: {card}", f"command: `python benchmarks/prefill.py {' '.join(argv)}`".replace("  ", " "),
             f"torch {torch.__version__}, triton {triton.__version__}, fla-core {fla.__version__}; "
             f"{args.repeats} rounds of 10 calls each, interleaved, after {args.warmup} warm-up calls; VK fp32 pool; "
             "check mode"]
    for op, (name, tp) in PRESETS.items():
        if op in args.ops:
            lines.append(f"{op}: {name} TP{tp}" + (" (smoke: H=1 HV=2 K=V=16)" if args.smoke else ""))
    if importlib.util.find_spec("flash_qla") and "gdn" in args.ops:
        lines.append("flash_qla is installed: fla may hand GDN to FlashQLA, which needs a precomputed gate; op and "
                     "bare then compute it in torch (FLA_FLASH_QLA=0: fla's Triton kernels and fused gate)")
    return [ln + "  " for ln in lines[:-1]] + lines[-1:]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--ops", nargs="+", choices=sorted(PRESETS), default=["kda", "gdn"])
    p.add_argument("--T", nargs="+", type=int, default=None, help=f"total tokens (default {TOKENS})")
    p.add_argument("--seqs", nargs="+", type=int, default=None, help=f"sequences per T (default {SEQUENCES})")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-loop", action="store_true", help="skip the token loop")
    p.add_argument("--host", action="store_true", help="also the op's host time per call, split by piece")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (the CPU under the interpreter)")
    p.add_argument("--out", default=None, help="write the Markdown table here too")
    args = p.parse_args(argv)
    args.T = args.T or ([24] if args.smoke else list(TOKENS))
    args.seqs = args.seqs or ([2] if args.smoke else list(SEQUENCES))
    args.warmup = args.warmup if args.warmup is not None else (0 if args.smoke else 3)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 10)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (before fla's kernels are imported)
        device = torch.device("cpu")
    else:
        print("needs CUDA (or --smoke, tiny sizes on the CPU under the Triton interpreter)")
        return 0
    rows = []
    for c in cases(args, device):
        rows.append(measure(c, args.warmup, args.repeats, loop=not args.no_loop and c.T == min(args.T)))
        r = rows[-1]
        if args.host:
            r["host"] = host_breakdown(c, make_call(c), args.repeats)
        print(f"{c.op} T={c.T} seqs={c.seqs}: op {r['op_ms']:.3f} ms, planned {r['planned_ms']:.3f} ms (op / planned "
              f"{r['ratio'][1]:.3f}), bare {r['bare_ms']:.3f} ms; device op {r['op_dev_ms']}, planned "
              f"{r['planned_dev_ms']}", file=sys.stderr, flush=True)
    text = table(rows, header(args, device, argv)) + (host_table(rows) if args.host else "")
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
