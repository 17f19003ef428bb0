"""Dumps of a call, for any op or contract: :func:`save_call` writes one, and with
``KDA_CONTRACTS_DUMP_DIR`` set every call rejected in ``check`` or ``strict`` mode is written
there (this module listens to the engine's rejection hook). ``kda-contracts validate DUMP``
replays one (:mod:`.dump_reader`, :mod:`.dump_report`).

A dump is one ``torch.save`` file that ``torch.load(weights_only=True)`` reads: a dict of
tensors and plain values, never a pickled object. Tensors are saved as torch saves them (their
storage, so dtype, shape, strides, storage offset and sharing between arguments survive: an
expanded or sliced tensor is judged the same after the round trip); their devices are recorded
too. Other objects are recorded by class (``"module:qualname"``) and fields, and rebuilt when that
class can be imported: pydantic models, dataclasses, named tuples, enums, and configs (anything
with ``contract_dims()``), whose dims, dtypes and the attributes the contract reads are recorded
as well, so a config that cannot be rebuilt is replayed faithfully from them.

The automatic dumps are bounded: at most ``KDA_CONTRACTS_DUMP_MAX`` files (default 20) named
``kda-dump-NNN-<op>.pt`` in the folder; the oldest are kept and later rejections are not saved
(one warning says so). A call whose tensors exceed ``KDA_CONTRACTS_DUMP_MAX_BYTES`` (default
256 MiB) is saved without tensor values (shapes, strides and devices only): the replay judges its
metadata but cannot run the value checks. Nothing is written for a call that passes. Saving never
raises: a failure is a warning, and the call's own ContractError is raised as it would be,
its message ending with the dump's path. Nothing is saved while torch.compile traces (the tensors
are fake then) or during CUDA-graph capture.

Example::

    kc.save_call(scale_rows, "call.pt", x, w, out)      # any op, or any @kc.contract function
    $ kda-contracts validate call.pt
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import reprlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import hooks, modes
from ..compile.marks import tracing
from ..errors import AnnotationError, ContractError
from ..model.markers import config_dim_source, config_dims, config_dtypes
from ..version import __version__

if TYPE_CHECKING:
    from ..contract.compiled import Contract
    from ..operation.opdef import Op


FORMAT_KEY = "kda_contracts_dump"  # the key that marks a file as a call dump; its value: the format version
FORMAT_VERSION = 1
TAG = "__kda__"  # marks an encoded object among the arguments: "object", "enum", "tensor" (values not saved), "unsaved"
DUMP_DIR_ENV = "KDA_CONTRACTS_DUMP_DIR"
DUMP_MAX_ENV = "KDA_CONTRACTS_DUMP_MAX"
DUMP_MAX_BYTES_ENV = "KDA_CONTRACTS_DUMP_MAX_BYTES"
DEFAULT_MAX = 20
DEFAULT_MAX_BYTES = 256 * 2**20
DUMP_NAME = re.compile(r"kda-dump-(\d+)-.*\.pt$")
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
_DEPTH = 32
_FULL_WARNED: set[str] = set()


def ref_of(obj: Any) -> str:
    """``"module:qualname"`` of a class or function (what the reader imports)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def tensor_record(t: torch.Tensor) -> dict[str, Any]:
    """What the verdict depends on besides values: dtype, shape, strides, offset, device."""
    try:
        nbytes = t.untyped_storage().nbytes()
    except Exception:  # a tensor without a storage (sparse, nested): its size in elements
        nbytes = t.numel() * t.element_size()
    return {"dtype": t.dtype, "shape": list(t.shape), "stride": list(t.stride()),
            "storage_offset": t.storage_offset(), "device": str(t.device), "storage_nbytes": int(nbytes)}


class _Encoder:
    """Turns a call's arguments into what ``torch.load(weights_only=True)`` can read back."""

    def __init__(self, values_saved: bool, match_attrs: frozenset[str], configs: tuple[Any, ...]) -> None:
        self.values_saved = values_saved
        self.match_attrs = match_attrs
        self.configs = {id(c) for c in configs if c is not None}
        self.tensors: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self._storages: dict[tuple[str, int], int] = {}

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())

    def encode(self, obj: Any, path: str, depth: int = 0) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if type(obj) in _PLAIN:
            return obj
        if depth > _DEPTH:
            return self._unsaved(obj, path, "nested too deep")
        if isinstance(obj, enum.Enum):
            return {TAG: "enum", "class": ref_of(type(obj)), "value": self.encode(obj.value, path, depth + 1)}
        if type(obj) in (list, tuple):
            return type(obj)(self.encode(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj))
        if type(obj) is dict and all(isinstance(k, str) for k in obj):
            return {k: self.encode(v, f"{path}[{k!r}]", depth + 1) for k, v in obj.items()}
        if isinstance(obj, (bool, int, float, str)):  # numpy scalars and other subclasses: the plain value
            plain = next(t for t in (bool, int, float, str) if isinstance(obj, t))
            self.notes.append(f"{path}: a {type(obj).__qualname__} saved as {plain.__name__}")
            return plain(obj)
        fields, kind = _fields_of(obj)
        if fields is None:
            return self._unsaved(obj, path, "not a tensor, a plain value, or an object with fields")
        out: dict[str, Any] = {TAG: "object", "class": ref_of(type(obj)), "kind": kind,
                               "fields": {k: self.encode(v, f"{path}.{k}", depth + 1) for k, v in fields.items()}}
        if id(obj) in self.configs or hasattr(obj, "contract_dims"):
            out["config"] = self._config_facts(obj)
        return out

    def _tensor(self, t: torch.Tensor, path: str) -> Any:
        rec = self.tensors[path] = tensor_record(t)
        try:
            key = (rec["device"], t.untyped_storage().data_ptr())
        except Exception:
            key = (rec["device"], id(t))
        self._storages[key] = rec["storage_nbytes"]
        return t.detach() if self.values_saved else {TAG: "tensor", **rec}

    def _unsaved(self, obj: Any, path: str, why: str) -> dict[str, Any]:
        self.notes.append(f"{path}: a {type(obj).__qualname__} could not be saved ({why}); the replay passes a "
                          "placeholder")
        return {TAG: "unsaved", "class": ref_of(type(obj)), "repr": reprlib.repr(obj)}

    def _config_facts(self, cfg: Any) -> dict[str, Any]:
        """What the engine reads of a config, so it can be replayed without its class."""
        try:
            dims = dict(config_dims(cfg))
            facts: dict[str, Any] = {"dims": dims, "dim_sources": {s: config_dim_source(cfg, s) for s in dims}}
            dts = config_dtypes(cfg)
        except Exception as exc:  # not a config the engine can read: the replay says so, as the call did
            self.notes.append(f"config: a {type(cfg).__qualname__} whose dims cannot be read ({type(exc).__name__})")
            return {"dims": {}, "dim_sources": {}, "attrs": {}}
        if dts:
            facts["dtypes"] = dict(dts)
        attrs = {}
        for a in sorted(self.match_attrs):
            try:
                attrs[a] = self.encode(getattr(cfg, a), f"config.{a}", _DEPTH)
            except AttributeError:
                continue
        facts["attrs"] = attrs
        return facts


def _fields_of(obj: Any) -> tuple[dict[str, Any] | None, str]:
    """An object's fields and how to rebuild it: pydantic, dataclass, namedtuple, mapping, object."""
    if hasattr(type(obj), "model_fields") and hasattr(type(obj), "model_validate"):
        return {k: getattr(obj, k) for k in type(obj).model_fields}, "pydantic"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, "dataclass"
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return dict(obj._asdict()), "namedtuple"
    if isinstance(obj, Mapping) and all(isinstance(k, str) for k in obj):
        return dict(obj), "mapping"
    if hasattr(obj, "contract_dims"):  # a config of another kind: its attributes, replayed from its facts
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")} if hasattr(obj, "__dict__") else {}, \
            "object"
    return None, ""


# -- what is saved ---------------------------------------------------------------------------------
def _target_of(target: Any) -> tuple[Op | None, Contract]:
    from ..operation.opdef import Op

    if isinstance(target, Op):
        return target, target.contract
    c = getattr(target, "__kda_contract__", None)
    if c is None:
        raise AnnotationError(f"kc.save_call: expected a kc.Op or a function decorated with @kc.contract, got "
                        f"{type(target).__name__} {getattr(target, '__qualname__', target)!r} (under mode 'off' "
                        "@kc.contract returns the function itself)")
    return None, c


def _owner_of(contract: Contract) -> tuple[Op | None, str | None]:
    """The op a contract belongs to (one of its variants), if any."""
    from ..operation.registry import ops

    for o in ops().values():
        for key, c in o.contracts.items():
            if c is contract:
                return o, key
    return None, None


def build_dump(op: Op | None, contract: Contract, variant: str | None, values: Mapping[str, Any], config: Any,
               saved: dict[str, Any], *, values_saved: bool = True, max_bytes: int | None = None) -> dict[str, Any]:
    """The dict a dump file holds (``max_bytes``: above it, tensors are saved without values)."""
    contracts = list(op.contracts.values()) if op is not None else [contract]
    attrs = frozenset(sp.match.attr for c in contracts for sp in c.spec.scalars.values() if sp.match is not None)
    enc = _Encoder(values_saved, attrs, (config,))
    arguments = {k: enc.encode(v, k) for k, v in values.items()}
    if max_bytes is not None and values_saved and enc.nbytes > max_bytes:
        return build_dump(op, contract, variant, values, config, saved, values_saved=False, max_bytes=max_bytes)
    cfg_arg = contract.spec.config_arg
    notes = list(enc.notes)
    if not values_saved:
        notes.append(f"tensor values not saved: the call's storages take {enc.nbytes} bytes, over "
                     f"{DUMP_MAX_BYTES_ENV}={max_bytes}")
    fn = op if op is not None else contract.fn
    target = {"kind": "op" if op is not None else "contract", "name": op.name if op is not None else contract.name,
              "ref": ref_of(fn), "variant": variant,
              "variant_args": list(op._variant_params) if op is not None else []}


    return {
        FORMAT_KEY: FORMAT_VERSION, "target": target, "arguments": arguments, "config_arg": cfg_arg,
        "config": None if cfg_arg is not None or config is None else enc.encode(config, "config"),
        "tensors": enc.tensors, "values_saved": values_saved, "saved": saved, "notes": notes,
        "versions": {"torch": str(torch.__version__), "kda_contracts": str(__version__)},
    }


def save_call(target: Any, path: str | os.PathLike[str], /, *args: Any, **kwargs: Any) -> Path:
    """Save a call of ``target`` (a :class:`kc.Op <kda_contracts.Op>` or a function decorated with
    ``@kc.contract``) to ``path``, without running or checking it, for ``kda-contracts validate``.
    An op's ``backend=`` is recorded too. Returns the path.

    Example::

        kc.save_call(scale_rows, "call.pt", x, w, out)
        $ kda-contracts validate call.pt          # exit 0 valid, 1 violations, 2 unusable
    """
    op, contract = _target_of(target)
    if not isinstance(path, (str, os.PathLike)):
        raise AnnotationError(f"kc.save_call: the path is a str or os.PathLike, got {path!r}")
    backend = kwargs.pop("backend", "auto") if op is not None else "auto"
    if not isinstance(backend, str):
        raise AnnotationError(f"kc.save_call: backend= takes a backend's name or 'auto', got {backend!r}")
    if op is None and getattr(target, "__self__", None) is not None:  # a bound method: self is the first argument
        args = (target.__self__, *args)
    signature = op.signature if op is not None else contract.spec.signature
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    variadic = [p.name for p in signature.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    values = {k: v for k, v in bound.arguments.items() if k not in variadic}
    variant = None
    if op is not None:
        try:
            variant, contract = op.contract_for(values)
        except ContractError:  # the variant-selecting arguments are themselves wrong: the replay says how
            pass
    mode = "strict" if modes.current_mode() == modes.STRICT else "check"
    saved = {"by": "kc.save_call", "mode": mode, "stage": None, "backend": None, "error": None,
             "backend_asked": backend}
    data = build_dump(op, contract, variant, values, contract._config_for(values), saved)
    dropped = [n for n in variadic if bound.arguments.get(n)]
    if dropped:
        data["notes"].append(f"{', '.join(dropped)} (variadic, never checked) not saved")
    p = Path(path)
    try:
        torch.save(data, p)
    except (OSError, RuntimeError) as exc:  # (torch says a missing folder with a RuntimeError)
        raise AnnotationError(f"kc.save_call: cannot write {str(p)!r}: {exc}") from exc
    return p


# -- saved automatically when a call is rejected -----------------------------------------------------
def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    except Warning:  # warnings turned into errors: never raise anything but the call's own error
        pass


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} is negative")
    return value


def _capturing() -> bool:
    if tracing():  # also at trace time, in the plain Python dynamo runs then
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _save_rejected(target: Contract | Op, values: Mapping[str, Any], config: Any, err: ContractError, stage: str,
                   backend: str | None) -> None:
    directory = os.environ.get(DUMP_DIR_ENV, "").strip()
    if not directory or _capturing():
        return
    from ..operation.opdef import Op

    op, variant = (target, None) if isinstance(target, Op) else _owner_of(target)
    name = op.name if op is not None else target.name
    try:
        limit, max_bytes = _env_int(DUMP_MAX_ENV, DEFAULT_MAX), _env_int(DUMP_MAX_BYTES_ENV, DEFAULT_MAX_BYTES)
        if isinstance(target, Op):
            variant, contract = target.contract_for(values)
        else:
            contract = target
        strict = stage in ("value checks", "after") or modes.current_mode() == modes.STRICT
        mode = "strict" if strict else "check"
        saved = {"by": "rejection", "mode": mode, "stage": stage, "backend": backend, "error": str(err),
                 "backend_asked": None}
        data = build_dump(op, contract, variant, values, config, saved, max_bytes=max_bytes)
        path = _write_bounded(Path(directory), name, limit, data)
    except Exception as exc:
        _warn(f"kda_contracts: could not save the rejected call of {name} to {DUMP_DIR_ENV}={directory}: "
              f"{type(exc).__name__}: {exc}")
        return
    if path is not None:
        err.dump_path = str(path)  # type: ignore[attr-defined]
        err.args = (f"{err.args[0] if err.args else ''}\n  call saved to {path} (replay: kda-contracts validate "
                    f"{path})", *err.args[1:])


def _write_bounded(directory: Path, name: str, limit: int, data: dict[str, Any]) -> Path | None:
    """Write ``data`` to the first free ``kda-dump-NNN-<name>.pt`` (None when ``limit`` are there)."""
    directory.mkdir(parents=True, exist_ok=True)
    taken = {int(m.group(1)) for f in os.listdir(directory) if (m := DUMP_NAME.match(f))}
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "call"
    for i in range(limit):
        if i in taken:
            continue
        path = directory / f"kda-dump-{i:03d}-{safe}.pt"
        try:
            fh = open(path, "xb")  # claimed by this process alone
        except FileExistsError:
            continue
        try:
            with fh:
                torch.save(data, fh)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path
    key = str(directory.resolve())
    if key not in _FULL_WARNED:
        _FULL_WARNED.add(key)
        _warn(f"kda_contracts: {directory} already holds {limit} dumps ({DUMP_MAX_ENV}={limit}); later rejected "
              "calls are not saved (the oldest are kept: remove them to save more)")
    return None


def _on_rejection(event: hooks.Rejection) -> None:
    _save_rejected(event.target, event.values, event.config, event.error, event.stage, event.backend)


hooks.on_rejection(_on_rejection)
