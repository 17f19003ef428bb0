"""The ``kda-contracts`` command (also ``python -m kda_contracts``): the engine's command line
with the commands of the ops we ship (``demo``, ``docs``, ``validate``).

Example::

    $ python -m kda_contracts demo
    $ kda-contracts docs --check
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._app.cli import commands
from ._engine import run_command_line

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kda-contracts``; returns the exit code."""
    return run_command_line(argv, commands())


if __name__ == "__main__":
    sys.exit(main())
