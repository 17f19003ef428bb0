"""The ``kda-contracts`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kda-contracts``; returns the exit code.

    Example::

        $ kda-contracts demo
    """
    parser = argparse.ArgumentParser(prog="kda-contracts", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="a valid Kimi-Linear decode call, five real mistakes caught, the reference kernel")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo()
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
