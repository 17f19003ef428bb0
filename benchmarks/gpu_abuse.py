"""Kernels under abuse on a GPU: out-of-range, duplicate and padding indices and empty batches
never touch a byte of the pool outside the valid slots, and every backend agrees with the
reference on valid calls. (The CPU interpreter runs the same checks in
tests/test_kernels_under_abuse.py; this is the once-on-the-device run.) Then every Triton launch
shape ``pick_config`` can choose (``--all-configs``: also benchmarks/decode.py's tuning candidates)
goes through the same abuse at Kimi-Linear head dims (K = V = 128), both layouts, fp32 and bf16
state, with fp32 activations so the output is held to 1e-4 and an fp32 state to 1e-5.

    python benchmarks/gpu_abuse.py [--all-configs]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

ORDER = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices")


def run(kernel, call, layout):
    kernel(*[call[k] for k in ORDER], num_heads=call["_H"], use_qk_l2norm=call["use_qk_l2norm_in_kernel"],
           lower_bound=call["lower_bound"], state_layout=layout)


def case(cfg, B, N, idx, layout, sdt, g, act=torch.bfloat16):
    seed = int(torch.randint(1 << 30, (1,), generator=g))
    call = make_decode_call(cfg, B, N, activation_dtype=act, state_dtype=sdt, device="cuda", seed=seed)
    # a pool that is every other slot of a bigger buffer: bytes between slots exist
    gen = torch.Generator().manual_seed(seed)
    big = torch.randn(2 * N, *call["initial_state"].shape[1:], generator=gen).to(device="cuda", dtype=sdt)
    call["initial_state"] = big[::2]
    call["ssm_state_indices"] = torch.tensor(idx, dtype=torch.int32, device="cuda")
    call["_H"] = cfg.local_num_heads
    return call, big


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    kernels = {n: kc.adapters.get(n).load() for n, (ok, _) in kc.adapters.available().items() if ok}
    print("backends:", ", ".join(kernels))
    failures, checked = 0, {n: 0 for n in kernels}
    for trial in range(60):
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
        valid = sorted({i for i in idx if 0 <= i < N})
        duplicated = len([i for i in idx if 0 <= i < N]) != len(valid)
        for name, kern in kernels.items():
            call, big = case(cfg, B, N, idx, layout, sdt, torch.Generator().manual_seed(trial))
            before = big.clone()
            run(kern, call, layout)
            torch.cuda.synchronize()
            touched = torch.zeros(2 * N, dtype=torch.bool)
            touched[[2 * i for i in valid]] = True
            keep = ~touched.cuda()
            same = torch.equal(big[keep].view(torch.uint8), before[keep].view(torch.uint8))
            pad_rows = [r for r, i in enumerate(idx) if not 0 <= i < N]
            zero = all(bool((call["out"][r] == 0).all()) for r in pad_rows)
            ok = same and zero
            if not duplicated and name != "torch":
                ref, ref_big = case(cfg, B, N, idx, layout, sdt, torch.Generator().manual_seed(trial))
                run(kernels["torch"], ref, layout)
                tol = 1e-4 if sdt == torch.float32 else 2e-2  # the state's dtype
                # out is bf16 (make_decode_call's activations): one bf16 ulp of rounding either way
                ok = ok and torch.allclose(call["out"].float(), ref["out"].float(), atol=1e-2, rtol=1e-2) and \
                    torch.allclose(big.float(), ref_big.float(), atol=tol, rtol=tol)
            checked[name] += 1
            if not ok:
                failures += 1
                print(f"FAIL {name} trial {trial}: H={H} HV={HV} K={K} V={V} {layout} {sdt} idx={idx} "
                      f"untouched={same} padding-zero={zero}")
    print("cases per backend:", checked, "failures:", failures)
    failures += check_configs("--all-configs" in sys.argv, kernels["torch"], g)
    return 1 if failures else 0


def configs_to_check(everything: bool) -> dict[str, tuple[object, tuple[str, ...], tuple[torch.dtype, ...]]]:
    """name -> (DecodeConfig, layouts, state dtypes) for every Triton launch shape to put through abuse."""
    from kda_kernels import triton_decode

    both = (torch.float32, torch.bfloat16)
    found = {f"picked {c}": (c, ("VK", "KV"), both) for c in triton_decode.picked_configs()}
    if everything:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from decode import candidate_configs

        for layout in ("VK", "KV"):
            for sdt in both:
                for batch, hv in ((64, 4), (256, 16), (1024, 32)):  # the candidates derive from the picked shape
                    for name, c in candidate_configs(layout, sdt, batch, hv).items():
                        found.setdefault(f"candidate {name} {c}", (c, (layout,), (sdt,)))
    return found


def check_configs(everything: bool, reference, g) -> int:
    """Each config on K = V = 128 calls with padding, out-of-range and valid indices (fp32 activations:
    out within 1e-4, fp32 state within 1e-5, bf16 state within 2e-3 plus one bf16 ulp)."""
    from kda_kernels import triton_decode

    failures = checked = 0
    for name, (config, layouts, dtypes) in configs_to_check(everything).items():
        for layout in layouts:
            for sdt in dtypes:
                for H, HV in ((2, 2), (1, 4)):
                    cfg = kc.KDAConfig(num_heads=H, num_v_heads=HV, head_k_dim=128, head_v_dim=128,
                                       state_layout=layout)
                    N, idx = 6, [3, -1, 6, 0, 2**31 - 1, 5, -9, 1]
                    kern = lambda *a, config=config, **k: triton_decode.packed_decode(*a, **k, config=config)  # noqa
                    call, big = case(cfg, len(idx), N, idx, layout, sdt, g, act=torch.float32)
                    ref, ref_big = case(cfg, len(idx), N, idx, layout, sdt, torch.Generator().manual_seed(0),
                                        act=torch.float32)
                    # the same inputs for both: copy the call's tensors over the reference's
                    for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias"):
                        ref[k] = call[k]
                    ref_big.copy_(big)
                    before = big.clone()
                    run(kern, call, layout)
                    run(reference, ref, layout)
                    torch.cuda.synchronize()
                    keep = torch.ones(2 * N, dtype=torch.bool, device="cuda")
                    keep[[2 * i for i in (3, 0, 5, 1)]] = False
                    same = torch.equal(big[keep].view(torch.uint8), before[keep].view(torch.uint8))
                    zero = all(bool((call["out"][r] == 0).all()) for r in (1, 2, 4, 6))
                    st_tol = (1e-5, 1e-5) if sdt == torch.float32 else (2e-3, 2**-7)
                    ok = same and zero and torch.allclose(call["out"], ref["out"], atol=1e-4, rtol=1e-4) and \
                        torch.allclose(big.float(), ref_big.float(), atol=st_tol[0], rtol=st_tol[1])
                    checked += 1
                    if not ok:
                        failures += 1
                        print(f"FAIL {name} {layout} {sdt} H={H} HV={HV}: untouched={same} padding-zero={zero}")
    print(f"triton launch shapes: {checked} cases, failures: {failures}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
