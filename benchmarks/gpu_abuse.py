"""Kernels under abuse on a GPU: out-of-range, duplicate and padding indices and empty batches
never touch a byte of the pool outside the valid slots, and every backend agrees with the
reference on valid calls. (The CPU interpreter runs the same checks in
tests/test_kernels_under_abuse.py; this is the once-on-the-device run.) Then every Triton launch
shape ``pick_config`` can choose (``--all-configs``: also benchmarks/decode.py's tuning candidates)
goes through the same abuse at Kimi-Linear head dims (K = V = 128), both layouts, fp32 and bf16
state, with fp32 activations so the output is held to 1e-4 and an fp32 state to 1e-5.

``--op gdn`` does the same for the GDN kernels (``kda_kernels.{triton,helion,fla}_decode
.gdn_packed_decode``, each reported and skipped when it does not load) against
``kda_kernels.gdn_reference``: both layouts, fp32/bf16/fp16 state, int32 and int64 indices,
padding and out-of-range indices, no duplicate slots (so every call is compared with the
reference), HV = H, 2H (Qwen3-Next) and 4H, and a canary slot before and after the pool as well as
between its slots, all bit-identical afterwards.

    python benchmarks/gpu_abuse.py [--op kda|gdn] [--all-configs] [--jobs 14]
    TRITON_INTERPRET=1 python benchmarks/gpu_abuse.py --op gdn --device cpu --trials 12   # the logic, on a CPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEVICE = "cuda"  # --device
# Activations of the abuse trials: bf16 on the GPU; fp32 on the CPU, where the Triton interpreter
# truncates fp32 -> bf16 (the GPU rounds) and so moves GDN's rounded beta by one bf16 ulp.
ACTIVATIONS = torch.bfloat16
ORDER = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices")


def run(kernel, call, layout):
    kernel(*[call[k] for k in ORDER], num_heads=call["_H"], use_qk_l2norm=call["use_qk_l2norm_in_kernel"],
           lower_bound=call.get("lower_bound"), state_layout=layout)
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def case(cfg, B, N, idx, layout, sdt, g, act=None, gdn=False, index_dtype=torch.int32):
    """A call on a pool that is every other slot of a bigger buffer, from slot 1 on: bytes between the
    slots and a canary slot before and after the pool exist. Returns (call, buffer); pool slot i is
    buffer slot 2i+1."""
    seed = int(torch.randint(1 << 30, (1,), generator=g))
    act = act or ACTIVATIONS
    call = make_decode_call(cfg, B, N, activation_dtype=act, state_dtype=sdt, device=DEVICE, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    if gdn:  # GDN's gate: one per value head
        HV = cfg.local_num_v_heads
        call["a"] = torch.randn(B, HV, generator=gen).to(device=DEVICE, dtype=act)
        call["dt_bias"] = torch.randn(HV, generator=gen).to(DEVICE)
        del call["lower_bound"]
    big = torch.randn(2 * N + 2, *call["initial_state"].shape[1:], generator=gen).to(device=DEVICE, dtype=sdt)
    call["initial_state"] = big[1 : 2 * N + 1 : 2]
    call["ssm_state_indices"] = torch.tensor(idx, dtype=index_dtype, device=DEVICE)
    call["_H"] = cfg.local_num_heads
    return call, big


def untouched(big, before, valid) -> bool:
    """Every byte of the buffer but the valid slots' is as it was."""
    keep = torch.ones(big.shape[0], dtype=torch.bool)
    keep[[2 * i + 1 for i in valid]] = False
    keep = keep.to(DEVICE)
    return torch.equal(big[keep].view(torch.uint8), before[keep].view(torch.uint8))


def kda_trial(trial, g):
    """(cfg, B, N, idx, layout, sdt, index dtype) of KDA trial ``trial`` (duplicates included)."""
    H = [1, 2, 4][trial % 3]
    HV = H * [1, 2][trial % 2]
    K, V = [(128, 128), (64, 128), (16, 32)][trial % 3]
    layout = "VK" if trial % 4 else "KV"
    sdt = [torch.float32, torch.bfloat16, torch.float16][trial % 3]
    cfg = kc.KDAConfig(num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, state_layout=layout)
    N = 6
    B = [0, 1, 4, 8][trial % 4]
    pool = [-1, -7, N, N + 3, 2**31 - 1, *range(N)]
    idx = [pool[int(i)] for i in torch.randint(len(pool), (B,), generator=g)]
    return cfg, B, N, idx, layout, sdt, torch.int32


def gdn_trial(trial, g):
    """(cfg, B, N, idx, layout, sdt, index dtype) of GDN trial ``trial``: padding and out-of-range
    indices, valid slots without duplicates."""
    H = [1, 2, 4][trial % 3]
    HV = H * [2, 1, 2, 4][trial % 4]
    K, V = [(128, 128), (64, 128), (16, 32)][(trial // 2) % 3]
    layout = "VK" if trial % 2 else "KV"
    sdt = [torch.float32, torch.bfloat16, torch.float16][trial % 3]
    index_dtype = torch.int64 if trial % 5 in (1, 3) else torch.int32
    cfg = kc.GDNConfig(num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, state_layout=layout)
    N = 8
    B = [0, 1, 4, 8][trial % 4]
    slots = torch.randperm(N, generator=g).tolist()
    big = 2**63 - 1 if index_dtype == torch.int64 else 2**31 - 1
    bad = [-1, -7, N, N + 3, big]
    idx = [slots.pop() if int(torch.randint(3, (1,), generator=g)) else bad[int(torch.randint(5, (1,), generator=g))]
           for _ in range(B)]
    return cfg, B, N, idx, layout, sdt, index_dtype


def abuse(kernels, reference, gdn, g, trials, share=0, jobs=1) -> int:
    """Every kernel on ``trials`` abusive calls (of those, trials ``share``, ``share + jobs``, ...);
    returns the number of failures."""
    failures, checked = 0, {n: 0 for n in kernels}
    for trial in range(share, trials, jobs):
        cfg, B, N, idx, layout, sdt, index_dtype = (gdn_trial if gdn else kda_trial)(trial, g)
        valid = sorted({i for i in idx if 0 <= i < N})
        duplicated = len([i for i in idx if 0 <= i < N]) != len(valid)

        def make(trial=trial, args=(cfg, B, N, idx, layout, sdt), index_dtype=index_dtype):
            return case(*args, torch.Generator().manual_seed(trial), gdn=gdn, index_dtype=index_dtype)

        for name, kern in kernels.items():
            call, big = make()
            before = big.clone()
            same = zero = ok = False
            try:
                run(kern, call, layout)
                same = untouched(big, before, valid)
                pad_rows = [r for r, i in enumerate(idx) if not 0 <= i < N]
                zero = all(bool((call["out"][r] == 0).all()) for r in pad_rows)
                ok = same and zero
                if not duplicated and name != "torch":
                    ref, ref_big = make()
                    run(reference, ref, layout)
                    tol = 1e-4 if sdt == torch.float32 else 2e-2  # the state's dtype
                    # out is bf16 (make_decode_call's activations): one bf16 ulp of rounding either way
                    ok = ok and torch.allclose(call["out"].float(), ref["out"].float(), atol=1e-2, rtol=1e-2) and \
                        torch.allclose(big.float(), ref_big.float(), atol=tol, rtol=tol)
                error = ""
            except Exception as exc:  # one backend's crash is a failure, not the end of the run
                ok, error = False, f" raised {type(exc).__name__}: {str(exc)[:100]}"
            checked[name] += 1
            if not ok:
                failures += 1
                print(f"FAIL {name} trial {trial}: H={cfg.num_heads} HV={cfg.num_v_heads} K={cfg.head_k_dim} "
                      f"V={cfg.head_v_dim} {layout} {sdt} {index_dtype} idx={idx} untouched={same} "
                      f"padding-zero={zero}{error}")
    print("cases per backend:", checked, "failures:", failures)
    return failures


def backends(op):
    """(kernels by name, the reference) for ``op``; GDN kernels that do not load are reported."""
    if op == "kda":
        from kda_kernels import reference  # the interface's reference (the "torch" adapter loads the op's body)

        kernels = {n: kc.adapters.get(n).load() for n, (ok, _) in kc.adapters.available().items() if ok}
        return {**kernels, "torch": reference.packed_decode}, reference.packed_decode
    from decode_gdn import load_ours, reference

    kernels, missing = load_ours()
    for name, why in missing.items():
        print(f"gdn backend {name}: unavailable ({why})")
    return {**kernels, "torch": reference()}, reference()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", choices=("kda", "gdn"), default="kda", help="the kernels to abuse (default: kda)")
    p.add_argument("--all-configs", action="store_true", help="also every decode.py tuning candidate")
    p.add_argument("--trials", type=int, default=60, help="abusive calls per backend (default: 60)")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to check this script under "
                   "TRITON_INTERPRET=1 (no launch-shape pass)")
    p.add_argument("--jobs", type=int, default=1, help="split the trials and the launch shapes over this many "
                   "processes (each compiles its share; the random indices differ from a one-process run)")
    args = p.parse_args(argv)
    global DEVICE, ACTIVATIONS
    DEVICE = args.device
    ACTIVATIONS = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("needs CUDA (or --device cpu)", file=sys.stderr)
        return 2
    if args.jobs > 1:
        return 1 if in_processes(args) else 0
    g = torch.Generator().manual_seed(0)
    kernels, reference = backends(args.op)
    print(f"{args.op} backends:", ", ".join(kernels))
    failures = abuse(kernels, reference, args.op == "gdn", g, args.trials)
    if DEVICE == "cuda" and (args.op == "kda" or "triton" in kernels):
        failures += check_configs(args.all_configs, reference, g, gdn=args.op == "gdn")
    return 1 if failures else 0


def _share(args, part: str, share: int) -> tuple[int, str]:
    """One process's share (``part``: "trials" or "shapes"): (failures, what it printed)."""
    import contextlib
    import io

    global DEVICE, ACTIVATIONS
    DEVICE = args.device
    ACTIVATIONS = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    g = torch.Generator().manual_seed(share)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        kernels, reference = backends(args.op)
        if part == "trials":
            failures = abuse(kernels, reference, args.op == "gdn", g, args.trials, share, args.jobs)
        elif DEVICE == "cuda" and (args.op == "kda" or "triton" in kernels):
            failures = check_configs(args.all_configs, reference, g, gdn=args.op == "gdn", share=share, jobs=args.jobs)
        else:
            failures = 0
    return failures, text.getvalue()


def in_processes(args) -> int:
    """The run split over ``args.jobs`` processes: every trial and launch shape once; the failures."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    parts = [(part, share) for part in ("trials", "shapes") for share in range(args.jobs)]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(_share, [args] * len(parts), *zip(*parts, strict=True)))
    for _, text in results:
        print(text, end="")
    failures = sum(f for f, _ in results)
    print(f"{args.op}: {args.jobs} processes, failures in all: {failures}")
    return failures


Layout = Literal["VK", "KV"]
#: name -> (DecodeConfig, layouts, state dtypes)
Configs = dict[str, tuple[object, tuple[Layout, ...], tuple[torch.dtype, ...]]]


def configs_to_check(everything: bool, gdn=False) -> Configs:
    """name -> (DecodeConfig, layouts, state dtypes) for every Triton launch shape to put through abuse
    (GDN's own table, once ``picked_configs`` takes ``gdn=``)."""
    import inspect

    from kda_kernels import triton_decode

    both = (torch.float32, torch.bfloat16)
    own = {"gdn": True} if gdn and "gdn" in inspect.signature(triton_decode.picked_configs).parameters else {}
    layouts: tuple[Layout, ...] = ("VK", "KV")
    found: Configs = {f"picked {c}": (c, layouts, both) for c in triton_decode.picked_configs(**own)}
    if everything:
        import decode
        from decode import candidate_configs

        decode.OP = decode.OPS["gdn" if gdn else "kda"]()

        for layout in layouts:
            for sdt in both:
                for batch, hv in ((64, 4), (256, 16), (1024, 32)):  # the candidates derive from the picked shape
                    for name, c in candidate_configs(layout, sdt, batch, hv).items():
                        found.setdefault(f"candidate {name} {c}", (c, (layout,), (sdt,)))
    return found


def check_configs(everything: bool, reference, g, gdn=False, share=0, jobs=1) -> int:
    """Each config (of those, configs ``share``, ``share + jobs``, ...) on K = V = 128 calls with
    padding, out-of-range and valid indices (fp32 activations: out within 1e-4, fp32 state within
    1e-5, bf16 state within 2e-3 plus one bf16 ulp)."""
    from kda_kernels import triton_decode

    kernel = triton_decode.gdn_packed_decode if gdn else triton_decode.packed_decode
    failures = checked = 0
    for name, (config, layouts, dtypes) in list(configs_to_check(everything, gdn).items())[share::jobs]:
        for layout in layouts:
            for sdt in dtypes:
                for H, HV in ((2, 2), (1, 4)):
                    cfg = (kc.GDNConfig if gdn else kc.KDAConfig)(num_heads=H, num_v_heads=HV, head_k_dim=128,
                                                                  head_v_dim=128, state_layout=layout)
                    N, idx = 6, [3, -1, 6, 0, 2**31 - 1, 5, -9, 1]
                    kern = lambda *a, config=config, **k: kernel(*a, **k, config=config)  # noqa
                    call, big = case(cfg, len(idx), N, idx, layout, sdt, g, act=torch.float32, gdn=gdn)
                    ref, ref_big = case(cfg, len(idx), N, idx, layout, sdt, torch.Generator().manual_seed(0),
                                        act=torch.float32, gdn=gdn)
                    # the same inputs for both: copy the call's tensors over the reference's
                    for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias"):
                        ref[k] = call[k]
                    ref_big.copy_(big)
                    before = big.clone()
                    run(kern, call, layout)
                    run(reference, ref, layout)
                    same = untouched(big, before, (3, 0, 5, 1))
                    zero = all(bool((call["out"][r] == 0).all()) for r in (1, 2, 4, 6))
                    st_tol = (1e-5, 1e-5) if sdt == torch.float32 else (2e-3, 2**-7)
                    ok = same and zero and torch.allclose(call["out"], ref["out"], atol=1e-4, rtol=1e-4) and \
                        torch.allclose(big.float(), ref_big.float(), atol=st_tol[0], rtol=st_tol[1])
                    checked += 1
                    if not ok:
                        failures += 1
                        print(f"FAIL {name} {layout} {sdt} H={H} HV={HV}: untouched={same} padding-zero={zero}")
    print(f"{'gdn ' if gdn else ''}triton launch shapes: {checked} cases, failures: {failures}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
