"""The packed-decode part of ``kda-contracts docs``: the reference page with the layout pictures,
the per-TP-degree table and the backends; the catalogue of known mistakes with the messages the
library really raises; the SVG pictures. GDN packed decode, the same call with another gate, gets
its sections, pictures and catalogue on the same pages, for its own model
(:mod:`kda_contracts.ops.gdn_decode.docs`). The engine (:mod:`kda_contracts._engine.tools.docs`) describes and
renders the contracts and keeps the folder in step.

Example::

    from kda_contracts import KDAConfig
    from kda_contracts._engine import write_docs as write
    from kda_contracts.ops.packed_decode.docs import generate
    files = generate(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2), "kimi-linear-48b-a3b, tp_size=2")
    write(files, "docs/generated")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._engine import Backend, Section, cell, describe_constraints
from .._packed.config import KDAConfig
from . import adapters


def describe_adapter(ad: Backend, cfg: KDAConfig | None) -> dict[str, Any]:
    """One backend as data. Leaves out whatever depends on this machine (availability, the
    Triton-interpreter devices), so the docs are the same everywhere."""
    out = adapters.describe(ad)
    out["requires"] = list(ad.requires)
    env = dict(cfg.contract_dims()) if cfg is not None else {}
    out["where_for_config"] = describe_constraints(ad.where, env, f"adapter {ad.name!r}")
    return out


# -- contracts.md ----------------------------------------------------------------------------------


def _tp_table(cfg: KDAConfig) -> list[str]:
    out = ["| tp_size | H | HV | `mixed_qkv` width 2·H·K+HV·V | `a` width HV·K | state slot HV·V·K | "
           "fp32 slot |", "|---|---|---|---|---|---|---|"]
    for t in (1, 2, 4, 8, 16):
        if t not in cfg.tp_sizes():
            continue
        c = cfg.with_tp(t)
        H, HV, K, V = c.local_num_heads, c.local_num_v_heads, c.head_k, c.head_v
        slot = HV * V * K
        mark = " (docs config)" if t == cfg.tp_size else ""
        out.append(f"| {t}{mark} | {H} | {HV} | {2 * H * K + HV * V} | {HV * K} | {slot} | "
                   f"{slot * 4 / 2**20:g} MiB |")
    return out


def _layouts(cfg: KDAConfig) -> Section:
    return Section("Packed decode layouts", [
        "One row of `mixed_qkv` (what the short conv + SiLU produced for one request): q heads, then k heads, "
        "then v heads, each head-major. `H` is not passed to the kernel: it is solved from this width.",
        "",
        "![mixed_qkv row: q heads, k heads, v heads](mixed_qkv.svg)",
        "",
        "The state pool, in the two layouts a call may declare (`KDAConfig(state_layout=...)` or "
        "`state_layout=`; never guessed from shapes, which agree when K == V):",
        "",
        "![VK state pool: slot, heads, V×K matrix with K contiguous](state_pool_vk.svg)",
        "",
        "![KV state pool: slot, heads, K×V matrix with V contiguous](state_pool_kv.svg)",
        "",
        "Per tensor-parallel degree (each rank holds `num_heads / tp_size` heads):",
        "",
        *_tp_table(cfg),
        "",
    ])


def _backends(doc: Mapping[str, Any]) -> Section:
    lines = [
        "`backend=\"auto\"` picks the available backend with the highest priority that supports the call "
        "(`kc.explain_backends(...)` says why for a given call). Availability depends on the machine and is "
        "not listed here: see `kc.adapters.available()`.",
        "",
        "| backend | priority | devices | needs | state dtypes | layouts | gates | dim constraints | what it is |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in doc["backends"]:
        cons = ", ".join(f"`{w['constraint']}`" + {True: " (holds)", False: " (**fails** for this config)",
                                                   None: ""}[w["holds_for_config"]] for w in b["where_for_config"])
        lines.append(
            f"| `{b['name']}` | {b['priority']} | {', '.join(b['devices'])} | "
            f"{', '.join(b['requires']) or '—'} | {', '.join(b['state_dtypes'] or ['any'])} | "
            f"{', '.join(b['layouts'])} | {', '.join(b['gates'])} | {cons or '—'} | {cell(b['description'])} |")
    lines.append("")
    return Section("Backends", lines)


# -- errors.md -------------------------------------------------------------------------------------


