"""What the Qwen3-Next GDN layer's contracts add to the shared ones (:mod:`.layer_contracts`, whose
hints include a conv weight in ``nn.Conv1d``'s ``[C, 1, k]`` layout): a hint for KDA-shaped gate
parameters (``dt_bias [HV*K]``, what a Kimi-Linear checkpoint holds) where GDN has one per value head.

Example::

    @contract(config_arg="self", hints=HINTS)
    def load_weights(self, in_proj_qkvz: Float[Tensor, "C+HV*V D"], ...) -> None: ...
"""

from __future__ import annotations

from .._engine import CallContext, ShapeError, Violation
from .._engine.facts import AxisMismatch
from .layer_contracts import HINTS as SHARED_HINTS

__all__ = ["HINTS"]


def _hint_kda_gate(v: Violation, ctx: CallContext) -> str | None:
    axis = v.fact(AxisMismatch)
    if v.kind is not ShapeError or v.argument not in ("A_log", "dt_bias") or axis is None:
        return None
    d = ctx.config.contract_dims()
    if axis.got != d["HV"] * d["K"] or d["K"] == 1:
        return None
    return (f"{v.argument} has HV*K = {axis.got} entries, one per value head and key channel: that is KDA's "
            f"(Kimi-Linear's) per-channel gate. GDN has one decay per value head: {v.argument} is [HV] = "
            f"[{d['HV']}]; check that the checkpoint is a Qwen3-Next one")


HINTS = (*SHARED_HINTS, _hint_kda_gate)
