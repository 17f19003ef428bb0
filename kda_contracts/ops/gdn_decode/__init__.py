"""GDN packed decode (Gated DeltaNet: Qwen3-Next, Qwen3.5): the second shipped op, built with
the public op API — contract (VK/KV variants), hints, config and the torch reference backend.
Semantics: ``docs/semantics.md``. Kernels register on :data:`gdn_packed_decode`
(``gdn_packed_decode.backend("triton", devices=("cuda",), priority=...)``).

Example::

    from kda_contracts.ops.gdn_decode import GDNConfig, gdn_packed_decode, validate_gdn_packed_decode
"""

from . import backends as backends  # registers the shipped kernels on gdn_packed_decode
from .config import GDN_PRESETS as GDN_PRESETS
from .config import GDNConfig as GDNConfig
from .decode import gdn_packed_decode as gdn_packed_decode
from .decode import validate_gdn_packed_decode as validate_gdn_packed_decode
