"""``@kc.op``: an operation = a contract + backends + dispatch.

The decorated function's annotations are the contract and its body is the PyTorch reference,
registered as backend ``"torch"``. Kernels are added with ``@op.backend(...)``; a call validates
its arguments per the mode, picks the highest-priority backend that supports it (device, dtypes,
dims, availability) and runs it. The choice is cached per call signature, so a repeated call
costs one dict lookup more than the bare contract.

An op whose argument shapes depend on a declared layout has several contract *variants*: pass
``variants={"VK": fn_vk, "KV": fn_kv}`` (functions whose annotations are each variant's
contract) and ``variant=`` a function of some of the op's parameters that names the variant of
a call.

Example::

    @kc.op
    def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
                   out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        "Reference: out = x * w."
        torch.mul(x, w, out=out)

    @scale_rows.backend("triton", devices=("cuda",), priority=30, where=["D % 16 == 0"])
    def _(x, w, out, *, dims): ...

    scale_rows(x, w, out)                      # validate -> pick -> run
    print(scale_rows.explain_backends(x, w, out))
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import NoneType
from typing import Any, NoReturn, TypeVar

import torch

from .. import hooks
from ..compile.marks import outside_compile
from ..contract.compiled import Contract
from ..contract.transaction import RESTORED, partial_writes, undeclared_hint, written_parts
from ..errors import (
    AnnotationError,
    ArgumentTypeError,
    ContractError,
    Violation,
    _hint_text,
    raise_violations,
)
from ..explain.explainer import explain_call
from ..model.spec import NO_HINT, CallContext, ContractOptions, Dims
from ..reading.annotations import build_spec
from ..reading.structure import mentions_array
from ..rules.memory import has_addresses, without_data
from . import registry
from .backends import Backend, BackendError, CallInfo, Reference
from .dispatch import bootstrap, build_dispatcher
from .strict import transact
from .table import BackendTable, Chosen, verdict_lines

_F = TypeVar("_F", bound=Callable[..., Any])
#: what ``written=`` must return (said when it returns something else)
_WRITTEN_RETURNS = ("{arg: None (all of it) | the rows of its dim 0 the call writes, a 1-D integer tensor of row "
                    "ids}")
_NOTHING_RAN = "no backend ran: the call changed no tensor"


# -- plug-ins -------------------------------------------------------------------------------------


# -- the op ---------------------------------------------------------------------------------------
class Op:
    """An operation: a contract (or several variants), a torch reference and backends.

    Made by :func:`op`; call it like the decorated function (plus ``backend="auto"``).
    """

    def __init__(self, fn: Callable[..., Any], options: ContractOptions, *, variants: Mapping[str, Any] | None,
                 variant: Callable[..., str] | None, returns: str | Sequence[str] | None,
                 after: Callable[[CallContext, str], list[Violation]] | None,
                 unchecked_dims: Callable[..., tuple[int, ...]] | None, namespace: str,
                 written: Callable[[CallContext], Mapping[str, Any]] | None = None) -> None:
        self.fn = fn
        self.name = options.name or fn.__name__
        self.namespace = namespace
        self.options = options
        self.signature = inspect.signature(fn)
        self._params = tuple(self.signature.parameters.values())
        if "backend" in self.signature.parameters:
            raise AnnotationError(f"{self.name}: an op parameter cannot be named 'backend' (the op's own keyword)")
        self._refuse_annotated_star_params(fn)
        self.contracts = self._build_contracts(fn, options, variants, variant)
        self.contract: Contract = next(iter(self.contracts.values()))
        #: ``variant=`` as given (the generated dispatcher calls it inside its own guard, with no
        #: extra call per call), and guarded (:meth:`_guarded`) for the other paths
        self._variant_raw = variant
        self._variant_expected = (f"the op's variant= to name the variant of the call (one of "
                                  f"{', '.join(map(repr, self.contracts))})")
        self.variant_of = None if variant is None else self._guarded(variant, "variant", self._variant_expected)
        self._variant_params = tuple(inspect.signature(variant).parameters) if variant is not None else ()
        self.returns = self._read_returns(returns)
        #: an op annotated ``-> None`` (without ``returns=``) returns None: its backend may return the
        #: tensors it wrote (as fla's do); a result of its own is refused (dispatch.lost_result)
        self.returns_none = self.returns is None and all(c.spec.return_hint is NoneType
                                                         for c in self.contracts.values())
        self.after = after
        self.written = None if written is None else self._checked_written(written)
        self.unchecked_dims = unchecked_dims
        spec = self.contract.spec
        floating = [n for n, tp in spec.tensors.items() if any(d.is_floating_point for d in tp.dtypes)]
        symbols = {v: c.spec.symbols for v, c in self.contracts.items()}
        self.table = BackendTable(self.name, self._params, symbols, floating, self._rebuild)
        self.table.contained = tuple(sorted({n for c in self.contracts.values() for n in c.spec.nested}))
        self.table.plugin_loader = self._load_plugins
        self._torch_op: Any = None
        self._dispatch: Callable[..., Any] | None = None
        self._key_layout: Any = None  # what the dispatcher's selection key holds (set when it is built)
        self._rebuild_enabled = False
        doc = (fn.__doc__ or "").strip().split("\n")[0] or "the op's body (PyTorch reference)"
        # outside autograd as a kernel, where the op returns only what it writes (a fresh result keeps its graph)
        writes = any(t.spec.mutated for c in self.contracts.values() for t in c.spec.tensors.values())
        self.table.register(Reference(name="torch", kernel=fn, devices=("*",), priority=0, description=doc,
                                      _outside_autograd=writes and not options.autograd and (
                                          self.returns is not None or self.returns_none)))
        self._rebuild_enabled = True
        self._rebuild()
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        params = [*self._params]
        kw = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default="auto", annotation=str)
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        params.insert(at, kw)
        self.__signature__ = self.signature.replace(parameters=params)
        # (listed in kc.ops() by kc.op once whole: operation/decorate.py)

    # -- building --------------------------------------------------------------------------------
    def _refuse_annotated_star_params(self, fn: Callable[..., Any]) -> None:
        """An op's ``*args``/``**kwargs`` may pass through unannotated; annotated, they would be checked
        as one container, which its backends and torch.library cannot take by name."""
        try:
            annotations = typing.get_type_hints(fn, include_extras=True)
        except Exception:  # (unresolvable annotations are reported where the contract reads them)
            annotations = {}
        for p in self._params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and annotations.get(p.name, Any) not in (Any, object):
                star = "*" if p.kind is p.VAR_POSITIONAL else "**"
                raise AnnotationError(f"{self.name}: {star}{p.name}: an op takes named parameters (its backends and "
                                      "torch.library see them by name); take a list or tuple of them, or leave "
                                      f"{star}{p.name} unannotated")

    def _build_contracts(self, fn: Callable[..., Any], options: ContractOptions,
                         variants: Mapping[str, Any] | None,
                         variant: Callable[..., str] | None) -> dict[str | None, Contract]:
        if variants is None:
            if variant is not None:
                raise AnnotationError(f"{self.name}: variant= names a call's variant, but no variants= were given")
            return {None: Contract(build_spec(fn, self._guarded_checks(options)), fn)}
        if variant is None or not variants:
            raise AnnotationError(f"{self.name}: variants= needs variant=, a function of the op's parameters that "
                                  "names the variant of a call")
        unknown = set(inspect.signature(variant).parameters) - set(self.signature.parameters)
        if unknown:
            raise AnnotationError(f"{self.name}: variant= takes {', '.join(sorted(unknown))}, not parameters of the op")
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise AnnotationError(f"{self.name}: cannot read the annotations: {exc}") from exc
        own = {k: v for k, v in hints.items() if mentions_array(v)}
        if own:
            raise AnnotationError(f"{self.name}: with variants=, the contract is each variant's annotations; "
                                  f"remove the op function's own ({', '.join(own)}) so none is ignored")
        out: dict[str | None, Contract] = {}
        want = [(p.name, p.kind) for p in self._params]
        for key, entry in variants.items():
            vfn, overrides = entry if isinstance(entry, tuple) else (entry, dict[str, Any]())
            got = [(p.name, p.kind) for p in inspect.signature(vfn).parameters.values()]
            if got != want:
                raise AnnotationError(f"{self.name}: variant {key!r} does not have the op's parameters "
                                      f"({', '.join(n for n, _ in got)} vs {', '.join(n for n, _ in want)})")
            fields = {**vars(options), "name": self.name, **overrides}
            c = Contract(build_spec(vfn, self._guarded_checks(ContractOptions(**fields))), vfn)
            out[key] = c
        symbols = {frozenset(c.spec.symbols) for c in out.values()}
        if len(symbols) != 1:
            raise AnnotationError(f"{self.name}: every variant must bind the same dims, got {sorted(symbols)}")
        return out

    def _read_returns(self, returns: str | Sequence[str] | None) -> tuple[str, ...] | str | None:
        if returns is None:
            return None
        names = (returns,) if isinstance(returns, str) else tuple(returns)
        bad = [n for n in names if n not in self.signature.parameters]
        if bad:
            raise AnnotationError(f"{self.name}: returns= names {', '.join(bad)}, not parameters of the op")
        if self.contract.spec.returns is not None:
            raise AnnotationError(f"{self.name}: returns= (the op returns its own arguments) and a tensor return "
                                  "annotation cannot both describe the result")
        for c in self.contracts.values():
            if c.spec.return_hint not in (NO_HINT, NoneType):  # (-> int would never be checked)
                raise AnnotationError(f"{self.name}: returns= (the op returns its own arguments) and a return "
                                      f"annotation (-> {_hint_text(c.spec.return_hint)}) cannot both describe the "
                                      "result: annotate the function -> None")
            # what the op returns it writes: strict mode snapshots (and torch.library declares) only those marked
            unmarked = [n for n in names if n not in c.spec.tensors or not c.spec.tensors[n].spec.mutated]
            if unmarked:
                raise AnnotationError(f"{self.name}: returns= {', '.join(unmarked)}, which the op must then write: "
                                      "mark them kc.Spec(mutated=True)")
        return names[0] if isinstance(returns, str) else names

    def _load_plugins(self) -> None:
        registry.load_plugins()
        for b, replace in registry.waiting_for(self.name):
            self.table.register(b, replace=replace)

    # -- backends --------------------------------------------------------------------------------
    def backend(self, name: str, *, devices: Iterable[str] = ("cuda",), priority: int = 10,
                where: Iterable[str] = (), dtypes: Mapping[str, Sequence[torch.dtype]] | Sequence[torch.dtype]
                | None = None, requires: Iterable[str] = (), availability: Callable[[], tuple[bool, str]] | None = None,
                description: str = "", explicit_devices: tuple[str, ...] | Callable[[], tuple[str, ...]] = (),
                variants: Iterable[str] | None = None, replace: bool = False) -> Callable[[Any], Any]:
        """Decorator registering a kernel (or ``"module:function"``, loaded on first use) as a
        backend. Its signature must be the op's (names and kinds), plus optional keyword-only
        ``dims`` and ``variant``; a mismatch, or a field of the wrong kind (``devices=("CPU",)``,
        ``priority="high"``), is an AnnotationError (a TypeError) naming it."""
        if not isinstance(name, str):  # a bare @op.backend would take the kernel for the name
            raise AnnotationError(f"{self.name}: write @{self.name}.backend('name', ...): a backend needs a name")

        def register(kernel: Any) -> Any:
            self.table.register(Backend(
                name=name, kernel=kernel, devices=devices, priority=priority, where=where,  # type: ignore[arg-type]
                dtypes=dtypes, requires=requires, availability=availability,  # type: ignore[arg-type]
                description=description or (getattr(kernel, "__doc__", None) or "").strip().split("\n")[0],
                explicit_devices=explicit_devices, variants=variants,  # type: ignore[arg-type]
                op=self.name), replace=replace)
            return kernel

        return register

    def register_backend(self, backend: Backend, *, replace: bool = False) -> Backend:
        """Add a :class:`Backend` declaration (e.g. one whose kernel is ``"module:function"``)."""
        return self.table.register(backend, replace=replace)

    def unregister_backend(self, name: str) -> None:
        self.table.unregister(name)

    def backends(self) -> list[Backend]:
        """Every backend, highest priority first (``op.available()`` says which can load here)."""
        return [self.table.registry[n] for n in self.table.names()]

    def available(self) -> dict[str, tuple[bool, str]]:
        """Each backend: ``(can load here, why not)``."""
        return {n: self.table.available(self.table.registry[n]) for n in self.table.names()}

    # -- validation and explanation --------------------------------------------------------------
    def _values(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        try:
            ba = self.signature.bind(*args, **kwargs)
        except TypeError as exc:  # (as Python says it of a call: naming the op, not inspect's frame)
            raise TypeError(f"{self.name}(): {exc}") from None
        ba.apply_defaults()
        return dict(ba.arguments)

    def contract_for(self, values: Mapping[str, Any]) -> tuple[str | None, Contract]:
        """The variant of a call (None without variants) and its contract."""
        if self.variant_of is None:
            return None, self.contract
        key = self.variant_of(*(values[p] for p in self._variant_params))
        if key not in self.contracts:
            self._bad_variant(key)
        return key, self.contracts[key]

    def _bad_variant(self, key: Any) -> None:
        """A call whose ``variant=`` names no variant: a ContractError naming the valid ones."""
        raise_violations(self.name, [Violation(
            ArgumentTypeError, ", ".join(self._variant_params) or "variant",
            f"arguments naming one of the variants {', '.join(map(repr, self.contracts))}",
            f"variant {key!r}")], {}, {})

    def validate(self, *args: Any, **kwargs: Any) -> Dims:
        """Check a call (whatever the mode) without running it; return its bound dims."""
        return self.validate_values(self._values(args, kwargs))

    def validate_values(self, values: Mapping[str, Any], *, strict: bool = False) -> Dims:
        """:meth:`validate` on arguments given by name; ``strict`` adds the value checks and the
        aliasing check of what the op writes (:meth:`alias_violations`)."""
        _, c = self.contract_for(values)
        config = c._config_for(values)
        dims = c.validate_values(values, config, strict=strict)
        if strict:
            ctx = CallContext(c.spec, dict(values), config, dict(dims), dims.provenance)
            violations = self.alias_violations(ctx)
            if violations:
                c.rejections += 1
                raise_violations(self.name, violations, dict(dims), dims.provenance)
        return dims

    def alias_violations(self, ctx: CallContext, parts: Mapping[str, Any] | None = None) -> list[Violation]:
        """Strict mode: the elements the op writes (``written=``, else every argument marked
        ``kc.Spec(mutated=True)``) share no byte with another argument, judged by address across
        storages (:func:`kda_contracts._engine.rules.memory.alias_violations`). During CUDA-graph capture, rows
        cannot be read without a sync: only arguments written whole are checked. ``parts``: what
        ``written=`` said of this call, if the caller asked already (having found that its tensors
        hold data)."""
        from ..rules.aliasing import alias_violations, tensor_leaves

        if parts is None:
            if without_data(ctx.values):  # meta or fake tensors: no addresses (the value checks said so)
                return []
            parts = written_parts(self.written, self.name, ctx)
        if any(isinstance(v, torch.Tensor) and v.is_cuda for v in ctx.values.values()) and \
                torch.cuda.is_current_stream_capturing():
            parts = {k: None for k, rows in parts.items() if rows is None}
        return alias_violations(tensor_leaves(ctx.values), parts, function=self.name) if parts else []

    def call_info(self, values: Mapping[str, Any], dims: Mapping[str, int], variant: str | None) -> CallInfo:
        """What the backends are told of a validated call."""
        spec = self.contract.spec
        dev = next((v.device.type for v in values.values() if isinstance(v, torch.Tensor)), "cpu")
        dtypes = {n: values[n].dtype for n in spec.tensors if isinstance(values.get(n), torch.Tensor)}
        absent = frozenset(n for n, v in values.items() if v is None)
        return CallInfo(device_type=dev, dtypes=dtypes, absent=absent, variant=variant, dims=dict(dims))

    def explain_backends(self, *args: Any, **kwargs: Any) -> str:
        """Say, for each backend, whether ``backend="auto"`` would pick it for this call and why
        (or why not), and which plug-ins failed to load. Validates the call first. With
        ``backend=`` naming one, also whether a call asking for it by name would run it."""
        asked = kwargs.pop("backend", "auto") if "backend" not in self.signature.parameters else "auto"
        values = self._values(args, kwargs)
        variant, _ = self.contract_for(values)
        info = self.call_info(values, self.validate_values(values), variant)
        lines = verdict_lines(self.table.verdicts(info))
        if asked != "auto":
            b = self.table.registry.get(asked) if isinstance(asked, str) else None
            if b is None:
                refused = [f"no backend of this name (registered: {', '.join(self.table.names())})"]
            else:
                ok, why = self.table.available(b)
                refused = [why] if not ok else self.table.unsupported(b, info, explicit=True)
            lines.append(f"backend={asked!r}: " + ("runs this call when asked by name" if not refused else
                                                   "a call asking for it is refused: " + "; ".join(refused)))
        for ep, why in self.plugin_errors().items():
            lines.append(f"plug-in {ep}: failed to load: {why}")
        return "\n".join(lines)

    def plugin_errors(self) -> dict[str, str]:
        """Plug-ins (of any op) that failed to load, with why."""
        self.table.load_plugins()
        return {**registry.plugin_errors(), **self.table.plugin_errors}

    @property
    def torch_op(self) -> Any:
        """This op as a ``torch.library`` custom op (made on first use), whose fake implementation
        is the contract; see :mod:`kda_contracts._engine.operation.torch_op`."""
        if self._torch_op is None:
            from .torch_op import make_torch_op

            self._torch_op = make_torch_op(self)
        return self._torch_op

    def __repr__(self) -> str:
        return f"<kda_contracts op {self.name} (backends: {', '.join(self.table.names())})>"

    # -- the dispatcher --------------------------------------------------------------------------
    def _rebuild(self) -> None:
        """Regenerate ``__call__`` (the selection key depends on what the backends declare)."""
        if not getattr(self, "_rebuild_enabled", False):
            return
        cls = type(self)
        if cls is Op:  # each op gets its own class, so that __call__ is its generated function
            cls = type(f"Op[{self.name}]", (Op,), {"__module__": __name__})
            self.__class__ = cls
        if not self.table.plugins_loaded:  # the first call loads the plug-ins, then dispatches
            cls.__call__ = bootstrap(self)  # type: ignore[method-assign]
            return
        cls.__call__ = build_dispatcher(self)  # type: ignore[method-assign]

    def _transact(self, chosen: Chosen, dims: tuple[int, ...], variant: str | None, vals: tuple[Any, ...],
                  config: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  memo: dict[str, Any] | None = None) -> Any:
        """Strict mode's run of the chosen backend (:func:`.strict.transact`)."""
        return transact(self, chosen, dims, variant, vals, config, args, kwargs, memo)

    # -- the op's own hooks, run during a call ---------------------------------------------------
    def _hook_failed(self, hook: str, expected: str, exc: Exception, *, subject: str = "it",
                     hint: str | None = _NOTHING_RAN) -> NoReturn:
        """A user hook of the op (``after=``, ``value_checks=``, ``variant=``, ``written=``) raised
        during a call: a BackendError naming the hook and the op, the original as its cause."""
        raise_violations(self.name, [Violation(BackendError, hook, expected,
                                               f"{subject} raised {type(exc).__name__}: {exc}", hint=hint)],
                         {}, {}, cause=exc)
        raise AssertionError  # unreachable: raise_violations raised

    def _guarded(self, fn: _F, hook: str, expected: str, *, subject: str = "it") -> _F:
        """``fn`` (the op's ``hook=``), whose exceptions become :meth:`_hook_failed`'s BackendError; a
        ContractError or AnnotationError it raises (a check of its own) goes on as itself. Its
        name and docstring stay ``fn``'s (the docs show them)."""
        failed = outside_compile(functools.partial(self._hook_failed, hook, expected, subject=subject))

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (ContractError, AnnotationError):
                raise
            except Exception as exc:
                failed(exc)
                raise  # unreachable: failed raised

        return guarded  # type: ignore[return-value]

    def _guarded_checks(self, options: ContractOptions) -> ContractOptions:
        """``options`` with its ``value_checks=`` guarded (:meth:`_guarded`)."""
        if not callable(options.value_checks):
            return options
        checks = self._guarded(options.value_checks, "value_checks", "the op's value checks to run on the arguments",
                               subject="they")
        return dataclasses.replace(options, value_checks=checks)

    def _checked_written(self, written: Callable[[CallContext], Mapping[str, Any]]) -> Callable[..., Any]:
        """``written=`` held to what it must return: a hook that raises is a BackendError
        (:meth:`_guarded`), a result of another kind an AnnotationError saying what it must be, and
        rows outside dim 0 (padding left in) a BackendError, since strict mode could not copy
        them. Rows on the host are read without a sync; rows on the device cost one read (strict
        mode only; never while a CUDA graph is captured, when the rows are not used)."""
        guarded = self._guarded(written, "written", "the op's written= to say what the call writes")

        @functools.wraps(written)
        def checked(ctx: CallContext) -> Mapping[str, Any]:
            parts = guarded(ctx)
            bad = type(parts).__name__ if not isinstance(parts, Mapping) else next(
                (f"a {type(rows).__name__} for {name!r}" for name, rows in parts.items() if rows is not None and not (
                    isinstance(rows, torch.Tensor) and rows.ndim == 1 and not rows.dtype.is_floating_point
                    and not rows.dtype.is_complex and rows.dtype is not torch.bool)), None)
            if bad is not None:
                raise AnnotationError(f"{self.name}: written= returned {bad}; it must return {_WRITTEN_RETURNS}")
            for name, rows in parts.items():
                self._refuse_rows_outside(name, rows, ctx.values.get(name))
            return parts

        return checked

    def _refuse_rows_outside(self, name: str, rows: torch.Tensor | None, t: Any) -> None:
        """A BackendError when ``written=`` gave rows of ``t`` outside its dim 0 (-1 padding)."""
        capturing = torch.cuda.is_current_stream_capturing
        if rows is None or not isinstance(t, torch.Tensor) or not rows.numel():
            return
        if not (has_addresses(rows) and has_addresses(t)) or (rows.is_cuda and capturing()):
            return  # no values to read (the snapshot is skipped then too)
        n = t.shape[0] if t.ndim else 0
        # host rows (packed decode's, from the value checks' one read) are read without a sync; rows
        # on the device in one read
        lo, hi = (int(rows.numpy().min()), int(rows.numpy().max())) if rows.device.type == "cpu" else \
            torch.stack(torch.aminmax(rows)).tolist()
        if lo < 0 or hi >= n:
            raise_violations(self.name, [Violation(
                BackendError, "written", f"the op's written= to give row ids of {name} in 0..{n - 1} (a negative id, "
                                         "padding, is not a row)", f"row ids from {lo} to {hi}",
                hint=f"leave padding and out-of-range ids out: rows[(rows >= 0) & (rows < {name}.shape[0])] "
                     f"({_NOTHING_RAN})")], {}, {})

    def _failed(self, backend: str, exc: BaseException, vals: tuple[Any, ...] | None = None, config: Any = None,
                variant: str | None = None, *, rolled_back: bool = False, undeclared: Sequence[str] = ()) -> None:
        """A backend raised on a validated call (its checked arguments ``vals``, ``config``,
        ``variant``): a BackendError naming it, the original as its cause; the call is saved
        (``KDA_CONTRACTS_DUMP_DIR``) as any rejected call is, as the backend left it."""
        what = (undeclared_hint(list(undeclared)) if undeclared else
                RESTORED if rolled_back and self.contract.written else
                partial_writes(self.contract.written) or "the op writes no tensor in place")
        names = self.contracts[variant]._param_names if variant in self.contracts else ()
        values = dict(zip(names, vals or (), strict=False))
        with hooks.rejecting(self, values, config, stage="backend", backend=backend) if vals is not None \
                else contextlib.nullcontext():
            raise_violations(self.name, [Violation(
                BackendError, "backend", f"backend {backend!r} to run the validated call",
                f"it raised {type(exc).__name__}: {exc}", hint=what)], {}, {}, cause=exc)

    def _dims_off(self, variant: str | None, *vals_and_cfg: Any) -> tuple[int, ...] | None:
        """The dims of a call in mode ``off`` (taken on trust; None when they cannot be read)."""
        c = self.contracts[variant]
        if self.unchecked_dims is not None:
            return self.unchecked_dims(variant, *vals_and_cfg[:-1])
        d = c._check(*vals_and_cfg)
        if d is None:
            try:
                values = dict(zip(c._param_names, vals_and_cfg[:-1], strict=True))
                env, _, _ = explain_call(c.spec, values, vals_and_cfg[-1])
            except Exception:
                return None
            return tuple(env.get(s, -1) for s in c.spec.symbols)
        return d


