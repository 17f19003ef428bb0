"""The GDN packed-prefill part of ``kda-contracts docs``, for GDN's own model (the page passes the
Qwen3-Next preset, whatever its own config): its section of ``contracts.md`` and its mistakes
catalogue in ``errors.md`` (:mod:`kda_contracts.ops._packed.prefill_docs` renders both).

Example::

    from kda_contracts import GDNConfig
    doc = describe(GDNConfig.preset("qwen3-next-80b-a3b"), "qwen3-next-80b-a3b, tp_size=1")
    sections(doc)[0].title            # 'GDN packed prefill (Qwen3-Next)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._engine import Section
from .._packed.config import KDAConfig
from .._packed.prefill_docs import describe_prefill, prefill_errors_lines, prefill_sections
from .mistakes import MISTAKES, reproduce
from .prefill import gdn_packed_prefill

TITLE = "GDN packed prefill (Qwen3-Next)"
_INTRO = (
    "`kc.gdn_packed_prefill` is KDA's prefill call with GDN's gate: `a [T, HV]` and `dt_bias [HV]` (one decay "
    "per value head), no `lower_bound`; beta is rounded to `b`'s dtype, as in GDN decode.",
)


def describe(cfg: KDAConfig, label: str) -> dict[str, Any]:
    """GDN prefill's part of ``contracts.json``, for ``cfg`` (a ``GDNConfig``)."""
    return describe_prefill(gdn_packed_prefill, cfg, label)


def sections(doc: Mapping[str, Any]) -> list[Section]:
    """GDN prefill's sections of ``contracts.md``."""
    return prefill_sections(doc, TITLE, _INTRO)


def errors_lines(cfg: KDAConfig, label: str) -> list[str]:
    """GDN prefill's part of ``errors.md``, reproduced for ``cfg`` (a ``GDNConfig``)."""
    return prefill_errors_lines(TITLE, "kda_contracts.ops.gdn_prefill.mistakes", label, MISTAKES,
                                lambda m: reproduce(m, cfg))
