"""The eager path at B = 1 on a CUDA device: ``kc.packed_decode`` / ``kc.gdn_packed_decode`` in off,
check and strict mode against our Triton kernel launched directly, as ratios taken within each round.

A B = 1 decode call is launch-bound (~15 µs of host time for a ~3 µs kernel), and the host of a
shared machine drifts by several µs from minute to minute, so medians of separate runs cannot show a
difference of 1-2 µs. Here every round times each path (``decode.wall_us_per_call``: 7 × N calls,
median) in a shuffled order, and each mode's ratio to the direct launch is taken within the round;
the median and interquartile range of those ratios over the rounds are reported. The mode is set
around each timed loop (as ``KDA_CONTRACTS_MODE`` or a ``kc.mode`` block around a serving loop sets
it), not per call. ``KDA_CONTRACTS_CHECK_CACHE=0`` runs it without the check cache.

    python benchmarks/eager_path.py                                   # KDA and GDN, 15 rounds
    KDA_CONTRACTS_CHECK_CACHE=0 python benchmarks/eager_path.py       # the same without the cache
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode
from decode_ops import OPS


def rounds_of(op_name: str, rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """µs per call of each path ("direct", "off", "check", "strict") in every round."""
    decode.OP = OPS[op_name]()
    _, paths = decode.eager_paths(torch.device("cuda"))
    calls = {"direct": 300, "off": 300, "check": 300, "strict": 20}
    got: dict[str, list[float]] = {p: [] for p in paths}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(paths)
        rng.shuffle(order)
        for p in order:
            fn, mode = paths[p]
            got[p].append(decode.timed_in_mode(fn, mode, calls[p]))
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="kda,gdn", help="comma-separated ops (default: kda,gdn)")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/eager_path.py needs a CUDA device", file=sys.stderr)
        return 2
    tag = "cache off" if os.environ.get("KDA_CONTRACTS_CHECK_CACHE") == "0" else "cache on"
    for name in args.op.split(","):
        got = rounds_of(name, args.rounds)
        direct = statistics.median(got["direct"])
        for mode in ("off", "check", "strict"):
            ratios = sorted(a / b for a, b in zip(got[mode], got["direct"], strict=True))
            q = statistics.quantiles(ratios, n=4)
            print(f"{tag} | {name} | {mode} | median {statistics.median(got[mode]):.1f} us | direct {direct:.1f} us | "
                  f"per-round ratio median {statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
