"""The ``kda-contracts`` commands: ``demo`` (:mod:`.demo`), ``docs`` (the shipped ops' pages,
:mod:`.docs`, for a KDA config named on the command line) and the engine's ``validate``, which
also reads packed decode's own dump format.

Example::

    [c.name for c in commands()]        # ['demo', 'docs', 'validate']
"""

from __future__ import annotations

import argparse

from .._engine import Command, DocsSource, ModulePage, docs_command, validate_command
from ..ops._packed.config import PRESETS, KDAConfig
from ..ops.packed_decode.cli import DEFAULT_PRESET, config_from_arg, dump_format

_DOCS_EPILOG = """\
what is rendered:
  (no --module)          packed decode and every registered contract, for --config/--tp:
                         contracts.md/.json, errors.md and the SVG pictures
  --module M [...]       only the ops and contracts defined in M (and its submodules):
                         contracts.md/.json; --config/--tp apply when given
  --module M --builtin   both
--check compares what these options would generate with the files in --out (so give
--module docs a folder of their own).

exit codes:
  0  docs written (or, with --check, up to date)
  1  --check: the files differ from what would be generated (each one is listed)
  2  a bad command line (unknown preset, unreadable config.json, a --module that fails
     to import or defines no contracts or ops, --availability without --module), or
     documenting a --module failed (traceback on stderr)
"""


_DEMO = ("a contract on a user-written attention function, one mistake caught; then a valid\n"
         "Kimi-Linear decode call, six real packed-decode mistakes caught (one of GDN's), the reference kernel")
_DEMO_HELP = "a contract on your own function, then the KDA/GDN tour"


def _docs_configure(d: argparse.ArgumentParser) -> None:
    d.add_argument("--config", help=f"a preset ({', '.join(sorted(PRESETS))}) or a Kimi-Linear config.json path "
                                    f"(default {DEFAULT_PRESET})")
    d.add_argument("--tp", type=int, help="tensor-parallel degree (default 1)")


def _docs_options(args: argparse.Namespace) -> list[str]:
    return ([f"--config {args.config}"] if args.config else []) + ([f"--tp {args.tp}"] if args.tp is not None else [])


def _docs_generate(cfg: KDAConfig, label: str, page: ModulePage | None) -> dict[str, str]:
    from .docs import generate

    return generate(cfg, label, page=page)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def commands() -> list[Command]:
    """Every ``kda-contracts`` command, in the order ``--help`` lists them."""
    docs = DocsSource(
        configure=_docs_configure, load=lambda args: config_from_arg(args.config, args.tp), options=_docs_options,
        generate=_docs_generate,
        description="Render every registered contract and backend to Markdown, JSON and SVG, with concrete shapes "
                    "for a config, and the catalogue of known mistakes; or, with --module, only the ops (contracts, "
                    "checks, backends) and contracts that your modules define.",
        epilog=_DOCS_EPILOG)
    return [Command("demo", _DEMO, _DEMO_HELP, _demo), docs_command(docs), validate_command([dump_format()])]
