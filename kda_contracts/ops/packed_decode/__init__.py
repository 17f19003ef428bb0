"""KDA packed decode (Kimi-Linear): the flagship op — contract, hints, backends, config,
mistakes catalogue, diagrams, dumps, custom op and demo. Semantics: ``kernels/INTERFACE.md``.

Example::

    from kda_contracts.ops.packed_decode import packed_decode, validate_packed_decode
"""

from .._packed.config import PRESETS as PRESETS
from .._packed.config import KDAConfig as KDAConfig
from .decode import explain_backends as explain_backends
from .decode import packed_decode as packed_decode
from .decode import packed_decode_contract as packed_decode_contract
from .decode import validate_packed_decode as validate_packed_decode
