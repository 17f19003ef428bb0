"""The GDN (Gated DeltaNet, Qwen3-Next) part of benchmarks/decode.py (``--op gdn``): our GDN kernels,
the oracle, the eager path and the summary against the targets of issue 14. decode.py assembles
these into its op description; this module never imports decode.py (which runs as ``__main__``).

Example::

    kernels, missing = load_ours()            # {"triton": fn, ...}, {"helion": "why not"}
    lines = summary(rows)                     # the targets table of the Markdown section
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

SECTION = "## GDN packed decode kernels (GPU)"
HV_PER_H = 2  # Qwen3-Next: 16 key heads, 32 value heads (per TP rank both divided)
BACKENDS = ("triton", "helion", "fla")  # kda_kernels.<name>_decode.gdn_packed_decode
# Checked for correctness but never timed: a host sync, which no CUDA graph can hold.
UNTIMED = {"fla": "checked, not timed: the fla adapter compacts valid rows on the host (a sync)"}
PEERS = ("sglang-triton", "fla-oop")
MAIN_PEER = "sglang-triton"
METHOD = ("HV = 2H (GVA, as Qwen3-Next), one gate per value head (a [B, HV], dt_bias [HV]). sglang-triton: "
          "sglang's Triton GDN packed decode. fla-oop: fla's fused_recurrent_gated_delta_rule, out of place (it "
          "has no indexed in-place entry): gather the slots, run it, scatter its fp32 final state back and copy "
          "its output (all timed), with beta = sigmoid(b) rounded to bf16 made once outside the timing.")


def load_ours() -> tuple[dict[str, Callable[..., None]], dict[str, str]]:
    """Our GDN kernels that load here (name -> kernel with the interface of kernels/INTERFACE.md)
    and, for the others, why not."""
    found: dict[str, Callable[..., None]] = {}
    missing: dict[str, str] = {}
    for name in BACKENDS:
        try:
            module = importlib.import_module(f"kda_kernels.{name}_decode")
            kernel = module.gdn_packed_decode
            ok, why = module.is_available() if hasattr(module, "is_available") else (True, "")
        except Exception as exc:  # not written yet, or breaks on import: reported and skipped
            ok, why = False, f"{type(exc).__name__}: {str(exc)[:120]}"
        if ok:
            found[name] = kernel
        else:
            missing[name] = why
    return found, missing


def reference() -> Callable[..., None]:
    """The oracle (``kda_kernels.gdn_reference``) behind our kernel interface (it has no lower_bound)."""
    from kda_kernels.gdn_reference import gdn_packed_decode

    def run(*args: Any, lower_bound: float | None = None, **kwargs: Any) -> None:
        assert lower_bound is None, "GDN has no bounded gate"
        gdn_packed_decode(*args, **kwargs)

    return run


def eager_setup(device: torch.device, ours: str) -> tuple[dict[str, Any], Callable[..., None], Callable[..., Any]]:
    """A Qwen3-Next-80B-A3B TP1 call at B = 1 (H = 16, HV = 32, fp32 state) for the eager-path figures:
    (call by name in sglang order, our kernel ``ours``, ``kc.gdn_packed_decode``)."""
    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call

    cfg = kc.GDNConfig.preset("qwen3-next-80b-a3b")
    call = make_decode_call(cfg, 1, 64, device=device)
    del call["lower_bound"]
    HV = cfg.local_num_v_heads
    g = torch.Generator().manual_seed(1)
    call["a"] = torch.randn(1, HV, generator=g).to(device=device, dtype=call["a"].dtype)  # GDN's gate
    call["dt_bias"] = torch.randn(HV, generator=g).to(device)
    kernel = importlib.import_module(f"kda_kernels.{ours}_decode").gdn_packed_decode
    return dict(call, config=cfg), kernel, kc.gdn_packed_decode


# --- the summary: issue 14's targets -------------------------------------------------------------


def _best_ours(data: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(fastest of our backends, sglang's row) per VK row key where both were timed."""
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    for d in data:
        if d["layout"] == "VK" and d["us"] and ":" not in d["backend"]:
            groups.setdefault((d["variant"], d["H"], d["state"], d["B"]), {})[d["backend"]] = d
    pairs = []
    for group in groups.values():
        ours = [d for n, d in group.items() if n not in PEERS and d["correct"]]
        if ours and MAIN_PEER in group:
            pairs.append((min(ours, key=lambda d: d["us"]), group[MAIN_PEER]))
    return pairs


def _where(d: dict[str, Any]) -> str:
    return f"{d['variant']}, H={d['H']}, {d['state']}, B={d['B']}"


def _ratio_target(pairs: list, batches: set[int], floor: float, label: str) -> list[str]:
    got = [(p["us"] / o["us"], o) for o, p in pairs if o["B"] in batches]
    if not got:
        return [f"| {label} | no rows with both | — |"]
    worst, at = min(got, key=lambda t: t[0])
    geo = math.exp(statistics.fmean(math.log(r) for r, _ in got))
    below = sum(r < floor for r, _ in got)
    verdict = "pass" if worst >= floor else f"**miss** ({below} of {len(got)} rows)"
    return [f"| {label} | worst {worst:.3f}× ({_where(at)}, {at['backend']}); geometric mean {geo:.3f}× over "
            f"{len(got)} rows | {verdict} |"]


def _copy_target(data: list[dict[str, Any]], pairs: list, state: str, floor: float) -> list[str]:
    label = f"≥ {floor:.0f} % of copy at B ≥ 256, {state} state"
    ours = [o for o, _ in pairs if o["B"] >= 256 and o["state"] == state]
    if not ours:
        return [f"| {label} | no rows | — |"]
    worst = min(ours, key=lambda d: d["pct_copy"])
    peer = [p["pct_copy"] for _, p in pairs if p["B"] >= 256 and p["state"] == state]
    verdict = "pass" if worst["pct_copy"] >= floor else "**miss**"
    return [f"| {label} | ours {worst['pct_copy']:.1f}–{max(d['pct_copy'] for d in ours):.1f} % (worst: "
            f"{_where(worst)}); sglang-triton {min(peer):.1f}–{max(peer):.1f} % | {verdict} |"]


def summary(data: list[dict[str, Any]]) -> list[str]:
    """Issue 14's targets, from the VK rows: the best of our backends per row against sglang's
    Triton kernel, and its share of the copy bandwidth at B ≥ 256."""
    pairs = _best_ours(data)
    if not pairs:
        return ["No row has both one of our GDN kernels and sglang-triton timed: no targets to check."]
    lines = ["Against the targets of issue 14 (ours = the fastest of our backends in each row, hot and cold rows; "
             "ratio = sglang-triton's time / ours):", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += _ratio_target(pairs, {8, 64, 256}, 1.03, "≥ 1.03× sglang-triton at B ∈ {8, 64, 256}")
    lines += _ratio_target(pairs, {1, 1024}, 1.0, "never slower than sglang-triton at B = 1 and 1024")
    lines += _copy_target(data, pairs, "float32", 95)
    lines += _copy_target(data, pairs, "bfloat16", 92)
    lines += ["", "B ≥ 256 (cold): the best of ours and the peers against the copy (% of copy):", "",
              "| H | HV | state | B | ours | ours % | sglang-triton % | fla-oop % | same-size copy TB/s |",
              "|---|---|---|---|---|---|---|---|---|"]
    fla = {(d["H"], d["state"], d["B"], d["variant"]): d for d in data if d["backend"] == "fla-oop" and d["us"]}
    for o, p in pairs:
        if o["B"] >= 256 and o["variant"] == "cold":
            f = fla.get((o["H"], o["state"], o["B"], "cold"), {})
            lines.append(f"| {o['H']} | {o['HV']} | {o['state']} | {o['B']} | {o['backend']} | {o['pct_copy']:.1f} | "
                         f"{p['pct_copy']:.1f} | {_fmt(f.get('pct_copy'))} | {_fmt(o['same_size_copy_tbps'], '.2f')} |")
    return lines


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)
