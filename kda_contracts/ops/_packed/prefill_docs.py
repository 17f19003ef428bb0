"""The packed-prefill part of ``kda-contracts docs``, shared by KDA's and GDN's prefill ops: a section of
``contracts.md`` per op (what the call is, then the op as the engine documents any ``kc.op``: its
variants' contracts for the op's docs config and every backend) and its mistakes catalogue for
``errors.md``, reproduced by running the library. Each op's ``docs.py`` names its config and title.

Example::

    doc = describe_prefill(packed_prefill, cfg, "kimi-linear-48b-a3b, tp_size=1")
    sections = prefill_sections(doc, "KDA packed prefill (Kimi-Linear)", intro)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._engine import Op, Section, describe_op, op_section
from .config import KDAConfig
from .mistakes import POOL, Mistake, Reproduction, catalogue_lines
from .prefill_mistakes import LENGTHS


def describe_prefill(op: Op, cfg: KDAConfig, label: str) -> dict[str, Any]:
    """A prefill op's part of ``contracts.json``: its docs config and the op described for it."""
    return {"config": {"label": label, "fields": json.loads(cfg.model_dump_json()), "dims": dict(cfg.contract_dims())},
            "op": describe_op(op, cfg)}


def prefill_sections(doc: Mapping[str, Any], title: str, intro: Sequence[str]) -> list[Section]:
    """The op's sections of ``contracts.md``: ``intro`` under ``title``, then the op itself."""
    cfg = doc["config"]
    dims = ", ".join(f"{k}={v}" for k, v in cfg["dims"].items())
    return [Section(title, [*intro, "", f"Shapes below are for **{cfg['label']}** ({dims}). Known mistakes and the "
                            "messages they produce: [errors.md](errors.md). Guide: [prefill.md](../prefill.md).", ""]),
            op_section(doc["op"])]


def prefill_errors_lines(title: str, module: str, label: str, mistakes: Sequence[Mistake],
                         run: Callable[[Mistake], Reproduction]) -> list[str]:
    """The op's part of ``errors.md``: its catalogue, each mistake reproduced by ``run``."""
    rows, body = catalogue_lines(mistakes, run)
    return [
        f"# {title}",
        "",
        f"Each known mistake of the call, made on a valid call for **{label}** ({len(LENGTHS)} sequences of "
        f"{', '.join(map(str, LENGTHS))} tokens, a pool of N={POOL} slots), with the message the library raises "
        f"today and the fix (`{module}`).",
        "",
        "| mistake | error | fix |",
        "|---|---|---|",
        *rows,
        "",
        *body,
    ]
