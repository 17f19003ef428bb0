"""Eager launch cost of ``kda_kernels.triton_decode.packed_decode``: ``kernel[grid]`` against the
cached compiled kernel's launcher (the fast launch), and a check that both give bit-identical results.

Checks, for several dtypes, layouts, padded strides, misaligned pointers, int arguments equal to 1,
padding and out-of-range indices, the oob counter and the shared-memory KV tile (its own Gluon
kernel, launched the same way): the fast launch writes the same bits as the
normal one (``out``, the whole pool storage including the gaps, the counter), also when replayed
from a CUDA graph captured with ``torch.cuda.set_sync_debug_mode("error")``. Then times the host
cost per call at B=1, H=HV=32, K=V=128 (wall clock of 300 back-to-back calls, synced at the end,
median of 7). Needs a CUDA device; ``kda_kernels`` must be importable, e.g.::

    mkdir -p /tmp/pp && ln -sfn $PWD/kernels /tmp/pp/kda_kernels
    PYTHONPATH=/tmp/pp:$PWD python benchmarks/triton_launch.py
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from kda_kernels import triton_decode as td
from kda_oracle import DecodeCase, _bits, _whole_storage, make_decode_case


class _SlowPathUsed(RuntimeError):
    pass


def _kernels() -> list[object]:
    """The JIT kernels the backend launches: the Triton kernel, and the shared-memory KV tile's."""
    from kda_kernels import triton_kv_shared

    shared = triton_kv_shared.kernel()
    return [td._packed_decode_kernel] + ([shared] if shared is not None else [])


def _forbid_slow_path() -> Callable[[], None]:
    """Make ``kernel[grid]`` raise (so a call that does not take the fast launch fails)."""

    def run(*args: object, **kwargs: object) -> None:
        raise _SlowPathUsed("kernel[grid] was called")

    kernels = _kernels()
    for kernel in kernels:
        kernel.run = run  # type: ignore[attr-defined]

    def restore() -> None:
        for kernel in kernels:
            delattr(kernel, "run")

    return restore


def _call(case: DecodeCase, state: torch.Tensor, out: torch.Tensor, **kw: object) -> None:
    td.packed_decode(
        case.mixed_qkv,
        case.a,
        case.b,
        case.A_log,
        case.dt_bias,
        case.scale,
        state,
        out,
        case.indices,
        num_heads=case.num_heads,
        use_qk_l2norm=case.use_qk_l2norm,
        lower_bound=case.lower_bound,
        state_layout=case.state_layout,
        **kw,  # type: ignore[arg-type]
    )


def _run(case: DecodeCase, fast: bool, counter: bool, config: td.DecodeConfig | None) -> tuple[torch.Tensor, ...]:
    td._fast_launch["enabled"] = fast
    state, out = case.clone_state(), case.new_out()
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda") if counter else None
    _call(case, state, out, oob_counter=cnt, config=config)
    torch.cuda.synchronize()
    return out, _whole_storage(state), cnt if cnt is not None else torch.zeros(1)


def _same(x: tuple[torch.Tensor, ...], y: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(_bits(a.contiguous()), _bits(b.contiguous())) for a, b in zip(x, y, strict=True))


def check_cases() -> int:
    cases: list[tuple[str, dict, bool, td.DecodeConfig | None]] = [
        ("fp32 small gva", dict(batch=5, num_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8), False, None),
        (
            "bf16 act/fp32 state, padded strides, pad+oob idx int32, counter",
            dict(
                batch=5,
                num_heads=2,
                num_v_heads=4,
                head_k_dim=16,
                head_v_dim=8,
                num_slots=9,
                indices=[3, -1, 40, 7, 2**31 - 1],
                index_dtype=torch.int32,
                act_dtype=torch.bfloat16,
                row_pad=3,
                slot_pad=5,
            ),
            True,
            None,
        ),
        (
            "bf16/bf16 KV bounded no-l2norm",
            dict(
                batch=4,
                num_heads=2,
                num_v_heads=4,
                head_k_dim=16,
                head_v_dim=16,
                act_dtype=torch.bfloat16,
                state_dtype=torch.bfloat16,
                state_layout="KV",
                lower_bound=-5.0,
                use_qk_l2norm=False,
            ),
            False,
            None,
        ),
        (
            "fp16/fp16 H=1 N=1 (ints == 1), counter",
            dict(
                batch=3,
                num_heads=1,
                num_v_heads=2,
                head_k_dim=16,
                head_v_dim=16,
                num_slots=1,
                indices=[0, -1, 1],
                act_dtype=torch.float16,
                state_dtype=torch.float16,
            ),
            True,
            None,
        ),
        (
            "K=12 V=20, tiles/stages config",
            dict(batch=3, num_heads=1, num_v_heads=2, head_k_dim=12, head_v_dim=20),
            False,
            td.DecodeConfig(block_v=8, num_warps=2, tiles=2, num_stages=2),
        ),
        (
            "bf16/bf16 KV, the shared-memory tile, padded strides, pad+oob idx, counter",
            dict(
                batch=9,
                num_heads=2,
                num_v_heads=4,
                head_k_dim=128,
                head_v_dim=128,
                num_slots=18,
                indices=[3, -1, 17, 40, 0, 11, -5, 8, 2],
                act_dtype=torch.bfloat16,
                state_dtype=torch.bfloat16,
                state_layout="KV",
                row_pad=8,
                slot_pad=8,
            ),
            True,
            td.DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True, state_eviction=""),
        ),
        (
            "production B=8 bf16/fp32 VK int64",
            dict(batch=8, num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128, act_dtype=torch.bfloat16),
            True,
            None,
        ),
    ]
    failures = 0
    for name, kwargs, counter, config in cases:
        case = make_decode_case(device="cuda", seed=1, **kwargs)
        variants = [("", case)]
        if name.startswith("fp32 small"):
            wide = torch.zeros(case.mixed_qkv.shape[0], case.mixed_qkv.shape[1] + 1, device="cuda")
            wide[:, 1:] = case.mixed_qkv
            variants.append((" +misaligned mixed_qkv", dataclasses.replace(case, mixed_qkv=wide[:, 1:])))
        for suffix, c in variants:
            normal = _run(c, False, counter, config)
            before = len(td._fast_launch["cache"])
            _run(c, True, counter, config)  # first call of the specialization: normal launch + remember
            cached = len(td._fast_launch["cache"]) > before
            restore = _forbid_slow_path()
            try:
                fast = _run(c, True, counter, config)
                err = ""
            except _SlowPathUsed as exc:
                fast, err = normal, f" ({exc})"
            finally:
                restore()
            ok = cached and not err and _same(normal, fast) and td._fast_launch["enabled"]
            failures += not ok
            cnt = f", counter {int(fast[2].item())}" if counter else ""
            print(f"{'ok  ' if ok else 'FAIL'} {name}{suffix}: new cache entry {cached}, bit-identical{cnt}{err}")
    return failures


def check_graph(layout: str = "VK", batch: int = 8) -> int:
    """One call captured through the fast launch and replayed; at B=64 in the KV layout with bf16 state
    auto picks the shared-memory tile (with Triton 3.6)."""
    indices = [5, -1, 999, 0, 3, 7, 1000, 2, *range(8, batch)]  # three rows out of range
    case = make_decode_case(
        batch=batch,
        num_heads=32,
        num_v_heads=32,
        head_k_dim=128,
        head_v_dim=128,
        act_dtype=torch.bfloat16,
        state_dtype=torch.float32 if layout == "VK" else torch.bfloat16,
        state_layout=layout,
        indices=indices,
        num_slots=2 * batch,
        device="cuda",
        seed=2,
    )
    normal = _run(case, False, True, None)
    td._fast_launch["enabled"] = True
    state, out = case.clone_state(), case.new_out()
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: normal launch, then one fast launch, on scratch copies
        for _ in range(2):
            _call(case, case.clone_state(), case.new_out(), oob_counter=torch.zeros_like(cnt))
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    restore = _forbid_slow_path()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(g):
            _call(case, state, out, oob_counter=cnt)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        restore()
    g.replay()
    torch.cuda.synchronize()
    ok = _same(normal, (out, _whole_storage(state), cnt)) and td._fast_launch["enabled"]
    plan = td._plans.get(_pkey(case, state, counted=True))
    kernel = "?" if plan is None else "shared-memory KV tile" if plan[4] is not None else "Triton kernel"
    print(
        f"{'ok  ' if ok else 'FAIL'} CUDA graph ({layout}, B={batch}, {kernel}): captured through the fast launch "
        f"without a sync; replay == normal eager launch (out, pool, counter {int(cnt.item())})"
    )
    return 0 if ok else 1


def host_us(*fns: Callable[[], object], calls: int = 300, reps: int = 7) -> list[tuple[float, float]]:
    """Host µs per call of each ``fn``: (median, min) over ``reps`` batches of ``calls`` back-to-back
    calls synced at the end; the functions' batches are interleaved so that drift hits them alike."""
    for fn in fns:
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    per_call: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, times in zip(fns, per_call, strict=True):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / calls * 1e6)
    return [(statistics.median(t), min(t)) for t in per_call]


def _with_fast(enabled: bool, fn: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        td._fast_launch["enabled"] = enabled
        return fn()

    return call


def _time_one(state_dtype: torch.dtype) -> None:
    case = make_decode_case(
        batch=1,
        num_heads=32,
        num_v_heads=32,
        head_k_dim=128,
        head_v_dim=128,
        act_dtype=torch.bfloat16,
        state_dtype=state_dtype,
        index_dtype=torch.int32,
        num_slots=64,
        device="cuda",
    )
    state, out = case.clone_state(), case.new_out()
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
    tag = str(state_dtype).removeprefix("torch.")
    (old, new, new_cnt) = host_us(
        _with_fast(False, lambda: _call(case, state, out)),
        _with_fast(True, lambda: _call(case, state, out)),
        _with_fast(True, lambda: _call(case, state, out, oob_counter=cnt)),
    )
    td._fast_launch["enabled"] = True
    print(
        f"  {tag:>8} state, median/min: kernel[grid] {old[0]:6.2f}/{old[1]:6.2f} us   "
        f"fast launch {new[0]:6.2f}/{new[1]:6.2f} us   fast + oob_counter {new_cnt[0]:6.2f}/{new_cnt[1]:6.2f} us"
    )
    if state_dtype is not torch.float32:
        return
    # pieces of the fast path: the key and the cache lookup alone, and the launcher alone
    pkey = _pkey(case, state)
    plan = td._plans.get(pkey)
    if plan is None:
        print(f"           (no plan for {pkey})")
        return
    grid, consts, _, plan_id, _ = plan
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state, out, case.indices, case.indices,
            float(case.scale), 0.0, state.shape[0])
    key = td._launch_key(args, plan_id)
    entry = td._fast_launch["cache"].get(key)
    if entry is None:
        print(f"           (no cache entry for {key})")
        return
    _, run, function, packed = entry
    get_stream, device = td._fast_launch["env"][1], torch.cuda.current_device()
    ((key_us, _), (launch_us, _)) = host_us(
        lambda: td._fast_launch["cache"].get(td._launch_key(args, plan_id)),
        lambda: run(*grid, get_stream(device), function, packed, None, None, None, *args, *consts),
    )
    print(f"           of which (medians): key + lookup {key_us:5.2f} us, launcher alone {launch_us:5.2f} us")
    print(f"           key: {key}")


def _pkey(case: DecodeCase, state: torch.Tensor, counted: bool = False) -> tuple:
    """The plan key ``_launch`` makes for an auto call of ``case`` (see ``_plan``)."""
    dims = (case.indices.shape[0], case.num_heads, state.shape[1], *case.head_dims, state.shape[0])
    return (dims, case.mixed_qkv.stride()[0], case.a.stride()[0], case.b.stride()[0], state.stride()[0], state.dtype,
            case.state_layout, False, bool(case.use_qk_l2norm), case.lower_bound is not None, counted,
            state.get_device(), None)


def timings() -> None:
    print(
        "\nhost time per eager call, B=1 H=HV=32 K=V=128, bf16 activations, int32 indices "
        "(300 calls, sync at end, median of 7):"
    )
    for state_dtype in (torch.float32, torch.bfloat16):
        _time_one(state_dtype)


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    rt = getattr(getattr(triton, "knobs", None), "runtime", None)
    print(
        f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}; "
        f"launch_enter_hook={getattr(rt, 'launch_enter_hook', '?')!r}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures = check_cases() + check_graph() + check_graph("KV", 64)
        entry = next(iter(td._fast_launch["cache"].values()), None)
        if entry is not None:
            print(
                f"compiled kernel: {type(entry[0]).__name__}, launcher {type(entry[1]).__name__}, "
                f"signature {list(entry[0].src.signature.values())}"
            )
        timings()
    for w in caught:
        print(f"warning: {w.message}")
        failures += isinstance(w.message, RuntimeWarning) and "fast launch" in str(w.message)
    print("ALL OK" if failures == 0 else f"{failures} FAILURES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
