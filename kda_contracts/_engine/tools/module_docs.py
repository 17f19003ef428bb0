"""Docs for the ops and contracts of chosen modules (``kda-contracts docs --module pkg.mod``).

What a module defines is found through the public registries and the module each function was
defined in: :func:`kda_contracts.ops` (an op's ``fn.__module__``) and
:func:`kda_contracts.registered_contracts` (a contract's ``fn.__module__``), a module counting
with its submodules. An op registers its contract(s) there too (under its name, variants as
``name[key]``); those are documented once, inside the op's section.

Each op is described (:func:`describe_op`) with its contract or each variant's, the user's own
checks with their docstrings (``value_checks=``, ``after=``; ``kc.Where`` constraints with their
hints are in each contract's constraints), and a backends table (:func:`describe_backend`). What
depends on the machine (backend availability) is left out unless asked for, so the generated
files can be committed and checked byte for byte.

Example::

    from kda_contracts import module_docs
    page = module_docs.describe_modules(["my_pkg.ops"])
    files = module_docs.generate(page)        # {"contracts.md": ..., "contracts.json": ...}
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..contract.compiled import Contract
from ..contract.decorator import registered_contracts
from ..operation.backends import Backend
from ..operation.opdef import Op
from ..operation.registry import ops
from .docs import GENERATED_MARK, Section, cell, describe_contract, render_contract, render_reference

_BACKEND_FIELDS = frozenset(f.name for f in dataclasses.fields(Backend))


# -- what a module defines -----------------------------------------------------------------------
def in_modules(module: str | None, modules: Sequence[str]) -> bool:
    """Whether ``module`` is one of ``modules`` or a submodule of one."""
    return module is not None and any(module == m or module.startswith(m + ".") for m in modules)


def _module_of(fn: Any) -> str | None:
    return getattr(fn, "__module__", None)


def select(modules: Sequence[str]) -> tuple[list[Op], dict[str, Contract]]:
    """The ops defined in ``modules`` (in definition order), and the registered contracts defined
    there that belong to no op (by registry key, in registration order)."""
    every_op = ops()
    of_ops = {id(c) for o in every_op.values() for c in o.contracts.values()}
    chosen = [o for o in every_op.values() if in_modules(_module_of(o.fn), modules)]
    contracts = {k: c for k, c in registered_contracts().items()
                 if id(c) not in of_ops and in_modules(_module_of(c.fn), modules)}
    return chosen, contracts


def empty_modules(modules: Sequence[str]) -> list[str]:
    """Those of ``modules`` that define neither an op nor a registered contract."""
    chosen, contracts = select(modules)
    found = [_module_of(o.fn) for o in chosen] + [_module_of(c.fn) for c in contracts.values()]
    return [m for m in modules if not any(in_modules(f, [m]) for f in found)]


# -- describing --------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A declared value as JSON-able data, the same on every machine (sets sorted)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (set, frozenset)):
        return sorted(str(_plain(v)) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _callable_name(value) if callable(value) else str(value)


def _callable_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = _module_of(fn)
    return f"{module}.{name}" if module else name


_EXAMPLE = re.compile(r"^Examples?::?\s*$", re.M)


def _doc(obj: Any) -> str:
    """A docstring, cleaned and without its ``Example::`` section (code, not prose)."""
    doc = inspect.getdoc(obj) or ""
    return _EXAMPLE.split(doc, 1)[0].strip()


def describe_callable(fn: Callable[..., Any] | None, when: str) -> dict[str, Any] | None:
    """A user's check (or variant selector) as data: its name, when it runs, its docstring."""
    if fn is None:
        return None
    return {"name": getattr(fn, "__qualname__", None) or type(fn).__qualname__, "when": when, "doc": _doc(fn)}


def describe_backend(b: Backend, floating: Sequence[str], available: tuple[bool, str] | None = None) -> dict[str, Any]:
    """One backend of an op as data; ``available`` (this machine's verdict) only when given."""
    dtypes: Any = None
    if b.dtypes is not None:
        dtypes = _plain(b.dtype_table(floating)) if isinstance(b.dtypes, Mapping) else \
            {"*floating*": _plain(list(b.dtypes))}
    out: dict[str, Any] = {
        "name": b.name, "priority": b.priority, "devices": ["any"] if "*" in b.devices else list(b.devices),
        "dtypes": dtypes, "where": list(b.where), "requires": list(b.requires),
        "variants": None if b.variants is None else list(b.variants), "description": b.description,
        "kernel": b.kernel if isinstance(b.kernel, str) else _callable_name(b.kernel),
        # a subclass's own fields, where they restrict more than their defaults do
        "more": {f.name: _plain(getattr(b, f.name)) for f in dataclasses.fields(b)
                 if f.name not in _BACKEND_FIELDS and not f.name.startswith("_")
                 and getattr(b, f.name) != f.default},
    }
    if available is not None:
        out["available"] = {"ok": available[0], "why_not": available[1]}
    return out


def _parameters(o: Op) -> str:
    """The op's parameters by name and kind (no annotations or defaults: they vary by machine)."""
    out, star = [], False
    for p in o.signature.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY and not star:
            out += ["*", p.name + _default(p.default)]
            star = True
        else:
            out.append(p.name + _default(p.default))
    out.insert(len(out) - (1 if out and out[-1].startswith("**") else 0), "backend='auto'" if star else
               "*, backend='auto'")
    return ", ".join(out)


def _default(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    simple = value is None or isinstance(value, (bool, int, float, str))
    return f"={value!r}" if simple else "=…"  # an object's repr may hold an address


def _contract_with_checks(key: str, c: Contract, doc_config: Any) -> dict[str, Any]:
    d = describe_contract(key, c, doc_config)
    check = describe_callable(c.spec.value_checks, "strict mode, on the arguments, before the kernel runs")
    d["value_checks"] = [check] if check else []
    return d


def describe_op(o: Op, doc_config: Any = None, *, availability: bool = False) -> dict[str, Any]:
    """One op as JSON-able data: its contract(s), checks and backends (highest priority first).

    Example::

        >>> describe_op(scale_rows)["backends"][0]["name"]
        'fast'
    """
    floating = o.table.floating
    variants = [k for k in o.contracts if k is not None]
    return {
        "name": o.name, "module": _module_of(o.fn), "signature": f"{o.name}({_parameters(o)})",
        "doc": _doc(o.fn),
        "returns": None if o.returns is None else [o.returns] if isinstance(o.returns, str) else list(o.returns),
        "variants": variants or None,
        "variant_selector": describe_callable(o.variant_of, "names the variant of a call"),
        "contracts": [_contract_with_checks(o.name if k is None else f"{o.name}[{k}]", c, doc_config)
                      for k, c in o.contracts.items()],
        "after": describe_callable(o.after, "strict mode, after the backend ran"),
        "backends": [describe_backend(b, floating, o.table.available(b) if availability else None)
                     for b in o.backends()],
    }


@dataclass(frozen=True)
class ModulePage:
    """What ``--module`` asked for, described: the modules, their ops and the contracts that
    belong to no op (each as data), and the registry keys documented (so a page that also holds
    the shipped ops' sections does not list them twice)."""

    modules: tuple[str, ...]
    config: str | None  # the label of the config the concrete shapes are for (None: per call)
    ops: list[dict[str, Any]]
    contracts: list[dict[str, Any]]
    keys: frozenset[str]
    availability: bool = False

    def data(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "config": self.config, "availability_listed": self.availability,
                "ops": self.ops, "contracts": self.contracts}


def describe_modules(modules: Sequence[str], doc_config: Any = None, config_label: str | None = None, *,
                     availability: bool = False) -> ModulePage:
    """The ops and contracts of ``modules`` (already imported), described for ``doc_config``."""
    chosen, contracts = select(modules)
    keys = {k for k, c in registered_contracts().items() for o in chosen for oc in o.contracts.values() if c is oc}
    return ModulePage(
        modules=tuple(modules), config=config_label if doc_config is not None else None,
        ops=[describe_op(o, doc_config, availability=availability) for o in chosen],
        contracts=[_contract_with_checks(k, c, doc_config) for k, c in contracts.items()],
        keys=frozenset(keys | contracts.keys()), availability=availability)


# -- Markdown ------------------------------------------------------------------------------------
def _dtypes_cell(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "any"
    return "; ".join(("floating tensors" if arg == "*floating*" else f"`{arg}`") + ": " + "/".join(v)
                     for arg, v in d.items())


def _backends_table(backends: Sequence[Mapping[str, Any]], has_variants: bool, availability: bool) -> list[str]:
    more = any(b["more"] for b in backends)
    head = ["backend", "priority", "devices", "dtypes", "where", "requires", "description"]
    head += ["variants"] * has_variants + ["also restricts"] * more + ["available here"] * availability
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in backends:
        row = [f"`{b['name']}`", str(b["priority"]), ", ".join(b["devices"]), cell(_dtypes_cell(b["dtypes"])),
               ", ".join(f"`{cell(w)}`" for w in b["where"]) or "—", ", ".join(b["requires"]) or "—",
               cell(b["description"]) or "—"]
        if has_variants:
            row.append(", ".join(b["variants"]) if b["variants"] is not None else "all")
        if more:
            row.append(cell("; ".join(f"{k}: {_more_value(v)}" for k, v in b["more"].items())) or "—")
        if availability:
            ok, why = b["available"]["ok"], b["available"]["why_not"]
            row.append("yes" if ok else f"no: {cell(why)}")
        out.append("| " + " | ".join(row) + " |")
    return [*out, ""]


def _more_value(v: Any) -> str:
    return "any" if v is None else ", ".join(map(str, v)) if isinstance(v, list) else str(v)


def _check_lines(checks: Sequence[Mapping[str, Any] | None]) -> list[str]:
    out = []
    for c in checks:
        if c is None:
            continue
        doc = c["doc"].replace("\n", "\n  ") if c["doc"] else "(no docstring)"
        out.append(f"- `{c['name']}` ({c['when']}): {doc}")
    return out


def _contract_body(c: Mapping[str, Any]) -> list[str]:
    """A described contract's lines without its heading; the value checks are listed with their
    whole docstrings (not in the contract's one-line strict-mode note)."""
    out = [f"`{c['signature']}`", "", *render_contract({**c, "strict_value_checks": None}, heading=False)]
    checks = _check_lines(c.get("value_checks", []))
    return out + (["Value checks:", "", *checks, ""] if checks else [])


def op_section(d: Mapping[str, Any], *, availability: bool = False) -> Section:
    """The Markdown section of a described op (:func:`describe_op`)."""
    lines = [f"`{d['signature']}`, defined in `{d['module']}`. Call it like the function; `backend=` "
             "forces one backend (default `'auto'`: the highest priority that supports the call).", ""]
    if d["doc"]:
        lines += [d["doc"], ""]
    if d["returns"]:
        lines += ["Returns " + ", ".join(f"`{r}`" for r in d["returns"]) + " (the arguments it writes).", ""]
    if d["variants"]:
        sel = d["variant_selector"]
        lines += [f"Contract variants {', '.join(f'`{v}`' for v in d['variants'])}: `{sel['name']}` names the "
                  "variant of each call" + (f": {sel['doc']}" if sel["doc"] else "."), ""]
    lines += ["Backends (highest priority first):", "",
              *_backends_table(d["backends"], bool(d["variants"]), availability)]
    for variant, c in zip(d["variants"] or [None], d["contracts"], strict=True):
        lines += ["### Contract" if variant is None else f"### Variant {variant}: `{c['key']}`", ""]
        lines += _contract_body(c)
    if d["after"]:
        lines += ["After the backend ran:", "", *_check_lines([d["after"]]), ""]
    return Section(d["name"], lines)


def _intro(page: ModulePage) -> list[str]:
    names = ", ".join(f"`{m}`" for m in page.modules)
    opts = " ".join(f"--module {m}" for m in page.modules)
    shapes = (f"Concrete shapes are for the config **{page.config}**." if page.config else
              "No config: dims are bound per call.")
    avail = ("Backend availability is this machine's (`--availability`)." if page.availability else
             "Backend availability depends on the machine and is not listed (`op.available()` says it at run "
             "time; `--availability` adds it here).")
    return [f"The ops and contracts defined in {names} (and submodules). {shapes} {avail}", "",
            f"Regenerate with `kda-contracts docs {opts}`. Machine-readable: [contracts.json](contracts.json)."]


def render_page(page: ModulePage) -> str:
    """``contracts.md`` for the modules alone: one section per op, then the other contracts."""
    sections = [op_section(d, availability=page.availability) for d in page.ops]
    return render_reference(_intro(page), [], before=sections, after=[
        Section(c["key"], _contract_body(c)) for c in page.contracts])


def generate(page: ModulePage) -> dict[str, str]:
    """The files of a module page: ``contracts.md`` and ``contracts.json``."""
    data = {"generator": GENERATED_MARK, **page.data()}
    return {"contracts.md": render_page(page),
            "contracts.json": json.dumps(data, indent=2, ensure_ascii=False) + "\n"}
