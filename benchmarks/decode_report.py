"""The report of benchmarks/decode.py: KDA's summary against sglang's Helion kernel, the Markdown
table and the picture (``--plot``), from the rows as dicts (``decode.add_ratios``). GDN's summary
is in decode_gdn.py.

Example::

    render(data, copy_tbps, eager, "python benchmarks/decode.py", method_text)   # -> Markdown section
"""

from __future__ import annotations

import datetime
import io
import json
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

SECTION = "## Packed decode kernels (GPU)"
OURS = "triton"  # what backend="auto" runs on CUDA


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def summary(data: list[dict[str, Any]]) -> list[str]:
    """KDA: ours against sglang's Helion kernel (its main peer), and % of copy at B ≥ 256."""
    ours = [d for d in data if d["backend"] == OURS and d["layout"] == "VK" and d["vs_main_peer"]]
    if not ours:
        return []
    worst = min(ours, key=lambda d: d["vs_main_peer"])
    geo = math.exp(statistics.fmean(math.log(d["vs_main_peer"]) for d in ours))
    big = [d["pct_copy"] for d in ours if d["B"] >= 256 and d["state"] == "float32"]
    lines = [f"Ours ({OURS}) / sglang-helion over {len(ours)} rows (hot and cold): geometric mean "
             f"**{geo:.3f}×**, worst **{worst['vs_main_peer']:.3f}×** ({worst['variant']}, H={worst['H']}, "
             f"{worst['state']}, B={worst['B']})."]
    if big:
        lines.append(f"Ours at B ≥ 256 with fp32 state: {min(big):.1f}–{max(big):.1f} % of copy.")
        lines += ["", "fp32 state, B ≥ 256 (cold): ours and sglang-helion against the 2 GiB copy and against a copy "
                  "of the same number of state bytes (timed the same way, right after the row):", "",
                  "| H | B | ours TB/s | ours % of copy | sgl-helion % of copy | same-size copy TB/s | "
                  "ours % of same-size copy |", "|---|---|---|---|---|---|---|"]
        peers = {(d["H"], d["B"], d["variant"]): d for d in data
                 if d["backend"] == "sglang-helion" and d["layout"] == "VK" and d["state"] == "float32"}
        for d in ours:
            if d["B"] >= 256 and d["state"] == "float32" and d["variant"] == "cold":
                sh = peers.get((d["H"], d["B"], "cold"), {})
                lines.append(f"| {d['H']} | {d['B']} | {fmt(d['tbps'], '.2f')} | {fmt(d['pct_copy'], '.1f')} | "
                             f"{fmt(sh.get('pct_copy'), '.1f')} | {fmt(d['same_size_copy_tbps'], '.2f')} | "
                             f"{fmt(d['pct_same_size_copy'], '.1f')} |")
        lines.append("")
    kv = [d["kv_vs_vk"] for d in data if d["backend"] == OURS and d["kv_vs_vk"]]
    if kv:
        lines.append(f"Ours, KV layout / VK layout speed (same rows): {min(kv):.3f}–{max(kv):.3f}×.")
    return lines


def run_facts() -> str:
    """When, on what and with which versions this process runs (the first line under the heading)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = [f"torch {torch.__version__}"]
    for dist in ("triton", "helion", "fla-core"):
        try:
            versions.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return (f"Run {datetime.date.today().isoformat()} on {torch.cuda.get_device_name()} · {', '.join(versions)} · "
            f"Python {platform.python_version()}")


def render(data: list[dict[str, Any]], copy_tbps: float, eager: list[tuple[str, float]], cmd: str, method: str, *,
           section: str = SECTION, summary_lines: list[str] | None = None, main_peer: str = "sglang-helion",
           eager_shape: str = "H = 32", facts: str | None = None) -> str:
    """The Markdown section under ``section``: run facts (``run_facts()`` unless ``facts``), ``method``
    (how it was measured), the summary (KDA's unless ``summary_lines``), every row (the "vs" column
    against ``main_peer``), the eager path."""
    lines = [
        section, "", facts or run_facts(), f"Command: `{cmd}`", "",
        f"Device-to-device copy measured in the same run (read + write; the better of before and after the "
        f"sweep): **{copy_tbps:.2f} TB/s**. {method}", "",
    ]
    lines += [*(summary(data) if summary_lines is None else summary_lines), ""]
    gva = any(d["HV"] != d["H"] for d in data)
    lines += [f"| variant | layout | backend | {'H/HV' if gva else 'H'} | state | B | µs | TB/s | % of copy | "
              f"vs peer | vs {main_peer.replace('sglang-', 'sgl-')} | err out | err state | ok | note |",
              "|" + "---|" * 15]
    for d in data:
        heads = f"{d['H']}/{d['HV']}" if gva else d["H"]
        lines.append(
            f"| {d['variant']} | {d['layout']} | {d['backend']} | {heads} | {d['state']} | {d['B']} | "
            f"{fmt(d['us'], '.1f')} | {fmt(d['tbps'], '.2f')} | {fmt(d['pct_copy'], '.0f')} | "
            f"{fmt(d['vs_best_peer'], '.3f')} | {fmt(d['vs_main_peer'], '.3f')} | {fmt(d['err_out'], '.1e')} | "
            f"{fmt(d['err_state'], '.1e')} | {'—' if d['correct'] is None else ('✓' if d['correct'] else '✗')} | "
            f"{d['note']} |")
    if eager:
        lines += ["", f"Eager path at B = 1, {eager_shape}, fp32 state (µs per call, wall clock, median of 3 "
                  "interleaved rounds of 7×300 calls; the mode set around each timed loop, not per call):", "",
                  "| path | µs/call |", "|---|---|"]
        lines += [f"| {label} | {us:.1f} |" for label, us in eager]
    return "\n".join(lines) + "\n"


def plot(json_path: Path, png: Path) -> None:
    """% of copy against B, one line per backend and peer (VK), hot and cold panels, ceiling drawn
    (KDA or GDN, as the file's ``op`` says; files without it are KDA's). ``json_path`` may name several
    files of one op, comma-separated (a sweep split over several commands; the best copy is the ceiling)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [json.loads(Path(p).read_text()) for p in str(json_path).split(",")]
    doc = dict(docs[0], copy_tbps=max(d["copy_tbps"] for d in docs), rows=[r for d in docs for r in d["rows"]])
    rows = [d for d in doc["rows"] if d["layout"] == "VK" and d["us"] and ":" not in d["backend"]]
    combos = sorted({(d["H"], d["state"]) for d in rows}, key=lambda c: (-c[0], c[1]))
    fig, axes = plt.subplots(len(combos), 2, figsize=(9, 2.3 * len(combos)), sharex=True, sharey=True, squeeze=False)
    names = sorted({d["backend"] for d in rows}, key=lambda n: (n != OURS, n))
    for i, (H, st) in enumerate(combos):
        for j, variant in enumerate(("hot", "cold")):
            ax = axes[i][j]
            ax.axhline(100, color="k", lw=0.8, ls="--")
            for n in names:
                pts = sorted((d["B"], 100 * d["tbps"] / doc["copy_tbps"]) for d in rows
                             if d["backend"] == n and d["H"] == H and d["state"] == st and d["variant"] == variant)
                if pts:
                    ours = n == OURS
                    ax.plot(*zip(*pts, strict=False), marker="o", ms=3 if ours else 2, lw=3 if ours else 1, label=n,
                            zorder=1 if ours else 2)
            ax.set_xscale("log", base=2)
            hv = next((d.get("HV", H) for d in rows if d["H"] == H), H)
            heads = f"H={H}" if hv == H else f"H={H}, HV={hv}"
            ax.set_title(f"{variant}, {heads}, {st} state", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("% of copy", fontsize=7)
    axes[-1][0].set_xlabel("B (requests)", fontsize=7)
    axes[-1][1].set_xlabel("B (requests)", fontsize=7)
    axes[0][1].legend(fontsize=6, loc="lower right")
    op = doc.get("op", "kda").upper()
    fig.suptitle(f"{op} packed decode on {doc['device']}: effective bandwidth / copy ({doc['copy_tbps']:.2f} TB/s, "
                 "dashed)", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=72)
    from PIL import Image  # matplotlib's own dependency: a 64-colour palette keeps the file small

    Image.open(buf).convert("RGB").quantize(colors=64).save(png, optimize=True)
