"""The ops kda-contracts ships, one package each, built on the engine's public API:
``packed_decode`` (KDA, Kimi-Linear). Each holds its contract, hints, mistakes catalogue,
diagrams, dump report, custom op, demo and command-line commands; its kernels live in
``kda_kernels``.

Example::

    from kda_contracts.ops import cli_commands
    [c.name for c in cli_commands()]        # ['demo', 'docs', 'validate']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cli import Command

__all__ = ["cli_commands"]


def cli_commands() -> list[Command]:
    """The ``kda-contracts`` subcommands of every shipped op, in help order (the registry the
    engine's command line reads; each op's commands are imported only when asked for)."""
    from .packed_decode.cli import commands as packed_decode_commands

    return [*packed_decode_commands()]
