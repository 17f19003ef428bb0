"""Layer prefill throughput (issue 31): the Kimi-Linear and Qwen3-Next layers' packed varlen prefill,
``layer.prefill(x [T, D], ..., cu_seqlens=...)`` (the packed prefill ops; fla's chunk kernels on a
GPU), against the old path, the padded prefill run one token at a time through the reference
decode (``layer.prefill(x [B, T/B, D], ...)``), at Kimi-Linear-48B (TP1) and Qwen3-Next-80B (TP2)
sizes: random weights in bf16, fp32 state pools, check mode, B sequences of equal length. Tokens per
second of the whole layer (projections, short convolution, recurrence, gated norm, output). The
token loop is slow, so it runs at ``--loop-T`` tokens only, and the packed path is timed there too
(the ratio is taken at the same T). Prints a Markdown table.

    python benchmarks/layer_prefill.py                       # on a CUDA machine
    python benchmarks/layer_prefill.py --smoke               # tiny sizes on the CPU (a smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import kda_contracts as kc
from kda_contracts.models import kimi_linear, qwen3_next

PRESETS = {"kimi": ("kimi-linear-48b-a3b", 1), "qwen": ("qwen3-next-80b-a3b", 2)}
Layer = kimi_linear.KimiDeltaAttention | qwen3_next.Qwen3NextGatedDeltaNet


def layer_for(kind: str, device: torch.device, smoke: bool) -> Layer:
    layer: Layer
    if kind == "kimi":
        cfg = (kc.KDAConfig(num_heads=2, head_k_dim=16, hidden_size=32) if smoke else
               kc.KDAConfig.preset(PRESETS[kind][0], tp_size=PRESETS[kind][1]))
        layer = kimi_linear.KimiDeltaAttention(cfg, device=device, dtype=torch.float32 if smoke else torch.bfloat16)
        layer.load_weights(**kimi_linear.random_weights(cfg, seed=0))
    else:
        cfg = (kc.GDNConfig(num_heads=1, num_v_heads=2, head_k_dim=16, hidden_size=32) if smoke else
               kc.GDNConfig.preset(PRESETS[kind][0], tp_size=PRESETS[kind][1]))
        layer = qwen3_next.Qwen3NextGatedDeltaNet(cfg, device=device, dtype=torch.float32 if smoke else torch.bfloat16)
        layer.load_weights(**qwen3_next.random_weights(cfg, seed=0))
    return layer


def timed_ms(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median ms of ``run()`` (synchronised), after one warm-up call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def packed_ms(layer: Layer, T: int, seqs: int, device: torch.device, repeats: int) -> float:
    D = layer.config.hidden_size
    assert D is not None  # the layer's constructor rejects a config without it
    x = (0.1 * torch.randn(T, D, generator=torch.Generator().manual_seed(T))).to(device, layer.dtype)
    ssm, conv = layer.new_state_pools(seqs + 1, device=device)
    slots = torch.arange(seqs, dtype=torch.int32, device=device)
    cu = torch.tensor([T * i // seqs for i in range(seqs + 1)], dtype=torch.int32, device=device)
    return timed_ms(lambda: layer.prefill(x, ssm, conv, slots, cu_seqlens=cu), device, repeats)


def loop_ms(layer: Layer, T: int, seqs: int, device: torch.device, repeats: int) -> float:
    D = layer.config.hidden_size
    assert D is not None  # the layer's constructor rejects a config without it
    x = (0.1 * torch.randn(seqs, T // seqs, D, generator=torch.Generator().manual_seed(T))).to(device, layer.dtype)
    ssm, conv = layer.new_state_pools(seqs + 1, device=device)
    slots = torch.arange(seqs, dtype=torch.int32, device=device)
    return timed_ms(lambda: layer.prefill(x, ssm, conv, slots), device, repeats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--T", nargs="+", type=int, default=[4096, 16384], help="total tokens of the packed path")
    p.add_argument("--seqs", type=int, default=4, help="sequences per call")
    p.add_argument("--loop-T", type=int, default=256, help="total tokens where the token loop is timed")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny layers on the CPU, one repeat")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.smoke:
        print("layer_prefill.py: no CUDA device; run with --smoke for the CPU smoke test", file=sys.stderr)
        return 0
    if args.smoke:
        args.T, args.loop_T, args.repeats = [64], 16, 1
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}; {args.seqs} sequences of equal length, check mode\n")
    print("| layer | path | T | ms | tokens/s | packed ÷ loop at that T |")
    print("|---|---|---|---|---|---|")
    with kc.mode("check"), torch.no_grad():
        for kind in PRESETS:
            layer = layer_for(kind, device, args.smoke)
            label = "Kimi-Linear-48B TP1" if kind == "kimi" else "Qwen3-Next-80B TP2"
            if args.smoke:
                label += " (smoke sizes)"
            loop = loop_ms(layer, args.loop_T, args.seqs, device, args.repeats)
            short = packed_ms(layer, args.loop_T, args.seqs, device, args.repeats)
            print(f"| {label} | token loop (padded) | {args.loop_T} | {loop:.2f} | {args.loop_T / loop * 1e3:,.0f} | |")
            print(f"| {label} | packed | {args.loop_T} | {short:.2f} | {args.loop_T / short * 1e3:,.0f} | "
                  f"{loop / short:,.1f}× |")
            for T in args.T:
                ms = packed_ms(layer, T, args.seqs, device, args.repeats)
                print(f"| {label} | packed | {T} | {ms:.2f} | {T / ms * 1e3:,.0f} | |")
            del layer
    return 0


if __name__ == "__main__":
    sys.exit(main())
