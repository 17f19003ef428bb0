"""Reading dumps back: the safe loader every dump format shares (:func:`load_file`), and the
decoding of a :func:`kc.save_call <kda_contracts.save_call>` dump (:func:`read_call_dump`): the
op or contract imported from its ``"module:qualname"``, the arguments rebuilt, the config rebuilt
from its class or, when that cannot be imported, replayed from the facts recorded with it.

Nothing is unpickled: files are read with ``torch.load(weights_only=True)``, and the only code a
dump can cause to run is the import of the modules it names (the op's, the config's).

Example::

    dump = read_call_dump(load_file("call.pt"))
    dump.op.name, dump.values["x"].shape
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import modes
from .dumps import FORMAT_KEY, FORMAT_VERSION, TAG

if TYPE_CHECKING:
    from ..contract.compiled import Contract
    from ..operation.opdef import Op


class DumpError(Exception):
    """The file is not a usable dump (``kda-contracts validate`` exits 2); the message says why."""


@dataclass(frozen=True)
class LoadedFile:
    """A file read with ``torch.load(weights_only=True)``: what it holds, the storage locations
    its tensors were saved on, and those loaded on the CPU instead (no such device here)."""

    path: str
    raw: Any
    locations: tuple[str, ...]
    moved: tuple[str, ...]


def _refusal(exc: pickle.UnpicklingError) -> str:
    # torch's message is long; its "Unsupported global: ..." line names the offending object.
    text = str(exc).strip()
    m = re.search(r"(Unsupported [^.]*(?:\.[A-Za-z_][\w]*)*)", text)
    return m.group(1) if m else (text.splitlines()[0] if text else type(exc).__name__)


def load_file(path: str | os.PathLike[str]) -> LoadedFile:
    """Read a dump file safely: each tensor on its saved device when this machine has it, else
    on the CPU. Raises :class:`DumpError` for a missing file, a file ``torch.save`` did not write,
    or one that needs arbitrary unpickling (refused, never executed).

    Example::

        loaded = load_file("call.pt"); loaded.moved     # ('cuda:0',) on a machine without a GPU
    """
    p = Path(path)
    if not p.is_file():
        raise DumpError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    moved: set[str] = set()
    seen: set[str] = set()

    def restore(storage: Any, location: str) -> Any:
        seen.add(location)
        if location == "cpu" or location.startswith("meta"):
            return None
        dev = torch.device(location)
        if dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count():
            return None
        moved.add(location)
        return storage

    with open(p, "rb") as fh:
        magic = fh.read(4)
    if not (zipfile.is_zipfile(p) or magic[:1] == b"\x80"):  # torch.save writes a zip (or, legacy, a pickle)
        raise DumpError(f"{p}: not a torch.save file (neither a zip archive nor a pickle)")
    try:
        raw = torch.load(p, map_location=restore, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DumpError(f"{p}: refused by torch.load(weights_only=True): the file holds objects other than "
                        f"tensors and plain Python values ({_refusal(exc)}). Save calls with kc.save_call, which "
                        "writes only those.") from None
    except Exception as exc:
        raise DumpError(f"{p}: torch.load failed ({type(exc).__name__}: {str(exc)[:200]})") from None
    return LoadedFile(str(p), raw, tuple(sorted(seen)), tuple(sorted(moved)))


def is_call_dump(raw: Any) -> bool:
    """Whether a loaded file is a :func:`kc.save_call <kda_contracts.save_call>` dump."""
    return isinstance(raw, Mapping) and FORMAT_KEY in raw


# -- stand-ins -------------------------------------------------------------------------------------
class SavedConfig:
    """A config replayed from what the engine read of it when it was saved (its class could not
    be rebuilt): its fields and the attributes the contract reads, ``contract_dims()``,
    ``contract_dtypes()`` and where each dim came from."""

    def __init__(self, cls: str, fields: Mapping[str, Any], facts: Mapping[str, Any]) -> None:
        self.__dict__.update(fields)
        self.__dict__.update(facts.get("attrs", {}))
        self._cls, self._facts = cls, facts

    def contract_dims(self) -> dict[str, int]:
        return dict(self._facts.get("dims", {}))

    def contract_dtypes(self) -> dict[str, torch.dtype]:
        return dict(self._facts.get("dtypes", {}))

    def contract_dim_source(self, sym: str) -> str:
        return str(self._facts.get("dim_sources", {}).get(sym, f"{sym}={self.contract_dims().get(sym)}"))

    def __repr__(self) -> str:
        return f"{self._cls.rpartition(':')[2]} ({self._cls}, replayed from its saved facts)"


@dataclass(frozen=True, repr=False)
class Placeholder:
    """An argument the dump could not hold (its class and repr), or an object that could not be
    rebuilt (its fields as attributes)."""

    cls: str
    repr: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<{self.cls} not saved: {self.repr}>" if not self.fields else f"<{self.cls} not rebuilt>"

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


def _cwd_on_path() -> None:
    # A console script's sys.path lacks the current directory, where a user's op module often is.
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)


def import_ref(ref: str) -> Any:
    """The object named ``"module:qualname"`` (its module imported under mode ``check``, so
    that the contracts it defines exist whatever ``KDA_CONTRACTS_MODE`` says).

    Example::

        import_ref("kda_contracts.ops.packed_decode.decode:packed_decode")   # the op
    """
    module, _, qual = ref.partition(":")
    if "<locals>" in qual:
        raise ImportError(f"{qual} is defined inside a function; only a module-level name can be imported")
    _cwd_on_path()
    with modes.mode("check"):
        obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class _Decoder:
    """Turns a dump's arguments back into values (see :mod:`kda_contracts._engine.tools.dumps` for the encoding)."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes

    def decode(self, obj: Any, path: str) -> Any:
        if type(obj) in (list, tuple):
            return type(obj)(self.decode(v, f"{path}[{i}]") for i, v in enumerate(obj))
        if not isinstance(obj, dict):
            return obj
        tag = obj.get(TAG)
        if tag is None:
            return {k: self.decode(v, f"{path}[{k!r}]") for k, v in obj.items()}
        if tag == "tensor":
            return _meta_tensor(obj)
        if tag == "unsaved":
            return Placeholder(str(obj.get("class")), str(obj.get("repr")))
        if tag == "enum":
            return import_ref(obj["class"])(self.decode(obj["value"], path))
        if tag == "object":
            return self._object(obj, path)
        raise DumpError(f"{path}: unknown encoded value {tag!r} (made by a newer kda-contracts?)")

    def _object(self, obj: Mapping[str, Any], path: str) -> Any:
        cls_ref, kind = str(obj["class"]), obj.get("kind")
        fields = {k: self.decode(v, f"{path}.{k}") for k, v in obj.get("fields", {}).items()}
        facts = obj.get("config")
        if kind not in _REBUILT and facts is not None:
            self.notes.append(f"{path}: config {cls_ref} replayed from its saved dims, dtypes and attributes (only "
                              "pydantic models, dataclasses, named tuples and mappings are rebuilt)")
            return SavedConfig(cls_ref, fields, facts)
        try:
            made = _rebuild(import_ref(cls_ref), kind, fields)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if facts is not None:
                self.notes.append(f"{path}: config {cls_ref} not rebuilt ({why}); replayed from its saved dims, "
                                  "dtypes and attributes")
                return SavedConfig(cls_ref, fields, facts)
            self.notes.append(f"{path}: {cls_ref} not rebuilt ({why}); replayed as an object with its fields")
            return Placeholder(cls_ref, f"<{cls_ref}>", fields)
        if facts is not None and hasattr(made, "contract_dims") and dict(made.contract_dims()) != facts.get("dims"):
            self.notes.append(f"{path}: config {cls_ref} rebuilt with other dims ({dict(made.contract_dims())}) than "
                              f"it had when saved ({facts.get('dims')}); replayed from the saved ones")
            return SavedConfig(cls_ref, fields, facts)
        return made


_REBUILT = ("pydantic", "dataclass", "namedtuple", "mapping")


def _rebuild(cls: Any, kind: Any, fields: dict[str, Any]) -> Any:
    if kind == "pydantic":
        return cls.model_validate(fields)
    if kind == "dataclass":
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        made = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(made, k, v)
        return made
    if kind == "namedtuple":
        return cls(**fields)
    if kind == "mapping":
        try:
            return cls(fields)
        except Exception:
            return dict(fields)
    raise TypeError(f"{getattr(cls, '__qualname__', cls)} is not a pydantic model, a dataclass, a named tuple or a "
                    "mapping")


def _meta_tensor(rec: Mapping[str, Any]) -> torch.Tensor:
    """A tensor saved without its values: dtype, shape, strides and offset, on the meta device."""
    shape, stride, offset = list(rec["shape"]), list(rec["stride"]), int(rec["storage_offset"])
    span = offset + (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0)
    itemsize = torch.empty((), dtype=rec["dtype"], device="meta").element_size()
    base = torch.empty(max(span, int(rec.get("storage_nbytes", 0)) // itemsize), dtype=rec["dtype"], device="meta")
    return base.as_strided(shape, stride, offset)


# -- a call dump -----------------------------------------------------------------------------------
@dataclass
class CallDump:
    """A loaded :func:`kc.save_call <kda_contracts.save_call>` dump, ready to replay."""

    path: str
    target: Mapping[str, Any]  # kind ("op" | "contract"), name, ref, variant, variant_args
    op: Op | None
    contract: Contract  # a contract's own; for an op, its first variant (the call's is op.contract_for)
    values: dict[str, Any]
    config: Any  # the static config (None when the call passes one as the argument config_arg)
    config_arg: str | None
    tensors: Mapping[str, Mapping[str, Any]]  # argument path -> dtype, shape, stride, offset, saved device
    values_saved: bool
    saved: Mapping[str, Any]  # by, mode, stage, backend, error, backend_asked
    notes: list[str]
    loaded: LoadedFile

    @property
    def saved_mode(self) -> str:
        return "strict" if self.saved.get("mode") == "strict" else "check"


def _resolve(target: Mapping[str, Any], path: str) -> tuple[Op | None, Contract]:
    from ..contract.decorator import registered_contracts
    from ..operation.opdef import Op
    from ..operation.registry import ops

    kind, name, ref = target.get("kind"), str(target.get("name")), str(target.get("ref"))
    if kind not in ("op", "contract"):
        raise DumpError(f"{path}: malformed call dump: target kind {kind!r} (expected 'op' or 'contract')")
    try:
        obj: Any = import_ref(ref)
    except Exception as exc:
        found = ops().get(name) if kind == "op" else None
        if found is None:
            raise DumpError(f"{path}: cannot import the {kind} {name!r} from {ref} ({type(exc).__name__}: {exc}). "
                            "Run kda-contracts validate where that module imports (from the project's root, or "
                            "with PYTHONPATH set)") from None
        obj = found
    if kind == "op":
        if not (isinstance(obj, Op) and obj.name == name):
            obj = ops().get(name)
        if obj is None:
            raise DumpError(f"{path}: {ref} is not the op {name!r} (kc.ops() has no op of that name)")
        return obj, obj.contract
    c = getattr(obj, "__kda_contract__", None) or registered_contracts().get(name)
    if c is None:
        raise DumpError(f"{path}: {ref} is not a function decorated with @kc.contract")
    return None, c


def read_call_dump(loaded: LoadedFile) -> CallDump:
    """Decode a call dump: import its op or contract, rebuild its arguments and config.

    Raises :class:`DumpError` for a dump of another format version, a malformed one, or one
    whose op cannot be imported here."""
    raw, p = loaded.raw, loaded.path
    version = raw.get(FORMAT_KEY)
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise DumpError(f"{p}: call dump format {version!r} {'is newer than' if newer else 'is not'} the one this "
                        f"kda-contracts reads ({FORMAT_VERSION})")
    for key, kind in (("target", Mapping), ("arguments", Mapping), ("tensors", Mapping), ("saved", Mapping)):
        if not isinstance(raw.get(key), kind):
            raise DumpError(f"{p}: malformed call dump: {key!r} is missing or not a dict")
    op, contract = _resolve(raw["target"], p)
    notes = [str(n) for n in raw.get("notes", [])]
    dec = _Decoder(notes)
    values = {str(k): dec.decode(v, str(k)) for k, v in raw["arguments"].items()}
    _refuse_other_signature(contract, values, p)
    config = dec.decode(raw.get("config"), "config")
    return CallDump(p, dict(raw["target"]), op, contract, values, config, raw.get("config_arg"), raw["tensors"],
                    bool(raw.get("values_saved", True)), dict(raw["saved"]), notes, loaded)


def _refuse_other_signature(contract: Any, values: Mapping[str, Any], path: str | Path) -> None:
    """A dump whose arguments no longer fit the function's signature (a parameter renamed, added
    or removed since it was saved) is not a verdict on the call: DumpError (exit 2), naming them."""
    params = contract.spec.signature.parameters
    unknown = [n for n in values if n not in params]
    missing = [n for n, p in params.items() if n not in values and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unknown or missing:
        said = "; ".join(part for part in (
            f"saved arguments the function has no parameter for: {', '.join(unknown)}" if unknown else "",
            f"parameters with no saved argument: {', '.join(missing)}" if missing else "") if part)
        raise DumpError(f"{path}: the dump's arguments no longer match {contract.name}'s signature ({said}): it was "
                        "saved from another version of the code; save the call again")
