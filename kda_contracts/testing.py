"""Public helpers for tests of code that uses kda-contracts: random, valid calls for each shipped op.

Example::

    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call, make_gdn_decode_call
    call = make_decode_call(kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), batch=2, pool=4)
    out, state = kc.packed_decode(**call, backend="torch")
    gdn = make_gdn_decode_call(kc.GDNConfig.preset("qwen3-next-80b-a3b", tp_size=8), batch=2, pool=4)
    out, state = kc.gdn_packed_decode(**gdn, backend="torch")
"""

from __future__ import annotations

from .ops._packed.calls import make_decode_call
from .ops.gdn_decode.calls import make_gdn_decode_call

__all__ = ["make_decode_call", "make_gdn_decode_call"]


