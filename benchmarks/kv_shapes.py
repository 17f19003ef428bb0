"""KV-layout launch shapes at small batches, side by side: every Triton launch shape we have for the
KV layout (16-64 columns on 1, 2 or 4 warps, with and without the masked guard and cache hints; the
chunked tile; the shared-memory tile at 16-128 columns in 16- or 32-row chunks), each checked against
the reference and timed hot and cold (CUDA-graph replay, as ``benchmarks/decode.py``), against our
VK pick. Prints, per row, ``auto``'s KV pick and the six fastest shapes, with KV / VK. It asks whether a
different launch of the kernels we have closes the KV / VK gap where ``auto`` trails (small B).

    python benchmarks/kv_shapes.py --states bfloat16 --json OUT.json   # ~8 minutes on an H200 (compiles)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode as D


def shapes(sdt: torch.dtype, batch: int, num_v_heads: int, device: torch.device) -> dict[str, Any]:
    """Name -> DecodeConfig, duplicates of an earlier one left out (``pick``: auto's)."""
    from kda_kernels import triton_kv_shared
    from kda_kernels.triton_decode import DecodeConfig as DC
    from kda_kernels.triton_decode import pick_config

    out = {"pick": pick_config(batch, num_v_heads, D.V, sdt, "KV")}
    for bv, w in itertools.product((8, 16, 32, 64), (1, 2, 4)):
        out[f"bv{bv}-w{w}"] = DC(bv, w)
        if batch * num_v_heads <= 256:
            out[f"bv{bv}-w{w}-m"] = DC(bv, w, guard="mask")
    out.update({"bv16-w1-noev": DC(16, 1, state_eviction=""), "bv32-w1-noev": DC(32, 1, state_eviction=""),
                "bv32-w1-ka": DC(32, 1, act_eviction="evict_last"), "bv16-w1-ka": DC(16, 1, act_eviction="evict_last"),
                "ck-fe0": DC(64 if sdt.itemsize == 4 else 128, 1, kv_chunk=32, kv_first_eviction=""),
                "ck16-bv64": DC(64, 1, kv_chunk=16, kv_first_eviction=""),
                "ck16-bv32": DC(32, 1, kv_chunk=16, kv_first_eviction="")})
    for bv, w, ck in itertools.product((16, 32, 64, 128), (1, 2, 4), (16, 32)):
        if triton_kv_shared.unsupported(D.K, D.V, sdt, bv, w, ck, device) is None:
            out[f"sh{bv}-w{w}-c{ck}"] = DC(bv, w, kv_chunk=ck, kv_shared=True, state_eviction="")
    seen: dict[Any, str] = {}
    return {name: cfg for name, cfg in out.items() if seen.setdefault(cfg, name) == name}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", default="32,16,4")
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--states", default="bfloat16,float32")
    p.add_argument("--json", help="write every row's times (µs) here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kv_shapes.py needs a CUDA device", file=sys.stderr)
        return 2
    from kda_kernels import triton_decode

    D.OP = D.OPS["kda"]()
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    copy = D.copy_bandwidth(dev, warm_s=2.0)
    print(f"# copy {copy:.2f} TB/s", flush=True)
    rows = []
    for name, H, B in itertools.product(args.states.split(","), map(int, args.heads.split(",")),
                                        map(int, args.batches.split(","))):
        sdt = getattr(torch, name)
        t0 = time.time()
        cfgs = shapes(sdt, B, H, dev)
        kv = {n: D.our_binder(triton_decode.packed_decode, config=c) for n, c in cfgs.items()}
        checks = D.check(kv, H, sdt, B, "KV", dev)
        bad = {n: c for n, c in checks.items() if not c[2]}
        tkv = D.time_row({n: b for n, b in kv.items() if n not in bad}, H, sdt, B, "KV", dev, l2)
        tvk = D.time_row({"vk": D.our_binder(triton_decode.packed_decode)}, H, sdt, B, "VK", dev, l2)
        for v in ("hot", "cold"):
            vk = tvk[(v, "vk")]
            times = {n: t for n in cfgs if isinstance(t := tkv.get((v, n)), float)}
            if isinstance(vk, str):  # our VK launch could not be captured (time_row's error): no ratios
                print(f"{name[:4]} H={H} B={B} {v}: vk {vk}", flush=True)
                rows.append(dict(H=H, state=name, B=B, variant=v, vk=vk, **times))
                continue
            fastest = sorted(times, key=times.__getitem__)[:6]
            pick = times.get("pick")
            line = f"{name[:4]} H={H} B={B} {v}: vk {vk:.2f}"
            line += f" pick {pick:.2f} ({vk / pick:.3f})" if pick else " pick failed"
            print(line + " fastest: " + " ".join(f"{n} {times[n]:.2f} ({vk / times[n]:.3f})" for n in fastest),
                  flush=True)
            rows.append(dict(H=H, state=name, B=B, variant=v, vk=vk, **times))
        if bad:
            print(f"#  MISMATCH or failure: {bad}", flush=True)
        print(f"#  {len(cfgs)} shapes, {time.time() - t0:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(copy_tbps=copy, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
