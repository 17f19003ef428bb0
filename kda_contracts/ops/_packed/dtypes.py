"""The dtype table of KDA packed decode, in one place: what each role may be, and the names a
:class:`~kda_contracts.KDAConfig` uses to pin one. The decode contract, the Kimi-Linear layer's
contracts and the config all read it.

Example::

    >>> from kda_contracts.ops._packed.dtypes import INDEX_DTYPES, DTYPES_BY_NAME
    >>> DTYPES_BY_NAME["int32"] in INDEX_DTYPES
    True
"""

from __future__ import annotations

import torch

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""``mixed_qkv``, ``a``, ``b``, ``out`` (and a layer's hidden states)."""
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The recurrent-state pool."""
INDEX_DTYPES = (torch.int32, torch.int64)
"""``ssm_state_indices`` (slot indices; < 0 marks padding)."""

DTYPES_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}
"""The dtype names a config pins a role with (``KDAConfig(index_dtype="int32")``)."""
