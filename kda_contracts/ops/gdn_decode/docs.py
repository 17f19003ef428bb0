"""The GDN part of ``kda-contracts docs``: GDN packed decode documented for the Qwen3-Next preset.

Whatever the docs config of the page (a Kimi-Linear one), GDN is shown for its own model,
:data:`DOC_PRESET`: its pictures (the packed row with GVA, the gate against KDA's, both state
layouts), the concrete shape of every argument per tensor-parallel degree, the op itself as the
engine documents any ``kc.op`` (:func:`kda_contracts._engine.tools.module_docs.describe_op`: each variant's
contract and every backend ``gdn_packed_decode.backends()`` lists, so new kernels appear by
themselves), and its part of the error catalogue. :mod:`kda_contracts.ops.packed_decode.docs`
puts these on the generated pages.

Example::

    doc = describe()
    sections(doc)[0].title            # 'GDN packed decode (Qwen3-Next)'
    files()["gdn_gate.svg"]           # an SVG picture
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..._engine import Section, describe_contract, describe_op, mark_svg, op_section
from .._packed.mistakes import catalogue_lines
from .._packed.svg import mixed_qkv_svg, state_pool_svg
from .config import GDNConfig
from .decode import gdn_packed_decode
from .diagrams import gate_svg
from .mistakes import BATCH, MISTAKES, POOL, reproduce

DOC_PRESET = "qwen3-next-80b-a3b"
TP_SIZES = (1, 2, 4, 8)  # the degrees the preset is served at; the table shows each
TITLE = "GDN packed decode (Qwen3-Next)"
FILES = ("gdn_mixed_qkv.svg", "gdn_gate.svg", "gdn_state_pool_vk.svg", "gdn_state_pool_kv.svg")


def docs_config(tp_size: int = 1) -> GDNConfig:
    """The config GDN is documented for: the Qwen3-Next-80B-A3B preset at ``tp_size``."""
    return GDNConfig.preset(DOC_PRESET, tp_size=tp_size)


def _shapes(op_contracts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every tensor argument's symbolic shape and its concrete shape per TP degree; an argument
    the variants shape differently (the state) gets a row per variant."""
    described = {tp: {v: {a["name"]: a for a in describe_contract(f"{gdn_packed_decode.name}[{v}]", c,
                                                                    docs_config(tp))["arguments"]}
                      for v, c in op_contracts.items()} for tp in TP_SIZES}
    variants = list(op_contracts)
    rows = []
    for name in op_contracts[variants[0]].spec.tensors:
        shapes = {v: op_contracts[v].spec.tensors[name].symbolic() for v in variants}
        per_variant = len(set(shapes.values())) > 1
        for v in variants if per_variant else variants[:1]:
            rows.append({"argument": f"{name} ({v})" if per_variant else name, "shape": shapes[v],
                         "concrete": {str(tp): described[tp][v][name]["concrete_shape"] for tp in TP_SIZES}})
    return rows


def _dims(tp: int) -> dict[str, int]:
    cfg = docs_config(tp)
    return {**cfg.contract_dims(), "state_slot": cfg.local_num_v_heads * cfg.head_v * cfg.head_k}


def describe() -> dict[str, Any]:
    """GDN's part of ``contracts.json``: its docs config, shapes per TP degree and the op."""
    cfg = docs_config()
    return {
        "config": {"label": f"{DOC_PRESET}, tp_size={cfg.tp_size}", "fields": json.loads(cfg.model_dump_json()),
                   "dims": dict(cfg.contract_dims()),
                   "dim_sources": {s: cfg.contract_dim_source(s) for s in cfg.contract_dims()}},
        "shapes": _shapes(gdn_packed_decode.contracts),
        "dims_per_tp": {str(tp): _dims(tp) for tp in TP_SIZES},
        "op": describe_op(gdn_packed_decode, cfg),
    }


def _shape_table(doc: Mapping[str, Any]) -> list[str]:
    tps = list(doc["dims_per_tp"])
    out = ["| argument | shape | " + " | ".join(f"TP{t}" for t in tps) + " |", "|---|---|" + "---|" * len(tps)]
    for row in doc["shapes"]:
        out.append(f"| `{row['argument']}` | `{row['shape']}` | " +
                   " | ".join(f"`{row['concrete'][t]}`" for t in tps) + " |")
    for sym in ("H", "HV", "K", "V"):
        out.append(f"| dim `{sym}` | — | " + " | ".join(str(doc["dims_per_tp"][t][sym]) for t in tps) + " |")
    out.append("| fp32 state slot | `HV*V*K` | " + " | ".join(
        f"{doc['dims_per_tp'][t]['state_slot'] * 4 / 2**20:g} MiB" for t in tps) + " |")
    return [*out, ""]


def _overview(doc: Mapping[str, Any]) -> Section:
    cfg = doc["config"]
    dims = ", ".join(f"{k}={v} ({cfg['dim_sources'][k]})" for k, v in cfg["dims"].items())
    return Section(TITLE, [
        f"`kc.gdn_packed_decode` (Gated DeltaNet: Qwen3-Next, Qwen3.5) takes KDA's packed decode call but for the "
        f"gate. It is documented here for its own model, **{cfg['label']}**: {dims}, whatever the docs config "
        "above; GVA, with two value heads per q/k head (HV = 2H). Guide: [guide-gdn.md](../guide-gdn.md).",
        "",
        "The packed `mixed_qkv` row is KDA's layout (q heads, k heads, v heads); with HV = 2H the v part is as wide "
        "as q and k together:",
        "",
        "![GDN mixed_qkv row: 16 q heads, 16 k heads, 32 v heads](gdn_mixed_qkv.svg)",
        "",
        "What differs from KDA is the gate: `a` is `[B, HV]` and `dt_bias` `[HV]` (one decay per value head, for "
        "the whole V×K state matrix), where KDA's are `[B, HV*K]` and `[HV*K]`; there is no `lower_bound`:",
        "",
        "![GDN gate [B, HV] against KDA's [B, HV*K]](gdn_gate.svg)",
        "",
        "The state pool, in the layout a call declares (`GDNConfig(state_layout=...)` or `state_layout=`; never "
        "guessed from shapes, which agree when K == V, as in Qwen3-Next):",
        "",
        "![GDN VK state pool: slot, 32 heads, V×K matrix with K contiguous](gdn_state_pool_vk.svg)",
        "",
        "![GDN KV state pool: slot, 32 heads, K×V matrix with V contiguous](gdn_state_pool_kv.svg)",
        "",
        "Every argument's shape per tensor-parallel degree (`GDNConfig.preset(\"qwen3-next-80b-a3b\", "
        "tp_size=...)`; each rank holds `num_heads / tp_size` q/k heads and `num_v_heads / tp_size` value heads):",
        "",
        *_shape_table(doc),
        "Known GDN mistakes and the messages they produce: [errors.md](errors.md#gdn-packed-decode-qwen3-next).",
        "",
    ])


def sections(doc: Mapping[str, Any]) -> list[Section]:
    """GDN's sections of ``contracts.md``: the overview with its pictures and shapes, then the op
    (signature, backends, each variant's contract for the docs config)."""
    return [_overview(doc), op_section(doc["op"])]


def errors_lines() -> list[str]:
    """GDN's part of ``errors.md``: its catalogue, reproduced for the docs config."""
    cfg = docs_config()
    rows, body = catalogue_lines(MISTAKES, lambda m: reproduce(m, cfg))
    return [
        f"# {TITLE}",
        "",
        f"Each known GDN packed-decode mistake, made on a valid call for **{DOC_PRESET}, tp_size={cfg.tp_size}** "
        f"(B={BATCH} requests, a pool of N={POOL} slots), with the message the library raises today and the fix "
        "(`kda_contracts.ops.gdn_decode.mistakes`). GDN's own mistakes come first, then those it shares with KDA.",
        "",
        "| mistake | error | fix |",
        "|---|---|---|",
        *rows,
        "",
        *body,
    ]


def files() -> dict[str, str]:
    """GDN's pictures, by file name."""
    cfg = docs_config()
    return {
        "gdn_mixed_qkv.svg": mark_svg(mixed_qkv_svg(cfg)),
        "gdn_gate.svg": mark_svg(gate_svg(cfg)),
        "gdn_state_pool_vk.svg": mark_svg(state_pool_svg(cfg, "VK")),
        "gdn_state_pool_kv.svg": mark_svg(state_pool_svg(cfg, "KV")),
    }
