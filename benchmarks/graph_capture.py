"""Capture ``kc.packed_decode`` in a CUDA graph in ``check`` and ``strict`` modes and replay it.

Shows that validation adds no host-device sync during capture (``torch.cuda.set_sync_debug_mode``
set to ``"error"`` turns any sync into an exception) and that the replayed graph gives the same
results as eager calls. Run on a CUDA machine:

    python benchmarks/graph_capture.py
"""

from __future__ import annotations

import sys

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b", index_dtype="int32")
    backend = next(n for n in ("triton", "helion", "torch") if kc.adapters.available().get(n, (False,))[0])
    failures = 0
    for mode in ("check", "strict"):
        call = make_decode_call(cfg, 8, 64, device="cuda")
        call["ssm_state_indices"][-1] = -1  # one padding row
        eager = dict(call, initial_state=call["initial_state"].clone(), out=call["out"].clone())
        with kc.mode(mode):  # type: ignore[arg-type]
            kc.packed_decode(**eager, config=cfg, backend=backend)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up (compiles kernels) outside capture
                warm = dict(call, initial_state=call["initial_state"].clone(), out=call["out"].clone())
                kc.packed_decode(**warm, config=cfg, backend=backend)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.cuda.graph(g):
                    kc.packed_decode(**call, config=cfg, backend=backend)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            g.replay()
            torch.cuda.synchronize()
        same_out = torch.equal(call["out"], eager["out"])
        same_state = torch.equal(call["initial_state"], eager["initial_state"])
        ok = same_out and same_state
        failures += not ok
        print(f"{mode:>6} mode, backend={backend}: captured without a sync; replay == eager: out {same_out}, "
              f"state {same_state}")
        # A bad shape is still rejected before capture would record anything.
        bad = dict(call, a=call["a"].view(8, 32, 128))
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                kc.packed_decode(**bad, config=cfg, backend=backend)
            print(f"{mode:>6} mode: bad shape NOT rejected during capture")
            failures += 1
        except kc.ShapeError:
            print(f"{mode:>6} mode: bad shape rejected during capture (ShapeError)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
