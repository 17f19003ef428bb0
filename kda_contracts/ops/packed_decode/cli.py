"""What packed decode adds to the ``kda-contracts`` command line: its config named on the command
line (a preset or a Kimi-Linear ``config.json``, :func:`config_from_arg`) and its own dump format
for the engine's ``validate`` (the files :func:`.dump.save_dump` writes: :mod:`.dump`).

Example::

    >>> config_from_arg("kimi-linear-48b-a3b", 2)[1]
    'kimi-linear-48b-a3b, tp_size=2'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..._engine import CommandError, DumpFormat, LoadedFile
from .._packed.config import PRESETS, KDAConfig

_DUMP_EPILOG = """\
packed_decode dumps (save_dump): a dict with keys mixed_qkv, a, b, A_log, dt_bias, scale,
initial_state, out, ssm_state_indices (required), use_qk_l2norm_in_kernel, lower_bound
(optional), "config" (dict of KDAConfig fields, a preset name, or {"preset": name,
"tp_size": n}), "state_layout" ("VK" or "KV"); kda_contracts.ops.packed_decode.dump.save_dump
writes one. Checked in strict mode unless --mode check; --config, --tp and --state-layout
override the dump's.
"""


# -- docs ------------------------------------------------------------------------------------------


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


DEFAULT_PRESET = "kimi-linear-48b-a3b"


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
