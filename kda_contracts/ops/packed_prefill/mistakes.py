"""The catalogue of known KDA packed-prefill mistakes, each one reproducible: the varlen mistakes
both prefill ops share (:mod:`kda_contracts.ops._packed.prefill_mistakes`) after KDA's own, a GDN-shaped
gate. :func:`reproduce` runs one through ``validate_packed_prefill`` and returns the error the
library really raises; ``kda-contracts docs`` renders the catalogue in ``errors.md``.

Example::

    >>> from kda_contracts import KDAConfig
    >>> r = reproduce(MISTAKES[0], KDAConfig.preset("kimi-linear-48b-a3b"))
    >>> r.error, r.message.splitlines()[1]
    ('ShapeError', '  [1] a: ShapeError')
"""

from __future__ import annotations

from ..._engine import ShapeError
from .._packed.config import KDAConfig
from .._packed.mistakes import Attempt, Mistake, Reproduction
from .._packed.mistakes import reproduce as _reproduce
from .._packed.prefill_mistakes import prefill_mistakes, valid_prefill_call
from .prefill import validate_packed_prefill


def _gdn_gate(cfg: KDAConfig) -> Attempt:
    c = valid_prefill_call(cfg, False)
    return Attempt(dict(c, a=c["a"].new_zeros(c["a"].shape[0], cfg.local_num_v_heads)), cfg)


MISTAKES: tuple[Mistake, ...] = (
    Mistake("prefill-gdn-shaped-a", "Prefill: `a` with GDN's shape [T, HV]",
            "a = a_proj(x)  # a Qwen3-Next layer's one logit per value head",
            "a kernel reads a[t, hv*K + k]: past each row, silently wrong decays",
            "pass KDA's gate, one logit per key channel: [T, HV*K]; for a GDN layer call `kc.gdn_packed_prefill`",
            ShapeError, _gdn_gate),
    *prefill_mistakes("prefill-", gdn=False),
)


def reproduce(mistake: Mistake, cfg: KDAConfig) -> Reproduction:
    """Make ``mistake`` on a valid KDA prefill call for ``cfg``; the error ``validate_packed_prefill`` raises."""
    return _reproduce(mistake, cfg, validate=validate_packed_prefill)
