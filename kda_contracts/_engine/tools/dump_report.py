"""The verdict on a :func:`kc.save_call <kda_contracts.save_call>` dump, as ``kda-contracts
validate`` prints it: every violation (the contract's own report, with fixes), the dims that
could be bound with where each came from, and for an op which backend ``backend="auto"`` would
run it and why each other one would not (as ``op.explain_backends`` says).

The replay uses the engine's slow path (the specification the generated checker agrees with),
with the config the call had. Device checks use the devices the tensors were saved on, also when
they were loaded elsewhere (a GPU dump read on a laptop) or saved without values.

Example::

    report = check_call(read_call_dump(load_file("call.pt")), strict=True)
    print(report.render()); report.exit_code      # 0 valid, 1 violations
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..contract.compiled import Contract
from ..errors import ContractError, DeviceError, Violation, format_report, uninspectable
from ..explain.explainer import explain_call
from ..model.spec import CallContext, Dims
from ..operation.backends import Backend
from ..operation.table import verdict_lines
from .dump_reader import CallDump, Placeholder, SavedConfig
from .dumps import DUMP_DIR_ENV, TAG

if TYPE_CHECKING:
    from ..operation.opdef import Op


EXIT_VALID, EXIT_INVALID = 0, 1
_SAVED_KEYS = ("by", "mode", "stage", "backend", "backend_asked", "error")


@dataclass
class CallReport:
    """The verdict on a dump; ``render()`` is the text, ``to_json()`` the same as data."""

    dump: CallDump
    mode: str
    variant: str | None
    dims: Dims
    violations: list[Violation]
    backends: list[tuple[Backend, list[str]]] | None  # None: not asked (not an op, or the call is invalid)
    plugin_errors: dict[str, str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def exit_code(self) -> int:
        return EXIT_VALID if self.ok else EXIT_INVALID

    def render(self) -> str:
        d, t = self.dump, self.dump.target
        variant = f", variant {self.variant}" if self.variant is not None else ""
        lines = [f"kda-contracts validate: {d.path}",
                 f"call:    {t['name']} ({t['kind']} {t['ref']}){variant}, mode {self.mode}",
                 f"saved:   {_saved_line(d.saved)}",
                 f"config:  {_config_line(self._config())}"]
        lines += [f"note:    {n}" for n in self.notes]
        lines += ["", "arguments:"]
        width = max((len(k) for k in d.values), default=0)
        lines += [f"  {k:<{width}}  {_argument_line(k, v, d.tensors)}" for k, v in d.values.items()]
        lines.append("")
        if self.ok:
            lines.append("VALID: the call meets the contract")
            if d.saved.get("by") == "rejection" and d.saved.get("error"):
                lines += ["", "rejected when saved:"] + [f"  {line}" for line in str(d.saved["error"]).splitlines()]
        else:
            n = len(self.violations)
            lines.append(f"INVALID: {n} violation{'s' if n != 1 else ''}")
            lines += format_report(str(t["name"]), self.violations, {}, {}).splitlines()[1:]
        lines.append("")
        if self.dims:
            lines.append("dims:")
            w = max(len(s) for s in self.dims)
            lines += [f"  {s:<{w}} = {_dim(v):<6} {self.dims.provenance.get(s, '')}".rstrip()
                      for s, v in self.dims.items()]
        else:
            lines.append("dims: none could be bound")
        if d.op is not None:
            lines.append("")
            if self.backends is None:
                lines.append(f"backends: none would run it ({d.op.name} validates before dispatching)")
            else:
                lines.append("backends (backend='auto'):")
                lines += verdict_lines(self.backends)
                lines += [f"plug-in {ep}: failed to load: {why}" for ep, why in self.plugin_errors.items()]
        return "\n".join(lines) + "\n"

    def _config(self) -> Any:
        c = self.dump.config_arg
        return self.dump.values.get(c) if c is not None else self.dump.config

    def to_json(self) -> dict[str, Any]:
        d = self.dump
        chosen = next((b.name for b, r in self.backends or [] if not r), None)
        return {
            "path": d.path, "valid": self.ok, "exit_code": self.exit_code, "mode": self.mode,
            "target": {"kind": d.target["kind"], "name": d.target["name"], "ref": d.target["ref"],
                       "variant": self.variant},
            "saved": jsonable({k: d.saved.get(k) for k in _SAVED_KEYS}),
            "config": _config_json(self._config()),
            "arguments": {k: _argument_json(k, v, d.tensors) for k, v in d.values.items()},
            "notes": list(self.notes),
            "violations": [{"argument": v.argument, "error": v.kind.kind_name, "expected": v.expected,
                            "got": v.got, "details": list(v.details), "fix": v.hint} for v in self.violations],
            "dims": {k: {"value": v, "from": self.dims.provenance.get(k)} for k, v in self.dims.items()},
            "backends": None if self.backends is None else [
                {"name": b.name, "priority": b.priority, "accepts": not r, "chosen": b.name == chosen, "reasons": r}
                for b, r in self.backends],
            "plugin_errors": dict(self.plugin_errors),
        }


# -- the verdict -----------------------------------------------------------------------------------
def _explain(contract: Contract, values: Mapping[str, Any], config: Any) -> tuple[Dims, list[Violation]]:
    """What the contract's full report says of a call (as ``Contract.fail`` builds it)."""
    tv = contract.type_violations(values)
    if tv:
        return Dims({}, {}), tv
    try:
        env, prov, violations = explain_call(contract.spec, values, config)
    except ContractError as err:
        return Dims(dict(err.dims), dict(err.provenance)), list(err.violations)
    except Exception as exc:  # as on the live path: an object no rule foresaw is a violation
        return Dims({}, {}), [uninspectable(exc)]
    return Dims(env, prov), list(violations)


@dataclass(frozen=True)
class _OnDevice:
    device: torch.device


def _saved_devices(contract: Contract, values: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, str]:
    return {n: str(tensors[n]["device"]) for n in contract.spec.tensors
            if isinstance(values.get(n), torch.Tensor) and isinstance(tensors.get(n), Mapping)}


def _device_violations(contract: Contract, saved: Mapping[str, str]) -> list[Violation]:
    """The contract's device rules decided on the devices the tensors were saved on."""
    first = contract.spec.first_tensor
    if first is None or first not in saved:
        return []
    out = []
    for name, tp in contract.spec.tensors.items():
        for rule in tp.rules:
            if rule.family == "device" and name in saved:
                facts = {"value": _OnDevice(torch.device(saved[name])), "device": torch.device(saved[first])}
                if rule.broken(**facts):
                    out.append(rule.violation(**facts))
    return out


def _variant(dump: CallDump, notes: list[str]) -> tuple[str | None, Contract, list[Violation]]:
    op: Op | None = dump.op
    if op is None:
        return None, dump.contract, []
    try:
        variant, contract = op.contract_for(dump.values)
    except ContractError as err:  # the variant-selecting arguments themselves are wrong
        return None, op.contract, list(err.violations)
    saved = dump.target.get("variant")
    if saved is not None and saved != variant:
        notes.append(f"saved as variant {saved}; these arguments select variant {variant} here")
    return variant, contract, []


def check_call(dump: CallDump, *, strict: bool | None = None) -> CallReport:
    """Replay a dump: the contract (and with ``strict``, default the mode it was saved in, the
    value checks, and an op's ``after`` checks when it was rejected by them), then, for a valid
    op call, the backends' verdicts."""
    mode = dump.saved_mode if strict is None else ("strict" if strict else "check")
    notes = list(dump.notes)
    variant, contract, early = _variant(dump, notes)
    if early:
        return CallReport(dump, mode, variant, Dims({}, {}), early, None, {}, notes)
    values = dump.values
    cfg_arg = contract.spec.config_arg
    config = values.get(cfg_arg) if cfg_arg is not None else (
        dump.config if dump.config is not None else contract.spec.config)
    dims, violations = _explain(contract, values, config)
    saved = _saved_devices(contract, values, dump.tensors)
    moved = {n: d for n, d in saved.items() if str(values[n].device) != d}
    if moved:
        where = ", ".join(sorted(set(moved.values())))
        how = "on the CPU" if dump.values_saved else "without values (on the meta device)"
        notes.append(f"tensors saved on {where} were loaded {how} here: device checks use the saved devices")
        violations = _device_violations(contract, saved) + [v for v in violations if v.kind is not DeviceError]
    if not violations and mode == "strict":
        violations = _strict_violations(dump, contract, values, config, dims, notes)
    backends, plugin_errors = None, {}
    if not violations and dump.op is not None:
        info = dump.op.call_info(values, dims, variant)
        if contract.spec.first_tensor in saved:
            info = dataclasses.replace(info, device_type=torch.device(saved[contract.spec.first_tensor]).type)
        backends = [(b, list(r)) for b, r in dump.op.table.verdicts(info)]
        plugin_errors = dump.op.plugin_errors()
        asked = dump.saved.get("backend_asked")
        if asked not in (None, "auto"):
            notes.append(f"the call asked for backend={asked!r}")
    if not violations and dump.saved.get("by") == "rejection":
        notes.append(f"rejected when it was saved (its report is below), valid here: {_why_valid_now(dump, mode)}")
    return CallReport(dump, mode, variant, dims, violations, backends, plugin_errors, notes)


def _why_valid_now(dump: CallDump, mode: str) -> str:
    if mode == "check" and dump.saved_mode == "strict":
        return "replayed in mode check, without the value checks"
    if mode == "strict" and not dump.values_saved:
        return "its tensor values were not saved, so the value checks could not run"
    return "the contract, its checks or the config's class changed since"


def _strict_violations(dump: CallDump, contract: Contract, values: Mapping[str, Any], config: Any, dims: Dims,
                       notes: list[str]) -> list[Violation]:
    if not dump.values_saved:
        notes.append("strict mode: the value checks were skipped (the tensors were saved without values)")
        return []
    ctx = CallContext(contract.spec, values, config, dict(dims), dims.provenance)
    out = contract.value_violations(ctx)  # the value rules, then value_checks=
    op = dump.op
    if not out and op is not None:
        out = op.alias_violations(ctx)
    if not out and op is not None and op.after is not None and dump.saved.get("stage") == "after":
        backend = str(dump.saved.get("backend"))
        notes.append(f"saved after backend {backend!r} ran: its outputs are as it left them, and the op's after "
                     "checks are replayed")
        out = list(op.after(ctx, backend))
    return out


# -- rendering -------------------------------------------------------------------------------------
def jsonable(obj: Any) -> Any:
    """``obj`` as JSON data (dtypes and devices as strings, tensors as their metadata).

    Example::

        jsonable({"dtype": torch.float16, "shape": (2, 3)})   # {'dtype': 'torch.float16', 'shape': [2, 3]}
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return {"tensor": _tensor_json(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items() if k != TAG}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, SavedConfig):
        return {k: jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")}
    if isinstance(obj, Placeholder):
        return {"class": obj.cls, "repr": obj.repr, "fields": jsonable(obj.fields)}
    fields = getattr(type(obj), "model_fields", None)
    if fields is not None:
        return {k: jsonable(getattr(obj, k)) for k in fields}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return repr(obj)


def _tensor_json(t: torch.Tensor, rec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
            "storage_offset": t.storage_offset(), "device": str(rec["device"]) if rec else str(t.device)}


def _argument_json(name: str, v: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(v, torch.Tensor):
        rec = tensors.get(name)
        return {"tensor": _tensor_json(v, rec if isinstance(rec, Mapping) else None)}
    return {"value": jsonable(v)}


def _argument_line(name: str, v: Any, tensors: Mapping[str, Any]) -> str:
    if isinstance(v, torch.Tensor):
        rec = tensors.get(name)
        dev = rec["device"] if isinstance(rec, Mapping) else v.device
        return (f"{str(v.dtype).removeprefix('torch.')} {list(v.shape)} strides {tuple(v.stride())} offset "
                f"{v.storage_offset()} on {dev}")
    if isinstance(v, (SavedConfig, Placeholder)) or hasattr(v, "contract_dims"):
        return _config_line(v) if hasattr(v, "contract_dims") else repr(v)
    text = repr(v)
    return text if len(text) <= 100 else text[:97] + "..."


def _config_line(cfg: Any) -> str:
    if cfg is None:
        return "none (dims come from the tensors)"
    cls = repr(cfg) if isinstance(cfg, SavedConfig) else type(cfg).__name__
    try:
        dims = dict(cfg.contract_dims()) if hasattr(cfg, "contract_dims") else None
    except Exception:
        dims = None
    if dims is None:
        from ..model.markers import config_dims

        try:
            dims = dict(config_dims(cfg))
        except Exception:
            return repr(cfg)[:100]
    fixed = ", ".join(f"{k}={v}" for k, v in dims.items()) or "no dims"
    how = "" if isinstance(cfg, SavedConfig) else f" ({type(cfg).__module__}:{type(cfg).__qualname__})"
    return f"{cls}{how} fixing {fixed}"


def _config_json(cfg: Any) -> dict[str, Any] | None:
    if cfg is None:
        return None
    cls = cfg._cls if isinstance(cfg, SavedConfig) else f"{type(cfg).__module__}:{type(cfg).__qualname__}"
    return {"class": cls, "rebuilt": not isinstance(cfg, SavedConfig), "fields": jsonable(cfg)}


def _saved_line(saved: Mapping[str, Any]) -> str:
    if saved.get("by") != "rejection":
        return f"by kc.save_call (mode {saved.get('mode')})"
    stage = saved.get("stage")
    what = {"contract": "the contract", "value checks": "strict mode's value checks"}.get(
        str(stage), f"the op's after checks, once backend {saved.get('backend')!r} had run")
    return f"automatically ({DUMP_DIR_ENV}): rejected in mode {saved.get('mode')} by {what}"


def _dim(v: Any) -> str:
    return str(list(v)) if isinstance(v, tuple) else str(v)  # a variadic dim binds a tuple of sizes
