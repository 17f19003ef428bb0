"""``kc.install_import_hook``: a contract on every function of a package, without decorating each.

Every module of the named packages imported after the hook is installed gets ``kc.contract`` on
each of its functions and methods whose annotations mention a jaxtyping array type, exactly as if
it had been decorated by hand (same engine, same errors, same registry).

How: a ``sys.meta_path`` finder hands out the module's own loader wrapped so that, once the
module has run, its namespace is walked (a post-exec module walk, not a source rewrite):

- module-level functions defined in the module (``fn.__module__`` is the module: imported names
  are left to the module that defines them) and the methods of classes defined in it (nested
  classes too; plain, static and class methods, property and cached_property accessors) are
  replaced by their contracted wrappers, like ``@kc.contract`` on each;
- annotations are read after the whole module ran, so forward references and
  ``from __future__ import annotations`` resolve as they do for ``typing.get_type_hints``;
- no source is rewritten, so there is no bytecode cache to keep apart and nothing depends on how
  the module's source is found (zip imports, pytest's assertion rewriting, editable installs).

The price, said here and in docs/testing.md: a reference taken *while the module runs* keeps the
undecorated function (a registry filled by a decorator, ``functools.partial(f)``, a default
argument), and functions nested in other functions are not contracted.

Never silent: a function whose contract the engine refuses (or whose annotations cannot be read,
say a name imported only under ``TYPE_CHECKING``) makes the import fail with one
:class:`AnnotationError` listing every such function of the module. To leave one unchecked, mark
it (or its class) ``@typing.no_type_check``, the standard marker jaxtyping's hook honours too. A
function already decorated with ``@kc.contract(...)`` keeps its own contract. Modules imported
before the hook was installed are not touched, and the hook says so with an
:class:`ImportHookWarning`. ``kda_contracts`` itself is never hooked.

Example::

    with kc.install_import_hook("my_model"):       # or several: ["my_model", "my_kernels.ops"]
        import my_model                             # and every my_model.* imported from now on
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import warnings
from collections.abc import Iterable, Sequence
from types import ModuleType, TracebackType
from typing import Any

from .. import modes
from ..contract.decorator import contract, register_contract
from ..errors import AnnotationError
from ..reading.members import Decorate, contract_members, wants_contract

_SELF = "kda_contracts"
_LISTED = 5  # module names a warning lists before "and N more"


class ImportHookWarning(UserWarning):
    """Modules of a hooked package that were imported before the hook and are not contracted."""


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _package_names(packages: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(packages, str):
        names: tuple[Any, ...] = (packages,)
    else:
        try:
            if isinstance(packages, (bytes, bytearray)):
                raise TypeError
            names = tuple(packages)
        except TypeError:
            raise AnnotationError(f"kc.install_import_hook: expected a package name or several, got {packages!r}") \
                from None
    if not names:
        raise AnnotationError("kc.install_import_hook: no package named; pass one or several, e.g. "
                         "install_import_hook('my_model')")
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise AnnotationError(f"kc.install_import_hook: {name!r} is not a module name (dotted identifiers, "
                             "e.g. 'my_model' or 'my_model.layers')")
        if _is_within(name, _SELF):
            raise AnnotationError(f"kc.install_import_hook: {name!r}: kda_contracts is never hooked (its functions "
                                  "carry the contracts they need already)")
    return names


def _listed(names: Sequence[str]) -> str:
    more = len(names) - _LISTED
    return ", ".join(names[:_LISTED]) + (f" and {more} more" if more > 0 else "")


class _ContractingLoader(importlib.abc.Loader):
    """A module's own loader, which then hands the module to the hook (anything else: the loader's)."""

    def __init__(self, loader: Any, hook: ImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook._contract_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        if name == "_loader":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)


class ImportHook(importlib.abc.MetaPathFinder):
    """What :func:`install_import_hook` returns: the installed finder, a context manager that
    uninstalls it on exit.

    - ``packages``: the packages it covers (each with its submodules); ``mode``: the pinned mode
      of the contracts it makes (None: the mode in force, as ``@kc.contract`` without ``mode=``).
    - ``contracted``: for each module it contracted, the names of the contracts it put on it
      (also registered, under ``"module:name"``, in ``kc.registered_contracts()``).
    - ``already_imported``: modules of those packages imported before it was installed (not contracted).

    Example::

        hook = kc.install_import_hook("my_model", mode="strict")
        import my_model.layers
        hook.contracted["my_model.layers"]     # ('rmsnorm', 'Attention.forward', ...)
        hook.uninstall()
    """

    def __init__(self, packages: tuple[str, ...], mode: modes.ModeName | None, doc: bool | None) -> None:
        self.packages = packages
        self.mode = mode
        self.doc = doc
        self.contracted: dict[str, tuple[str, ...]] = {}
        self.already_imported = tuple(sorted(m for m in list(sys.modules) if self.covers(m)))

    def covers(self, module: str) -> bool:
        """Whether modules named ``module`` get contracts from this hook."""
        return not _is_within(module, _SELF) and any(_is_within(module, p) for p in self.packages)

    @property
    def installed(self) -> bool:
        return self in sys.meta_path

    def uninstall(self) -> None:
        """Stop contracting modules imported from now on (those contracted stay so)."""
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def __enter__(self) -> ImportHook:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        state = "installed" if self.installed else "uninstalled"
        return f"<kda_contracts import hook for {', '.join(self.packages)} (mode {self.mode or 'in force'}, {state})>"

    # -- the finder --------------------------------------------------------------------------------
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not self.covers(fullname):
            return None
        for finder in list(sys.meta_path):  # the finder that would have found it without us
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, ImportHook) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ContractingLoader(spec.loader, self)
        return spec  # type: ignore[no-any-return]

    # -- the walk ----------------------------------------------------------------------------------
    def _decorator(self, module: str, done: list[str]) -> Decorate:
        def decorate(fn: Any, name: str) -> Any:
            wrapper = contract(mode=self.mode, name=name, register=False, doc=self.doc)(fn)
            if wrapper is not fn:  # the mode in force at import is off: the function itself
                register_contract(f"{module}:{name}", wrapper.__kda_contract__)
                done.append(name)
            return wrapper

        return decorate

    def _contract_class(self, cls: type, decorate: Decorate, refusals: list[AnnotationError],
                        seen: set[int]) -> None:
        if id(cls) in seen or getattr(cls, "__no_type_check__", False):
            return
        seen.add(id(cls))
        contract_members(cls, decorate, defined_in=cls.__module__, refused=lambda _, err: refusals.append(err))
        for attr, inner in list(vars(cls).items()):
            if inspect.isclass(inner) and inner.__qualname__ == f"{cls.__qualname__}.{attr}":
                self._contract_class(inner, decorate, refusals, seen)

    @staticmethod
    def _contract_function(obj: Any, decorate: Decorate) -> Any:
        """``obj`` contracted when its annotations mention a tensor type (else itself); a function
        under ``functools.lru_cache``/``functools.cache`` is contracted beneath a new cache of the
        same parameters, so a call that misses the cache is checked."""
        inner = _cached_function(obj)
        fn = obj if inner is None else inner
        if not wants_contract(fn, fn.__qualname__):
            return obj
        wrapper = decorate(fn, fn.__qualname__)
        if inner is None:
            return wrapper
        cached = functools.lru_cache(**obj.cache_parameters())(wrapper)
        return functools.update_wrapper(cached, fn)

    def _contract_module(self, module: ModuleType) -> None:
        name = module.__name__
        done: list[str] = []
        decorate = self._decorator(name, done)
        refusals: list[AnnotationError] = []
        replaced: dict[int, Any] = {}  # id(function) -> its wrapper, for a second name of one function
        seen: set[int] = set()
        for attr, obj in list(vars(module).items()):
            if getattr(obj, "__module__", None) != name:
                continue  # imported, or not a function or class
            if inspect.isclass(obj):
                self._contract_class(obj, decorate, refusals, seen)
            elif inspect.isfunction(obj) and id(obj) in replaced:
                setattr(module, attr, replaced[id(obj)])
            elif inspect.isfunction(obj) or _cached_function(obj) is not None:
                try:
                    wrapper = self._contract_function(obj, decorate)
                except AnnotationError as err:
                    refusals.append(err)
                    continue
                if wrapper is not obj:
                    replaced[id(obj)] = wrapper
                    setattr(module, attr, wrapper)
        if refusals:
            what = "a function" if len(refusals) == 1 else f"{len(refusals)} functions"
            raise AnnotationError(
                f"kc.install_import_hook: cannot contract {what} of {name} (fix the annotations, or mark a function "
                "or class @typing.no_type_check to leave it unchecked):\n" + "\n".join(f"  {e}" for e in refusals))
        self.contracted[name] = tuple(done)


def install_import_hook(packages: str | Iterable[str], mode: modes.ModeName | None = None, *,
                        doc: bool | None = None) -> ImportHook:
    """Contract every function and method with a tensor annotation in the modules of ``packages``
    imported from now on (see the module docstring for what is contracted and what is refused).

    ``mode``: pin the contracts' mode (``"check"``, ``"strict"``, ``"off"``); None follows the mode
    in force, as ``@kc.contract`` does. ``doc``: as ``kc.contract(doc=...)``. Returns the
    :class:`ImportHook`; ``with`` uninstalls it on exit. Modules of those packages imported already
    are not contracted: an :class:`ImportHookWarning` names them.

    Example::

        with kc.install_import_hook(["my_model", "my_kernels"], mode="strict"):
            import my_model
    """
    names = _package_names(packages)
    if mode is not None:
        modes.parse_mode(mode, f"kc.install_import_hook(mode={mode!r})")
    if doc is not None and not isinstance(doc, bool):
        raise AnnotationError(f"kc.install_import_hook: doc= takes True, False or None, got {doc!r}")
    hook = ImportHook(names, mode, doc)
    if hook.already_imported:
        warnings.warn(f"kc.install_import_hook: {_listed(hook.already_imported)} imported before the hook was "
                      f"installed, not contracted; modules of {', '.join(names)} imported from now on are. Install the "
                      "hook before the first import (under pytest: --kda-contracts-packages)",
                      ImportHookWarning, stacklevel=2)
    sys.meta_path.insert(0, hook)
    return hook


def _cached_function(obj: Any) -> Any:
    """The function under a ``functools.lru_cache``/``functools.cache`` wrapper, else None."""
    inner = getattr(obj, "__wrapped__", None)
    return inner if callable(getattr(obj, "cache_parameters", None)) and inspect.isfunction(inner) else None
