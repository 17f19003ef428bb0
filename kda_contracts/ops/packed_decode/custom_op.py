"""``torch.ops.kda_contracts.packed_decode``: packed decode as a torch.library custom op whose
fake (meta) implementation *is* the contract (``kc.packed_decode.torch_op``, see
:mod:`kda_contracts._engine.operation.torch_op`), so torch.compile, torch.export and ``opcheck`` see exactly the
shapes, dtypes and strides the contract accepts. ``out`` and ``initial_state`` are declared
mutated; the op returns nothing. The config is not an argument of a custom op: pass
``state_layout`` instead.

Importing this module registers the op (it is not imported by ``import kda_contracts``).

Example::

    import kda_contracts.ops.packed_decode.custom_op  # registers the op
    torch.ops.kda_contracts.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx,
                                          True, None, "VK", "auto")
"""

from __future__ import annotations

from .decode import packed_decode as _op

packed_decode = _op.torch_op
