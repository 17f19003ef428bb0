"""The ops kda-contracts ships, one package each, built on the engine's public API:
``packed_decode`` (KDA, Kimi-Linear). Each holds its contract, hints, mistakes catalogue,
diagrams, dump format, custom op, demo and command-line commands; its kernels live in
``kda_kernels``.

Example::

    from kda_contracts.ops import cli_commands
    [c.name for c in cli_commands()]        # ['demo', 'docs', 'validate']
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._engine import Command

__all__ = ["cli_commands"]


class _CallablePackage(types.ModuleType):
    """``kc.ops()`` lists every op; ``kc.ops`` is also the name of this package, and importing a
    package binds its name on the parent, so the package answers the call the same way."""

    def __call__(self) -> dict[str, Any]:
        from .._engine import ops

        return ops()


sys.modules[__name__].__class__ = _CallablePackage


def cli_commands() -> list[Command]:
    """The ``kda-contracts`` subcommands of every shipped op, in help order, and the engine's
    ``validate``, which also reads the shipped ops' own dump formats (the registry the engine's
    command line reads; each op's commands are imported only when asked for)."""
    from .._engine import validate_command
    from .packed_decode.cli import commands as packed_decode_commands
    from .packed_decode.cli import dump_format as packed_decode_dumps

    return [*packed_decode_commands(), validate_command([packed_decode_dumps()])]
