"""KDA packed (varlen) prefill (Kimi-Linear): a batch of sequences packed token after token, each
continuing from its pool slot or from zero, its final state written back. Contract, backends
(chunked torch reference, token loop, flash-linear-attention's ``chunk_kda``), mistakes, docs part.
Semantics: ``docs/prefill.md``.

Example::

    from kda_contracts.ops.packed_prefill import packed_prefill, validate_packed_prefill
"""

from . import backends as backends  # registers fla and the token loop on packed_prefill
from .prefill import packed_prefill as packed_prefill
from .prefill import validate_packed_prefill as validate_packed_prefill
