"""The KDA packed-decode contract, written once as annotations for each state layout (the
layout cannot be told from shapes when K == V, so it is declared, never guessed), and how a
call picks its layout. Semantics: ``kernels/INTERFACE.md``.

Everything else — binding H from the width of ``mixed_qkv``, agreement with a ``KDAConfig``,
the error report — is the engine's.

Example::

    >>> packed_decode_contract("KV").spec.tensors["initial_state"].symbolic()
    '[N, HV, K, V]'
"""

# No `from __future__ import annotations` here: the contract annotations below are built from
# local values and must be evaluated when the function is defined.

from collections.abc import Callable
from typing import Annotated, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..._engine import MatchConfig, Range, Spec, Where
from .._packed.checks import VALUE_RULES, value_checks
from .._packed.dtypes import ACTIVATION_DTYPES, INDEX_DTYPES, STATE_DTYPES
from .._packed.layouts import LAYOUTS, Layout, layout_resolver

PACKED_DECODE_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
                      "ssm_state_indices", "use_qk_l2norm_in_kernel", "lower_bound")

_WHERE = (
    Where("HV % H == 0", hint="value heads HV must be a multiple of the q/k heads H (each q/k head serves "
          "HV/H value heads); check num_heads/num_v_heads and the width of mixed_qkv"),
    Where("HV >= 1"), Where("K >= 1"), Where("V >= 1"),
    Where("N >= 1", hint="the state pool has no slots"),
)


def _make_signature(layout: Layout) -> Callable[..., Any]:
    state_dims = "N HV V K" if layout == "VK" else "N HV K V"

    def packed_decode(
        mixed_qkv: Annotated[Float[Tensor, "B 2*H*K+HV*V"],
                             Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        a: Annotated[Float[Tensor, "B HV*K"],
                     Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        b: Annotated[Float[Tensor, "B HV"],
                     Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")],
        A_log: Annotated[Float[Tensor, "HV"], Spec(dtypes=(torch.float32,), contiguous=True)],
        dt_bias: Annotated[Float[Tensor, "HV*K"], Spec(dtypes=(torch.float32,), contiguous=True)],
        scale: Annotated[float, Range(gt=0, finite=True), MatchConfig("scale", rel_tol=1e-6)],
        initial_state: Annotated[Float[Tensor, state_dims],
                                 Spec(dtypes=STATE_DTYPES, inner_contiguous=3, config_dtype="state", disjoint=True,
                                      mutated=True)],
        out: Annotated[Float[Tensor, "B 1 HV V"],
                       Spec(dtypes=ACTIVATION_DTYPES, contiguous=True, same_dtype_as="mixed_qkv", mutated=True)],
        ssm_state_indices: Annotated[Int[Tensor, "B"],
                                     Spec(dtypes=INDEX_DTYPES, config_dtype="index", contiguous=True)],
        use_qk_l2norm_in_kernel: Annotated[bool, MatchConfig("use_qk_l2norm")] = False,
        lower_bound: Annotated[float | None, Range(lt=0, finite=True), MatchConfig("effective_lower_bound")] = None,
        *,
        config: Any = None,
        state_layout: str | None = None,  # "VK" | "KV" | None, read by resolve_layout (the variant)
    ) -> None:
        """KDA packed decode."""

    packed_decode.__qualname__ = "packed_decode"
    return packed_decode


VARIANTS = {layout: _make_signature(layout) for layout in LAYOUTS}  # the op's contract per state layout
OPTIONS = {"config_arg": "config", "where": _WHERE, "bind_first": ("initial_state", "mixed_qkv"),
           "value_checks": value_checks, "value_rules": VALUE_RULES}


resolve_layout = layout_resolver("packed_decode")
resolve_layout.__doc__ = """The declared state layout of a packed-decode call: ``state_layout=``, else the config's,
else "VK"; a keyword that contradicts the config is a LayoutError.

Example::

    >>> resolve_layout(None, None), resolve_layout(None, "KV")
    ('VK', 'KV')
"""
