"""Backends of an op (:mod:`kda_contracts.op`): who can run a validated call, and which one
``backend="auto"`` picks.

A :class:`Backend` declares its name, its kernel (the function, or ``"module:function"``
imported on first use), the device types it runs on, its priority, the dtypes it supports per
argument, constraints on the call's dims in the contract grammar (``"D % 16 == 0"``), the
modules it needs and an optional availability probe. Nothing is imported until a backend is
asked for; what cannot load says why.

A kernel takes the op's own parameters (same names, same kinds, in the same order) and may add
two keyword-only ones: ``dims`` (the call's bound dims, ``dims.B``) and ``variant`` (the
contract variant of the call, for ops that have several). The signature is checked when the
kernel is registered (or, for ``"module:function"``, when it is loaded).

Example::

    @my_op.backend("triton", devices=("cuda",), priority=30, where=["D % 16 == 0"],
                   dtypes={"x": (torch.float16, torch.bfloat16)}, requires=("triton",))
    def _(x, out, *, dims): ...
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from ..contract.body import body_uses_checks, runner
from ..errors import AnnotationError
from ..errors import BackendError as BackendError  # (defined with the other errors; kept importable from here)
from ..grammar.constraints import Constraint, parse_constraint
from ..source import define

EXTRA_PARAMETERS = ("dims", "variant")  # keyword-only parameters a kernel may add to the op's


@dataclass(frozen=True)
class CallInfo:
    """What a backend is told of a validated call to say whether it supports it."""

    device_type: str
    dtypes: Mapping[str, torch.dtype]  # the tensor arguments some backend has a dtypes= for
    absent: frozenset[str]  # optional arguments passed as None
    variant: str | None
    dims: Mapping[str, int]


def _dtype_names(dts: Iterable[torch.dtype]) -> str:
    return "/".join(str(d).removeprefix("torch.") for d in dts)


_DEVICE_TYPES = "a sequence of device types such as ('cpu', 'cuda') ('*': any device)"


def _device_types_problem(devices: Sequence[Any]) -> str | None:
    """Why ``devices`` are not all device types (``": 'CPU' is not ..."``), None when they are."""
    for d in devices:
        if isinstance(d, torch.device):
            return f": {d!r} is a torch.device, not a device type (write {d.type!r})"
        if not isinstance(d, str):
            return f": {d!r} is not a str"
        if d == "*":
            continue
        kind, colon, _ = d.partition(":")
        if colon and re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            return f": {d!r} is a device, not a device type (write {kind!r}: a backend runs on every index)"
        if not re.fullmatch(r"[a-z][a-z0-9_]*", d):  # (a plug-in's type torch learns later is fine)
            return f": {d!r} is not a device type (they are lowercase names: 'cpu', 'cuda', 'mps', ...)"
    return None


def _read_dtypes(dtypes: Any) -> tuple[Any, str | None]:
    """``dtypes=`` with its sequences as tuples, and why it is neither ``{"arg": (dtypes...)}`` nor
    a sequence of dtypes (None when it is one)."""
    if not isinstance(dtypes, Mapping):
        return _read_dtype_list(dtypes)
    out = {}
    for arg, allowed in dtypes.items():
        if not isinstance(arg, str):
            return dtypes, f"{arg!r} is not an argument name"
        out[arg], why = _read_dtype_list(allowed)
        if why is not None:
            return dtypes, f"{arg!r}: {why}"
    return out, None


def _read_dtype_list(allowed: Any) -> tuple[Any, str | None]:
    if isinstance(allowed, torch.dtype):
        return allowed, f"{allowed} alone is not a sequence (write ({allowed},))"
    if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Iterable):
        return allowed, f"{allowed!r} is not a sequence of torch dtypes{_dtype_named(allowed, '({},)')}"
    items = tuple(allowed)
    bad = next((d for d in items if not isinstance(d, torch.dtype)), None)
    if bad is not None:
        return items, f"{bad!r} is not a torch.dtype{_dtype_named(bad, '{}')}"
    return items, "no dtype is listed (the backend would never run)" if not items else None


def _dtype_named(text: Any, spelling: str) -> str:
    """`` (write torch.float32)`` when ``text`` is the name of a torch dtype ("float32")."""
    named = getattr(torch, text, None) if isinstance(text, str) else None
    return f" (write {spelling.format(named)})" if isinstance(named, torch.dtype) else ""


@dataclass(frozen=True)
class Backend:
    """One backend of an op. ``priority`` orders ``backend="auto"``: the highest available
    backend that supports the call wins (faster kernels get higher numbers).

    - ``devices``: device types ``auto`` may pick it for; ``explicit_devices`` more that it runs
      on only when asked by name (e.g. the CPU under ``TRITON_INTERPRET``; a callable is asked
      per call).
    - ``dtypes``: ``{"arg": (dtypes...)}``; a plain sequence applies to every floating-point
      tensor argument of the op.
    - ``where``: constraints on the call's dims; ``variants``: the contract variants it supports.
    - ``requires``: modules it imports; ``availability``: a probe ``() -> (ok, why)``.
    - ``op``: for a plug-in, the name of the op it is for.

    A field dispatch could not use (``devices=("cuda:0",)``, ``priority=None``, ``kernel=42``)
    is refused when the backend is made: an AnnotationError saying what the field takes.
    """

    name: str
    kernel: str | Callable[..., Any]
    devices: tuple[str, ...] = ("cpu", "cuda")
    priority: int = 0
    where: tuple[str, ...] = ()
    dtypes: Mapping[str, Sequence[torch.dtype]] | Sequence[torch.dtype] | None = None
    requires: tuple[str, ...] = ()
    availability: Callable[[], tuple[bool, str]] | None = None
    description: str = ""
    explicit_devices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    variants: tuple[str, ...] | None = None
    op: str | None = None
    _constraints: tuple[Constraint, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        who = self.who()
        self._refuse_bad_declaration(who)
        object.__setattr__(self, "_constraints", tuple(parse_constraint(w, who) for w in self.where))
        for c in self._constraints:
            if c.facts():  # a backend sees the call's dims, not its arguments: never skip silently
                raise AnnotationError(f"{who}: where {c.text!r}: a backend constraint is on dims only; "
                                      f"{', '.join(f.key for f in c.facts())} is not a dim")

    def who(self) -> str:
        """How messages name this declaration: ``"op: backend 'name'"`` (``adapter`` for packed decode's kind)."""
        word = type(self).__name__.lower()
        return f"{self.op}: {word} {self.name!r}" if isinstance(self.op, str) else f"{word} {self.name!r}"

    def _refuse_bad_declaration(self, who: str) -> None:
        """Refuse (AnnotationError) a field dispatch could not use, saying what it takes, and store
        the sequences as tuples: a mistake here would otherwise raise on every call, or leave the
        backend silently never chosen."""
        def refuse(attr: str, takes: str, why: str = "") -> NoReturn:
            raise AnnotationError(f"{who}: {attr}= takes {takes}, got {getattr(self, attr)!r}{why}")

        if not isinstance(self.name, str) or not self.name:
            refuse("name", "a non-empty str")
        module, _, function = self.kernel.partition(":") if isinstance(self.kernel, str) else ("", "", "")
        if not callable(self.kernel) and not (module and function):
            refuse("kernel", "the kernel (a callable) or 'module:function' (imported on first use)")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            refuse("priority", "an int (backend='auto' tries the highest first)")
        for attr in ("devices", "explicit_devices", "where", "requires", "variants"):
            value = getattr(self, attr)
            if (value is None and attr == "variants") or (attr == "explicit_devices" and callable(value)):
                continue
            takes = _DEVICE_TYPES if attr.endswith("devices") else "a sequence of strings"
            if isinstance(value, str):  # ("cuda") is a string, not a tuple: never split it silently
                refuse(attr, "a sequence of strings", f" (write ({value!r},))")
            if not isinstance(value, Iterable):
                refuse(attr, takes)
            object.__setattr__(self, attr, tuple(value))
            why = _device_types_problem(getattr(self, attr)) if attr.endswith("devices") else \
                next((f": {v!r} is not a str" for v in getattr(self, attr) if not isinstance(v, str)), None)
            if why is not None:
                refuse(attr, takes, why)
        if self.dtypes is not None:
            dtypes, why = _read_dtypes(self.dtypes)
            if why is not None:
                refuse("dtypes", "{'arg': (torch.float16, ...)}, or a sequence of torch dtypes for every floating "
                                 "tensor argument", f": {why}")
            object.__setattr__(self, "dtypes", dtypes)
        for attr, kind in (("availability", "a probe () -> (ok, why), or None"), ("op", "an op's name, or None")):
            value = getattr(self, attr)
            if value is not None and not (callable(value) if attr == "availability" else isinstance(value, str)):
                refuse(attr, kind)
        if not self.devices and not self.explicit_devices:
            refuse("devices", _DEVICE_TYPES, " (with no device and no explicit_devices= the backend would never run)")
        if self.variants == ():
            refuse("variants", "the op's variants it supports, or None for all",
                   " (with no variant the backend would never run)")
        if not isinstance(self.description, str):
            refuse("description", "a str")

    def load(self) -> Callable[..., Any]:
        """The kernel itself (imported now when given as ``"module:function"``)."""
        if callable(self.kernel):
            return self.kernel
        module, _, attr = self.kernel.partition(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return fn

    # -- what the table asks of a backend (subclasses may adapt other kernel conventions) --------
    def dtype_table(self, floating: Sequence[str]) -> dict[str, frozenset[torch.dtype]]:
        """The supported dtypes per argument (``floating``: the op's floating tensor arguments)."""
        if self.dtypes is None:
            return {}
        if isinstance(self.dtypes, Mapping):
            return {k: frozenset(v) for k, v in self.dtypes.items()}
        return {k: frozenset(self.dtypes) for k in floating}

    def key_args(self, floating: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(tensor arguments whose dtype, optional arguments whose None-ness)`` this backend's
        support depends on: what a call's selection key must hold for it."""
        return tuple(self.dtype_table(floating)), ()

    def extra_unsupported(self, info: CallInfo) -> list[str]:
        """Reasons beyond device, dtypes, variants and dims (for subclasses)."""
        return []

    def signature_problem(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter]) -> str | None:
        """Why ``kernel`` cannot be called as this op's backend (None when it can)."""
        return signature_problem(kernel, params)[0]

    def make_runner(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter],
                    dims_types: Mapping[str | None, type]) -> Callable[..., Any]:
        """``run(dims, variant, *op_args)``: calls ``kernel`` with the op's arguments (positional
        ones by position, keyword-only ones by name) plus the extras its signature asks for; the
        kernel itself when it asks for none (the dispatcher then calls it directly).
        ``dims_types``: the named tuple of the dims of each variant (None: an op without)."""
        _, wants = signature_problem(kernel, params)
        if not wants:
            return kernel  # called directly with the op's arguments
        return _runner(kernel, params, dims_types, wants)


def signature_problem(kernel: Callable[..., Any], params: Sequence[inspect.Parameter]) -> tuple[str | None, set[str]]:
    """``(why not, extras)``: whether ``kernel`` has the op's parameters (names and kinds, in
    order) and which of :data:`EXTRA_PARAMETERS` it adds as keyword-only parameters."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read ({exc})", set()
    got = list(sig.parameters.values())
    extras = {p.name for p in got if p.kind is p.KEYWORD_ONLY and p.name in EXTRA_PARAMETERS
              and p.name not in {q.name for q in params}}
    got = [p for p in got if p.name not in extras]
    want = [(p.name, p.kind) for p in params]
    have = [(p.name, p.kind) for p in got]
    if have == want:
        return None, extras
    for i, ((wn, wk), (hn, hk)) in enumerate(zip(want, have, strict=False)):
        if wn != hn:
            return f"parameter {i + 1} is {hn!r}, the op's is {wn!r}", extras
        if wk != hk:
            return f"parameter {hn!r} is {hk.description}, the op's is {wk.description}", extras
    if len(have) < len(want):
        return f"missing parameter(s) {', '.join(n for n, _ in want[len(have):])}", extras
    extra = [n for n, _ in have[len(want):]]
    return (f"extra parameter(s) {', '.join(extra)} (a kernel may add only keyword-only "
            f"{' and '.join(EXTRA_PARAMETERS)})"), extras


def _runner(kernel: Callable[..., Any], params: Sequence[inspect.Parameter], dims_types: Mapping[str | None, type],
            wants: set[str], *, dims_first: bool = False) -> Callable[..., Any]:
    """``run(dims, variant, *op_args)`` calling ``kernel`` in kind (``dims_first``: with the raw
    dims tuple and the variant as its first two arguments)."""
    names = [p.name for p in params]
    prefix = "_kc_"
    while any(n.startswith(prefix) for n in names):
        prefix += "_"
    args = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            args.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            args.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            args.append(f"{p.name}={p.name}")
        else:
            args.append(p.name)
    if dims_first:
        args[:0] = [f"{prefix}d", f"{prefix}v"]
    if "dims" in wants:
        args.append(f"dims={prefix}D[{prefix}v]._make({prefix}d)")
    if "variant" in wants:
        args.append(f"variant={prefix}v")
    formal = [f"*{p.name}" if p.kind is p.VAR_POSITIONAL else f"**{p.name}" if p.kind is p.VAR_KEYWORD
              else p.name for p in params]
    src = (f"def run({prefix}d, {prefix}v, {', '.join(formal)}):\n"
           f"    return {prefix}k({', '.join(args)})\n")
    ns: dict[str, Any] = {f"{prefix}k": kernel, f"{prefix}D": dims_types}
    return define(src, "<kda_contracts backend runner>", "run", ns)


# -- the torch reference as a backend -------------------------------------------------------------
@dataclass(frozen=True)
class Reference(Backend):
    """An op's own body as its ``"torch"`` backend; with ``kc.check``/``kc.dims`` inside, it runs
    with the call's dims. ``_outside_autograd``: it runs under ``torch.no_grad()``, as a kernel
    writes outside autograd, for an op without ``autograd=True`` that returns only the tensors it
    writes: it would otherwise record a graph into them from an input that requires grad (an
    ``nn.Parameter``), and the next call would refuse the written tensor. (An op that also returns
    a fresh result keeps autograd on: its result's graph is the caller's.)"""

    _outside_autograd: bool = False  # (not a restriction: docs leave "_" fields out)

    def make_runner(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter],
                    dims_types: Mapping[str | None, type]) -> Callable[..., Any]:
        if not body_uses_checks(kernel):
            if not self._outside_autograd:
                return super().make_runner(kernel, params, dims_types)
            _, wants = signature_problem(kernel, params)  # (wrapped below: not the kernel itself, called directly)
            run = _runner(kernel, params, dims_types, wants)
        else:
            name = getattr(kernel, "__name__", "op")
            bodies = {v: runner(name, t._fields, kernel, False) for v, t in dims_types.items()}  # type: ignore[attr-defined]

            def with_dims(d: tuple[int, ...] | None, v: Any, *args: Any, **kwargs: Any) -> Any:
                return kernel(*args, **kwargs) if d is None else bodies[v](d, *args, **kwargs)  # None: mode off

            run = _runner(with_dims, params, dims_types, set(), dims_first=True)
        return torch.no_grad()(run) if self._outside_autograd else run
