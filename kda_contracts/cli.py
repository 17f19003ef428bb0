"""The ``kda-contracts`` command line.

Commands:
  demo      a valid Kimi-Linear decode call, five real mistakes caught, the reference kernel
  docs      generate the shape docs (Markdown, JSON, SVG) from the registered contracts; --check
            exits 1 when the files on disk differ from what would be generated
  validate  the full contract report on a torch.save'd packed-decode call
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .ops.packed_decode.config import PRESETS, KDAConfig

__all__ = ["config_from_arg", "main"]

DEFAULT_PRESET = "kimi-linear-48b-a3b"
DEFAULT_DOCS_DIR = "docs/generated"

_VALIDATE_EPILOG = """\
exit codes:
  0  the call meets the contract
  1  the call breaks the contract (every violation is listed)
  2  the file is not a usable dump: missing, not a torch.save file, refused by
     torch.load(weights_only=True), not a dict, missing arguments, bad config;
     also a bad command line

The dump is a dict: keys mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
ssm_state_indices (required), use_qk_l2norm_in_kernel, lower_bound (optional),
"config" (dict of KDAConfig fields, a preset name, or {"preset": name, "tp_size": n}),
"state_layout" ("VK" or "KV"). kda_contracts.ops.packed_decode.dump.save_dump writes one.
"""

_DOCS_EPILOG = """\
exit codes:
  0  docs written (or, with --check, up to date)
  1  --check: the files differ from what would be generated (each one is listed)
  2  a bad command line (unknown preset, unreadable config.json, a --module that fails to import)
"""


class CommandError(Exception):
    """A bad command line argument (exit code 2)."""


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


def _docs(args: argparse.Namespace) -> int:
    from . import docs

    cfg, label = config_from_arg(args.config, args.tp)
    for mod in args.module:
        try:
            importlib.import_module(mod)
        except Exception as exc:
            raise CommandError(f"--module {mod!r}: cannot import it ({type(exc).__name__}: {exc})") from None
    files = docs.generate(cfg, label)
    if args.check:
        problems = docs.check(files, args.out)
        if problems:
            print(f"kda-contracts docs --check: {len(problems)} file(s) out of date in {args.out}:")
            for p in problems:
                print(f"  {p}")
            opts = "".join(f" {o}" for o in _docs_options(args))
            print(f"regenerate with: kda-contracts docs{opts}")
            return 1
        print(f"kda-contracts docs --check: {len(files)} files in {args.out} are up to date")
        return 0
    done = docs.write(files, args.out)
    for line in done:
        print(line)
    print(f"{len(files)} files in {args.out} ({len(done)} changed) for {label}")
    return 0


def _docs_options(args: argparse.Namespace) -> list[str]:
    opts = []
    if args.out != DEFAULT_DOCS_DIR:
        opts.append(f"--out {args.out}")
    if args.config:
        opts.append(f"--config {args.config}")
    if args.tp is not None:
        opts.append(f"--tp {args.tp}")
    opts += [f"--module {m}" for m in args.module]
    return opts


def _validate(args: argparse.Namespace) -> int:
    from .ops.packed_decode.dump import EXIT_UNUSABLE, DumpError, check_dump, load_dump

    if args.tp is not None and not args.config:
        raise CommandError("--tp needs --config (the dump's own config already says its tp_size)")
    cfg = config_from_arg(args.config, args.tp)[0] if args.config else None
    try:
        dump = load_dump(args.dump, config=cfg, state_layout=args.state_layout)
    except DumpError as exc:
        print(f"kda-contracts validate: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = check_dump(dump, strict=args.mode == "strict")
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.render(), end="")
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kda-contracts``; returns the exit code.

    Example::

        $ kda-contracts demo
        $ kda-contracts docs --check
        $ kda-contracts validate step.pt
    """
    parser = argparse.ArgumentParser(prog="kda-contracts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="a valid Kimi-Linear decode call, five real mistakes caught, the reference kernel")

    d = sub.add_parser("docs", help="generate the shape docs from the registered contracts",
                       description="Render every registered contract and backend to Markdown, JSON and SVG, "
                                   "with concrete shapes for a config, and the catalogue of known mistakes.",
                       epilog=_DOCS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--out", default=DEFAULT_DOCS_DIR, help=f"output folder (default {DEFAULT_DOCS_DIR})")
    d.add_argument("--config", help=f"a preset ({', '.join(sorted(PRESETS))}) or a Kimi-Linear config.json path "
                                    f"(default {DEFAULT_PRESET})")
    d.add_argument("--tp", type=int, help="tensor-parallel degree (default 1)")
    d.add_argument("--module", action="append", default=[], metavar="MODULE",
                   help="import MODULE first, so the contracts it decorates are documented too (repeatable)")
    d.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ from what "
                                                        "would be generated")

    v = sub.add_parser("validate", help="report on a torch.save'd packed-decode call",
                       description="Load a dump of a packed-decode call (torch.load(weights_only=True)) and print "
                                   "every violation, the bound dims with where each came from, and which "
                                   "backends would accept the call.",
                       epilog=_VALIDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("dump", help="the .pt file")
    v.add_argument("--config", help="check against this config instead of the dump's (a preset or a config.json)")
    v.add_argument("--tp", type=int, help="tensor-parallel degree for --config (default 1)")
    v.add_argument("--state-layout", choices=("VK", "KV"), help="the declared state layout (default: the dump's, "
                                                                "else the config's, else VK)")
    v.add_argument("--mode", choices=("check", "strict"), default="strict",
                   help="strict (default) adds the value checks: index range, duplicate slots, aliasing, finiteness")
    v.add_argument("--json", action="store_true", help="print the report as JSON")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from .ops.packed_decode.demo import run_demo

            return run_demo()
        if args.command == "docs":
            return _docs(args)
        if args.command == "validate":
            return _validate(args)
    except CommandError as exc:
        print(f"kda-contracts {args.command}: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
