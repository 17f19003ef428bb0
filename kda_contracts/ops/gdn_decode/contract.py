"""The GDN packed-decode contract, one variant per state layout, written with the public markers
only (``kc.Spec``, ``kc.Range``, ``kc.MatchConfig``, ``kc.Where``). It is KDA's contract but for
the gate: ``a`` is ``[B, HV]`` and ``dt_bias`` ``[HV]`` (one decay per value head), and there is no
``lower_bound`` (a config with KDA's bounded gate, or with ``kda_layers``, is refused: ``fits_gdn``).
Semantics: ``docs/semantics.md``.

Example::

    >>> VARIANTS["KV"].__annotations__["initial_state"].__origin__.dim_str
    'N HV K V'
"""

# No `from __future__ import annotations`: the annotations are built from local values.

from collections.abc import Callable
from typing import Annotated, Any

import annotated_types
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ... import _engine as kc
from .._packed.config import fits_gdn
from .._packed.dtypes import ACTIVATION_DTYPES, INDEX_DTYPES, STATE_DTYPES
from .._packed.layouts import layout_resolver

LAYOUTS: tuple[str, ...] = ("VK", "KV")
SYMBOLS: tuple[str, ...] = ("B", "H", "HV", "K", "V", "N")
GDN_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices",
            "use_qk_l2norm_in_kernel")

WHERE: tuple[kc.Where, ...] = (
    kc.Where("HV % H == 0", hint="value heads HV must be a multiple of the q/k heads H (each q/k head serves "
             "HV/H value heads); check linear_num_key_heads/linear_num_value_heads and the width of mixed_qkv"),
    kc.Where("HV >= 1"), kc.Where("K >= 1"), kc.Where("V >= 1"),
    kc.Where("N >= 1", hint="the state pool has no slots"),
)


def _make_signature(layout: str) -> Callable[..., Any]:
    state_dims = "N HV V K" if layout == "VK" else "N HV K V"
    act = kc.Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")

    def gdn_packed_decode(
        mixed_qkv: Annotated[Float[Tensor, "B 2*H*K+HV*V"], act],
        a: Annotated[Float[Tensor, "B HV"], act],
        b: Annotated[Float[Tensor, "B HV"], act],
        A_log: Annotated[Float[Tensor, "HV"], kc.Spec(dtypes=(torch.float32,), contiguous=True)],
        dt_bias: Annotated[Float[Tensor, "HV"], kc.Spec(dtypes=(torch.float32,), contiguous=True)],
        scale: Annotated[float, kc.Range(gt=0, finite=True), kc.MatchConfig("scale", rel_tol=1e-6)],
        initial_state: Annotated[Float[Tensor, state_dims],
                                 kc.Spec(dtypes=STATE_DTYPES, inner_contiguous=3, config_dtype="state",
                                         disjoint=True, mutated=True)],
        out: Annotated[Float[Tensor, "B 1 HV V"],
                       kc.Spec(dtypes=ACTIVATION_DTYPES, contiguous=True, same_dtype_as="mixed_qkv", mutated=True)],
        ssm_state_indices: Annotated[Int[Tensor, "B"],
                                     kc.Spec(dtypes=INDEX_DTYPES, config_dtype="index", contiguous=True)],
        use_qk_l2norm_in_kernel: Annotated[bool, kc.MatchConfig("use_qk_l2norm")] = False,
        *,
        config: Annotated[Any, annotated_types.Predicate(fits_gdn)] = None,  # a KDA layer's config is refused
        state_layout: str | None = None,  # "VK" | "KV" | None, read by resolve_layout (the variant)
    ) -> None:
        """GDN packed decode."""

    return gdn_packed_decode


VARIANTS: dict[str, Callable[..., Any]] = {layout: _make_signature(layout) for layout in LAYOUTS}


# GDN's layout is declared as KDA's is (state_layout=, else the config's, else VK): the same resolver
resolve_layout: Callable[[Any, str | None], str] = layout_resolver("gdn_packed_decode")
