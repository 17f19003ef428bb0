"""What ``kc.op`` adds to a call over the bare ``@kc.contract`` of the same function: the backend
selection (one cached lookup per call signature) and the indirection to the kernel.

Both sides run the same checks and call the same no-op kernel, so the difference is the op
layer alone. Cases: a small user op (three tensors) and KDA packed decode (nine tensors, a
config, two contract variants), in check and off modes. Medians of ``--repeats`` runs of
``--number`` calls each, timed with ``time.process_time_ns`` (or ``perf_counter_ns``).

Usage::

    python benchmarks/op_overhead.py --repeats 15 --number 20000 --out docs/op-overhead.md
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.contract.wrapping import build_wrapper
from kda_contracts.testing import make_decode_call

TIMERS = {"process": time.process_time_ns, "perf": time.perf_counter_ns}


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def user_cases() -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]:
    """(op call, bare contract call, args) for a three-tensor op with a no-op kernel."""

    @kc.op(name="bench_scale_rows", returns="out")
    def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
                   out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        torch.mul(x, w, out=out)

    @scale_rows.backend("noop", devices=("cpu",), priority=100)
    def _kernel(x: Any, w: Any, out: Any) -> None:
        return None

    @kc.contract(register=False)
    def bare(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
             out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]):  # (the op's result is not checked either)
        _kernel(x, w, out)
        return out

    return scale_rows, bare, (torch.zeros(4, 8), torch.zeros(8), torch.zeros(4, 8))


def decode_cases() -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """(op call, bare contract call, args, kwargs) for packed decode with a no-op kernel."""
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=1, index_dtype="int32", activation_dtype="bfloat16",
                              state_dtype="float32")
    call = make_decode_call(cfg, 8, 16)
    order = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices",
             "use_qk_l2norm_in_kernel", "lower_bound")
    args = tuple(call[k] for k in order)
    kc.packed_decode.register_backend(kc.adapters.Adapter(name="bench-noop", kernel=noop, devices=("cpu",),
                                                          priority=1000), replace=True)
    contract = kc.packed_decode_contract("VK")

    def kernel_after_contract(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: Any,
                              initial_state: Any, out: Any, ssm_state_indices: Any,
                              use_qk_l2norm_in_kernel: Any = False, lower_bound: Any = None, *,
                              config: Any = None, state_layout: Any = None) -> Any:
        noop(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, num_heads=32,
             use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound, state_layout="VK")
        return out, initial_state

    # the bare contract: the same compiled contract and generated wrapper around the same no-op kernel
    # (returning the written arguments, as the op does, which checks no return: the contract's `-> None`
    # is the op body's, so it is left out here)
    bare = build_wrapper(kc.Contract(dataclasses.replace(contract.spec, return_hint=inspect.Parameter.empty),
                                     kernel_after_contract), None)
    return kc.packed_decode, bare, args, {"config": cfg}


def median_ns(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], number: int, repeats: int,
              timer: Callable[[], int]) -> float:
    for _ in range(200):
        fn(*args, **kwargs)
    runs = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = timer()
            for _ in range(number):
                fn(*args, **kwargs)
            runs.append((timer() - t0) / number)
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(runs)


def run(number: int, repeats: int, timer: Callable[[], int]) -> list[tuple[str, str, float, float]]:
    """Rows (case, mode, op ns, bare contract ns), op and bare interleaved per mode."""
    op_u, bare_u, args_u = user_cases()
    op_d, bare_d, args_d, kw_d = decode_cases()
    rows = []
    try:
        for mode in ("check", "off"):
            with kc.mode(mode):
                for case, op, bare, args, kw in (("user op (3 tensors)", op_u, bare_u, args_u, {}),
                                                 ("packed decode", op_d, bare_d, args_d, kw_d)):
                    o = median_ns(op, args, kw, number, repeats, timer)
                    b = median_ns(bare, args, kw, number, repeats, timer)
                    rows.append((case, mode, o, b))
    finally:
        kc.packed_decode.unregister_backend("bench-noop")
    return rows


def report(rows: list[tuple[str, str, float, float]], command: str) -> str:
    lines = ["| case | mode | `kc.op` call (µs) | bare `kc.contract` (µs) | op ÷ contract |", "|---|---|---|---|---|"]
    for case, mode, o, b in rows:
        lines.append(f"| {case} | {mode} | {o / 1e3:.2f} | {b / 1e3:.2f} | {o / b:.3f}× |")
    return "\n".join([f"Command: `{command}`", "", *lines, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--timer", choices=sorted(TIMERS), default="process")
    p.add_argument("--out", default=None, help="write the markdown table here too")
    a = p.parse_args(argv)
    rows = run(a.number, a.repeats, TIMERS[a.timer])
    text = report(rows, "python benchmarks/op_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
