"""``kda-contracts docs``: the pages of the ops we ship, for a KDA config. ``contracts.md`` (every
registered contract and backend, KDA's layouts and backends table, GDN's section for its own
model), ``contracts.json`` (the same as data), ``errors.md`` (each op's mistakes catalogue with
the messages the library raises) and the SVG pictures. Each op provides its part; this module
puts them on the same pages.

Example::

    from kda_contracts import KDAConfig
    files = generate(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2), "kimi-linear-48b-a3b, tp_size=2")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._engine import (
    DO_NOT_EDIT,
    GENERATED_MARK,
    Contract,
    ModulePage,
    describe_contracts,
    mark_svg,
    op_section,
    registered_contracts,
    render_reference,
    slug,
)
from ..ops._packed.config import KDAConfig
from ..ops._packed.mistakes import BATCH, POOL, catalogue_lines
from ..ops._packed.svg import mixed_qkv_svg, state_pool_svg
from ..ops.gdn_decode import docs as gdn_docs
from ..ops.gdn_decode.decode import gdn_packed_decode
from ..ops.gdn_prefill import docs as gdn_prefill_docs
from ..ops.gdn_prefill.prefill import gdn_packed_prefill
from ..ops.packed_decode import adapters
from ..ops.packed_decode.docs import _backends, _layouts, describe_adapter
from ..ops.packed_decode.mistakes import MISTAKES, reproduce
from ..ops.packed_prefill import docs as prefill_docs
from ..ops.packed_prefill.prefill import packed_prefill

_GDN_LABEL = f"{gdn_docs.DOC_PRESET}, tp_size=1"  # GDN's ops are documented for their own model
FILES = ("contracts.md", "contracts.json", "errors.md", "mixed_qkv.svg", "state_pool_vk.svg", "state_pool_kv.svg",
         *gdn_docs.FILES)


def describe(cfg: KDAConfig, label: str, contracts: Mapping[str, Contract] | None = None,
             page: ModulePage | None = None) -> dict[str, Any]:
    """The whole generated reference as data (what ``contracts.json`` holds); ``page``: the
    ops and contracts of ``--module`` modules, added after the packed-decode sections (their
    contracts are then left out of the default list, every registered contract). GDN's
    contracts are described in its own part (``"gdn_packed_decode"``), for its own model."""
    if contracts is None:
        skip = page.keys if page is not None else frozenset()
        contracts = {k: c for k, c in registered_contracts().items() if k not in skip}
    own_sections = [id(c) for o in (gdn_packed_decode, packed_prefill, gdn_packed_prefill)
                    for c in o.contracts.values()]
    contracts = {k: c for k, c in contracts.items() if id(c) not in own_sections}
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
    if page is None or all(o["name"] not in (packed_prefill.name, gdn_packed_prefill.name) for o in page.ops):
        doc["packed_prefill"] = prefill_docs.describe(cfg, label)
        doc["gdn_packed_prefill"] = gdn_prefill_docs.describe(gdn_docs.docs_config(), _GDN_LABEL)
    if page is not None:
        doc["contracts"] += page.contracts
        doc["modules"] = page.data()
    return doc


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


def render_contracts_md(doc: Mapping[str, Any]) -> str:
    """``contracts.md``: every contract and backend, with the packed-decode pictures."""
    has_decode = any(c["key"].startswith("packed_decode[") for c in doc["contracts"])
    before = [_layouts(KDAConfig.model_validate(doc["config"]["fields"]))] if has_decode else []
    page = doc.get("modules")
    ops = [op_section(d, availability=page["availability_listed"]) for d in page["ops"]] if page else []
    gdn = gdn_docs.sections(doc["gdn_packed_decode"]) if "gdn_packed_decode" in doc else []
    prefill = [*prefill_docs.sections(doc["packed_prefill"]), *gdn_prefill_docs.sections(doc["gdn_packed_prefill"])] \
        if "packed_prefill" in doc else []
    return render_reference(_intro(doc), doc["contracts"], before, [_backends(doc), *gdn, *prefill, *ops])


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
    prefill = [*prefill_docs.errors_lines(cfg, label),
               *gdn_prefill_docs.errors_lines(gdn_docs.docs_config(), _GDN_LABEL)]
    return "\n".join([*lines, "", *body, *gdn_docs.errors_lines(), *prefill])


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
