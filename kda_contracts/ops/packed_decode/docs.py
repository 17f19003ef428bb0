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

import json
from collections.abc import Mapping
from typing import Any

from ..._engine import (
    DO_NOT_EDIT,
    GENERATED_MARK,
    Backend,
    Contract,
    ModulePage,
    Section,
    cell,
    describe_constraints,
    describe_contracts,
    mark_svg,
    op_section,
    registered_contracts,
    render_reference,
    slug,
)
from ..gdn_decode import docs as gdn_docs
from ..gdn_decode.decode import gdn_packed_decode
from . import adapters
from .config import KDAConfig
from .diagrams import mixed_qkv_svg, state_pool_svg
from .mistakes import BATCH, MISTAKES, POOL, catalogue_lines, reproduce

__all__ = ["FILES", "describe", "generate", "render_contracts_md", "render_errors_md"]

FILES = ("contracts.md", "contracts.json", "errors.md", "mixed_qkv.svg", "state_pool_vk.svg", "state_pool_kv.svg",
         *gdn_docs.FILES)


def describe_adapter(ad: Backend, cfg: KDAConfig | None) -> dict[str, Any]:
    """One backend as data. Leaves out whatever depends on this machine (availability, the
    Triton-interpreter devices), so the docs are the same everywhere."""
    out = adapters.describe(ad)
    out["requires"] = list(ad.requires)
    env = dict(cfg.contract_dims()) if cfg is not None else {}
    out["where_for_config"] = describe_constraints(ad.where, env, f"adapter {ad.name!r}")
    return out


def describe(cfg: KDAConfig, label: str, contracts: Mapping[str, Contract] | None = None,
             page: ModulePage | None = None) -> dict[str, Any]:
    """The whole generated reference as data (what ``contracts.json`` holds); ``page``: the
    ops and contracts of ``--module`` modules, added after the packed-decode sections (their
    contracts are then left out of the default list, every registered contract). GDN's
    contracts are described in its own part (``"gdn_packed_decode"``), for its own model."""
    if contracts is None:
        skip = page.keys if page is not None else frozenset()
        contracts = {k: c for k, c in registered_contracts().items() if k not in skip}
    gdn = [id(c) for c in gdn_packed_decode.contracts.values()]
    contracts = {k: c for k, c in contracts.items() if id(c) not in gdn}
    doc: dict[str, Any] = {
        "generator": GENERATED_MARK,
        "config": {
            "label": label,
            "fields": json.loads(cfg.model_dump_json()),
            "dims": dict(cfg.contract_dims()),
            "dim_sources": {s: cfg.contract_dim_source(s) for s in cfg.contract_dims()},
        },
        "contracts": describe_contracts(contracts, cfg),
        "backends": [describe_adapter(adapters.get(n), cfg) for n in adapters.names()],
    }
    if page is None or all(o["name"] != gdn_packed_decode.name for o in page.ops):  # else --module documents it
        doc["gdn_packed_decode"] = gdn_docs.describe()
    if page is not None:
        doc["contracts"] += page.contracts
        doc["modules"] = page.data()
    return doc


# -- contracts.md ----------------------------------------------------------------------------------
def _intro(doc: Mapping[str, Any]) -> list[str]:
    cfg = doc["config"]
    fields = cfg["fields"]
    dims = ", ".join(f"{k}={v} ({cfg['dim_sources'][k]})" for k, v in cfg["dims"].items())
    pins = ", ".join(f"{r}_dtype={fields[f'{r}_dtype']}" for r in ("activation", "state", "index")
                     if fields.get(f"{r}_dtype")) or "none (every allowed dtype is accepted)"
    return [
        f"Generated from the registered contracts and backends for the config **{cfg['label']}**: {dims}; "
        f"state layout {fields['state_layout']}, {fields['gate']} gate, l2norm {fields['use_qk_l2norm']}, "
        f"scale {fields['scale']!r}; pinned dtypes: {pins}.",
        "",
        "Regenerate with `kda-contracts docs` (another config: `kda-contracts docs --config kimi-linear-48b-a3b "
        "--tp 2`, or a `config.json` path). Machine-readable: [contracts.json](contracts.json). Known mistakes "
        "and the messages they produce: [errors.md](errors.md).",
    ] + ([] if "gdn_packed_decode" not in doc else [
        "",
        f"GDN packed decode (`gdn_packed_decode`, Qwen3-Next) is documented for its own model, "
        f"**{doc['gdn_packed_decode']['config']['label']}**, with shapes for TP "
        f"{'/'.join(map(str, gdn_docs.TP_SIZES))}: [{gdn_docs.TITLE}](#{slug(gdn_docs.TITLE)}).",
    ])


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


def render_contracts_md(doc: Mapping[str, Any]) -> str:
    """``contracts.md``: every contract and backend, with the packed-decode pictures."""
    has_decode = any(c["key"].startswith("packed_decode[") for c in doc["contracts"])
    before = [_layouts(KDAConfig.model_validate(doc["config"]["fields"]))] if has_decode else []
    page = doc.get("modules")
    ops = [op_section(d, availability=page["availability_listed"]) for d in page["ops"]] if page else []
    gdn = gdn_docs.sections(doc["gdn_packed_decode"]) if "gdn_packed_decode" in doc else []
    return render_reference(_intro(doc), doc["contracts"], before, [_backends(doc), *gdn, *ops])


# -- errors.md -------------------------------------------------------------------------------------
def render_errors_md(cfg: KDAConfig, label: str) -> str:
    """``errors.md``: each known mistake, the message the library raises for it, and the fix;
    packed decode's for ``cfg``, then GDN's for its own model."""
    rows, body = catalogue_lines(MISTAKES, lambda m: reproduce(m, cfg))
    lines = [
        DO_NOT_EDIT,
        "",
        "# Error catalogue",
        "",
        f"Each known packed-decode mistake, made on a valid call for **{label}** (B={BATCH} requests, a pool "
        f"of N={POOL} slots), with the message the library raises today and the fix. The messages are produced "
        "by running the library (`kda_contracts.ops.packed_decode.mistakes`), so they cannot drift from the code. "
        f"GDN's (Qwen3-Next) follow: [{gdn_docs.TITLE}](#{slug(gdn_docs.TITLE)}).",
        "",
        "| mistake | error | fix |",
        "|---|---|---|",
        *rows,
    ]
    return "\n".join([*lines, "", *body, *gdn_docs.errors_lines()])


def generate(cfg: KDAConfig, label: str, contracts: Mapping[str, Contract] | None = None,
             page: ModulePage | None = None) -> dict[str, str]:
    """Every generated file, by name: Markdown, JSON and SVG, all deterministic for ``cfg``
    (``contracts``: default every registered one; ``page``: the ``--module`` ops and contracts
    too, as ``kda-contracts docs --builtin --module M`` renders them)."""
    doc = describe(cfg, label, contracts, page)
    return {
        "contracts.md": render_contracts_md(doc),
        "contracts.json": json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n",
        "errors.md": render_errors_md(cfg, label),
        "mixed_qkv.svg": mark_svg(mixed_qkv_svg(cfg)),
        "state_pool_vk.svg": mark_svg(state_pool_svg(cfg, "VK")),
        "state_pool_kv.svg": mark_svg(state_pool_svg(cfg, "KV")),
        **gdn_docs.files(),
    }
