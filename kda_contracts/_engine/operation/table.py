"""An op's backends (:class:`BackendTable`): registration (a kernel that cannot take the op's call
is refused, naming why), availability probed once and cached, which backends can run a call and
why the others cannot (:meth:`BackendTable.verdicts`), and the choice ``backend="auto"`` makes,
cached per selection key (:class:`Chosen`).

Example::

    table.choose("auto", info).name      # 'triton'
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AnnotationError, ContractError, Violation, raise_violations
from .backends import (
    _DEVICE_TYPES,
    Backend,
    BackendError,
    CallInfo,
    _device_types_problem,
    _dtype_names,
)


class BackendTable:
    """The backends of one op: registry, lazy loading, availability, selection and its cache.

    ``params``: the op's parameters (what a kernel must take); ``symbols``: its dims, in the
    order each variant's checker binds them (one entry, None, for an op without variants);
    ``floating``: its floating tensor arguments; ``optional``: arguments that may be None.
    ``on_change`` is called whenever the set of backends changes (the op rebuilds its key).
    """

    SELECTED_MAX = 512

    def __init__(self, op_name: str, params: Sequence[inspect.Parameter], symbols: Mapping[str | None, Sequence[str]],
                 floating: Sequence[str], on_change: Callable[[], None]) -> None:
        self.op_name = op_name
        self.params = tuple(params)
        self.dims_types: dict[str | None, type] = {
            v: namedtuple("BoundDims", s, rename=True) for v, s in symbols.items()}  # type: ignore[misc]
        self.floating = tuple(floating)
        #: arguments holding tensors inside containers (dtypes= cannot judge those)
        self.contained: tuple[str, ...] = ()
        self.on_change = on_change
        self.registry: dict[str, Backend] = {}
        self.runners: dict[str, Callable[..., Any]] = {}
        self.direct: set[str] = set()  # backends whose runner is the kernel itself (no extras)
        self.availability: dict[str, tuple[bool, str]] = {}
        self.selected: dict[tuple[Any, ...], Chosen] = {}
        #: the dispatcher's last choice for a call the check cache answered, ``(dims, backend, chosen)``
        #: (the CachedDims object, the backend= object): replaced whole, emptied with ``selected``
        self.last: list[tuple[Any, Any, Chosen | None]] = [NO_LAST]
        self.plugin_errors: dict[str, str] = {}
        self.plugins_loaded = False
        self.plugin_loader: Callable[[], None] | None = None

    # -- registry --------------------------------------------------------------------------------
    def register(self, backend: Backend, *, replace: bool = False) -> Backend:
        if not isinstance(backend, Backend):
            raise AnnotationError(f"{self.op_name}: a backend must be a kda_contracts Backend, "
                                  f"got {type(backend).__name__}")
        if backend.name == "auto":
            raise AnnotationError(f"{self.op_name}: 'auto' is not a backend name (it asks for the best one)")
        if not isinstance(replace, bool):
            raise AnnotationError(f"{self.op_name}: replace= takes True or False, got {replace!r}")
        if backend.op is not None and backend.op != self.op_name:
            raise AnnotationError(f"{self.op_name}: backend {backend.name!r} is declared for the op {backend.op!r} "
                                  f"(op=), not {self.op_name!r}")
        if backend.name in self.registry and not replace:
            raise AnnotationError(f"{self.op_name}: a backend named {backend.name!r} is already registered "
                                  "(pass replace=True)")
        unknown = set(backend.dtype_table(self.floating)) - {p.name for p in self.params}
        if unknown:
            raise AnnotationError(f"{self.op_name}: backend {backend.name!r}: dtypes= names "
                                  f"{', '.join(sorted(unknown))}, not parameters of the op")
        # never silent: dtypes= is read from top-level tensors; tensors inside containers would be skipped
        contained = set(self.contained) & (set(backend.dtypes) if isinstance(backend.dtypes, Mapping) else
                                           set(self.contained) if backend.dtypes is not None else set())
        if contained:
            raise AnnotationError(f"{self.op_name}: backend {backend.name!r}: dtypes= cannot judge tensors inside "
                                  f"a container ({', '.join(sorted(contained))}); name the top-level tensors it "
                                  "applies to (dtypes={'x': (...)}) and check the others in the kernel")
        variants = {v for v in self.dims_types if v is not None}
        stray = set(backend.variants or ()) - variants
        if stray:  # never silent: a typo would leave the backend unchosen forever
            raise AnnotationError(f"{self.op_name}: backend {backend.name!r}: variants= names "
                                  f"{', '.join(sorted(stray))}, not a variant of the op "
                                  f"({'its variants: ' + ', '.join(sorted(variants)) if variants else 'it has none'})")
        known = {s for t in self.dims_types.values() for s in t._fields}  # type: ignore[attr-defined]
        for c in backend._constraints:
            if not c.symbols() <= known:  # never silent: a typo would skip the constraint forever
                raise AnnotationError(f"{self.op_name}: backend {backend.name!r}: where {c.text!r} names "
                                      f"{', '.join(sorted(c.symbols() - known))}, not a dim of the op "
                                      f"(its dims: {', '.join(sorted(known))})")
        if callable(backend.kernel):
            why = backend.signature_problem(backend.kernel, self.params)
            if why is not None:
                raise AnnotationError(f"{self.op_name}: backend {backend.name!r}: the kernel "
                                      f"{getattr(backend.kernel, '__qualname__', backend.kernel)!r} does not take "
                                      f"the op's parameters: {why}")
        self.registry[backend.name] = backend
        self.refresh(backend.name)
        return backend

    def unregister(self, name: str) -> None:
        if not isinstance(name, str) or name not in self.registry:  # never silent: a typo would leave it registered
            raise AnnotationError(f"{self.op_name}: no backend named {name!r} to unregister "
                                  f"(its backends: {', '.join(self.registry)})")
        self.registry.pop(name)
        self.refresh(name)

    def refresh(self, name: str | None = None) -> None:
        """Forget loaded kernels, availability and selections (of one backend, or all)."""
        for cache in (self.runners, self.availability):
            if name is None:
                cache.clear()
            else:
                cache.pop(name, None)
        self.selected.clear()
        self.last[0] = NO_LAST
        self.on_change()

    def load_plugins(self) -> None:
        if not self.plugins_loaded and self.plugin_loader is not None:
            self.plugins_loaded = True
            self.plugin_loader()

    def names(self) -> list[str]:
        """Registered backends, highest priority first."""
        self.load_plugins()
        return sorted(self.registry, key=lambda n: -self.registry[n].priority)

    def get(self, name: str) -> Backend:
        self.load_plugins()
        try:
            return self.registry[name]
        except (KeyError, TypeError):  # (TypeError: an unhashable name, e.g. backend=["torch"])
            raise BackendError(f"{self.op_name}: unknown backend {name!r}; registered: "
                               f"{', '.join(self.names())} (or 'auto')", function=self.op_name) from None

    # -- loading and availability ----------------------------------------------------------------
    def available(self, b: Backend) -> tuple[bool, str]:
        """``(True, "")`` when ``b`` can load here, else ``(False, why)``; cached per process."""
        cached = self.availability.get(b.name)
        if cached is None:
            cached = self.availability[b.name] = self._probe(b)
        return cached

    def _probe(self, b: Backend) -> tuple[bool, str]:
        """Whether ``b`` can load here. A backend that is broken (a package it requires fails to
        import, its availability check raises, its ``"module:function"`` kernel cannot be loaded or
        does not take the op's call) is unavailable and said so in a RuntimeWarning, once: ``auto``
        never passes over a broken backend without a word. One whose package is not installed, or
        whose check says no (no CUDA device here), is simply unavailable."""
        for mod in b.requires:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError:
                return False, f"{mod} is not installed"
            except Exception as exc:  # a package that breaks on import
                return self._broken(b, f"{mod} fails to import ({exc})")
        if b.availability is not None:
            try:
                answer = b.availability()
            except Exception as exc:  # a plug-in's probe must not break dispatch
                return self._broken(b, f"availability check failed: {exc!r}")
            if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool)
                    and isinstance(answer[1], str)):  # ("no" would read as ok="n", why="o")
                return self._broken(b, f"availability check returned {answer!r}, not (ok: bool, why: str)")
            ok, why = answer
            if not ok:
                return False, why
        if not callable(b.kernel):  # import it now: a broken or mis-shaped kernel is unavailable
            try:
                self.runner(b)
            except Exception as exc:
                return self._broken(b, f"kernel {b.kernel!r} cannot be loaded: {exc}")
        return True, ""

    def _broken(self, b: Backend, why: str) -> tuple[bool, str]:
        warnings.warn(f"kda_contracts: {self.op_name}: backend {b.name!r} is broken, so backend='auto' will not "
                      f"choose it: {why}", RuntimeWarning, stacklevel=4)
        return False, why

    def runner(self, b: Backend) -> Callable[..., Any]:
        """``run(dims, variant, *op_args)`` for backend ``b`` (its kernel loaded and checked)."""
        fn = self.runners.get(b.name)
        if fn is None:
            kernel = b.load()
            if not callable(b.kernel):
                why = b.signature_problem(kernel, self.params)
                if why is not None:
                    raise TypeError(f"it does not take the op's parameters: {why}")
            fn = b.make_runner(kernel, self.params, self.dims_types)
            if fn is kernel:
                self.direct.add(b.name)
            self.runners[b.name] = fn
        return fn

    # -- support and selection -------------------------------------------------------------------
    def unsupported(self, b: Backend, info: CallInfo, *, explicit: bool = False) -> list[str]:
        """Why ``b`` cannot run a call (empty when it can); ``explicit``: asked for by name."""
        why: list[str] = []
        devices = b.devices + (self._explicit_devices(b) if explicit else ())
        if info.device_type not in devices and "*" not in devices:
            why.append(f"runs on {'/'.join(b.devices)}, not {info.device_type}")
        for arg, allowed in b.dtype_table(self.floating).items():
            got = info.dtypes.get(arg)
            if got is not None and got not in allowed:
                supports = _dtype_names(sorted(allowed, key=str))
                why.append(f"{arg} dtype {_dtype_names([got])} not supported (supports {supports})")
        if b.variants is not None and info.variant is not None and info.variant not in b.variants:
            why.append(f"variant {info.variant} not supported")
        why += b.extra_unsupported(info)
        for c in b._constraints:
            if not c.symbols() <= info.dims.keys():
                continue
            got_dims = ", ".join(f"{s}={info.dims[s]}" for s in sorted(c.symbols()))
            try:
                if not c.holds(dict(info.dims)):
                    why.append(f"needs {c.text} (got {got_dims})")
            except ZeroDivisionError:  # (a contract's where= fails such a call too: see explain)
                why.append(f"where {c.text}: division by zero (got {got_dims})")
        return why

    def _explicit_devices(self, b: Backend) -> tuple[str, ...]:
        """``b.explicit_devices``, asked now when it is a callable: one that raises is a
        BackendError (its exception the cause), one that returns no device types an
        AnnotationError saying what it must return."""
        if not callable(b.explicit_devices):
            return b.explicit_devices
        try:
            got = b.explicit_devices()
        except (ContractError, AnnotationError):
            raise
        except Exception as exc:
            raise_violations(self.op_name, [Violation(
                BackendError, "backend", f"the explicit_devices() of backend {b.name!r} to name the device types "
                                         "it runs on when asked by name", f"it raised {type(exc).__name__}: {exc}")],
                {}, {}, cause=exc)
        devices = tuple(got) if isinstance(got, Iterable) and not isinstance(got, str) else None
        why = (f" (write ({got!r},))" if isinstance(got, str) else ": it is not a sequence") if devices is None \
            else _device_types_problem(devices)
        if devices is None or why is not None:
            raise AnnotationError(f"{self.op_name}: backend {b.name!r}: explicit_devices() returned {got!r}; it must "
                                  f"return {_DEVICE_TYPES}{why}")
        return devices

    def verdicts(self, info: CallInfo) -> list[tuple[Backend, list[str]]]:
        """Every backend with the reasons it cannot run the call, highest priority first."""
        out = []
        for n in self.names():
            b = self.registry[n]
            reasons = self.unsupported(b, info)
            if info.device_type in b.devices or "*" in b.devices:  # no need to import a GPU backend for a CPU call
                ok, why = self.available(b)
                reasons = ([why] if not ok else []) + reasons
            out.append((b, reasons))
        return out

    def choose(self, backend: str, info: CallInfo, *, dims_free: bool = False) -> Backend:
        """The named backend (which must support the call), or for ``"auto"`` the best one
        (``dims_free``: among those whose support does not depend on the dims, as under
        torch.compile, where the dims may be symbolic)."""
        if backend != "auto":
            b = self.get(backend)
            ok, why = self.available(b)
            reasons = ([why] if not ok else []) + self.unsupported(b, info, explicit=True)
            if reasons:
                raise_violations(self.op_name, [Violation(
                    BackendError, "backend", f"a backend that can run this call ({backend!r} was asked for)",
                    f"{backend!r}: {'; '.join(reasons)}",
                    hint=f"pass backend='auto' to let kda_contracts pick, or see "
                         f"{self.op_name}.explain_backends(...)")],
                    dict(info.dims), {})
            return b
        table = self.verdicts(info)
        chosen = next((b for b, r in table if not r and not (dims_free and b._constraints)), None)
        if chosen is None:
            raise_violations(self.op_name, [Violation(
                BackendError, "backend", "an available backend that supports this call",
                "; ".join(f"{b.name}: {', '.join(r)}" for b, r in table) or "no backend is registered")],
                dict(info.dims), {})
        assert chosen is not None  # raise_violations raised
        return chosen

    def select_cached(self, key: tuple[Any, ...], backend: str, make_info: Callable[[], CallInfo]) -> Chosen:
        """The backend to run a call, cached by ``key`` (which must determine the call's
        :class:`CallInfo`): one dict lookup once the key has been seen."""
        hit = self.selected.get(key)
        if hit is not None:
            return hit
        b = self.choose(backend, make_info())
        chosen = Chosen.of(b.name, self.runner(b), b.name in self.direct)
        if len(self.selected) >= self.SELECTED_MAX:
            self.selected.clear()
            self.last[0] = NO_LAST
        self.selected[key] = chosen
        return chosen


@dataclass(frozen=True)
class Chosen:
    """A selected backend as the dispatcher sees it: its name and its runner, which takes
    ``(dims, variant, *op_args)`` — or, when ``direct``, the op's arguments alone (the kernel
    itself, when it asks for no extras: one call frame less)."""

    name: str
    run: Callable[..., Any]
    direct: bool = False
    #: watch mode: the runner that hands the backend's kernel the rules to check itself (its
    #: ``rules``, by the kernel's check number), when the runner has one (``run.kda_watched``: a name
    #: no user's kernel function carries by chance; a direct backend's runner is the user's kernel)
    watched: Callable[..., Any] | None = None

    @classmethod
    def of(cls, name: str, run: Callable[..., Any], direct: bool) -> Chosen:
        return cls(name, run, direct, getattr(run, "kda_watched", None))


#: the empty ``BackendTable.last`` (no dims object is None: a cached call's dims are a CachedDims)
NO_LAST: tuple[None, None, None] = (None, None, None)


def verdict_lines(verdicts: Sequence[tuple[Backend, Sequence[str]]]) -> list[str]:
    """One line per backend, as ``op.explain_backends`` words them: the one ``backend="auto"``
    picks, those that support the call but rank lower, and why each other one cannot run it.

    Example::

        verdict_lines(table.verdicts(info))   # ['    fast: chosen (priority 30, ...)', ...]
    """
    lines, chosen = [], None
    for b, reasons in verdicts:
        if not reasons and chosen is None:
            chosen = b.name
            lines.append(f"{b.name:>8}: chosen (priority {b.priority}, the highest that supports this call)")
        elif not reasons:
            lines.append(f"{b.name:>8}: supports this call, but {chosen} has a higher priority")
        else:
            lines.append(f"{b.name:>8}: not chosen: {'; '.join(reasons)}")
    return lines
