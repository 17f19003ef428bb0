"""A continuous-batching decode loop over one Kimi-Linear KDA layer, with its contracts on.

Requests arrive, are prefilled (their prompt through the reference recurrence), decode one token
per step in a fixed-width batch (empty rows are padding, slot -1) and leave; their state slots go
back to a free list. The loop reports decode tokens/s and the share of decode time spent in
contract checks, measured two ways:

- A/B: the same loop (same seed, same schedule, same inputs) under ``kc.mode("off")``, runs
  alternating, the fastest of each mode kept;
- direct: the host time of the checks one decode step makes (the layer's ``decode`` contract and
  the ``packed_decode`` contract it calls), timed alone over many calls.

Run::

    python examples/decode_loop.py                                   # CPU, the tiny test layer
    python examples/decode_loop.py --device cuda --backend triton \\
        --config tests/data/kimi_linear_48b_a3b_config.json --max-batch 64 --slots 512 --steps 400
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import kda_contracts as kc
from kda_contracts._engine.modes import parse_mode
from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

TINY = Path(__file__).resolve().parents[1] / "tests" / "data" / "kimi_linear_tiny_config.json"


@dataclass
class LoopStats:
    mode: str
    steps: int = 0
    decode_tokens: int = 0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    prefill_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Continuous-batching decode loop over a Kimi-Linear KDA layer.")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "triton", "helion", "fla"),
                   help="packed-decode backend (auto: the best available, see kc.explain_backends)")
    p.add_argument("--config", type=Path, default=TINY, help="a Kimi-Linear config.json (default: the tiny one)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="weights and activations (the recurrent state stays fp32)")
    p.add_argument("--check-mode", default="check", choices=("check", "strict"), help="mode of the checked run")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (kernel compilation)")
    p.add_argument("--max-batch", type=int, default=16, help="batch rows per step (padding when fewer requests)")
    p.add_argument("--slots", type=int, default=64, help="state-pool slots")
    p.add_argument("--max-prompt", type=int, default=8, help="prompt lengths are 1..max-prompt")
    p.add_argument("--max-new", type=int, default=48, help="requests decode 1..max-new tokens")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs per mode, alternating check/off; the fastest of each is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch (0: torch's default; 1 is fastest for the tiny layer)")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    args = p.parse_args(argv)
    if args.slots < args.max_batch:
        p.error("--slots must be at least --max-batch (each running request holds a slot)")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Progress:
    """A plain-text progress line, redrawn in place with ``\\r`` (at most ~10 times a second)."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled, self.last = label, total, enabled, 0.0

    def update(self, done: int, batch: int, rows: int, tok_s: float, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.last < 0.1):
            return
        self.last = now
        width = 24
        fill = width * done // max(self.total, 1)
        sys.stdout.write(f"\r  {self.label:<6} [{'#' * fill}{'.' * (width - fill)}] {done:>5}/{self.total} steps"
                         f" | batch {batch:>3}/{rows} | {tok_s:>9.0f} tok/s")
        sys.stdout.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stdout.write("\n")


def run_loop(layer: KimiDeltaAttention, args: argparse.Namespace, mode: str, device: torch.device) -> LoopStats:
    """One run of the loop under ``mode``; the schedule and inputs depend on ``args.seed`` only."""
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    D, rows, dtype = layer.config.hidden_size, args.max_batch, layer.dtype
    bank = torch.randn(16, rows, D, generator=gen).to(device=device, dtype=dtype)  # decode inputs
    prompts = torch.randn(16, args.max_prompt, D, generator=gen).to(device=device, dtype=dtype)
    slot_idx = torch.arange(args.slots, device=device)
    ssm, conv = layer.new_state_pools(args.slots, device=device)
    free, active = list(range(args.slots)), {}  # slot -> tokens left to decode
    stats = LoopStats(mode)
    bar = Progress(mode, args.steps, not args.no_progress)
    with kc.mode(mode):  # type: ignore[arg-type]
        for step in range(args.warmup + args.steps):
            timed = step >= args.warmup
            # Requests join while there is room; each is prefilled into a slot from the free list.
            while free and len(active) < rows and rng.random() < 0.5:
                slot, n = free.pop(), rng.randint(1, args.max_prompt)
                t0 = time.perf_counter()
                layer.prefill(prompts[step % 16, None, :n], ssm, conv, slot_idx[slot:slot + 1])
                _sync(device)
                if timed:
                    stats.prefill_s += time.perf_counter() - t0
                    stats.prefill_tokens += n
                active[slot] = rng.randint(1, args.max_new)
            batch = list(active)
            order = torch.randperm(rows, generator=gen)[: len(batch)]  # padding rows anywhere
            idx = torch.full((rows,), -1, dtype=torch.int64)
            idx[order] = torch.tensor(batch, dtype=torch.int64)
            idx = idx.to(device)
            t0 = time.perf_counter()
            layer.decode(bank[step % 16], ssm, conv, idx)
            _sync(device)  # an engine syncs each step anyway, to sample the next tokens
            if timed:
                stats.decode_s += time.perf_counter() - t0
                stats.decode_tokens += len(batch)
                stats.steps += 1
                bar.update(stats.steps, len(batch), rows, stats.tokens_per_s, force=stats.steps == args.steps)
            for slot in batch:  # requests that are done leave; their slots are reused
                active[slot] -= 1
                if not active[slot]:
                    del active[slot]
                    free.append(slot)
    bar.close()
    return stats


def packed_decode_args(layer: KimiDeltaAttention, ssm: torch.Tensor, idx: torch.Tensor) -> tuple:
    """The packed-decode call the layer makes for a batch of ``len(idx)`` rows (contents zero)."""
    d, B, cfg = layer.contract_dims(), idx.shape[0], layer.config
    act = {"device": ssm.device, "dtype": layer.dtype}
    return (torch.zeros(B, d["C"], **act), torch.zeros(B, d["HV"] * d["K"], **act), torch.zeros(B, d["HV"], **act),
            layer.A_log, layer.dt_bias, cfg.scale, ssm, torch.zeros(B, 1, d["HV"], d["V"], **act), idx,
            cfg.use_qk_l2norm, cfg.effective_lower_bound)


def time_checks(layer: KimiDeltaAttention, args: argparse.Namespace, device: torch.device,
                repeats: int = 2000) -> tuple[float, float]:
    """Host microseconds per call of the two contract checks a decode step makes (full batch)."""
    cfg = layer.config
    ssm, conv = layer.new_state_pools(args.slots, device=device)
    x = torch.zeros(args.max_batch, cfg.hidden_size, device=device, dtype=layer.dtype)
    idx = torch.arange(args.max_batch, device=device)
    pd_args = (*packed_decode_args(layer, ssm, idx), cfg, None)  # then config and state_layout
    m = parse_mode(args.check_mode)
    layer_contract = KimiDeltaAttention.decode.__kda_contract__
    decode_contract = kc.packed_decode_contract(cfg.state_layout)
    timings = []
    for fn in (lambda: layer_contract.enforce((layer, x, ssm, conv, idx), layer, m),
               lambda: decode_contract.enforce(pd_args, cfg, m)):
        for _ in range(50):
            fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        timings.append((time.perf_counter() - t0) / repeats * 1e6)
    return timings[0], timings[1]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    layer = KimiDeltaAttention.from_hf_config(args.config, backend=args.backend, device=device, dtype=dtype)
    layer.load_weights(**random_weights(layer.config, seed=args.seed, dtype=dtype))
    d = layer.contract_dims()
    print(f"Kimi-Linear KDA layer from {args.config.name}: H={d['H']} HV={d['HV']} K={d['K']} V={d['V']} "
          f"D={d['D']} conv={d['W'] + 1} | {args.dtype} on {device} | batch {args.max_batch} rows, "
          f"{args.slots} slots | backend={args.backend!r}")
    if args.backend == "auto":
        ssm, _ = layer.new_state_pools(1, device=device)
        why = kc.explain_backends(*packed_decode_args(layer, ssm, torch.zeros(1, dtype=torch.int64, device=device)),
                                  config=layer.config)
        print("  auto picks: " + next(line.strip() for line in why.splitlines() if ": chosen" in line))

    runs: dict[str, LoopStats] = {}
    for _ in range(max(args.repeats, 1)):
        for mode in (args.check_mode, "off"):
            s = run_loop(layer, args, mode, device)
            if mode not in runs or s.decode_s < runs[mode].decode_s:
                runs[mode] = s
    on, off = runs[args.check_mode], runs["off"]
    for s in (on, off):
        print(f"  {s.mode:<6} {s.steps} steps, {s.decode_tokens} decode tokens in {s.decode_s:.3f} s: "
              f"{s.tokens_per_s:,.0f} tok/s ({s.decode_s / max(s.steps, 1) * 1e3:.3f} ms/step); "
              f"prefill {s.prefill_tokens} tokens in {s.prefill_s:.3f} s")

    layer_us, decode_us = time_checks(layer, args, device)
    step_us = on.decode_s / max(on.steps, 1) * 1e6
    ab = on.decode_s / off.decode_s - 1 if off.decode_s else 0.0  # timing noise included
    print(f"contract checks ({args.check_mode}): {layer_us + decode_us:.1f} us/step of host time "
          f"(layer decode {layer_us:.1f} + packed_decode {decode_us:.1f}) = "
          f"{(layer_us + decode_us) / step_us:.1%} of a {step_us:.0f} us step; "
          f"A/B: the {args.check_mode} run's decode time is {ab:+.1%} vs the off run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
