"""GDN packed (varlen) prefill (Qwen3-Next): KDA's prefill call with GDN's gate (one decay per value
head). Contract, backends (chunked torch reference, token loop, flash-linear-attention's
``chunk_gated_delta_rule``), mistakes, docs part. Semantics: ``docs/prefill.md``.

Example::

    from kda_contracts.ops.gdn_prefill import gdn_packed_prefill, validate_gdn_packed_prefill
"""

from . import backends as backends  # registers fla and the token loop on gdn_packed_prefill
from .prefill import gdn_packed_prefill as gdn_packed_prefill
from .prefill import validate_gdn_packed_prefill as validate_gdn_packed_prefill
