"""Packed-decode kernels side by side with their peers: correctness on the device, then speed.

``--op kda`` (the default), Kimi-Linear sizes: K = V = 128; H = HV = 32, 16, 4 i.e. TP1/TP2/TP8.
``--op gdn``, Qwen3-Next sizes: K = V = 128; H = 16, 8 with HV = 2H (GVA; ``--heads`` gives H), one
gate per value head (``a`` [B, HV], ``dt_bias`` [HV]); the GDN-specific parts are in decode_gdn.py.
For fp32 and bf16 state and B = 1, 8, 64, 256, 1024, every available backend and peer of the op
runs in one process on the same inputs:

* correctness first, per row: output and used slots against the PyTorch reference, every other
  slot bit-identical;
* then speed: CUDA events over CUDA-graph replay, the backends interleaved sample by sample, over a
  pool of many more slots than B with random slots. "hot" replays one slot set (at small B it stays
  in L2, as when a layer is timed alone); "cold" rotates through at least 16 disjoint slot sets per
  graph, together at least 4x the L2, so every call reads its slots from DRAM, as a layer does
  between the other layers of a model.

Reported per row: µs per call, effective TB/s (state read + write + activations), % of the
device-to-device copy bandwidth measured in the same run, and ours / best peer (time ratio
inverted: > 1 means ours is faster). "ours" is the backend ``backend="auto"`` runs (triton). Each
op writes its own section of docs/benchmarks.md.

    python benchmarks/decode.py --out docs/benchmarks.md --json OUT.json   # on a CUDA machine
    python benchmarks/decode.py --op gdn --out docs/benchmarks.md --json GDN.json
    python benchmarks/decode.py --quick                                    # a smaller sweep
    python benchmarks/decode.py --plot OUT.json docs/decode.png            # the picture (CPU is fine)
    python benchmarks/decode.py --report A.json B.json --out docs/benchmarks.md   # a sweep split in parts
    python benchmarks/decode.py --dry [--op gdn]                           # CPU smoke test (Triton interpreter)

Peers, when importable: for KDA, sglang's Helion and Triton KDA packed-decode kernels (bring them in
with ``benchmarks/fetch_peers.sh DEST`` and put DEST on PYTHONPATH; see docs/kernels.md) and
flash-linear-attention's in-place ``fused_recurrent_kda`` kernel (``pip install fla-core``); for
GDN, sglang's Triton GDN packed-decode kernel and fla's ``fused_recurrent_gated_delta_rule`` (out of
place: fla-core 0.6.0 has no indexed in-place GDN entry). Missing backends and peers are reported.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_peers
from decode_ops import KDA, OPS, Kernel
from decode_report import OURS, plot, render, run_facts
from markdown_sections import replace_section

import kda_contracts as kc

HOT_CALLS = 20  # calls per hot graph
COLD_MIN_SETS = 16
COLD_L2_MULTIPLE = 4  # the cold slot sets together span at least this many L2s
COLD_MAX_SETS = 2048
SAMPLES = 5  # medians over this many timings per backend, interleaved across backends
MIN_SAMPLE_MS = 10.0
K = V = 128
ACTIVATIONS = torch.bfloat16  # mixed_qkv, a, b and out


def method_text() -> str:
    """How the rows were measured (the paragraph under the run facts in the report)."""
    act = "bf16" if ACTIVATIONS == torch.bfloat16 else "fp32"
    return (
        f"K = V = 128, {OP.method} {act} activations, l2norm on, softplus gate. µs = median per call over CUDA-graph "
        f"replay (CUDA events, {SAMPLES} samples of ≥ {MIN_SAMPLE_MS:.0f} ms, backends interleaved). hot: "
        f"{HOT_CALLS} calls on one random set of B slots; cold: each graph rotates through ≥ {COLD_MIN_SETS} "
        f"disjoint random slot sets spanning ≥ {COLD_L2_MULTIPLE}× the L2. TB/s = (state read + write + "
        "activations) / time. vs peer = best peer's time / ours (> 1: ours faster); "
        f"vs {OP.main_peer} likewise. ok = output and used slots within tolerance of the PyTorch reference and all "
        "other slots bit-identical.")


Launch = Callable[[torch.Tensor], None]
Binder = Callable[[dict[str, Any]], Launch]
OP = KDA  # the op being measured (main sets it from --op)
SECTION: str | None = None  # --section: the report's heading instead of the op's


@dataclass
class Row:
    variant: str  # hot | cold
    layout: str
    backend: str
    H: int
    HV: int
    state: str
    B: int
    us: float | None
    tbps: float | None
    pct_copy: float | None
    err_out: float | None
    err_state: float | None
    correct: bool | None
    note: str = ""


def traffic_bytes(B: int, H: int, HV: int, state_bytes: int, act_bytes: int, gate_width: int) -> int:
    """State read + write, q, k, v, the gate inputs (``gate_width`` per value head: K for KDA, 1 for
    GDN), b, and the output."""
    state = 2 * B * HV * V * K * state_bytes
    acts = B * (2 * H * K + HV * V + HV * gate_width + HV) * act_bytes + B * HV * V * act_bytes
    return state + acts


def gate_width() -> int:
    return K if OP.gate_per_channel else 1


# --- inputs ---------------------------------------------------------------------------------------


def device_inputs(H: int, B: int, N: int, sdt: torch.dtype, layout: str, device: torch.device,
                  seed: int = 0) -> dict[str, Any]:
    """Random valid inputs made on the device (a pool of tens of GB is too slow to make on the host)."""
    g = torch.Generator(device=device).manual_seed(seed)
    HV, G, act = OP.hv_per_h * H, gate_width(), ACTIVATIONS

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=g)

    shape = (N, HV, V, K) if layout == "VK" else (N, HV, K, V)
    state = torch.empty(shape, device=device, dtype=sdt)
    for chunk in state.split(max(1, (1 << 28) // (HV * V * K))):  # 1 GiB of fp32 noise at a time
        chunk.copy_(0.1 * torch.randn(chunk.shape, device=device, generator=g))
    return dict(mixed_qkv=rnd(B, 2 * H * K + HV * V).to(act), a=rnd(B, HV * G).to(act), b=rnd(B, HV).to(act),
                A_log=(1 + 15 * torch.rand(HV, device=device, generator=g)).log(), dt_bias=0.5 * rnd(HV * G),
                scale=K**-0.5, state=state, out=torch.zeros(B, 1, HV, V, device=device, dtype=act), H=H,
                layout=layout)


def slot_sets(N: int, B: int, sets: int, device: torch.device, seed: int = 1) -> torch.Tensor:
    """``sets`` disjoint random sets of B slots out of N, as int32 ``[sets, B]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(N, generator=g)[: sets * B].view(sets, B).to(torch.int32).to(device)


def cold_sets(B: int, HV: int, state_bytes: int, l2_bytes: int) -> int:
    per_set = B * HV * V * K * state_bytes
    return min(COLD_MAX_SETS, max(COLD_MIN_SETS, math.ceil(COLD_L2_MULTIPLE * l2_bytes / per_set)))


# --- backends -------------------------------------------------------------------------------------


def our_binder(kernel: Callable[..., None], **extra: Any) -> Binder:
    def bind(x: dict[str, Any]) -> Launch:
        def launch(indices: torch.Tensor) -> None:
            kernel(x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["scale"], x["state"], x["out"],
                   indices, num_heads=x["H"], use_qk_l2norm=True, lower_bound=None, state_layout=x["layout"],
                   **extra)

        return launch

    return bind


def candidate_configs(layout: str, sdt: torch.dtype, batch: int, num_v_heads: int) -> dict[str, Any]:
    """Extra Triton launch shapes timed with --candidates (named ``triton:NAME`` in the rows), each
    derived from the shape ``pick_config`` chooses for the row, and none equal to it or to another:
    for VK the guard (``m``: masked, ``br``: branch), program orders (``vf``: V tiles fastest, ``hf``:
    heads fastest, ``grp``: groups of 16 heads), cache hints (``qka``: q, k and the gate inputs kept in
    L2, not v; ``ka``: all activations; ``noev`` / ``ev1``: no hint / evict_first on the state;
    ``cg``: the state read through L2 only; ``cs``: streaming stores; ``se1``: evict_first on the state
    store only) and for fp32 other tiles (``r4``, ``r8``, ``r16``, ``t2``: two pipelined 4-row tiles;
    ``r8-flat-br``: 8 rows, request-major, branch guard; ``r4-m-vf``: 4 rows, masked guard, V tiles
    fastest); ``fo``: the output summed from the decayed tile
    (``fused_output``), on the picked shape or on 8 rows (``r8-fo``), ``nofo`` the picked shape without it;
    ``el``: the state load issued before
    the gate and norm math (``early_load``), ``el-fo`` both;
    for KV other tiles and the two-pass chunked tile (``ck``), the full-width one with no hint on its
    first pass (``fe0``; ``fe1``: evict_first) and variations of it (``se0``: no hint on the second
    pass, ``st0``: on its stores, ``ld0``: on its loads; ``ka``: q, k and the gate inputs kept in L2;
    ``w2``: two warps; ``m``: masked guard; ``h``: half width; ``grp``: groups of 16 heads; ``rN``: at
    most N registers; ``ck32-el``: evict_last on the first pass, the shape picked before from
    B·HV = 8192), 64 columns on two warps (``bv64-w2``, the one picked before at 1024-4096), and the
    shared-memory tile (``sh128-w2``, ``sh64-w1``: auto's shapes from B·HV = 2048 / 4096, for GDN
    from 1024 / 2048; ``sh128-w4``), and the register tile (``rgN``: N columns, ``-wW``: W warps,
    ``-ev0``: no hint on the state, ``-ka``: q, k and the gate inputs kept in L2). For VK also, for both
    state widths: ``rN`` the pick on N rows (2 to 32), ``w2`` on two warps, ``r2x-w2`` twice the rows on
    two warps, ``m`` / ``br`` the masked / branch guard; and ``base``: the regime table's own shape where
    this card's table (``pick_config(device=...)``) picks another."""
    from kda_kernels.triton_decode import DecodeConfig, pick_config

    gdn = {"gdn": True} if OP.name == "gdn" and "gdn" in inspect.signature(pick_config).parameters else {}
    p = pick_config(batch, num_v_heads, V, sdt, layout, **gdn, **device_kw())  # this card's pick
    grouped = num_v_heads % 16 == 0
    qka = dict(act_eviction="evict_last", v_eviction="")  # keep q, k and the gate inputs, not v, in L2
    if layout == "KV":
        wide = sdt.itemsize >= 4
        out = {"bv128-w4": p._replace(block_v=128, num_warps=4), "noev": p._replace(state_eviction=""),
               "ck16": p._replace(block_v=32 if wide else 64, num_warps=1, kv_chunk=16),
               "ck32": p._replace(block_v=64, num_warps=1, kv_chunk=32),
               "wide-ck16": p._replace(block_v=64 if wide else 128, num_warps=1, kv_chunk=16),
               "wide-ck32": p._replace(block_v=64 if wide else 128, num_warps=1, kv_chunk=32)}
        # the full-width chunked tile with no hint on its first pass (fe0), and variations of it
        fe0 = DecodeConfig(block_v=64 if wide else 128, num_warps=1, kv_chunk=32, kv_first_eviction="")
        out.update({"fe0": fe0, "fe1": fe0._replace(kv_first_eviction="evict_first"),
                    "fe0-se0": fe0._replace(state_eviction=""), "fe0-st0": fe0._replace(store_eviction=""),
                    "fe0-ld0": fe0._replace(state_eviction="", store_eviction="evict_first"),
                    "fe0-ka": fe0._replace(act_eviction="evict_last", v_eviction=""),
                    "fe0-w2": fe0._replace(num_warps=2), "fe0-m": fe0._replace(guard="mask"),
                    "fe0-h": fe0._replace(block_v=fe0.block_v // 2), "bv64-w2": DecodeConfig(64, 2),
                    "ck32-el": fe0._replace(kv_first_eviction="evict_last"),
                    "fe0-r168": fe0._replace(max_registers=168), "fe0-r128": fe0._replace(max_registers=128)})
        if grouped:
            out["grp"] = p._replace(grid="grouped")
            out["fe0-grp"] = fe0._replace(grid="grouped")
        # the shared-memory tile (CUDA, Triton 3.6): auto's shapes (16-bit state: 128 columns on two
        # warps; fp32: 64 on one), timed also below the sizes auto takes them from
        shared = DecodeConfig(128, 2, kv_chunk=16, kv_shared=True, state_eviction="")
        out.update({"sh128-w2": shared, "sh64-w1": shared._replace(block_v=64, num_warps=1),
                    "sh128-w4": shared._replace(num_warps=4)})
        # the register tile (Gluon, CUDA): 16 to 64 columns on one to four warps
        regs = DecodeConfig(16, 1, kv_registers=True)
        out.update({"rg16": regs, "rg16-ev0": regs._replace(state_eviction=""), "rg16-w2": regs._replace(num_warps=2),
                    "rg32": regs._replace(block_v=32), "rg32-w2": regs._replace(block_v=32, num_warps=2),
                    "rg32-ka": regs._replace(block_v=32, act_eviction="evict_last"),
                    "rg64-w2": regs._replace(block_v=64, num_warps=2),
                    "rg64-w4": regs._replace(block_v=64, num_warps=4)})
        return _unique(p, {**out, **_tile_knobs(p)})
    rows = p.block_v
    mask = dict(guard="mask")
    if sdt.itemsize < 4:
        out = {"m": p._replace(**mask), "br": p._replace(guard="branch"), "qka": p._replace(**qka),
               "vf": p._replace(grid="v_fastest"), "hf": p._replace(grid="head_fastest"),
               "m-plain": DecodeConfig(rows, 1, **mask),
               "m-vf": DecodeConfig(rows, 1, grid="v_fastest", **mask),
               "m-cg": DecodeConfig(rows, 1, load_cache=".cg", **mask),
               "m-qka": DecodeConfig(rows, 1, **mask, **qka),
               "m-qka-noev": DecodeConfig(rows, 1, state_eviction="", **mask, **qka),
               "m-ka-noev": DecodeConfig(rows, 1, state_eviction="", act_eviction="evict_last", **mask)}
        if grouped:
            out.update({"grp": DecodeConfig(rows, 1, grid="grouped"),
                        "grp-qka": DecodeConfig(rows, 1, grid="grouped", state_eviction="", **qka),
                        "m-grp": DecodeConfig(rows, 1, grid="grouped", **mask),
                        "m-grp-qka": DecodeConfig(rows, 1, grid="grouped", state_eviction="", **mask, **qka),
                        "m-grp-qka-ev": DecodeConfig(rows, 1, grid="grouped", **mask, **qka),
                        "m-grp-cg": DecodeConfig(rows, 1, grid="grouped", load_cache=".cg", **mask),
                        "m-grp-noev": DecodeConfig(rows, 1, grid="grouped", state_eviction="", **mask)})
        else:
            out["m-hf"] = DecodeConfig(rows, 1, grid="head_fastest", **mask)
    else:
        out = {f"r{12 - rows}": p._replace(block_v=12 - rows) if rows in (4, 8) else p._replace(block_v=8),
               "vf": p._replace(grid="v_fastest"), "flat": p._replace(grid="flat"),
               "hf": p._replace(grid="head_fastest"),
               "noev": p._replace(state_eviction=""), "ev1": p._replace(state_eviction="evict_first"),
               "noact": p._replace(act_eviction="", v_eviction=None), "ka": p._replace(act_eviction="evict_last"),
               "qka": p._replace(**qka), "cg": p._replace(load_cache=".cg"), "cs": p._replace(store_cache=".cs"),
               "br": p._replace(guard="branch"), "t2": p._replace(block_v=4, tiles=2, num_stages=2),
               "r4-vf-noev-ka": p._replace(block_v=4, grid="v_fastest", state_eviction="", act_eviction="evict_last"),
               "r8-vf": p._replace(block_v=8, grid="v_fastest"), "r16": p._replace(block_v=16),
               "r16-vf": p._replace(block_v=16, grid="v_fastest"), "se1": p._replace(store_eviction="evict_first"),
               "r8-flat-br": p._replace(block_v=8, grid="flat", guard="branch"),
               "r4-m-vf": p._replace(block_v=4, grid="v_fastest", guard="mask"),
               "r8-flat-br-fo": p._replace(block_v=8, grid="flat", guard="branch", fused_output=True)}
        if grouped:
            out["grp"] = p._replace(grid="grouped")
    # tiles of 2 to 32 rows, two warps (on the same rows, or on twice as many), the guards
    for n in (2, 4, 8, 16, 32):
        out.setdefault(f"r{n}", p._replace(block_v=n))
    out.update({"w2": p._replace(num_warps=2), "r2x-w2": p._replace(block_v=2 * rows, num_warps=2)})
    out.setdefault("m", p._replace(guard="mask"))
    out.setdefault("br", p._replace(guard="branch"))
    out.update(_tile_knobs(p))
    if "device" in inspect.signature(pick_config).parameters:  # the regime table's own pick (every card's base)
        out["base"] = pick_config(batch, num_v_heads, V, sdt, layout, **gdn, device="default")
    return _unique(p, out)


def device_kw() -> dict[str, Any]:
    """``{"device": this GPU's name}`` for ``pick_config`` (its per-device table), where it takes one."""
    from kda_kernels.triton_decode import pick_config

    if "device" not in inspect.signature(pick_config).parameters or not torch.cuda.is_available():
        return {}
    return {"device": torch.cuda.get_device_name()}


def _unique(pick: Any, candidates: dict[str, Any]) -> dict[str, Any]:
    """The candidates without the pick and without repeats (the first name of a shape is kept)."""
    unique: dict[Any, str] = {pick: ""}
    return {name: c for name, c in candidates.items() if unique.setdefault(c, name) == name}


def _tile_knobs(p: Any) -> dict[str, Any]:
    """The picked shape with the output summed from the decayed tile (``fo``; ``r8-fo`` on 8 rows; ``nofo``:
    without it) and
    with the state load issued before the gate and norm math (``el``, ``el-fo``), where they apply."""
    if p.kv_shared or p.kv_chunk:
        return {}
    out = {"fo": p._replace(fused_output=True), "r8-fo": p._replace(block_v=8, fused_output=True),
           "nofo": p._replace(fused_output=False)}
    if p.tiles == 1:
        out.update({"el": p._replace(early_load=True), "el-fo": p._replace(early_load=True, fused_output=True)})
    return out


SKIP: set[str] = set()  # backends left out (--skip)
ONLY: set[str] = set()  # candidates timed (--only; empty: all)
SAME_SIZE_COPY: dict[tuple[int, str, int], float] = {}  # (H, state, B) -> TB/s of a copy of the state's bytes
CONFIG_OF: dict[tuple[str, str, int, int, str], str] = {}  # (layout, state, B, HV, backend) -> its DecodeConfig


def backends(layout: str, sdt: torch.dtype, B: int, HV: int, ours: dict[str, Kernel], peers: dict[str, Binder],
             candidates: bool) -> dict[str, Binder]:
    """Ours (``OP.ours()``: only ``OURS`` on KV), candidates, then peers (VK only)."""
    # KV: only ours (and the reference that stands in for it in a GDN dry run)
    out = {n: our_binder(k) for n, k in ours.items() if n not in SKIP and (layout == "VK" or n in (OURS, "torch"))}
    if OURS in out:
        from kda_kernels.triton_decode import pick_config

        gdn = {"gdn": True} if OP.name == "gdn" and "gdn" in inspect.signature(pick_config).parameters else {}
        CONFIG_OF[(layout, str(sdt)[6:], B, HV, OURS)] = repr(pick_config(B, HV, V, sdt, layout, **gdn, **device_kw()))
    if candidates and OURS in ours:
        from kda_kernels import triton_decode

        kernel = getattr(triton_decode, OP.triton_kernel)
        for cname, cfg in candidate_configs(layout, sdt, B, HV).items():
            if not ONLY or cname in ONLY:
                out[f"{OURS}:{cname}"] = our_binder(kernel, config=cfg)
                CONFIG_OF[(layout, str(sdt)[6:], B, HV, f"{OURS}:{cname}")] = repr(cfg)
    if layout == "VK":
        out.update({n: b for n, b in peers.items() if n not in SKIP})
    return out


# --- correctness ----------------------------------------------------------------------------------


def tolerances(sdt: torch.dtype) -> tuple[tuple[float, float], tuple[float, float]]:
    """(atol, rtol) for out and for the state. out is bf16 here, so one bf16 ulp (at most 2^-7
    relative) on top of 1e-4 (fp32 state) / 2e-3 (bf16 state), the benchmark tolerances of
    docs/semantics.md: two fp32 results a rounding apart may land on neighbouring bf16 values. The
    state: 1e-5 (fp32), or 2e-3 plus one ulp (bf16)."""
    if sdt == torch.float32:
        return (1e-4, 2**-7), (1e-5, 1e-5)
    return (2e-3, 2**-7), (2e-3, 2**-7)


def check(binders: dict[str, Binder], H: int, sdt: torch.dtype, B: int, layout: str,
          device: torch.device) -> dict[str, tuple[float | None, float | None, bool | None, str]]:
    """Each backend on a fresh copy of one small pool: max errors vs the reference (``OP.reference``),
    and whether the slots it should not touch are bit-identical (neither, for a candidate this machine
    cannot run)."""
    from kda_kernels.triton_configs import ConfigUnsupported

    N = 2 * B + 8
    x = device_inputs(H, B, N, sdt, layout, device, seed=B + H)
    idx = slot_sets(N, B, 1, device, seed=7)[0]
    pristine = x["state"].clone()
    ref = dict(x, out=x["out"].clone(), state=x["state"].clone())
    our_binder(OP.reference())(ref)(idx)
    used = torch.zeros(N, dtype=torch.bool, device=device)
    used[idx.long()] = True
    (oa, orr), (sa, sr) = tolerances(sdt)
    results: dict[str, tuple[float | None, float | None, bool | None, str]] = {}
    for name, bind in binders.items():
        x["state"].copy_(pristine)
        x["out"].fill_(float("nan"))
        try:
            bind(x)(idx)
            torch.cuda.synchronize()
        except ConfigUnsupported as exc:  # a candidate this machine cannot run: not a wrong answer
            results[name] = (None, None, None, f"not here: {str(exc).partition('cannot run here: ')[2][:100]}")
            continue
        except Exception as exc:
            results[name] = (None, None, False, f"failed: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        out, st = x["out"].float(), x["state"][used].float()
        r_out, r_st = ref["out"].float(), ref["state"][used].float()
        e_out = (out - r_out).abs().max().item()
        e_st = (st - r_st).abs().max().item()
        ok = bool(torch.isclose(out, r_out, atol=oa, rtol=orr).all()) and \
            bool(torch.isclose(st, r_st, atol=sa, rtol=sr).all()) and \
            torch.equal(x["state"][~used].view(torch.uint8), pristine[~used].view(torch.uint8))
        results[name] = (e_out, e_st, ok, "" if ok else "MISMATCH")
    del x, ref, pristine
    return results


# --- timing ---------------------------------------------------------------------------------------


def capture(launch: Launch, index_sets: list[torch.Tensor]) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for idx in index_sets[:3]:
            launch(idx)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for idx in index_sets:
            launch(idx)
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_ms(g: torch.cuda.CUDAGraph, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def time_interleaved(graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]]) -> dict[str, float]:
    """Median µs per call for each graph (of ``calls`` calls), sampled round-robin."""
    reps = {n: max(1, math.ceil(MIN_SAMPLE_MS / replay_ms(g, 1))) for n, (g, _) in graphs.items()}
    samples: dict[str, list[float]] = {n: [] for n in graphs}
    for _ in range(SAMPLES):
        for n, (g, calls) in graphs.items():
            samples[n].append(replay_ms(g, reps[n]) * 1e3 / calls)
    return {n: statistics.median(v) for n, v in samples.items()}


def copy_bandwidth(device: torch.device, warm_s: float = 0.0, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy (``dst.copy_(src)`` of ``nbytes``, eager launches timed with CUDA events), read +
    write counted, in TB/s: the median of SAMPLES timings of 10 copies, after ``warm_s`` seconds of
    copying (an idle GPU starts at a low clock). Not in a graph: there torch's copy becomes a memcpy
    node, which measured ~2.8 TB/s against ~4.2 for the copy kernel eager launches run."""
    n = nbytes // 4  # fp32 elements
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t0 = time.time()
    while True:
        dst.copy_(src)
        torch.cuda.synchronize()
        if time.time() - t0 >= warm_s:
            break
    times = []
    for _ in range(SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 10)
    del src, dst
    return 2 * n * 4 / (statistics.median(times) * 1e-3) / 1e12


# --- compiling ahead (--warm) ----------------------------------------------------------------------


def launch_shapes(batches: list[int], heads: list[int], states: list[torch.dtype], layouts: list[str],
                  candidates: bool) -> list[tuple[int, str, str, Any]]:
    """(H, state dtype name, layout, DecodeConfig) of every Triton launch the sweep makes: the picked
    shape of each row and, with ``candidates``, the (--only) candidates."""
    from kda_kernels.triton_decode import pick_config

    gdn = {"gdn": True} if OP.name == "gdn" and "gdn" in inspect.signature(pick_config).parameters else {}
    gdn.update(device_kw())
    found: dict[tuple[int, str, str, Any], None] = {}
    for H in heads:
        for sdt in states:
            for B in batches:
                for layout in layouts:
                    HV = OP.hv_per_h * H
                    cfgs = [pick_config(B, HV, V, sdt, layout, **gdn)]
                    if candidates:
                        cfgs += [c for n, c in candidate_configs(layout, sdt, B, HV).items() if not ONLY or n in ONLY]
                    for c in cfgs:
                        found[(H, str(sdt)[6:], layout, c)] = None
    return list(found)


def _warm_one(op: str, device_name: str, H: int, state: str, layout: str, cfg: Any) -> str:
    """Compile one launch shape (run in a worker process): two tiny launches, with a pool size that is
    not and one that is a multiple of 16 (Triton specializes N on that, and the sweep uses both)."""
    global OP
    OP = OPS[op]()
    from kda_kernels import triton_decode

    kernel = getattr(triton_decode, OP.triton_kernel)
    device = torch.device(device_name)
    try:
        for N in (8, 16):
            x = device_inputs(H, 2, N, getattr(torch, state), layout, device)
            our_binder(kernel, config=cfg)(x)(torch.arange(2, dtype=torch.int32, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # reported; the sweep then checks (and times) it as it would anyway
        return f"H={H} {state} {layout} {cfg}: {type(exc).__name__}: {str(exc)[:120]}"
    return ""


def warm(workers: int, shapes: list[tuple[int, str, str, Any]], device: str = "cuda") -> None:
    """Compile the sweep's Triton launch shapes in ``workers`` processes into Triton's on-disk cache,
    so the sweep (one process) loads them instead of compiling them one after the other."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        errors = [e for e in pool.map(_warm_one, *zip(*[(OP.name, device, *s) for s in shapes], strict=True)) if e]
    for e in errors:
        print(f"# warm: {e}", file=sys.stderr)
    print(f"# warm: {len(shapes)} launch shapes compiled in {workers} processes in {time.time() - t0:.1f}s, "
          f"{len(errors)} failed", file=sys.stderr)


# --- the sweep ------------------------------------------------------------------------------------


def time_row(binders: dict[str, Binder], H: int, sdt: torch.dtype, B: int, layout: str, device: torch.device,
             l2_bytes: int) -> dict[tuple[str, str], float | str]:
    """(variant, backend) -> µs per call (or the error) for hot and cold, on one shared pool."""
    S = cold_sets(B, OP.hv_per_h * H, sdt.itemsize, l2_bytes)
    x = device_inputs(H, B, max(S * B, 64), sdt, layout, device)
    sets = list(slot_sets(x["state"].shape[0], B, S, device))
    results: dict[tuple[str, str], float | str] = {}
    for variant, index_sets in (("hot", [sets[0]] * HOT_CALLS), ("cold", sets)):
        graphs = {}
        for name, bind in binders.items():
            try:
                graphs[name] = (capture(bind(x), index_sets), len(index_sets))
            except Exception as exc:
                torch.cuda.synchronize()
                results[(variant, name)] = f"no graph: {type(exc).__name__}: {str(exc)[:80]}"
        for name, us in time_interleaved(graphs).items():
            results[(variant, name)] = us
        del graphs
    del x, sets
    torch.cuda.empty_cache()
    return results


def sweep(device: torch.device, batches: list[int], heads: list[int], states: list[torch.dtype], layouts: list[str],
          candidates: bool, on_row: Callable[[list[Row]], None]) -> list[Row]:
    peers, missing = decode_peers.load_peers(OP.name)
    ours, missing_ours = OP.ours()
    for kind, why_not in (("backend", missing_ours), ("peer", missing)):
        for name, why in why_not.items():
            print(f"# {OP.name} {kind} {name}: unavailable ({why})", file=sys.stderr)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    rows: list[Row] = []
    for H in heads:
        HV = OP.hv_per_h * H
        for sdt in states:
            for B in batches:
                for layout in layouts:
                    t0 = time.time()
                    binders = backends(layout, sdt, B, HV, ours, peers, candidates)
                    checks = check(binders, H, sdt, B, layout, device)
                    # not timed: the untimed, any whose check raised (no capture of a failing launch) and any
                    # candidate this machine cannot run
                    timed = {n: b for n, b in binders.items()
                             if n not in OP.untimed and not checks[n][3].startswith(("failed", "not here"))}
                    times: dict[tuple[str, str], float | str] = {
                        **time_row(timed, H, sdt, B, layout, device, l2),
                        **{(v, n): OP.untimed[n] for v in ("hot", "cold") for n in binders if n in OP.untimed}}
                    if B >= 256 and layout == "VK":  # a copy of the state's bytes: the ceiling at this size
                        state_bytes = B * HV * V * K * sdt.itemsize
                        SAME_SIZE_COPY[(H, str(sdt)[6:], B)] = copy_bandwidth(device, nbytes=state_bytes)
                    rows += make_rows(checks, times, layout, H, sdt, B)
                    print(f"# {OP.name} H={H} HV={HV} {sdt} B={B} {layout}: {time.time() - t0:.1f}s "
                          + " ".join(f"{n}={times.get(('cold', n))!s:.6}" for n in binders), file=sys.stderr)
                    on_row(rows)
    return rows


def make_rows(checks: dict[str, tuple[float | None, float | None, bool | None, str]],
              times: dict[tuple[str, str], float | str], layout: str, H: int, sdt: torch.dtype, B: int) -> list[Row]:
    """The hot and cold rows of one (H, state, B, layout): the check's verdict and the timing (or why none)."""
    HV = OP.hv_per_h * H
    nbytes = traffic_bytes(B, H, HV, sdt.itemsize, ACTIVATIONS.itemsize, gate_width())
    rows = []
    for variant in ("hot", "cold"):
        for name, (e_out, e_st, ok, note) in checks.items():
            t = times.get((variant, name))
            us = t if isinstance(t, float) else None
            note = note or (t if isinstance(t, str) else "")
            tb = None if us is None else nbytes / (us * 1e-6) / 1e12
            rows.append(Row(variant, layout, name, H, HV, str(sdt)[6:], B, us, tb, None, e_out, e_st, ok, note))
    return rows


# --- eager path -----------------------------------------------------------------------------------


def wall_us_per_call(fn: Callable[[], None], calls: int = 300) -> float:
    """Median wall-clock µs per call of back-to-back eager calls (device synced at the end)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def eager_paths(device: torch.device) -> tuple[str, dict[str, tuple[Callable[[], None], str | None]]]:
    """The op's name and the B=1 eager paths (``OP.eager_shape``, fp32 state): ``"direct"`` (our
    kernel launched directly) and ``"off"``, ``"check"``, ``"strict"`` (the op, to be run with that
    mode set around the timed loop), each as ``(call, mode)``."""
    call, kernel, op = OP.eager(device, OURS)
    state, mq = call["initial_state"], call["mixed_qkv"]
    HV, Vs, Ks = state.shape[1:]
    x = dict(call, state=state, H=(mq.shape[1] - HV * Vs) // (2 * Ks), layout="VK")
    direct = our_binder(kernel)(x)
    idx = call["ssm_state_indices"]

    def via_op() -> None:
        op(**call, backend=OURS)

    paths: dict[str, tuple[Callable[[], None], str | None]] = {"direct": (lambda: direct(idx), None)}
    paths.update({mode: (via_op, mode) for mode in ("off", "check", "strict")})
    return op.__name__, paths


def timed_in_mode(fn: Callable[[], None], mode: str | None, calls: int = 300) -> float:
    """:func:`wall_us_per_call` with ``mode`` (if any) set around the timed loop, not per call."""
    if mode is None:
        return wall_us_per_call(fn, calls)
    with kc.mode(mode):  # type: ignore[arg-type]
        return wall_us_per_call(fn, calls)


def eager_overhead(device: torch.device) -> list[tuple[str, float]]:
    """µs per eager call at B=1 (``OP.eager_shape``, fp32 state), interleaved three times: the
    contract's modes against our kernel launched directly. The mode is set around each timed loop
    (as ``KDA_CONTRACTS_MODE`` or a ``kc.mode`` block around a serving loop sets it), not per call."""
    name, paths = eager_paths(device)
    labels = {"direct": f"{OURS} kernel called directly (launch only)",
              **{m: f"kc.{name}(backend='{OURS}'), {m} mode" for m in ("off", "check", "strict")}}
    got: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(3):
        for p, (fn, mode) in paths.items():
            got[p].append(timed_in_mode(fn, mode))
    return [(labels[p], statistics.median(v)) for p, v in got.items()]


def eager_or_none(device: torch.device) -> list[tuple[str, float]]:
    """The eager-path figures, or none (and why, on stderr) when the op's call cannot run here."""
    try:
        return eager_overhead(device)
    except Exception as exc:  # e.g. GDN's op without a "triton" backend registered yet
        print(f"# eager path skipped: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return []


# --- report ---------------------------------------------------------------------------------------


def add_ratios(rows: list[Row], copy_tbps: float) -> list[dict[str, Any]]:
    """Rows as dicts with % of copy, and for ours: ours / best peer and ours / the main peer (> 1: faster)."""
    peers = OP.peers
    out = []
    key = lambda r: (r.variant, r.layout, r.H, r.state, r.B)  # noqa: E731
    by_key: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault(key(r), {})[r.backend] = r
    for r in rows:
        d = asdict(r)
        d["pct_copy"] = None if r.tbps is None else 100 * r.tbps / copy_tbps
        same = SAME_SIZE_COPY.get((r.H, r.state, r.B))
        d["same_size_copy_tbps"] = same
        d["pct_same_size_copy"] = None if r.tbps is None or same is None else 100 * r.tbps / same
        group = by_key[key(r)]
        peer_us = [us for p in peers if p in group and (us := group[p].us) is not None]
        vk = by_key.get((r.variant, "VK", r.H, r.state, r.B), {}).get(r.backend)
        d["vs_best_peer"] = None if not peer_us or r.us is None else min(peer_us) / r.us
        main = group.get(OP.main_peer)
        d["vs_main_peer"] = None if main is None or main.us is None or r.us is None else main.us / r.us
        d["kv_vs_vk"] = None if r.layout != "KV" or vk is None or vk.us is None or r.us is None else vk.us / r.us
        if (cfg := CONFIG_OF.get((r.layout, r.state, r.B, r.HV, r.backend))) is not None:
            d["config"] = cfg  # our launch shape (the pick, or a candidate's)
        out.append(d)
    return out


def report(data: list[dict[str, Any]], copy_tbps: float, eager: list[tuple[str, float]], cmd: str,
           facts: str | None = None, method: str | None = None) -> str:
    """The op's Markdown section (this process's run facts and method unless given)."""
    return render(data, copy_tbps, eager, cmd, method or method_text(), section=SECTION or OP.section,
                  summary_lines=OP.summary(data), main_peer=OP.main_peer, eager_shape=OP.eager_shape, facts=facts)


def save_json(path: Path, rows: list[Row], copy_tbps: float, cmd: str, eager: list[tuple[str, float]]) -> None:
    """Every row and the run's facts (what --plot and --report read)."""
    doc = dict(op=OP.name, main_peer=OP.main_peer, device=torch.cuda.get_device_name(), facts=run_facts(),
               method=method_text(), copy_tbps=copy_tbps, command=cmd, rows=add_ratios(rows, copy_tbps), eager=eager)
    path.write_text(json.dumps(doc, indent=1))


def report_from_json(paths: list[str], out: str | None) -> int:
    """The section from one or more --json files of one op (a sweep split over several commands):
    rows together, the copy ceiling the best of the runs' (% of copy recomputed against it)."""
    global OP
    docs = [json.loads(Path(p).read_text()) for p in paths]
    OP = OPS[docs[0].get("op", "kda")]()
    copy_tbps = max(d["copy_tbps"] for d in docs)
    data = [dict(r, pct_copy=None if r["tbps"] is None else 100 * r["tbps"] / copy_tbps)
            for d in docs for r in d["rows"]]
    # JSON gives each (label, µs) pair as a list; render only unpacks them
    eager: list[tuple[str, float]] = next((d["eager"] for d in docs if d.get("eager")), [])
    text = report(data, copy_tbps, eager, "; ".join(d["command"] for d in docs), docs[0].get("facts"),
                  docs[0].get("method"))
    print(text)
    if out:
        replace_section(Path(out), SECTION or OP.section, text)
    return 0


def dry_run(out: str | None, json_out: str | None) -> int:
    """Exercise the sweep's code paths on the CPU: Triton kernels under its interpreter, CUDA timing
    and graphs replaced by stubs; the section and rows go to ``out`` and ``json_out`` when given.
    For GDN the reference is also timed as a backend ("torch", checked against itself), so the rows
    and the report exist before any GDN kernel does."""
    global SAMPLES, OP, ACTIVATIONS
    SAMPLES = 1
    # fp32 activations: the Triton interpreter truncates fp32 -> bf16 where the GPU rounds, which
    # would move GDN's beta (sigmoid(b) rounded to b's dtype) by one bf16 ulp against the reference.
    ACTIVATIONS = torch.float32
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel module is first imported
    if OP.name == "gdn":
        real = OP.ours

        def with_reference() -> tuple[dict[str, Kernel], dict[str, str]]:
            found, missing = real()
            return {**found, "torch": OP.reference()}, missing

        OP = replace(OP, ours=with_reference)
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *a: "cpu (dry run)"  # type: ignore[assignment]
    torch.cuda.get_device_properties = lambda *a: type("P", (), {"L2_cache_size": 1 << 20})  # type: ignore

    def fake_time(graphs: dict[str, tuple[Any, int]]) -> dict[str, float]:
        return {n: float(1 + i) for i, n in enumerate(graphs)}

    globals().update(capture=lambda launch, sets: launch(sets[0]), time_interleaved=fake_time)
    globals()["K"] = globals()["V"] = 8
    kc.adapters.refresh()
    SKIP.add("helion")  # its pinned configs do not run under the CPU interpreter
    rows = sweep(torch.device("cpu"), [1, 2], [2], [torch.float32, torch.bfloat16], ["VK", "KV"], True,
                 lambda rows: None)
    data = add_ratios(rows, 1.0)
    text = report(data, 1.0, [("dry", 0.0)], "dry")
    print(text)
    if out:
        replace_section(Path(out), OP.section, text)
    if json_out:
        save_json(Path(json_out), rows, 1.0, "dry", [("dry", 0.0)])
    bad = [d for d in data if d["correct"] is False]
    print(f"dry run: {len(data)} rows, {len(bad)} incorrect", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the Markdown table here (replacing its section)")
    p.add_argument("--json", help="write every row (and the copy bandwidth) here, updated after each row")
    p.add_argument("--op", choices=sorted(OPS), default="kda", help="the op to measure (default: kda)")
    p.add_argument("--quick", action="store_true", help="B in {1, 256}, the first of --heads only")
    p.add_argument("--candidates", action="store_true", help="also time extra Triton launch shapes (tuning)")
    p.add_argument("--only", default="", help="comma-separated candidate names: time only these (with --candidates)")
    p.add_argument("--warm", type=int, default=0, metavar="N", help="first compile every Triton launch shape of "
                   "the sweep in N processes (Triton's on-disk cache), then time in this one")
    p.add_argument("--no-kv", action="store_true", help="skip the KV-layout rows")
    p.add_argument("--no-eager", action="store_true", help="skip the eager-path figures")
    p.add_argument("--heads", help="H values (default: 32,16,4 for kda; 16,8 for gdn, with HV = 2H)")
    p.add_argument("--batches", default="1,8,64,256,1024")
    p.add_argument("--states", default="float32,bfloat16")
    p.add_argument("--skip", default="", help="comma-separated backends or peers to leave out")
    p.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="draw the picture from a --json file and exit")
    p.add_argument("--dry", action="store_true", help="CPU smoke test of this script (tiny sizes, no timing)")
    p.add_argument("--report", nargs="+", metavar="JSON", help="write the section (--out) from --json files of one "
                   "op, e.g. a sweep split by --heads over several commands, and exit")
    p.add_argument("--section", help="the Markdown heading of the section (--out, --report) instead of the op's, "
                   "e.g. '## Packed decode kernels (GPU, H100)' for a second card's table")
    args = p.parse_args(argv)
    global OP, SECTION
    OP = OPS[args.op]()
    SECTION = args.section
    if args.plot:
        plot(Path(args.plot[0]), Path(args.plot[1]))
        return 0
    if args.report:
        return report_from_json(args.report, args.out)
    SKIP.update(filter(None, args.skip.split(",")))
    ONLY.update(filter(None, args.only.split(",")))
    if args.dry:
        return dry_run(args.out, args.json)
    if not torch.cuda.is_available():
        print("benchmarks/decode.py needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    batches = [1, 256] if args.quick else [int(b) for b in args.batches.split(",")]
    heads = [int(h) for h in (args.heads or OP.heads).split(",")][: 1 if args.quick else None]
    layouts = ["VK"] if args.no_kv else ["VK", "KV"]
    states = [getattr(torch, name) for name in args.states.split(",")]
    if args.warm:
        warm(args.warm, launch_shapes(batches, heads, states, layouts, args.candidates))
    copy_tbps = copy_bandwidth(device, warm_s=2.0)
    print(f"# copy bandwidth {copy_tbps:.2f} TB/s", file=sys.stderr)
    cmd = "python " + " ".join(sys.argv)

    eager = [] if args.no_eager else eager_or_none(device)
    for label, us in eager:
        print(f"# eager: {label}: {us:.1f} µs", file=sys.stderr)

    def save(rows: list[Row]) -> None:
        if args.json:
            save_json(Path(args.json), rows, copy_tbps, cmd, eager)

    rows = sweep(device, batches, heads, states, layouts, args.candidates, save)
    copy_after = copy_bandwidth(device, warm_s=0.5)
    print(f"# copy bandwidth after the sweep {copy_after:.2f} TB/s", file=sys.stderr)
    copy_tbps = max(copy_tbps, copy_after)  # the ceiling: the better of the two
    save(rows)
    text = report(add_ratios(rows, copy_tbps), copy_tbps, eager, cmd)
    print(text)
    if args.out:
        replace_section(Path(args.out), SECTION or OP.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
