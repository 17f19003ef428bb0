"""Packed-decode kernels side by side: correctness on the device, then speed.

For Kimi-Linear sizes (K = V = 128; H = HV = 32 and 16; fp32 and bf16 state; B = 1, 8, 64, 256)
every available backend runs in one process on the same inputs: a pool of ``max(8*B, 64)`` slots
indexed by a random permutation (so the state is not L2-resident), timed with CUDA events over
CUDA-graph replay (kernel time) and eagerly (kernel + launch), reported as µs per call and
effective TB/s against the device-to-device copy bandwidth measured in the same run. Also the
host overhead of ``kc.packed_decode`` at B = 1 (validation + dispatch + launch, no graph).

    python benchmarks/decode.py --out docs/benchmarks.md      # on a CUDA machine
    python benchmarks/decode.py --quick                       # a smaller sweep

Peers: flash-linear-attention's ``fused_recurrent_kda`` kernel (its in-place continuous-batching
path, with q/k/v already dense: kernel time only) when ``fla-core`` is installed.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

SECTION = "## Packed decode kernels (GPU)"
GRAPH_CALLS = 20  # kernel launches captured in one graph
REPLAYS = 10
SAMPLES = 7  # medians over this many timings


@dataclass
class Row:
    backend: str
    H: int
    state: str
    B: int
    graph_us: float | None
    eager_us: float | None
    tbps: float | None
    max_err_out: float | None
    max_err_state: float | None
    note: str = ""


def traffic_bytes(B: int, H: int, HV: int, K: int, V: int, state_bytes: int, act_bytes: int) -> int:
    state = 2 * B * HV * V * K * state_bytes
    acts = B * (2 * H * K + HV * V + HV * K + HV) * act_bytes + B * HV * V * act_bytes
    return state + acts


def time_events(fn: Callable[[], None], reps: int) -> float:
    """Median µs per ``fn`` call over SAMPLES timings of ``reps`` calls each."""
    times = []
    for _ in range(SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def time_graph(fn: Callable[[], None]) -> float:
    """Median µs per call under CUDA-graph replay (GRAPH_CALLS calls per graph)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return time_events(g.replay, REPLAYS) / GRAPH_CALLS


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy, read + write counted, in TB/s."""
    n = 1 << 29  # 2 GiB of fp32
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    us = time_events(lambda: dst.copy_(src), 5)
    del src, dst
    return 2 * n * 4 / (us * 1e-6) / 1e12


def backends_here() -> dict[str, Callable[..., None]]:
    out: dict[str, Callable[..., None]] = {}
    for name, (ok, why) in kc.adapters.available().items():
        if ok:
            out[name] = kc.adapters.get(name).load()
        else:
            print(f"# backend {name}: unavailable ({why})", file=sys.stderr)
    return out


def fla_kernel_only(call: dict[str, Any], H: int) -> Callable[[], None] | None:
    """fla's in-place kernel on pre-densified q/k/v (kernel time only, indices all valid)."""
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception:
        return None
    mq, st = call["mixed_qkv"], call["initial_state"]
    B, HV, V, K = mq.shape[0], st.shape[1], st.shape[2], st.shape[3]
    q = mq[:, : H * K].reshape(B, 1, H, K).contiguous()
    k = mq[:, H * K : 2 * H * K].reshape(B, 1, H, K).contiguous()
    v = mq[:, 2 * H * K :].reshape(B, 1, HV, V).contiguous()
    g = call["a"].reshape(B, 1, HV, K).contiguous()
    beta = call["b"].reshape(B, 1, HV).contiguous()
    out = torch.empty(B, 1, HV, V, dtype=mq.dtype, device=mq.device)

    def run() -> None:
        fused_recurrent_kda_fwd(
            q=q, k=k, v=v, g=g, beta=beta, A_log=call["A_log"], dt_bias=call["dt_bias"], initial_state=st,
            scale=call["scale"], inplace_final_state=True, state_v_first=True,
            ssm_state_indices=call["ssm_state_indices"], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, lower_bound=call["lower_bound"], out=out)

    return run


def run_kernel(kernel: Callable[..., None], call: dict[str, Any], H: int) -> Callable[[], None]:
    c = call

    def run() -> None:
        kernel(c["mixed_qkv"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["scale"], c["initial_state"], c["out"],
               c["ssm_state_indices"], num_heads=H, use_qk_l2norm=c["use_qk_l2norm_in_kernel"],
               lower_bound=c["lower_bound"], state_layout="VK")

    return run


def max_errors(kernel_run: Callable[[], None], call: dict[str, Any], ref: tuple[torch.Tensor, torch.Tensor],
               idx: torch.Tensor) -> tuple[float, float]:
    kernel_run()
    torch.cuda.synchronize()
    out_err = (call["out"].float() - ref[0].float()).abs().max().item()
    st_err = (call["initial_state"][idx].float() - ref[1][idx].float()).abs().max().item()
    return out_err, st_err


def sweep(device: torch.device, batches: list[int], heads: list[int], states: list[torch.dtype],
          eager: bool) -> tuple[list[Row], float]:
    kernels = backends_here()
    rows: list[Row] = []
    copy_tbps = copy_bandwidth(device)
    print(f"# copy bandwidth {copy_tbps:.2f} TB/s", file=sys.stderr)
    for H in heads:
        cfg = kc.KDAConfig(num_heads=H, head_k_dim=128, head_v_dim=128)
        for sdt in states:
            for B in batches:
                N = max(8 * B, 64)
                base = make_decode_call(cfg, B, N, activation_dtype=torch.bfloat16, state_dtype=sdt, device=device)
                base["use_qk_l2norm_in_kernel"] = True
                idx = base["ssm_state_indices"].long()
                nbytes = traffic_bytes(B, H, H, 128, 128, torch.finfo(sdt).bits // 8, 2)
                # The reference result from the pristine pool.
                ref_call = dict(base, initial_state=base["initial_state"].clone(), out=base["out"].clone())
                kernels["torch"](*[ref_call[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale",
                                                         "initial_state", "out", "ssm_state_indices")],
                                 num_heads=H, use_qk_l2norm=True, lower_bound=None, state_layout="VK")
                ref = (ref_call["out"], ref_call["initial_state"])
                del ref_call
                candidates: dict[str, tuple[Callable[[], None], dict[str, Any]]] = {}
                for name, kern in kernels.items():
                    c = dict(base, initial_state=base["initial_state"].clone(), out=base["out"].clone())
                    candidates[name] = (run_kernel(kern, c, H), c)
                c = dict(base, initial_state=base["initial_state"].clone())
                fla_run = fla_kernel_only(c, H)
                if fla_run is not None:
                    candidates["fla-kernel"] = (fla_run, c)
                for name, (fn, c) in candidates.items():
                    note = ""
                    try:
                        if name == "fla-kernel":
                            fn()
                            torch.cuda.synchronize()
                            st_err = (c["initial_state"][idx].float() - ref[1][idx].float()).abs().max().item()
                            out_err = None
                        else:
                            out_err, st_err = max_errors(fn, c, ref, idx)
                    except Exception as exc:  # report, keep going
                        rows.append(Row(name, H, str(sdt)[6:], B, None, None, None, None, None,
                                        f"failed: {type(exc).__name__}: {str(exc)[:80]}"))
                        continue
                    graph_us = eager_us = None
                    try:
                        graph_us = time_graph(fn)
                    except Exception as exc:
                        note = f"no graph: {type(exc).__name__}"
                        torch.cuda.synchronize()
                    if eager or graph_us is None:
                        eager_us = time_events(fn, 20)
                    best = graph_us if graph_us is not None else eager_us
                    tbps = nbytes / (best * 1e-6) / 1e12 if best else None
                    rows.append(Row(name, H, str(sdt)[6:], B, graph_us, eager_us, tbps, out_err, st_err, note))
                    print(f"# {rows[-1]}", file=sys.stderr)
                del candidates, base, ref
                torch.cuda.empty_cache()
    return rows, copy_tbps


def wall_us_per_call(fn: Callable[[], None], calls: int = 300) -> float:
    """Median wall-clock µs per call of back-to-back eager calls (device synced at the end)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def host_overhead(device: torch.device) -> list[tuple[str, float]]:
    """µs per eager call at B=1 (H=32, fp32 state): validation + dispatch + launch, and launch alone."""
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b")
    call = make_decode_call(cfg, 1, 64, device=device)
    best = next(n for n in kc.adapters.names()  # the one backend="auto" would run
                if device.type in kc.adapters.get(n).devices and kc.adapters.get(n).available()[0])
    results = []
    for label, mode, config in (("check mode", "check", None), ("check mode + config", "check", cfg),
                                ("off mode", "off", None)):
        with kc.mode(mode):  # type: ignore[arg-type]
            us = wall_us_per_call(lambda config=config: kc.packed_decode(**call, backend=best, config=config))
        results.append((f"kc.packed_decode(backend='{best}'), {label}", us))
    direct = run_kernel(kc.adapters.get(best).load(), call, cfg.local_num_heads)
    results.append((f"{best} kernel called directly (launch only)", wall_us_per_call(direct)))
    return results


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def render(rows: list[Row], copy_tbps: float, overhead: list[tuple[str, float]], cmd: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    versions = [f"torch {torch.__version__}"]
    for dist in ("triton", "helion", "fla-core"):
        try:
            versions.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    lines = [
        SECTION,
        "",
        f"Run {datetime.date.today().isoformat()} on {torch.cuda.get_device_name()} · {', '.join(versions)} · "
        f"Python {platform.python_version()}",
        f"Command: `{cmd}`",
        "",
        f"Measured device-to-device copy bandwidth (read + write): **{copy_tbps:.2f} TB/s**. K = V = 128, "
        "HV = H, bf16 activations, l2norm on, softplus gate, VK state; pool of max(8·B, 64) slots, random slots. "
        f"graph = CUDA-graph replay ({GRAPH_CALLS} calls per graph), eager = back-to-back launches; medians of "
        f"{SAMPLES}. TB/s = (state read + write + activations) / best time. Errors vs the PyTorch reference "
        "(max abs, out / used state slots; fla-kernel writes its own out buffer, so only its state is compared).",
        "",
        "| backend | H | state | B | graph µs | eager µs | TB/s | % of copy | max err out | max err state | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pct = None if r.tbps is None else 100 * r.tbps / copy_tbps
        lines.append(f"| {r.backend} | {r.H} | {r.state} | {r.B} | {fmt(r.graph_us, '.1f')} | "
                     f"{fmt(r.eager_us, '.1f')} | {fmt(r.tbps, '.2f')} | {fmt(pct, '.0f')} | "
                     f"{fmt(r.max_err_out, '.1e')} | {fmt(r.max_err_state, '.1e')} | {r.note} |")
    lines += ["", "Host overhead at B = 1, H = 32, fp32 state, eager (µs per call, wall clock, median):", "",
              "| path | µs/call |", "|---|---|"]
    lines += [f"| {label} | {us:.1f} |" for label, us in overhead]
    return "\n".join(lines) + "\n"


def dry_run() -> int:
    """Exercise the sweep's code paths on the CPU: torch.cuda timing is replaced by a stub."""
    global SAMPLES
    SAMPLES = 1
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]

    def fake_time(fn: Callable[[], None], reps: int = 1) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    def no_graph(fn: Callable[[], None]) -> float:
        raise RuntimeError("no CUDA graphs on the CPU")

    globals().update(time_events=fake_time, time_graph=no_graph, copy_bandwidth=lambda device: 1.0)
    torch.cuda.get_device_name = lambda *a: "cpu (dry run)"  # type: ignore[assignment]
    kc.adapters.refresh()
    rows, copy_tbps = sweep(torch.device("cpu"), [1, 2], [2], [torch.float32], True)
    print(render(rows, copy_tbps, [("dry", 0.0)], "dry"))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the Markdown table here (replacing the file)")
    p.add_argument("--quick", action="store_true", help="B in {1, 256}, H=32 only")
    p.add_argument("--no-eager", action="store_true", help="graph timings only")
    p.add_argument("--dry", action="store_true", help="CPU smoke test of this script (tiny sizes, no timing)")
    args = p.parse_args(argv)
    if args.dry:
        return dry_run()
    if not torch.cuda.is_available():
        print("benchmarks/decode.py needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    batches = [1, 256] if args.quick else [1, 8, 64, 256]
    heads = [32] if args.quick else [32, 16]
    rows, copy_tbps = sweep(device, batches, heads, [torch.float32, torch.bfloat16], not args.no_eager)
    overhead = host_overhead(device)
    text = render(rows, copy_tbps, overhead, "python " + " ".join(sys.argv))
    print(text)
    if args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from markdown_sections import replace_section

        replace_section(Path(args.out), SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
