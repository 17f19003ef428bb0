"""GPU tuning scratch for ``kda_kernels.triton_decode`` (``benchmarks/decode.py --candidates`` times
launch shapes side by side with the peers; this script keeps its wider correctness matrix).

On a CUDA machine, in the repository root::

    python benchmarks/triton_tune.py --sweep --out OUTDIR    # correctness + config sweep + fla
    python benchmarks/triton_tune.py --out OUTDIR            # correctness + picked configs + fla

It checks the kernel against ``kda_kernels.reference`` on the GPU (both gates, both layouts,
GVA, three state dtypes, int32/int64 indices, padding, out-of-range indices with the counter, a
strided pool whose other bytes must stay bit-identical), measures a device-to-device copy, then
times calls as CUDA-graph replays of 20 calls with a different random index set per call over a
pool of 8*B (at least 2048) slots, so the state is not L2-resident. Effective bandwidth counts
``2*B*HV*V*K*state_bytes`` plus the activations.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def import_kernels():
    try:
        import kda_kernels  # noqa: F401
    except ImportError:  # not installed (a bare GPU machine): load the folder under its name
        spec = importlib.util.spec_from_file_location(
            "kda_kernels", ROOT / "kernels" / "__init__.py", submodule_search_locations=[str(ROOT / "kernels")]
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["kda_kernels"] = mod
        spec.loader.exec_module(mod)
    from kda_kernels import reference, triton_decode

    return triton_decode, reference


td, ref = import_kernels()
DecodeConfig = td.DecodeConfig
DEV = "cpu" if "--dry" in sys.argv else "cuda"  # --dry: CPU + TRITON_INTERPRET smoke test of this script
K = V = 128
ACT = torch.bfloat16


def make_inputs(B: int, H: int, HV: int, act: torch.dtype = ACT, seed: int = 0) -> dict:
    g = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    return dict(
        mixed_qkv=r(B, 2 * H * K + HV * V).to(act),
        a=r(B, HV * K).to(act),
        b=r(B, HV).to(act),
        A_log=(1 + 15 * torch.rand(HV, device=DEV, generator=g)).log(),
        dt_bias=0.5 * r(HV * K),
        scale=K**-0.5,
    )


def call(fn, inp: dict, state, out, idx, H, **kw) -> None:
    fn(
        inp["mixed_qkv"],
        inp["a"],
        inp["b"],
        inp["A_log"],
        inp["dt_bias"],
        inp["scale"],
        state,
        out,
        idx,
        num_heads=H,
        use_qk_l2norm=kw.pop("l2", True),
        lower_bound=kw.pop("lb", None),
        **kw,
    )


TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-3, 2**-7), torch.float16: (5e-4, 2**-10)}


def close(x, y) -> tuple[bool, float]:
    atol, rtol = TOL[y.dtype]
    err = (x.float() - y.float()).abs()
    ok = bool((err <= atol + rtol * y.float().abs()).all())
    return ok, float(err.max()) if err.numel() else 0.0


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


# --- correctness ---------------------------------------------------------------------------------


def check_case(
    name: str,
    *,
    B=6,
    H=2,
    HV=4,
    N=40,
    sdt=torch.float32,
    act=ACT,
    layout="VK",
    lb=None,
    l2=True,
    idx_list=None,
    idx_dtype=torch.int64,
    config=None,
    counter=True,
) -> bool:
    if idx_list is None:
        idx_list = torch.randperm(N)[:B].tolist()
    B = len(idx_list)
    inp = make_inputs(B, H, HV, act, seed=B * 7 + HV)
    inner = (V, K) if layout == "VK" else (K, V)
    big = torch.randn(N, 2, HV, *inner, device=DEV).to(sdt)  # pool = big[:, 0]: stride(0) = 2 slots
    pool = big[:, 0]
    idx = torch.tensor(idx_list, dtype=idx_dtype, device=DEV)
    before = big.clone()
    s_ref = pool.clone()
    o_ref = torch.empty(B, 1, HV, V, dtype=act, device=DEV)
    call(ref.packed_decode, inp, s_ref, o_ref, idx, H, lb=lb, l2=l2, state_layout=layout)
    o = torch.full_like(o_ref, float("nan"))
    ctr = torch.zeros(1, dtype=torch.int32, device=DEV)
    call(
        td.packed_decode,
        inp,
        pool,
        o,
        idx,
        H,
        lb=lb,
        l2=l2,
        state_layout=layout,
        oob_counter=ctr if counter else None,
        config=config,
    )
    sync()
    ok_o, e_o = close(o, o_ref)
    valid = sorted({s for s in idx_list if 0 <= s < N})
    ok_s, e_s = close(pool[valid], s_ref[valid])
    keep = torch.ones(N, 2, dtype=torch.bool, device=DEV)
    keep[valid, 0] = False
    bits = {4: torch.int32, 2: torch.int16}[big.element_size()]
    untouched = bool((big.view(bits)[keep] == before.view(bits)[keep]).all())
    n_oob = sum(1 for s in idx_list if s >= N)
    ok_c = int(ctr.item()) == n_oob or not counter
    ok = ok_o and ok_s and untouched and ok_c
    log(
        f"check {name:38s} out_err={e_o:.2e} state_err={e_s:.2e} untouched={untouched} "
        f"oob={int(ctr.item())}/{n_oob} {'OK' if ok else 'FAIL'}"
    )
    return ok


def correctness(configs: list) -> bool:
    ok = True
    for layout in ("VK", "KV"):
        for lb in (None, -5.0):
            ok &= check_case(f"{layout} lb={lb} gva", layout=layout, lb=lb)
    ok &= check_case("no l2norm mha", H=4, HV=4, l2=False)
    for sdt in (torch.bfloat16, torch.float16):
        ok &= check_case(f"state {sdt}", sdt=sdt)
    ok &= check_case("act fp32 state fp32", act=torch.float32)
    ok &= check_case("act fp16 state fp16", act=torch.float16, sdt=torch.float16)
    for idt in (torch.int32, torch.int64):
        ok &= check_case(f"pad+oob {idt}", idx_list=[3, -1, 40, 7, 2**31 - 1, -5, 0], idx_dtype=idt)
    ok &= check_case("KV pad+oob bf16", layout="KV", sdt=torch.bfloat16, idx_list=[41, 5, -1, 9])
    if DEV == "cuda":
        ok &= check_case("B=64 H=HV=32 picked config", B=64, H=32, HV=32, N=128)
    for cfg in configs:
        ok &= check_case(f"cfg {tuple(cfg)}", B=3, H=2, HV=2, N=16, config=cfg, counter=False)
    return ok


# --- diagnostic: the same tiling with no math (load a tile of a slot, scale it, store it) ---------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _tile_copy_kernel(state, indices, stride_state, HV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    NG: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_b = (pid // (HV * NG)).to(tl.int64)
    i_hv = (pid // NG) % HV
    o_v = (pid % NG) * BV + tl.arange(0, BV)
    o_k = tl.arange(0, K)
    slot = tl.load(indices + i_b).to(tl.int64)
    p = state + slot * stride_state + i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    x = tl.load(p, eviction_policy="evict_first").to(tl.float32)
    tl.store(p, (x * 0.999).to(state.dtype.element_ty), eviction_policy="evict_first")


def time_tile_copy(B: int, H: int, sdt: torch.dtype, bv: int, warps: int) -> float:
    st = pool(H, sdt)
    calls = [
        (
            lambda idx=idx: _tile_copy_kernel[(B * H * (V // bv),)](
                st, idx, st.stride(0), H, K=K, V=V, BV=bv, num_warps=warps
            )
        )
        for idx in index_sets(B, st.shape[0])
    ]
    return time_graph(calls)


# --- timing --------------------------------------------------------------------------------------


def time_graph(calls: list, reps: int = 7) -> float:
    """Median µs per call over graph replays of ``calls`` (captured once)."""
    if DEV == "cpu":  # --dry: run each call once, no timing
        for c in calls:
            c()
        return 1.0
    calls[0]()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del graph
    return statistics.median(ts)


def copy_bandwidth() -> float:
    src = torch.empty(2**29, dtype=torch.float32, device=DEV).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3)
    bw = 2 * src.numel() * 4 / statistics.median(ts) / 1e12
    del src, dst
    return bw


_POOLS: dict = {}


def pool(H: int, sdt: torch.dtype, N: int = 2048) -> torch.Tensor:
    N = 16 if DEV == "cpu" else N
    key = (H, sdt)
    if key not in _POOLS:
        _POOLS[key] = (0.1 * torch.randn(N, H, V, K, device=DEV)).to(sdt)
    return _POOLS[key]


def regime_bytes(B: int, H: int, HV: int, sdt: torch.dtype) -> int:
    act = 2
    return 2 * B * HV * V * K * sdt.itemsize + B * (2 * H * K + HV * V + HV * K + HV) * act + B * HV * V * act


def index_sets(B: int, N: int, n: int = 20) -> list:
    n = 2 if DEV == "cpu" else n
    g = torch.Generator().manual_seed(B)
    return [torch.randperm(N, generator=g)[:B].to(torch.int32).to(DEV) for _ in range(n)]


def time_ours(B: int, H: int, sdt: torch.dtype, config) -> float:
    HV = H
    st = pool(H, sdt)
    inp = make_inputs(B, H, HV)
    out = torch.empty(B, 1, HV, V, dtype=ACT, device=DEV)
    calls = [
        (lambda idx=idx: call(td.packed_decode, inp, st, out, idx, H, config=config))
        for idx in index_sets(B, st.shape[0])
    ]
    return time_graph(calls)


def fla_fn():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as exc:
        log(f"fla not available: {exc!r}")
        return None
    return fused_recurrent_kda_fwd


def fla_call(fwd, inp: dict, st, out, idx, H: int, HV: int, v_first: bool) -> None:
    B = idx.shape[0]
    fwd(
        q=inp["q"],
        k=inp["k"],
        v=inp["v"],
        g=inp["g"],
        beta=inp["beta"],
        A_log=inp["A_log"],
        dt_bias=inp["dt_bias"],
        initial_state=st,
        scale=inp["scale"],
        output_final_state=False,
        inplace_final_state=True,
        state_v_first=v_first,
        ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
        out=out,
    )
    del B


def fla_inputs(inp: dict, B: int, H: int, HV: int) -> dict:
    x = inp["mixed_qkv"]
    d = dict(inp)
    d["q"] = x[:, : H * K].reshape(B, 1, H, K).contiguous()
    d["k"] = x[:, H * K : 2 * H * K].reshape(B, 1, H, K).contiguous()
    d["v"] = x[:, 2 * H * K :].reshape(B, 1, HV, V).contiguous()
    d["g"] = inp["a"].reshape(B, 1, HV, K).contiguous()
    d["beta"] = inp["b"].reshape(B, 1, HV).contiguous()
    return d


def check_fla(fwd) -> None:
    B, H, HV, N = 4, 2, 4, 16
    inp = make_inputs(B, H, HV)
    st = torch.randn(N, HV, V, K, device=DEV)
    idx = torch.randperm(N)[:B].to(DEV)
    s1, s2 = st.clone(), st.clone()
    o1 = torch.empty(B, 1, HV, V, dtype=ACT, device=DEV)
    o2 = torch.empty_like(o1)
    call(td.packed_decode, inp, s1, o1, idx, H)
    fla_call(fwd, fla_inputs(inp, B, H, HV), s2, o2, idx, H, HV, v_first=True)
    sync()
    log(f"fla(VK) vs ours: out_err={(o1.float() - o2.float()).abs().max():.2e} state_err={(s1 - s2).abs().max():.2e}")


def time_fla(fwd, B: int, H: int, sdt: torch.dtype, v_first: bool) -> float:
    HV = H
    st = pool(H, sdt)
    inp = fla_inputs(make_inputs(B, H, HV), B, H, HV)
    out = torch.empty(B, 1, HV, V, dtype=ACT, device=DEV)
    calls = [(lambda idx=idx: fla_call(fwd, inp, st, out, idx, H, HV, v_first)) for idx in index_sets(B, st.shape[0])]
    return time_graph(calls)


SWEEP = [
    DecodeConfig(4, 1),
    DecodeConfig(8, 1),
    DecodeConfig(16, 1),
    DecodeConfig(32, 2),
    DecodeConfig(4, 1, 4, 3),
    DecodeConfig(8, 1, 2, 2),
    DecodeConfig(8, 1, 4, 3),
    DecodeConfig(16, 1, 2, 2),
]
REGIMES = [(B, H) for H in (32, 16) for B in (1, 8, 64, 256)]
DTYPES = [torch.float32, torch.bfloat16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="time every SWEEP config, not just the picked one")
    p.add_argument("--out", default=".", help="folder for tune.json")
    p.add_argument("--dry", action="store_true", help="CPU smoke test of this script (TRITON_INTERPRET=1)")
    args = p.parse_args()
    import triton

    global REGIMES, SWEEP
    if args.dry:
        REGIMES, SWEEP = [(1, 2), (3, 1)], SWEEP[:3] + SWEEP[11:13]
    else:
        props = torch.cuda.get_device_properties(0)
        log(
            f"{props.name} SMs={props.multi_processor_count} L2={props.L2_cache_size >> 20} MiB "
            f"torch={torch.__version__} triton={triton.__version__}"
        )
    configs = SWEEP if args.sweep else []
    ok = correctness(configs)
    log(f"correctness: {'ALL OK' if ok else 'FAILURES'}")
    bw = copy_bandwidth() if not args.dry else 0.0
    log(f"device-to-device copy: {bw:.3f} TB/s (read+write)")
    if args.sweep and not args.dry:
        for sdt in DTYPES:
            nb = regime_bytes(256, 32, 32, sdt)
            for bv, w in ((4, 1), (8, 1), (16, 1), (32, 2), (32, 4)):
                us = time_tile_copy(256, 32, sdt, bv, w)
                log(
                    f"tile-copy diag {str(sdt)[6:]:8s} B=256 H=32 BV={bv:2d} w{w}: {us:8.2f} us "
                    f"{nb / (us * 1e-6) / 1e12:.2f} TB/s"
                )
    fwd = fla_fn()
    if fwd is not None:
        try:
            check_fla(fwd)
        except Exception as exc:
            log(f"fla check failed: {exc!r}")
            fwd = None

    results = []
    for sdt in DTYPES:
        for B, H in REGIMES:
            nbytes = regime_bytes(B, H, H, sdt)
            picked = td.pick_config(B, H, V, sdt)
            row: dict = dict(B=B, H=H, dtype=str(sdt).removeprefix("torch."), MB=nbytes / 1e6, picked=list(picked))
            row["picked_us"] = time_ours(B, H, sdt, None)
            if args.sweep:
                row["sweep"] = {}
                for cfg in SWEEP:
                    row["sweep"][str(tuple(cfg))] = time_ours(B, H, sdt, cfg)
            if fwd is not None:
                for vf in (False, True):
                    try:
                        row[f"fla_{'VK' if vf else 'KV'}_us"] = time_fla(fwd, B, H, sdt, vf)
                    except Exception as exc:
                        log(f"fla timing failed: {exc!r}")
            results.append(row)
            tb = lambda us, nbytes=nbytes: nbytes / (us * 1e-6) / 1e12  # noqa: E731
            line = (
                f"{row['dtype']:8s} B={B:3d} H={H:2d} picked{tuple(picked)}: {row['picked_us']:8.2f} us "
                f"{tb(row['picked_us']):5.2f} TB/s"
            )
            for key in ("fla_KV_us", "fla_VK_us"):
                if key in row:
                    line += f" | {key[:6]} {row[key]:8.2f} us ({row[key] / row['picked_us']:.2f}x)"
            log(line)
            if args.sweep:
                best = sorted(row["sweep"].items(), key=lambda kv: kv[1])[:2]
                log("    best: " + ", ".join(f"{k}={v:.2f}us/{tb(v):.2f}TB/s" for k, v in best))
    if args.sweep:
        for sdt in DTYPES:
            name = str(sdt).removeprefix("torch.")
            rows = [r for r in results if r["dtype"] == name]
            log(f"sweep {name}, us per call; columns " + " ".join(f"B{r['B']}H{r['H']}" for r in rows))
            for cfg in SWEEP:
                key = str(tuple(cfg))
                cells = []
                for r in rows:
                    fastest = min(r["sweep"].values())
                    cells.append(f"{r['sweep'][key]:8.2f}{'*' if r['sweep'][key] <= fastest * 1.02 else ' '}")
                print(
                    f"  {cfg.block_v:3d} w{cfg.num_warps} t{cfg.tiles} s{cfg.num_stages} "
                    f"{cfg.state_eviction[:6]:6s} " + "".join(cells),
                    flush=True,
                )
    with open(Path(args.out) / "tune.json", "w") as f:
        json.dump(dict(copy_TBps=bw, correctness_ok=ok, results=results), f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
