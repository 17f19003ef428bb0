"""The ops kda-contracts ships, one package each, built on the engine's API
(``kda_contracts._engine``) and what the packed linear-attention ops share (:mod:`._packed`),
never on one another: ``packed_decode`` (KDA, Kimi-Linear) and ``gdn_decode`` (GDN,
Qwen3-Next), and their varlen prefills ``packed_prefill`` and ``gdn_prefill``. Each holds its
contract, hints, mistakes catalogue, diagrams and docs part; its kernels live in ``kda_kernels``.
What spans several ops (the demo, the docs pages, the command line) lives above them, in
``kda_contracts._app``.

Example::

    import kda_contracts as kc
    sorted(kc.ops())        # ['gdn_packed_decode', 'gdn_packed_prefill', 'packed_decode', 'packed_prefill']
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    """``kc.ops()`` lists every op; ``kc.ops`` is also the name of this package, and importing a
    package binds its name on the parent, so the package answers the call the same way."""

    def __call__(self) -> dict[str, Any]:
        from .._engine import ops

        return ops()


sys.modules[__name__].__class__ = _CallablePackage
