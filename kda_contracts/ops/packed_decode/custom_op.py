"""``torch.ops.kda_contracts.packed_decode``: packed decode as a torch.library custom op whose
fake (meta) implementation *is* the contract, so torch.compile, torch.export and ``opcheck`` see
exactly the shapes, dtypes and strides the contract accepts.

Importing this module registers the op (it is not imported by ``import kda_contracts``).

Example::

    import kda_contracts.ops.packed_decode.custom_op  # registers the op
    torch.ops.kda_contracts.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx,
                                          True, None, "VK", "auto")
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...errors import ContractError, passthrough_for_compile
from .decode import packed_decode as _packed_decode
from .decode import validate_packed_decode

__all__ = ["packed_decode"]


@torch.library.custom_op("kda_contracts::packed_decode", mutates_args=("initial_state", "out"))
def packed_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool, lower_bound: float | None, state_layout: str, backend: str,
) -> None:
    """KDA packed decode (in place on ``out`` and the used slots of ``initial_state``)."""
    _packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   use_qk_l2norm_in_kernel, lower_bound, backend=backend, state_layout=state_layout)  # type: ignore[arg-type]


@packed_decode.register_fake
def _(*args: Any) -> None:
    # The contract is the meta function: tracing a call that breaks it raises the same
    # ContractError an eager call would, before any graph is built. The dispatcher passes the
    # op's arguments in its schema order: the eleven of packed_decode, state_layout, backend.
    # Under torch.compile it raises as a class dynamo lets through unwrapped (see
    # passthrough_for_compile), so ``except kc.ShapeError`` works around compiled code too.
    *call, state_layout, _backend = args
    try:
        validate_packed_decode(*call, state_layout=state_layout)
    except ContractError as err:
        if torch.compiler.is_compiling():
            raise passthrough_for_compile(err) from None
        raise
