"""The catalogue of known GDN packed-prefill mistakes (Qwen3-Next), each one reproducible: GDN's own,
a KDA-shaped gate, then the varlen mistakes both prefill ops share
(:mod:`kda_contracts.ops._packed.prefill_mistakes`). Keys start with ``gdn-prefill-``.

Example::

    >>> from kda_contracts import GDNConfig
    >>> r = reproduce(MISTAKES[0], GDNConfig.preset("qwen3-next-80b-a3b"))
    >>> r.error, r.message.splitlines()[1]
    ('ShapeError', '  [1] a: ShapeError')
"""

from __future__ import annotations

from ..._engine import ShapeError
from .._packed.config import KDAConfig
from .._packed.mistakes import Attempt, Mistake, Reproduction
from .._packed.mistakes import reproduce as _reproduce
from .._packed.prefill_mistakes import prefill_mistakes, valid_prefill_call
from .prefill import validate_gdn_packed_prefill


def _kda_gate(cfg: KDAConfig) -> Attempt:
    c = valid_prefill_call(cfg, True)
    return Attempt(dict(c, a=c["a"].new_zeros(c["a"].shape[0], cfg.local_num_v_heads * cfg.head_k)), cfg)


MISTAKES: tuple[Mistake, ...] = (
    Mistake("gdn-prefill-kda-shaped-a", "GDN prefill: `a` with KDA's shape [T, HV*K]",
            "a = gate_buffer[:T]  # sized for Kimi-Linear's per-channel gate",
            "a kernel reads a[t, hv] at row stride HV*K: silently wrong decays",
            "pass GDN's gate, one logit per value head: [T, HV]; for a KDA layer call `kc.packed_prefill`",
            ShapeError, _kda_gate),
    *prefill_mistakes("gdn-prefill-", gdn=True),
)


def reproduce(mistake: Mistake, cfg: KDAConfig) -> Reproduction:
    """Make ``mistake`` on a valid GDN prefill call for ``cfg``; the error ``validate_gdn_packed_prefill`` raises."""
    return _reproduce(mistake, cfg, validate=validate_gdn_packed_prefill)
