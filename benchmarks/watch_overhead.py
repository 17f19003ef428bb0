"""Watch mode's cost on a CUDA device (issue 30): eager packed decode (KDA, H = HV = 32, K = V = 128,
fp32 VK pool, the default backend) in watch mode against check mode at B = 1 and 8 (per-call host
time, the same call repeated; the modes alternate round by round), and CUDA-graph replay of a call
captured in each mode, B in {1, 8, 64, 256}. "watch": the Triton decode kernel checks the op's
rules itself (what the op does);
"fused": watch mode's own check kernel does (what an op whose kernel cannot pays); "fused -rows",
that kernel without ``FiniteRows`` (the one rule that reads the state rows the call uses: as many
bytes as the decode kernel reads). Prints a table; on a machine without CUDA it says so.

    python benchmarks/watch_overhead.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Literal

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

CFG = kc.KDAConfig(num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128)


def without_rows() -> contextlib.AbstractContextManager[None]:
    """A context in which the fused check skips ``FiniteRows`` (for the "-rows" column)."""
    from kda_contracts._engine.rules import fused

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        saved = fused._SLOT_OF[kc.FiniteRows]
        fused._SLOT_OF[kc.FiniteRows] = lambda *a: fused.SKIP
        fused._PREPARED.clear()
        try:
            yield
        finally:
            fused._SLOT_OF[kc.FiniteRows] = saved
            fused._PREPARED.clear()

    return ctx()


def fused_only() -> contextlib.AbstractContextManager[None]:
    """A context in which no backend's kernel is handed the rules: watch mode's own check kernel
    makes them (the "fused" columns: what an op whose kernel does not check pays)."""
    from kda_contracts._engine.contract import watch

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        real = watch.Pending.hand
        watch.Pending.hand = lambda self, watched: real(self, None)  # type: ignore[method-assign]
        try:
            yield
        finally:
            watch.Pending.hand = real  # type: ignore[method-assign]

    return ctx()


def eager_us(call: dict, iters: int, rounds: int = 9) -> dict[str, float]:
    """Median µs per eager call in check mode, watch mode and watch mode with the fused check kernel,
    the three alternating round by round (a host's drift hits each alike); each round synchronised
    at its end only."""
    times: dict[str, list[float]] = {"check": [], "watch": [], "fused": []}

    def run(mode: Literal["check", "watch"]) -> float:
        with kc.mode(mode):
            kc.packed_decode(**call, config=CFG)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                kc.packed_decode(**call, config=CFG)
            torch.cuda.synchronize()
            took = (time.perf_counter() - t0) / iters * 1e6
            kc.raise_pending()
        return took

    for _ in range(rounds):
        times["check"].append(run("check"))
        times["watch"].append(run("watch"))
        with fused_only():
            times["fused"].append(run("watch"))
    return {k: statistics.median(v) for k, v in times.items()}


def replay_us(call: dict, mode: Literal["check", "watch"], iters: int) -> float:
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
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("'watch': the decode kernel checks the rules itself; 'fused': watch mode's check kernel does")
    print("eager (µs per call): B   check   watch   watch/check   fused   fused/check")
    for b in (1, 8):
        call = make_decode_call(CFG, b, 64, device="cuda")
        t = eager_us(call, args.iters)
        check, watched, checked = t["check"], t["watch"], t["fused"]
        print(f"                   {b:4d} {check:7.1f} {watched:7.1f}   {watched / check:.3f}x   {checked:7.1f}   "
              f"{checked / check:.3f}x")
    print("graph replay (µs):  B   check   watch   watch - check     fused   fused - check   fused -rows - check")
    for b in (1, 8, 64, 256):
        call = make_decode_call(CFG, b, max(2 * b, 64), device="cuda")
        plain, own = replay_us(call, "check", args.iters), replay_us(call, "watch", args.iters)
        with fused_only():
            probed = replay_us(call, "watch", args.iters)
            with without_rows():
                lean = replay_us(call, "watch", args.iters)
        plain2 = replay_us(call, "check", args.iters)  # (again, after: the check graph's drift)
        plain = min(plain, plain2)
        print(f"                  {b:4d} {plain:7.1f} {own:7.1f} {own - plain:+7.2f} "
              f"({100 * (own / plain - 1):+.1f} %) "
              f"{probed:7.1f} {probed - plain:+7.2f} ({100 * (probed / plain - 1):+.1f} %) "
              f"{lean - plain:+7.2f} ({100 * (lean / plain - 1):+.1f} %)")


if __name__ == "__main__":
    main()
