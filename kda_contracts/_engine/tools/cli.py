"""The machinery of the ``kda-contracts`` command line: :class:`Command`, the engine's ``docs``
and ``validate`` commands, and :func:`main`, which runs the commands it is given (the package's
``__main__`` gives it the engine's and the shipped ops' commands; the engine never imports an op).

A command is a :class:`Command`: its name, its help, how it adds its arguments, and what it runs.
The ``docs`` command renders the contracts through a :class:`DocsSource` that an op provides
(its config on the command line and the files it generates); see :func:`docs_command`. The
``validate`` command replays a :func:`kc.save_call <kda_contracts.save_call>` dump of any op, and
reads the shipped ops' own dump formats (:class:`DumpFormat`); see :func:`validate_command`.
An unexpected exception in any command exits 2 with its traceback, never 1.

Example::

    $ kda-contracts demo
    $ kda-contracts docs --check
    $ kda-contracts validate step.pt
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .module_docs import ModulePage


DEFAULT_DOCS_DIR = "docs/generated"

class CommandError(Exception):
    """A bad command line argument (exit code 2)."""


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command without arguments of its own."""


@dataclass(frozen=True)
class Command:
    """One subcommand of ``kda-contracts``.

    ``summary`` is its line in ``kda-contracts --help`` (a second line continues it); ``run``
    returns the exit code and may raise :class:`CommandError` (exit 2).

    Example::

        Command("hello", "say hello", "say hello", run=lambda args: print("hello") or 0)
    """

    name: str
    summary: str
    help: str
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] = _no_arguments
    description: str | None = None
    epilog: str | None = None


@dataclass(frozen=True)
class DocsSource:
    """What ``kda-contracts docs`` renders by default (the shipped ops' docs, or with
    ``--builtin``): how the config is chosen on the command line (``configure`` adds the
    options, ``load`` reads them into a config and a label, ``options`` gives them back for the
    "regenerate with" line), the files generated for it (``generate(config, label, page)``;
    ``page``: the ``--module`` ops and contracts to add, or None), and the command's description
    and epilog (its exit codes)."""

    configure: Callable[[argparse.ArgumentParser], None]
    load: Callable[[argparse.Namespace], tuple[Any, str]]
    options: Callable[[argparse.Namespace], list[str]]
    generate: Callable[[Any, str, ModulePage | None], Mapping[str, str]]
    description: str
    epilog: str


def _import_modules(modules: Sequence[str]) -> None:
    """Import each ``--module`` (the current directory first on the path, as ``python -m`` has it)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (mod == exc.name or mod.startswith(exc.name + ".")):
                raise CommandError(f"--module {mod!r}: no such module in the current directory or on "
                                   "sys.path") from None
            raise CommandError(f"--module {mod!r}: cannot import it ({type(exc).__name__}: {exc})") from None
        except (Exception, SystemExit) as exc:
            raise CommandError(f"--module {mod!r}: cannot import it ({type(exc).__name__}: {exc})") from None


def _module_page(source: DocsSource, args: argparse.Namespace, cfg: Any, label: str) -> ModulePage:
    """The ``--module`` ops and contracts, described (the config applies when ``--builtin``
    or a config option was given)."""
    from . import module_docs

    _import_modules(args.module)
    empty = module_docs.empty_modules(args.module)
    if empty:
        raise CommandError(f"--module {', '.join(map(repr, empty))}: defines no contracts or ops (nothing in it or "
                           "its submodules is decorated with @kc.contract or @kc.op)")
    with_config = args.builtin or bool(source.options(args))
    try:
        return module_docs.describe_modules(args.module, cfg if with_config else None, label,
                                            availability=args.availability)
    except Exception as exc:  # a bug, never exit 1 (which --check means "out of date")
        traceback.print_exc()
        raise CommandError(f"--module {', '.join(args.module)}: documenting it failed ({type(exc).__name__}: "
                           f"{exc}; traceback above)") from None


def _run_docs(source: DocsSource, args: argparse.Namespace) -> int:
    from . import docs, module_docs

    if args.availability and not args.module:
        raise CommandError("--availability lists the backends of the --module ops; give --module")
    cfg, label = source.load(args)
    page = _module_page(source, args, cfg, label) if args.module else None
    files = source.generate(cfg, label, page) if page is None or args.builtin else module_docs.generate(page)
    if page is not None and not args.builtin:
        label = ", ".join(args.module)
    if args.check:
        problems = docs.check(files, args.out)
        if problems:
            print(f"kda-contracts docs --check: {len(problems)} file(s) out of date in {args.out}:")
            for p in problems:
                print(f"  {p}")
            opts = "".join(f" {o}" for o in _docs_options(source, args))
            print(f"regenerate with: kda-contracts docs{opts}")
            return 1
        print(f"kda-contracts docs --check: {len(files)} files in {args.out} are up to date")
        return 0
    done = docs.write(files, args.out)
    for line in done:
        print(line)
    print(f"{len(files)} files in {args.out} ({len(done)} changed) for {label}")
    return 0


def _docs_options(source: DocsSource, args: argparse.Namespace) -> list[str]:
    opts = [f"--out {args.out}"] if args.out != DEFAULT_DOCS_DIR else []
    opts += source.options(args) + [f"--module {m}" for m in args.module]
    return opts + ["--builtin"] * (args.builtin and bool(args.module)) + ["--availability"] * args.availability


def docs_command(source: DocsSource) -> Command:
    """The ``docs`` command for ``source``: ``--out``, the source's config options, ``--module``
    (repeatable: only the ops and contracts those modules define), ``--builtin`` (with
    ``--module``: the source's docs too), ``--availability`` and ``--check`` (exit 1 when the
    files on disk differ)."""

    def configure(d: argparse.ArgumentParser) -> None:
        d.add_argument("--out", default=DEFAULT_DOCS_DIR, help=f"output folder (default {DEFAULT_DOCS_DIR})")
        source.configure(d)
        d.add_argument("--module", action="append", default=[], metavar="MODULE",
                       help="document only the ops and contracts defined in MODULE and its submodules (repeatable; "
                            "found in the current directory first)")
        d.add_argument("--builtin", action="store_true",
                       help="with --module: the shipped ops' docs too (what is generated without --module)")
        d.add_argument("--availability", action="store_true",
                       help="with --module: say which backends can load on this machine (the output then depends "
                            "on the machine)")
        d.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ from what "
                                                            "would be generated")

    return Command(
        "docs", "generate the shape docs (Markdown, JSON, SVG) from the registered contracts; --check\n"
        "exits 1 when the files on disk differ from what would be generated",
        "generate the shape docs from the registered contracts", lambda args: _run_docs(source, args), configure,
        description=source.description, epilog=source.epilog)


# -- validate --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DumpFormat:
    """An op's own dump format, which ``kda-contracts validate`` reads besides
    :func:`kc.save_call <kda_contracts.save_call>`'s: its name, why a loaded file is not one
    (``why_not(raw)``; None when it is), how it adds its options (``options``: their ``dest``s,
    refused with other dumps) and how it validates a file (``run(args, loaded)``, the exit code).

    Example::

        DumpFormat("packed_decode dump", why_not, run, configure, ("config", "tp"), epilog)
    """

    name: str
    why_not: Callable[[Any], str | None]
    run: Callable[[argparse.Namespace, Any], int]
    configure: Callable[[argparse.ArgumentParser], None] = _no_arguments
    options: tuple[str, ...] = ()
    epilog: str = ""


_VALIDATE_EPILOG = """\
exit codes:
  0  the call meets the contract
  1  the call breaks the contract (every violation is listed)
  2  the file is not a usable dump: missing, not a torch.save file, refused by
     torch.load(weights_only=True), malformed, or its op cannot be imported here;
     an internal error (traceback on stderr); or a bad command line

A kc.save_call dump (also what KDA_CONTRACTS_DUMP_DIR collects) names its op or contract
as module:qualname, imported here (the current directory is on the path).
"""


def _run_validate(formats: Sequence[DumpFormat], args: argparse.Namespace) -> int:
    import json

    from .dump_reader import DumpError, is_call_dump, load_file, read_call_dump
    from .dump_report import check_call
    from .dumps import FORMAT_KEY

    try:
        loaded = load_file(args.dump)
        if not is_call_dump(loaded.raw):
            reasons = []
            for fmt in formats:
                why = fmt.why_not(loaded.raw)
                if why is None:
                    return fmt.run(args, loaded)
                reasons.append(f"not a {fmt.name} ({why})")
            raise DumpError(f"{loaded.path}: not a dump kda-contracts can read: not a kc.save_call dump (no "
                            f"{FORMAT_KEY!r} key){''.join(f'; {r}' for r in reasons)}")
        given = [f"--{o.replace('_', '-')}" for f in formats for o in f.options if getattr(args, o, None) is not None]
        if given:
            raise CommandError(f"{', '.join(given)}: for other dump formats; a kc.save_call dump carries its own "
                               "arguments and config")
        dump = read_call_dump(loaded)
    except DumpError as exc:
        print(f"kda-contracts validate: {exc}", file=sys.stderr)
        return 2
    report = check_call(dump, strict=None if args.mode is None else args.mode == "strict")
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render(), end="\n" if args.json else "")
    return report.exit_code


def validate_command(formats: Sequence[DumpFormat] = ()) -> Command:
    """The ``validate`` command: replays a :func:`kc.save_call <kda_contracts.save_call>` dump of
    any op or contract, or a file of one of ``formats`` (the shipped ops' own)."""

    def configure(v: argparse.ArgumentParser) -> None:
        v.add_argument("dump", help="the .pt file")
        v.add_argument("--mode", choices=("check", "strict"), default=None,
                       help="check: shapes, dtypes, devices, strides; strict adds the value checks. Default: the "
                            "mode the call was saved in (strict for the formats below)")
        v.add_argument("--strict", dest="mode", action="store_const", const="strict", help="same as --mode strict")
        v.add_argument("--json", action="store_true", help="print the report as JSON")
        for f in formats:
            f.configure(v)

    return Command(
        "validate", "the full contract report on a dumped call (kc.save_call, KDA_CONTRACTS_DUMP_DIR)",
        "report on a dumped call", lambda args: _run_validate(formats, args), configure,
        description="Load a dump of a call (torch.load(weights_only=True)) and print every violation, the bound dims "
                    "with where each came from, and, for an op, which backend would run the call and why the others "
                    "would not.",
        epilog=_VALIDATE_EPILOG + "".join("\n" + f.epilog for f in formats if f.epilog))


def _description(commands: Sequence[Command]) -> str:
    lines = ["The ``kda-contracts`` command line.", "", "Commands:"]
    for c in commands:
        first, *rest = c.summary.splitlines()
        lines.append(f"  {c.name:<9} {first}")
        lines += [" " * 12 + line for line in rest]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None, commands: Sequence[Command]) -> int:
    """Run the command line ``argv`` (None: ``sys.argv``) with ``commands``; returns the exit code.

    Example::

        $ kda-contracts demo
        $ kda-contracts docs --check
        $ kda-contracts validate step.pt
    """
    commands = list(commands)
    parser = argparse.ArgumentParser(prog="kda-contracts", description=_description(commands),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for c in commands:
        extra: dict[str, Any] = {}
        if c.description is not None or c.epilog is not None:
            extra = {"description": c.description, "epilog": c.epilog,
                     "formatter_class": argparse.RawDescriptionHelpFormatter}
        c.configure(sub.add_parser(c.name, help=c.help, **extra))
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in commands}
    try:
        return by_name[args.command].run(args)
    except CommandError as exc:
        print(f"kda-contracts {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, never a verdict: exit 2 (not 1, which means "violations" or "out of date")
        traceback.print_exc()
        print(f"kda-contracts {args.command}: internal error ({type(exc).__name__}: {exc}); the traceback is "
              "above", file=sys.stderr)
        return 2

