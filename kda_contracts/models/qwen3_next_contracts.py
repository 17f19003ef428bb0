"""What the Qwen3-Next GDN layer's contracts add to the shared ones (:mod:`.layer_contracts`):
hints for two mistakes of loading its weights: a conv weight in ``nn.Conv1d``'s ``[C, 1, k]`` layout
(Hugging Face checkpoints store it so), and KDA-shaped gate parameters (``dt_bias [HV*K]``, what a
Kimi-Linear checkpoint holds) where GDN has one per value head.

Example::

    @contract(config_arg="self", hints=HINTS)
    def load_weights(self, in_proj_qkvz: Float[Tensor, "C+HV*V D"], ...) -> None: ...
"""

from __future__ import annotations

from .._engine import CallContext, ShapeError, Violation
from .._engine.facts import AxisMismatch, RankMismatch
from .layer_contracts import HINTS as SHARED_HINTS

__all__ = ["HINTS"]


def _hint_hf_conv1d(v: Violation, ctx: CallContext) -> str | None:
    rank = v.fact(RankMismatch)
    if v.kind is not ShapeError or v.argument != "conv1d" or rank is None:
        return None
    if len(rank.shape) != 3 or rank.shape[1] != 1:
        return None
    return (f"conv1d looks like nn.Conv1d's weight {list(rank.shape)} ([C, 1, conv_kernel_size], as a Hugging "
            "Face checkpoint stores linear_attn.conv1d.weight): pass conv1d.squeeze(1), or load the checkpoint "
            "with weights_from_hf(state_dict, prefix)")


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


HINTS = (*SHARED_HINTS, _hint_hf_conv1d, _hint_kda_gate)
