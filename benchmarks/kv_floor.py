"""Where the KV layout's time goes at small batches, against VK. A stripped KDA decode kernel (the flat
grid and one ``[BV, K]`` state tile per program, as ours; no guards, hints or options) is timed for
both layouts in four modes, next to our ``auto`` pick of each layout:

- ``serial``: the output summed from the updated tile (as ours, ``fused_output`` off);
- ``fused``: the output from the decayed tile, ``h q + u (k . q)``: both sums side by side;
- ``bare``: the tile loaded, decayed and stored, no sums (the memory pattern alone);
- ``sums``: both sums over K, nothing stored.

If ``bare`` is level between the layouts and ``sums`` is not, the KV gap is in the sums over K (the
strided axis of a KV tile), not in its memory traffic. ``--ir`` (no GPU needed) compiles the kernel
for sm_90 and counts what those sums cost in each layout: layout conversions, barriers, shuffles.

    python benchmarks/kv_floor.py --json OUT.json       # ~3 minutes on an H200 (compiles ~190 kernels)
    python benchmarks/kv_floor.py --ir                  # anywhere with triton (CPU included)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode as D

MODES = ("serial", "fused", "bare", "sums")


@triton.jit
def stripped_decode(state, stride_state, idx, qkv, stride_qkv, a, stride_a, dt_bias, A_log, b, stride_b, out, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                    KV: tl.constexpr, MODE: tl.constexpr):
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_b = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    slot = tl.load(idx + i_b).to(tl.int64)
    row = qkv + i_b * stride_qkv
    b_q = tl.load(row + i_h * K + o_k).to(tl.float32)
    b_k = tl.load(row + (H + i_h) * K + o_k).to(tl.float32)
    b_x = tl.load(a + i_b * stride_a + i_hv * K + o_k).to(tl.float32) + tl.load(dt_bias + i_hv * K + o_k)
    b_A = tl.exp(tl.load(A_log + i_hv))
    b_beta = tl.sigmoid(tl.load(b + i_b * stride_b + i_hv).to(tl.float32))
    b_v = tl.load(row + 2 * H * K + i_hv * V + o_v).to(tl.float32)
    if slot >= 0:
        base = state + slot * stride_state + i_hv * (V * K)
        if KV:
            p_s = base + o_k[None, :] * V + o_v[:, None]
        else:
            p_s = base + o_v[:, None] * K + o_k[None, :]
        b_s = tl.load(p_s, eviction_policy="evict_first")
        b_g = -b_A * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
        b_q = b_q * (scale / tl.sqrt(tl.sum(b_q * b_q) + 1e-6))
        b_k = b_k * (1.0 / tl.sqrt(tl.sum(b_k * b_k) + 1e-6))
        b_d = tl.exp(b_g)
        h = b_s.to(tl.float32) * b_d[None, :]
        if MODE == 0:
            u = b_beta * (b_v - tl.sum(h * b_k[None, :], axis=1))
            h = h + u[:, None] * b_k[None, :]
            o = tl.sum(h * b_q[None, :], axis=1)
            tl.store(p_s, h.to(state.dtype.element_ty), eviction_policy="evict_first")
        elif MODE == 1:
            hk = tl.sum(h * b_k[None, :], axis=1)
            hq = tl.sum(h * b_q[None, :], axis=1)
            u = b_beta * (b_v - hk)
            o = hq + u * tl.sum(b_k * b_q)
            h = h + u[:, None] * b_k[None, :]
            tl.store(p_s, h.to(state.dtype.element_ty), eviction_policy="evict_first")
        elif MODE == 2:
            o = b_v
            tl.store(p_s, h.to(state.dtype.element_ty), eviction_policy="evict_first")
        else:
            o = tl.sum(h * b_k[None, :], axis=1) + tl.sum(h * b_q[None, :], axis=1)
        tl.store(out + (i_b * HV + i_hv) * V + o_v, o.to(out.dtype.element_ty))


def binder(mode: int, bv: int, warps: int) -> D.Binder:
    def bind(x: dict[str, Any]) -> D.Launch:
        HV = x["state"].shape[1]
        grid = (x["mixed_qkv"].shape[0] * HV * (D.V // bv),)
        st, qkv = x["state"], x["mixed_qkv"]

        def launch(indices: torch.Tensor) -> None:
            stripped_decode[grid](st, st.stride(0), indices, qkv, qkv.stride(0), x["a"], x["a"].stride(0),
                                  x["dt_bias"], x["A_log"], x["b"], x["b"].stride(0), x["out"], x["scale"],
                                  x["H"], HV, D.K, D.V, bv, x["layout"] == "KV", mode, num_warps=warps)
        return launch
    return bind


def ir_counts(layout: str, bv: int, warps: int, state: str) -> dict[str, int]:
    """Compile the ``serial`` kernel for sm_90 (no GPU needed) and count what its sums cost."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"state": f"*{state}", "stride_state": "i64", "idx": "*i32", "qkv": "*bf16", "stride_qkv": "i32",
           "a": "*bf16", "stride_a": "i32", "dt_bias": "*fp32", "A_log": "*fp32", "b": "*bf16", "stride_b": "i32",
           "out": "*bf16", "scale": "fp32"}
    consts = {"H": 32, "HV": 32, "K": 128, "V": 128, "BV": bv, "KV": layout == "KV", "MODE": 0}
    sig.update(dict.fromkeys(consts, "constexpr"))
    # pointers 16-byte aligned and strides multiples of 16, as Triton specializes them at a real launch
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t.startswith("*") or n.startswith("stride")}
    c = triton.compile(ASTSource(stripped_decode, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps})
    ttgir, ptx = c.asm["ttgir"], c.asm["ptx"]
    return {"layout conversions": ttgir.count("ttg.convert_layout"), "bar.sync": ptx.count("bar.sync"),
            "shfl": len(re.findall(r"\bshfl", ptx)), "st.shared": len(re.findall(r"\bst\.shared", ptx))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", default="32,4")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--states", default="bfloat16,float32")
    p.add_argument("--json", help="write every row's times (µs) here")
    p.add_argument("--ir", action="store_true", help="count conversions, barriers and shuffles of the compiled "
                   "sums for each layout (sm_90, no GPU needed) and exit")
    args = p.parse_args(argv)
    if args.ir:
        os.environ.pop("TRITON_INTERPRET", None)
        for state, (layout, bv), warps in itertools.product(("bf16", "fp32"), (("VK", 8), ("KV", 16), ("KV", 32)),
                                                            (1, 2)):
            print(f"{state} {layout} {bv} columns/rows, {warps} warp(s): {ir_counts(layout, bv, warps, state)}")
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/kv_floor.py needs a CUDA device (or --ir)", file=sys.stderr)
        return 2
    from kda_kernels import triton_decode
    from kda_kernels.triton_configs import pick_config

    D.OP = D.OPS["kda"]()
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    print(f"# copy {D.copy_bandwidth(dev, warm_s=2.0):.2f} TB/s", flush=True)
    res = []
    for name, H, B in itertools.product(args.states.split(","), map(int, args.heads.split(",")),
                                        map(int, args.batches.split(","))):
        sdt = getattr(torch, name)
        times: dict[tuple[str, str, str], Any] = {}
        for layout in ("VK", "KV"):
            pc = pick_config(B, H, D.V, sdt, layout)
            bvs = sorted({32 if pc.kv_chunk else pc.block_v, 8 if layout == "VK" else 16, 16 if layout == "VK" else 32})
            binders = {"ours": D.our_binder(triton_decode.packed_decode)}
            for bv, warps in itertools.product(bvs, (1, 2)):
                for m, mode in enumerate(MODES):
                    binders[f"{mode}-bv{bv}-w{warps}"] = binder(m, bv, warps)
            checked = {n: b for n, b in binders.items() if not n.startswith(("bare", "sums"))}
            bad = [n for n, c in D.check(checked, H, sdt, B, layout, dev).items() if not c[2]]
            if bad:
                print(f"# {layout}: wrong against the reference: {bad}", flush=True)
            for (variant, n), us in D.time_row(binders, H, sdt, B, layout, dev, l2).items():
                times[(variant, layout, n)] = us
        for variant in ("hot", "cold"):
            line = (f"{name[:4]} H={H} B={B} {variant}: VK ours {times[(variant, 'VK', 'ours')]:.2f} "
                    f"KV ours {times[(variant, 'KV', 'ours')]:.2f} |")
            for layout in ("VK", "KV"):
                best: dict[str, tuple[float, str]] = {}
                for (v, lay, n), us in times.items():
                    if v == variant and lay == layout and n != "ours" and isinstance(us, float):
                        mode = n.split("-")[0]
                        if mode not in best or us < best[mode][0]:
                            best[mode] = (us, n[len(mode) + 1:])
                line += f" {layout}: " + " ".join(f"{m} {u:.2f} ({s})" for m, (u, s) in best.items())
            print(line, flush=True)
            res.append({"variant": variant, "H": H, "B": B, "state": name,
                        **{f"{lay}:{n}": us for (v, lay, n), us in times.items() if v == variant}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
