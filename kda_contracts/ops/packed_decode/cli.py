"""The ``kda-contracts`` commands of packed decode: ``demo`` (the tour), ``docs`` (its config on
the command line and the files it generates: :mod:`.docs`), and its own dump format for the
engine's ``validate`` (the files :func:`.dump.save_dump` writes: :mod:`.dump`). The engine's
command line finds them through :func:`kda_contracts.ops.cli_commands`.

Example::

    >>> config_from_arg("kimi-linear-48b-a3b", 2)[1]
    'kimi-linear-48b-a3b, tp_size=2'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..._engine import Command, CommandError, DocsSource, DumpFormat, LoadedFile, docs_command
from .config import PRESETS, KDAConfig

if TYPE_CHECKING:
    from ..._engine import ModulePage

__all__ = ["commands", "config_from_arg", "dump_format"]

DEFAULT_PRESET = "kimi-linear-48b-a3b"

_DUMP_EPILOG = """\
packed_decode dumps (save_dump): a dict with keys mixed_qkv, a, b, A_log, dt_bias, scale,
initial_state, out, ssm_state_indices (required), use_qk_l2norm_in_kernel, lower_bound
(optional), "config" (dict of KDAConfig fields, a preset name, or {"preset": name,
"tp_size": n}), "state_layout" ("VK" or "KV"); kda_contracts.ops.packed_decode.dump.save_dump
writes one. Checked in strict mode unless --mode check; --config, --tp and --state-layout
override the dump's.
"""

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

_DEMO = "a valid Kimi-Linear decode call, six real mistakes caught (one of GDN's), the reference kernel"


def config_from_arg(value: str | None, tp: int | None) -> tuple[KDAConfig, str]:
    """The config named on the command line (a preset name, or a Kimi-Linear ``config.json``
    path) and a label for it that does not depend on where the file is.

    Example::

        >>> config_from_arg("kimi-linear-48b-a3b", 2)[1]
        'kimi-linear-48b-a3b, tp_size=2'
    """
    name = value or DEFAULT_PRESET
    tp_size = 1 if tp is None else tp
    try:
        if name in PRESETS:
            return KDAConfig.preset(name, tp_size=tp_size), f"{name}, tp_size={tp_size}"
        path = Path(name)
        if not path.is_file():
            raise CommandError(f"--config {name!r}: neither a preset ({', '.join(sorted(PRESETS))}) nor a file")
        return KDAConfig.from_hf_config(path, tp_size=tp_size), f"{path.name}, tp_size={tp_size}"
    except CommandError:
        raise
    except (ValueError, OSError) as exc:
        raise CommandError(f"--config {name!r}: {exc}") from None


# -- docs ------------------------------------------------------------------------------------------
def _docs_configure(d: argparse.ArgumentParser) -> None:
    d.add_argument("--config", help=f"a preset ({', '.join(sorted(PRESETS))}) or a Kimi-Linear config.json path "
                                    f"(default {DEFAULT_PRESET})")
    d.add_argument("--tp", type=int, help="tensor-parallel degree (default 1)")


def _docs_options(args: argparse.Namespace) -> list[str]:
    return ([f"--config {args.config}"] if args.config else []) + ([f"--tp {args.tp}"] if args.tp is not None else [])


def _docs_generate(cfg: KDAConfig, label: str, page: ModulePage | None) -> dict[str, str]:
    from .docs import generate

    return generate(cfg, label, page=page)


# -- validate: the packed-decode dump format ---------------------------------------------------------
def _dump_configure(v: argparse.ArgumentParser) -> None:
    v.add_argument("--config", help="packed_decode dumps: check against this config instead of the dump's (a preset "
                                    "or a config.json)")
    v.add_argument("--tp", type=int, help="tensor-parallel degree for --config (default 1)")
    v.add_argument("--state-layout", choices=("VK", "KV"), help="packed_decode dumps: the declared state layout "
                                                                "(default: the dump's, else the config's, else VK)")


def _dump_run(args: argparse.Namespace, loaded: LoadedFile) -> int:
    from .dump import EXIT_UNUSABLE, DumpError, check_dump, from_loaded

    if args.tp is not None and not args.config:
        raise CommandError("--tp needs --config (the dump's own config already says its tp_size)")
    cfg = config_from_arg(args.config, args.tp)[0] if args.config else None
    try:
        dump = from_loaded(loaded, config=cfg, state_layout=args.state_layout)
    except DumpError as exc:
        print(f"kda-contracts validate: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = check_dump(dump, strict=args.mode != "check")
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.render(), end="")
    return report.exit_code


def _dump_problem(raw: object) -> str | None:
    from .dump import dump_problem

    return dump_problem(raw)


def dump_format() -> DumpFormat:
    """The packed-decode dump format (:func:`.dump.save_dump`'s), for ``kda-contracts validate``."""
    return DumpFormat("packed_decode dump", _dump_problem, _dump_run, _dump_configure,
                      ("config", "tp", "state_layout"), _DUMP_EPILOG)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def commands() -> list[Command]:
    """The packed-decode commands, in the order ``kda-contracts --help`` lists them."""
    docs = DocsSource(
        configure=_docs_configure, load=lambda args: config_from_arg(args.config, args.tp), options=_docs_options,
        generate=_docs_generate,
        description="Render every registered contract and backend to Markdown, JSON and SVG, with concrete shapes "
                    "for a config, and the catalogue of known mistakes; or, with --module, only the ops (contracts, "
                    "checks, backends) and contracts that your modules define.",
        epilog=_DOCS_EPILOG)
    return [Command("demo", _DEMO, _DEMO, _demo), docs_command(docs)]
