"""Watch mode's cost on a CUDA device (issue 30): eager B=1 packed decode in watch mode against check
mode (per-call host time, the same call repeated), and CUDA-graph replay with and without watch
mode's probes captured, B in {1, 8, 64, 256}. Prints a table; on a machine without CUDA it says so.

    python benchmarks/watch_overhead.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

CFG = kc.KDAConfig(num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128)


def eager_us(call: dict, mode: str, iters: int) -> float:
    """Median µs per eager call over 5 rounds (each round synchronised at its end only)."""
    rounds = []
    with kc.mode(mode):
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                kc.packed_decode(**call, config=CFG)
            torch.cuda.synchronize()
            rounds.append((time.perf_counter() - t0) / iters * 1e6)
        kc.raise_pending()
    return statistics.median(rounds)


def replay_us(call: dict, mode: str, iters: int) -> float:
    """Median µs per replay of a graph captured in ``mode`` (check: no probes; watch: probes and fold)."""
    with kc.mode(mode):
        kc.packed_decode(**call, config=CFG)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kc.packed_decode(**call, config=CFG)
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / iters * 1e6)
    kc.raise_pending()
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("watch_overhead.py needs CUDA: nothing measured")
        return
    print(f"device: {torch.cuda.get_device_name()}")
    call = make_decode_call(CFG, 1, 64, device="cuda")
    check, watched = eager_us(call, "check", args.iters), eager_us(call, "watch", args.iters)
    print(f"eager B=1: check {check:.1f} µs, watch {watched:.1f} µs ({watched / check:.2f}x)")
    print("graph replay (µs):  B   check   watch   watch/check")
    for b in (1, 8, 64, 256):
        call = make_decode_call(CFG, b, max(2 * b, 64), device="cuda")
        plain, probed = replay_us(call, "check", args.iters), replay_us(call, "watch", args.iters)
        print(f"                  {b:4d} {plain:7.1f} {probed:7.1f}   {probed / plain:.2f}x")


if __name__ == "__main__":
    main()
