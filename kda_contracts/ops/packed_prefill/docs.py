"""The KDA packed-prefill part of ``kda-contracts docs``: its section of ``contracts.md`` (for the
page's config) and its mistakes catalogue in ``errors.md``
(:mod:`kda_contracts.ops._packed.prefill_docs` renders both).

Example::

    from kda_contracts import KDAConfig
    doc = describe(KDAConfig.preset("kimi-linear-48b-a3b"), "kimi-linear-48b-a3b, tp_size=1")
    sections(doc)[0].title            # 'KDA packed prefill (Kimi-Linear)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._engine import Section
from .._packed.config import KDAConfig
from .._packed.prefill_docs import describe_prefill, prefill_errors_lines, prefill_sections
from .mistakes import MISTAKES, reproduce
from .prefill import packed_prefill

TITLE = "KDA packed prefill (Kimi-Linear)"
_INTRO = (
    "`kc.packed_prefill` runs B sequences packed token after token (`mixed_qkv [T, 2*H*K + HV*V]`, `a [T, HV*K]`, "
    "`b [T, HV]`, `cu_seqlens [B+1]` int32 marking where each starts), each from its pool slot "
    "(`ssm_state_indices [B]`) when `has_initial_state [B]` says so, else from zero. It writes every token's "
    "output (`out [T, HV, V]`) and each sequence's final state to its slot: packed decode's math "
    "([semantics.md](../semantics.md)) token after token. Strict mode also checks `cu_seqlens` (starts at 0, "
    "never decreases, ends at T) and the slots (in range, distinct).",
)


def describe(cfg: KDAConfig, label: str) -> dict[str, Any]:
    """KDA prefill's part of ``contracts.json``, for the page's config."""
    return describe_prefill(packed_prefill, cfg, label)


def sections(doc: Mapping[str, Any]) -> list[Section]:
    """KDA prefill's sections of ``contracts.md``."""
    return prefill_sections(doc, TITLE, _INTRO)


def errors_lines(cfg: KDAConfig, label: str) -> list[str]:
    """KDA prefill's part of ``errors.md``, reproduced for ``cfg``."""
    return prefill_errors_lines(TITLE, "kda_contracts.ops.packed_prefill.mistakes", label, MISTAKES,
                                lambda m: reproduce(m, cfg))
