"""``kda-contracts validate DUMP.pt``: the full report on a packed-decode call saved to disk.

A dump is what an engine can ``torch.save`` when a decode step fails: a dict whose keys are the
argument names of ``packed_decode`` (``mixed_qkv`` ... ``ssm_state_indices`` required,
``use_qk_l2norm_in_kernel`` and ``lower_bound`` optional) plus, optionally, ``"config"`` (a dict
of :class:`~kda_contracts.KDAConfig` fields, or a preset name, or ``{"preset": name, "tp_size": 2}``)
and ``"state_layout"`` (``"VK"`` or ``"KV"``). :func:`save_dump` writes one.

It is read with ``torch.load(weights_only=True)``: a file that needs arbitrary unpickling is
refused, never executed. The report lists every violation (not just the first), the dims that
could be bound with where each came from, and which backends would accept the call.

Exit codes of the command: 0 the call is valid, 1 it breaks the contract, 2 the file is not a
usable dump (missing, not a ``torch.save`` file, refused by ``weights_only``, not a dict, missing
arguments, a bad config).

Example::

    >>> import tempfile, os
    >>> from kda_contracts import KDAConfig
    >>> from kda_contracts.testing import make_decode_call
    >>> cfg = KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8)
    >>> path = os.path.join(tempfile.mkdtemp(), "step.pt")
    >>> save_dump(path, make_decode_call(cfg, batch=2, pool=4), config=cfg)
    >>> check_dump(load_dump(path)).ok
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError

from ..._engine import (
    CallContext,
    ContractError,
    DeviceError,
    Dims,
    DumpError,
    LoadedFile,
    Violation,
    format_report,
    load_file,
    without_data,
)
from .._packed.config import PRESETS, KDAConfig
from . import adapters
from .contract import PACKED_DECODE_ARGS, resolve_layout
from .decode import packed_decode, packed_decode_contract

EXIT_VALID, EXIT_INVALID, EXIT_UNUSABLE = 0, 1, 2
REQUIRED = PACKED_DECODE_ARGS[:9]
OPTIONAL = PACKED_DECODE_ARGS[9:]
EXTRA_KEYS = ("config", "state_layout")


@dataclass
class DecodeDump:
    """A loaded dump: the call's arguments by name, its config and declared layout."""

    path: str
    values: dict[str, Any]
    config: KDAConfig | None
    config_origin: str
    state_layout: str | None
    notes: list[str] = field(default_factory=list)
    # Devices the tensors were saved on, and whether some were loaded elsewhere (no such device here).
    saved_devices: tuple[str, ...] = ()
    relocated: bool = False


def save_dump(path: str | os.PathLike[str], call: Mapping[str, Any], *, config: KDAConfig | None = None,
              state_layout: str | None = None) -> None:
    """Write a dump of a packed-decode call (``call``: its arguments by name) for
    ``kda-contracts validate``. The config is stored as plain fields, so the file loads with
    ``weights_only=True``.

    Example::

        save_dump("/tmp/step.pt", dict(mixed_qkv=mixed_qkv, a=a, ...), config=cfg)
    """
    data: dict[str, Any] = {k: v for k, v in call.items() if k in PACKED_DECODE_ARGS}
    if config is not None:
        data["config"] = config.model_dump()
    if state_layout is not None:
        data["state_layout"] = state_layout
    torch.save(data, path)


def _config_from(raw: Any) -> KDAConfig:
    if isinstance(raw, str):
        return KDAConfig.preset(raw)
    if isinstance(raw, Mapping):
        fields = dict(raw)
        preset = fields.pop("preset", None)
        if preset is not None:
            return KDAConfig.preset(str(preset), **fields)
        return KDAConfig(**fields)
    raise DumpError(f"'config' must be a dict of KDAConfig fields or a preset name "
                    f"({', '.join(sorted(PRESETS))}), got {type(raw).__name__}")


def dump_problem(raw: Any) -> str | None:
    """Why a loaded file is not a packed-decode dump (None when it is one, however broken: the
    rest is for :func:`from_loaded` to say)."""
    if not isinstance(raw, Mapping):
        return f"expected a dict of packed_decode arguments by name, got a {type(raw).__name__}"
    if not any(k in PACKED_DECODE_ARGS or k in EXTRA_KEYS for k in raw if isinstance(k, str)):
        shown = ", ".join(repr(k) for k in list(raw)[:8]) + (", ..." if len(raw) > 8 else "")
        return (f"none of the packed_decode arguments: is this a dump of another call (or a state_dict)? (keys: "
                f"{shown or 'none'}; required: {', '.join(REQUIRED)})")
    return None


def load_dump(path: str | os.PathLike[str], *, config: KDAConfig | None = None,
              state_layout: str | None = None) -> DecodeDump:
    """Read and check the structure of a dump; ``config``/``state_layout`` override the dump's.

    Raises :class:`DumpError` with a message that says what is wrong with the file.
    """
    return from_loaded(load_file(path), config=config, state_layout=state_layout)


def from_loaded(loaded: LoadedFile, *, config: KDAConfig | None = None,
                state_layout: str | None = None) -> DecodeDump:
    """:func:`load_dump` on a file already read with :func:`kda_contracts._engine.tools.dump_reader.load_file`."""
    p, raw, notes = loaded.path, loaded.raw, []
    if loaded.moved:
        notes.append(f"tensors saved on {', '.join(loaded.moved)} were loaded on the CPU (no such device here): "
                     "device checks see the CPU copies")
    problem = dump_problem(raw)
    if problem is not None:
        raise DumpError(f"{p}: {problem if not isinstance(raw, Mapping) else 'not a packed_decode dump: ' + problem}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        shown = ", ".join(repr(k) for k in list(raw)[:8]) + (", ..." if len(raw) > 8 else "")
        raise DumpError(f"{p}: not a packed_decode dump: missing {', '.join(missing)} (keys: {shown}; required: "
                        f"{', '.join(REQUIRED)})")
    ignored = [repr(k) for k in raw if k not in PACKED_DECODE_ARGS and k not in EXTRA_KEYS]
    if ignored:
        notes.append(f"ignored keys: {', '.join(ignored)}")
    values = {k: raw[k] for k in PACKED_DECODE_ARGS if k in raw}
    values.setdefault("use_qk_l2norm_in_kernel", False)
    values.setdefault("lower_bound", None)

    origin = "none"
    cfg = config
    if cfg is not None:
        origin = "the command line"
        if "config" in raw:
            notes.append("the dump's config was replaced by --config")
    elif raw.get("config") is not None:
        try:
            cfg = _config_from(raw["config"])
        except (ValidationError, ValueError, TypeError) as exc:
            raise DumpError(f"{p}: its 'config' is not a valid KDAConfig: {exc}") from None
        origin = "the dump"
    layout = state_layout if state_layout is not None else raw.get("state_layout")
    if layout is not None and layout not in ("VK", "KV"):
        raise DumpError(f"{p}: 'state_layout' must be 'VK' or 'KV', got {layout!r}")
    return DecodeDump(p, values, cfg, origin, layout, notes, loaded.locations, bool(loaded.moved))


@dataclass
class DumpReport:
    """The verdict on a dump: violations, bound dims, backends. ``render()`` is the text."""

    dump: DecodeDump
    layout: str
    mode: str
    dims: Dims
    violations: list[Violation]
    backends: list[tuple[str, list[str]]] | None  # None: not asked (the call is invalid)
    notes: list[str] = field(default_factory=list)  # about the check itself (value checks skipped)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def exit_code(self) -> int:
        return EXIT_VALID if self.ok else EXIT_INVALID

    def render(self) -> str:
        d = self.dump
        cfg = "none (dims come from the tensors)" if d.config is None else (
            f"{_config_label(d.config)} (from {d.config_origin})")
        lines = [f"kda-contracts validate: {d.path}",
                 f"call:   packed_decode, state layout {self.layout}, mode {self.mode}",
                 f"config: {cfg}"]
        lines += [f"note:   {n}" for n in [*d.notes, *self.notes]]
        lines.append("")
        if self.ok:
            lines.append("VALID: the call meets the contract")
        else:
            lines.append(f"INVALID: {len(self.violations)} violation{'s' if len(self.violations) != 1 else ''}")
            lines += format_report("packed_decode", self.violations, {}, {}).splitlines()[1:]
        lines.append("")
        if self.dims:
            lines.append("dims:")
            for sym, value in self.dims.items():
                lines.append(f"  {sym:<2} = {value:<6} {self.dims.provenance.get(sym, '')}")
        else:
            lines.append("dims: none could be bound")
        lines.append("")
        if self.backends is None:
            lines.append("backends: none would accept it (packed_decode validates before dispatching)")
        else:
            lines.append("backends:")
            chosen = next((n for n, r in self.backends if not r), None)
            for name, reasons in self.backends:
                if not reasons:
                    verdict = "accepts (backend='auto' picks it)" if name == chosen else "accepts"
                else:
                    verdict = "rejects: " + "; ".join(reasons)
                lines.append(f"  {name:>7}: {verdict}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.dump.path,
            "valid": self.ok,
            "exit_code": self.exit_code,
            "state_layout": self.layout,
            "mode": self.mode,
            "config": None if self.dump.config is None else self.dump.config.model_dump(mode="json"),
            "notes": [*self.dump.notes, *self.notes],
            "violations": [{"argument": v.argument, "error": v.kind.kind_name, "expected": v.expected,
                            "got": v.got, "details": list(v.details), "fix": v.hint} for v in self.violations],
            "dims": {k: {"value": v, "from": self.dims.provenance.get(k)} for k, v in self.dims.items()},
            "backends": None if self.backends is None else [{"name": n, "accepts": not r, "reasons": r}
                                                            for n, r in self.backends],
        }


def _config_label(cfg: KDAConfig) -> str:
    d = cfg.contract_dims()
    return (f"KDAConfig(H={d['H']}, HV={d['HV']}, K={d['K']}, V={d['V']}, tp_size={cfg.tp_size}, "
            f"state_layout={cfg.state_layout}, gate={cfg.gate})")


def check_dump(dump: DecodeDump, *, strict: bool = True) -> DumpReport:
    """Run the packed-decode contract on a loaded dump and collect the whole verdict.

    ``strict`` adds the value checks (index range, duplicate slots, aliasing, finiteness) when the
    shapes, dtypes and layouts are right; they read each broadcast (stride-0) value once, so a
    small dump of expanded activations of any logical size validates in bounded memory. A dump of
    meta tensors gets the metadata checks and a note that the value checks were skipped.
    """
    mode = "strict" if strict else "check"
    try:
        layout = resolve_layout(dump.config, dump.state_layout)
    except ContractError as err:  # the dump's state_layout contradicts its config
        return DumpReport(dump, dump.state_layout or "VK", mode, Dims({}, {}), list(err.violations), None)
    c = packed_decode_contract(layout)
    values = dict(dump.values, config=dump.config)
    dims, violations = c.explain(**values)
    if dump.relocated and len(dump.saved_devices) > 1:
        # Loading on the CPU erased the mismatch the call had; say so rather than call it valid.
        violations = [Violation(
            DeviceError, "(dump)", "every tensor on one device", f"tensors saved on {', '.join(dump.saved_devices)}",
            hint="this machine lacks one of those devices, so which argument was where is lost; validate on a "
                 "machine that has it to see the argument"), *violations]
    notes: list[str] = []
    blind = without_data(values)
    if not violations and strict and blind:
        notes.append(f"strict mode's value checks skipped: no data in {', '.join(blind)} (meta tensors); "
                     "only the metadata was checked")
    elif not violations and strict and (c.spec.value_checks is not None or c.spec.value_rules):
        ctx = CallContext(c.spec, values, dump.config, dict(dims), dims.provenance)
        violations = c.value_violations(ctx)  # the value rules, then value_checks=
    backends = None
    if not violations:
        info = packed_decode.call_info(values, dims, layout)
        backends = [(ad.name, reasons) for ad, reasons in adapters.verdicts(info)]
    return DumpReport(dump, layout, mode, dims, list(violations), backends, notes)
