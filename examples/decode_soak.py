"""Faults under load: a continuous-batching packed-decode loop where calls go wrong on purpose.

Requests arrive, decode for a random number of steps in a fixed-width batch (empty rows are
padding, slot -1) and leave; their pool slots are reused. Then the same schedule runs again with
faults injected:

- every ``--bad-every``-th call is first made malformed in a random way (a wrong shape, dtype,
  device-free metadata fault, a tensor that requires grad, a bool scale; in strict mode also an
  index past the pool, a duplicate slot, NaN activations) and must be rejected with every tensor
  bit-identical;
- every ``--fail-every``-th backend call fails: a test backend that, in strict mode, writes part
  of ``out`` and of the used slots and then raises (strict mode must roll that back), and in check
  mode raises before writing; the failed step is retried.

Every request's outputs and the final pool must match the clean run bit for bit. Memory (RSS,
and CUDA allocated bytes on a GPU) is sampled along the way; throughput of the clean loop is
measured in ``off``, ``check`` and ``strict`` modes, runs alternating, best of ``--repeats``.

Run::

    python examples/decode_soak.py --steps 5000                         # CPU, a tiny layer
    python examples/decode_soak.py --device cuda --preset kimi-linear-48b-a3b --max-batch 64 \\
        --slots 512 --steps 5000 --backend triton
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import kda_contracts as kc

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


@dataclass
class Schedule:
    """Which request occupies each batch row at each step (None: padding), and its slot."""

    rows: list[list[int | None]]
    slot_of: dict[int, int]


def make_schedule(steps: int, width: int, slots: int, seed: int) -> Schedule:
    rng = random.Random(seed)
    free = list(range(slots))
    rng.shuffle(free)
    active: dict[int, int] = {}  # request -> steps left
    rows: list[int | None] = [None] * width
    slot_of: dict[int, int] = {}
    out, nxt = [], 0
    for _ in range(steps):
        for i, r in enumerate(rows):
            if r is not None and active[r] == 0:
                free.append(slot_of[r])
                del active[r]
                rows[i] = None
        for i in range(width):
            if rows[i] is None and free and rng.random() < 0.5:
                r, nxt = nxt, nxt + 1
                slot_of[r] = free.pop(0)
                active[r] = rng.randint(1, 40)
                rows[i] = r
        for r in rows:
            if r is not None:
                active[r] -= 1
        out.append(list(rows))
    return Schedule(out, slot_of)


@dataclass
class Loop:
    cfg: kc.KDAConfig
    schedule: Schedule
    slots: int
    device: torch.device
    backend: str
    seed: int
    act_dtype: torch.dtype = torch.float32

    def new_pool(self) -> torch.Tensor:
        g = torch.Generator(device=self.device).manual_seed(self.seed)
        shape = (self.slots, self.cfg.local_num_v_heads, self.cfg.head_v, self.cfg.head_k)
        return torch.randn(shape, generator=g, device=self.device) * 0.1

    def inputs(self, step: int) -> dict[str, Any]:
        """The step's arguments (a fresh generator per step: a retried step sees the same inputs)."""
        cfg, width = self.cfg, len(self.schedule.rows[0])
        g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + step)
        H, HV, K, V = cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=self.device).to(self.act_dtype)

        idx = [self.schedule.slot_of[r] if r is not None else -1 for r in self.schedule.rows[step]]
        return {"mixed_qkv": rnd(width, 2 * H * K + HV * V), "a": rnd(width, HV * K), "b": rnd(width, HV),
                "A_log": torch.rand(HV, generator=g, device=self.device) * 0.5,
                "dt_bias": torch.randn(HV * K, generator=g, device=self.device) * 0.1, "scale": cfg.scale,
                "out": torch.empty(width, 1, HV, V, device=self.device, dtype=self.act_dtype),
                "ssm_state_indices": torch.tensor(idx, dtype=torch.int32, device=self.device),
                "use_qk_l2norm_in_kernel": cfg.use_qk_l2norm}

    def step(self, pool: torch.Tensor, args: dict[str, Any], backend: str | None = None) -> None:
        kc.packed_decode(**args, initial_state=pool, config=self.cfg, backend=backend or self.backend)


# -- faults ----------------------------------------------------------------------------------------
METADATA_FAULTS = ("shape", "dtype", "requires-grad", "bool-scale", "rank", "index-dtype")
VALUE_FAULTS = ("index-past-pool", "duplicate-slot", "nan-activation")


def malform(args: dict[str, Any], pool: torch.Tensor, kind: str) -> dict[str, Any]:
    bad = dict(args)
    if kind == "shape":
        bad["a"] = args["a"][:, :-1]
    elif kind == "dtype":
        bad["A_log"] = args["A_log"].double()
    elif kind == "requires-grad":
        bad["out"] = args["out"].clone().requires_grad_(True)
    elif kind == "bool-scale":
        bad["scale"] = True
    elif kind == "rank":
        bad["b"] = args["b"].unsqueeze(-1)
    elif kind == "index-dtype":
        bad["ssm_state_indices"] = args["ssm_state_indices"].float()
    elif kind == "index-past-pool":
        idx = args["ssm_state_indices"].clone()
        idx[0] = pool.shape[0]
        bad["ssm_state_indices"] = idx
    elif kind == "duplicate-slot":
        idx = args["ssm_state_indices"].clone()
        live = (idx >= 0).nonzero().flatten()
        if live.numel() >= 2:
            idx[live[1]] = idx[live[0]]
        else:
            idx[0] = pool.shape[0] + 3
        bad["ssm_state_indices"] = idx
    elif kind == "nan-activation":
        bad["mixed_qkv"] = args["mixed_qkv"].clone()
        bad["mixed_qkv"][0, 0] = float("nan")
    return bad


@dataclass
class Flaky:
    """A backend wrapping a real one that fails every ``every``-th call: in strict mode after
    writing part of ``out`` and of the used slots, in check mode before writing anything."""

    inner: str
    every: int
    calls: int = 0
    failures: int = 0

    def kernel(self, mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: Any, initial_state: Any,
               out: Any, ssm_state_indices: Any, use_qk_l2norm_in_kernel: Any = False, lower_bound: Any = None, *,
               config: Any = None, state_layout: Any = None, dims: Any, variant: Any) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            self.failures += 1
            if kc.get_mode() == "strict":
                out.view(-1)[: out.numel() // 2] = 13.0
                used = ssm_state_indices[ssm_state_indices >= 0].long()
                initial_state[used[:2]] = -7.0
            raise RuntimeError(f"injected backend failure #{self.failures}")
        table = kc.packed_decode.table
        run = table.runner(table.get(self.inner))
        call = (mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                use_qk_l2norm_in_kernel, lower_bound)
        if self.inner in table.direct:  # the kernel itself (it asks for no dims)
            run(*call, config=config, state_layout=state_layout)
        else:
            run(tuple(dims), variant, *call, config=config, state_layout=state_layout)


@dataclass
class SoakReport:
    mode: str
    steps: int
    calls: int = 0
    bad_calls: int = 0
    bad_rejected_unchanged: int = 0
    backend_failures: int = 0
    retries: int = 0
    by_fault: dict[str, int] = field(default_factory=dict)
    rss_mib: list[float] = field(default_factory=list)
    cuda_mib: list[float] = field(default_factory=list)
    outputs_match: bool = False
    pool_matches: bool = False


def run_clean(loop: Loop, steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    pool, outs = loop.new_pool(), []
    with kc.mode("off"):
        for s in range(steps):
            args = loop.inputs(s)
            loop.step(pool, args)
            outs.append(args["out"].clone())
    return outs, pool


def _sample(report: SoakReport, device: torch.device) -> None:
    report.rss_mib.append(rss_bytes() / 2**20)
    if device.type == "cuda":
        report.cuda_mib.append(torch.cuda.memory_allocated(device) / 2**20)


def run_faulty(loop: Loop, steps: int, mode: str, bad_every: int, fail_every: int, seed: int,
               reference: tuple[list[torch.Tensor], torch.Tensor]) -> SoakReport:
    rng = random.Random(seed)
    flaky = Flaky(loop.backend if loop.backend != "auto" else kc.packed_decode.table.names()[-1], fail_every)
    inner = [n for n in kc.packed_decode.table.names() if n != "soak-flaky"]
    if loop.backend == "auto":  # what auto would pick for this device, wrapped
        flaky.inner = next(n for n in inner if kc.packed_decode.available().get(n, (False,))[0]
                           and loop.device.type in (*kc.packed_decode.table.get(n).devices, "*"))
    kc.packed_decode.register_backend(kc.Backend(name="soak-flaky", kernel=flaky.kernel, devices=(loop.device.type,),
                                                 priority=-100), replace=True)
    report = SoakReport(mode, steps)
    faults = METADATA_FAULTS + (VALUE_FAULTS if mode == "strict" else ())
    pool, mismatched = loop.new_pool(), 0
    ref_outs, ref_pool = reference
    try:
        with kc.mode(mode):
            for s in range(steps):
                args = loop.inputs(s)
                report.calls += 1
                if report.calls % bad_every == 0:
                    kind = rng.choice(faults)
                    bad = malform(args, pool, kind)
                    before = (pool.clone(), args["out"].clone())
                    try:
                        loop.step(pool, bad, backend="soak-flaky")
                    except kc.ContractError:
                        if torch.equal(pool, before[0]) and torch.equal(args["out"].nan_to_num(0),
                                                                         before[1].nan_to_num(0)):
                            report.bad_rejected_unchanged += 1
                    report.bad_calls += 1
                    report.by_fault[kind] = report.by_fault.get(kind, 0) + 1
                for attempt in range(3):  # a failed step is retried (a failure is injected at most once)
                    try:
                        loop.step(pool, args, backend="soak-flaky")
                        break
                    except kc.BackendError:
                        report.retries += 1
                        if attempt == 2:
                            raise
                # compared as it comes (nothing kept: memory must stay flat)
                mismatched += not torch.equal(args["out"].view(torch.uint8), ref_outs[s].view(torch.uint8))
                if s % max(steps // 20, 1) == 0:
                    _sample(report, loop.device)
        _sample(report, loop.device)
    finally:
        kc.packed_decode.unregister_backend("soak-flaky")
    report.backend_failures = flaky.failures
    report.outputs_match = mismatched == 0 and len(ref_outs) == steps
    report.pool_matches = torch.equal(pool.view(torch.uint8), ref_pool.view(torch.uint8))
    return report


def throughput(loop: Loop, steps: int, repeats: int) -> dict[str, float]:
    """Decode steps per second of the clean loop in each mode (inputs made beforehand), the modes
    alternating, the best of ``repeats`` kept."""
    inputs = [loop.inputs(s) for s in range(steps)]
    pool = loop.new_pool()
    best: dict[str, float] = {}
    sync: Callable[[], None] = torch.cuda.synchronize if loop.device.type == "cuda" else (lambda: None)
    for _ in range(repeats):
        for mode in ("off", "check", "strict"):
            with kc.mode(mode):
                for args in inputs[:20]:
                    loop.step(pool, args)
                sync()
                t0 = time.perf_counter()
                for args in inputs:
                    loop.step(pool, args)
                sync()
                rate = steps / (time.perf_counter() - t0)
            best[mode] = max(best.get(mode, 0.0), rate)
    return best


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Packed-decode loop with injected faults.")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="torch")
    p.add_argument("--preset", default=None, help="a KDAConfig preset (default: a tiny test config)")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--bad-every", type=int, default=50)
    p.add_argument("--fail-every", type=int, default=200)
    p.add_argument("--modes", default="check,strict")
    p.add_argument("--throughput-steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the report here too")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    act = getattr(torch, args.dtype)
    dt = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[act]
    cfg = (kc.KDAConfig.preset(args.preset, tp_size=1, activation_dtype=dt, state_dtype="float32",
                               index_dtype="int32")
           if args.preset else kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16,
                                            activation_dtype=dt, state_dtype="float32", index_dtype="int32"))
    schedule = make_schedule(args.steps, args.max_batch, args.slots, args.seed)
    loop = Loop(cfg, schedule, args.slots, device, args.backend, args.seed, act)
    reference = run_clean(loop, args.steps)
    reports = [run_faulty(loop, args.steps, m, args.bad_every, args.fail_every, args.seed + 1, reference)
               for m in args.modes.split(",")]
    rates = throughput(loop, min(args.throughput_steps, args.steps), args.repeats)
    ok = all(r.outputs_match and r.pool_matches and r.bad_rejected_unchanged == r.bad_calls for r in reports)
    summary = {"device": str(device), "backend": args.backend, "steps": args.steps, "max_batch": args.max_batch,
               "slots": args.slots, "ok": ok, "steps_per_s": rates,
               "check_vs_off": rates["check"] / rates["off"], "strict_vs_off": rates["strict"] / rates["off"],
               "reports": [r.__dict__ for r in reports], "command": "python examples/decode_soak.py "
               + " ".join(sys.argv[1:] if argv is None else argv)}
    for r in reports:
        growth = (r.rss_mib[-1] - r.rss_mib[len(r.rss_mib) // 4]) if r.rss_mib else 0.0
        print(f"{r.mode:>6}: {r.steps} steps, {r.bad_calls} bad calls ({r.bad_rejected_unchanged} rejected with "
              f"nothing changed), {r.backend_failures} backend failures ({r.retries} retries); outputs "
              f"{'match' if r.outputs_match else 'DIFFER'}, pool {'matches' if r.pool_matches else 'DIFFERS'}; "
              f"RSS {r.rss_mib[0]:.0f} -> {r.rss_mib[-1]:.0f} MiB (+{growth:.1f} after the first quarter)"
              + (f"; CUDA allocated {r.cuda_mib[0]:.1f} -> {r.cuda_mib[-1]:.1f} MiB" if r.cuda_mib else ""))
    print(f"steps/s: off {rates['off']:.0f}, check {rates['check']:.0f} ({rates['check'] / rates['off']:.3f}x), "
          f"strict {rates['strict']:.0f} ({rates['strict'] / rates['off']:.3f}x)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
