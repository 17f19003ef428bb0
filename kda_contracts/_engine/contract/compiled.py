"""A compiled contract (:class:`Contract`): its spec, the generated checker behind its eager
cache, the return checker, the type shim beartype checks, and the slow paths that word a
rejected call. ``fn.__kda_contract__`` holds it on a decorated function.

beartype checks the non-tensor parameters and the Tensor-ness of tensor parameters through a
shim function carrying the stripped annotations.

Example::

    c = kc.contract(my_kernel_wrapper).__kda_contract__
    dims = c.validate(*args)         # raises a ContractError listing every violation
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import NoneType
from typing import Any

import torch
from beartype import BeartypeConf, beartype
from beartype.door import is_bearable
from beartype.roar import BeartypeCallHintParamViolation

from .. import hooks, modes
from ..codegen.check_cache import cached_checker
from ..codegen.checker import (
    bool_for_float,
    checked_parameters,
    checker_names,
    generate_checker,
    generate_return_checker,
)
from ..codegen.config_views import ConfigViews, refuse_built_in_trace, walked_built_in_trace
from ..codegen.types import every_item_checker, traced_type_check
from ..compile.marks import (
    eager_value_checks,
    made_in_trace,
    mark_constant_result,
    outside_compile,
    tracing_context,
)
from ..errors import (
    ArgumentTypeError,
    ContractError,
    Violation,
    hook_violations,
    raise_violations,
    uninspectable,
)
from ..explain.explainer import explain_call
from ..explain.results import explain_return
from ..model.nodes import Plain
from ..model.spec import NO_HINT, CallContext, ContractSpec, Dims
from ..reading.type_trees import read_types, type_mismatch
from ..rules.memory import skip_value_checks, without_data
from ..rules.reading import read_rules
from ..source import define
from .transaction import ROLLED_BACK, partial_writes
from .watch import ContractWatch, watcher

_BEARTYPE_CONF = BeartypeConf(is_pep484_tower=True)  # a float parameter accepts an int


def _strip_for_beartype(spec: ContractSpec) -> dict[str, Any]:
    ann: dict[str, Any] = {}
    for name, tp in spec.tensors.items():
        ann[name] = torch.Tensor | None if tp.optional else torch.Tensor
    for name, sp in spec.scalars.items():
        ann[name] = sp.hint
    return ann


class Contract:
    """A compiled contract: its spec, generated checker, and the ways to run it.

    Usually made by :func:`contract`; ``fn.__kda_contract__`` holds it on the decorated function.

    Example::

        c = kc.contract(my_kernel_wrapper).__kda_contract__
        dims = c.validate(*args)         # raises a ContractError listing every violation
    """

    def __init__(self, spec: ContractSpec, fn: Callable[..., Any]) -> None:
        self.spec = spec
        self.fn = fn
        self.name = spec.name
        self._param_names = checked_parameters(spec)
        #: the arguments a call may write (``kc.Spec(mutated=True)``), in signature order
        self.written = tuple(n for n, tp in spec.tensors.items() if tp.spec.mutated)
        src, consts, self.types_in_checker = generate_checker(spec)
        self.checker_source = src
        self.views = ConfigViews(spec)
        namespace: dict[str, Any] = {**consts, checker_names(spec)("views"): self.views}
        #: the generated checker itself; ``_check`` is it behind the eager cache of accepted metadata
        self._check_uncached: Callable[..., tuple[int, ...] | None] = define(
            src, f"<kda_contracts checker for {spec.name}>", "check", namespace)
        self._check: Callable[..., tuple[int, ...] | None] = cached_checker(spec, self._check_uncached, src, consts)
        self.return_source: str | None = None
        self._check_return: Callable[[Any, tuple[int, ...]], bool] | None = None
        if spec.returns is not None:
            self.return_source, rconsts = generate_return_checker(spec)
            self._check_return = define(self.return_source, f"<kda_contracts return checker for {spec.name}>",
                                        "check_return", dict(rconsts))
        #: a return annotation without tensors (``-> int``, ``-> None``): beartype's verdict (for an
        #: op, on what its backend returns, when the op returns that)
        self._check_plain_return: Callable[..., bool] | None = None
        inner = inspect.unwrap(fn)
        made_by_wrapper = inner is not fn and _is_generator(inner) and not _is_generator(fn)
        if spec.returns is None and spec.return_hint is not NO_HINT and not made_by_wrapper:
            # (not for a wrapper such as contextlib.contextmanager's, whose annotations describe the
            # generator it wraps, not what it returns)
            self._check_plain_return = _plain_return_checker(spec.return_hint)
        shim_src = f"def types({', '.join(self._param_names)}):\n    return None\n"
        shim = define(shim_src, f"<kda_contracts type shim for {spec.name}>", "types")
        shim.__annotations__ = _strip_for_beartype(spec)
        shim.__qualname__ = spec.name  # beartype names the shim in its own messages
        self._type_annotations = shim.__annotations__
        # beartype's shim, then every item of a container argument (beartype samples one per call)
        self.check_types: Callable[..., None] = every_item_checker(beartype(conf=_BEARTYPE_CONF)(shim),
                                                                   self._param_names, shim.__annotations__)
        self._provenance: dict[Any, Any] = {}
        # Usage counters (for the pytest plugin's summary): checked calls and rejected calls.
        # Under torch.compile ``calls`` counts traces: each is advanced by code dynamo runs at
        # trace time and never traces or guards on (see modes.counting_mode), so the compiled
        # code's runs do not count (they run no Python; dynamo's guards hold them to the shapes
        # the contract accepted when tracing).
        self.calls = 0
        self.rejections = 0
        # the mode in force, counting a call unless it is off (for entry points like packed_decode)
        self.enter: Callable[[], int] = modes.counting_mode(self)
        self._count = modes.counting_mode(self, modes.CHECK)
        # under torch.compile the types are traced as isinstance tests (type_trees: dynamo cannot trace
        # beartype), and a call they reject is reported at trace time as the contract's own error
        self._type_nodes = {n: Plain(h, read_types(h)) for n, h in self._type_annotations.items()}
        traced_type_check(self.check_types, self._param_names, self._type_nodes,
                          outside_compile(self._types_or_reject))
        self._reject = outside_compile(self._reject_positional)
        self._strict_checks = eager_value_checks(self._strict_positional, self.name)
        for rule in spec.value_rules:  # (an AnnotationError at decoration for a rule naming nothing here)
            rule.check_declaration(self.name, spec.tensors, spec.symbols)
        #: watch mode's step (``value_rules``), None without rules
        self._watch = ContractWatch(self, spec.value_rules, self.written) if spec.value_rules else None

    # -- the slow paths ----------------------------------------------------------------------
    def _bind_values(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        ba = self.spec.signature.bind(*args, **kwargs)
        ba.apply_defaults()
        return dict(ba.arguments)

    def _types_or_reject(self, *vals: Any) -> None:
        """The type check at trace time (every item of a container, as the traced check): a
        violation raises the contract's report, counted."""
        values = dict(zip(self._param_names, vals, strict=True))
        if self.type_violations(values):
            self.fail_types(values)

    def fail_types(self, values: Mapping[str, Any]) -> None:
        """Count and raise the report of a call whose argument types beartype rejected (saving
        the call when ``KDA_CONTRACTS_DUMP_DIR`` asks for it)."""
        self.rejections += 1
        with hooks.rejecting(self, values, self._config_for(values)):
            violations = self.type_violations(values)
            if not violations:  # the type check rejected what the explanation cannot name (not expected)
                violations = [Violation(ArgumentTypeError, "(arguments)", "types that fit the annotations",
                                        "rejected by the type check, which named no argument")]
            raise_violations(self.name, violations, {}, {})

    def type_violations(self, values: Mapping[str, Any]) -> list[Violation]:
        out = []
        for name, node in self._type_nodes.items():
            v = values.get(name)
            mismatch = type_mismatch(name, node, v)
            if mismatch is not None:
                expected, got = mismatch
                if name in self.spec.tensors:
                    expected = f"a torch.Tensor shaped {self.spec.tensors[name].symbolic()}"
                    if self.spec.tensors[name].optional:
                        expected += " or None"
                out.append(Violation(ArgumentTypeError, name, expected, got))
        for name in bool_for_float(self.spec, values):
            if all(o.argument != name for o in out):
                out.append(Violation(ArgumentTypeError, name, "float", f"bool ({values[name]!r})",
                                     hint="a bool is not a number here; pass a float"))
        return out

    def fail(self, values: Mapping[str, Any], config: Any) -> None:
        """Raise the full report for a call the fast path rejected (saved first when
        ``KDA_CONTRACTS_DUMP_DIR`` is set: :mod:`kda_contracts._engine.tools.dumps`)."""
        with hooks.rejecting(self, values, config):
            tv = self.type_violations(values)
            if self.spec.nested and tracing_context():  # (at trace time: nothing to read yet)
                tv += walked_built_in_trace(self.spec, values)
            if tv:
                self.rejections += 1
                raise_violations(self.name, tv, {}, {})
            try:
                dims, prov, violations = explain_call(self.spec, values, config)
            except ContractError:
                raise
            except Exception as exc:  # an object no rule foresaw: still a ContractError, never a crash
                self.rejections += 1
                raise_violations(self.name, [uninspectable(exc)], {}, {})
            if violations:
                self.rejections += 1
                raise_violations(self.name, violations, dims, prov)
        # The generated checker and the interpreter disagree: trust the interpreter, but say so.
        warnings.warn(f"kda_contracts: the fast checker of {self.name} rejected a call the full check accepts; "
                      "please report this with the call's shapes", RuntimeWarning, stacklevel=3)

    def provenance(self, config: Any) -> dict[str, str]:
        key = config is not None
        if key:
            if not _frozen(config):
                return self.spec.provenance(config)
            hit = self._provenance.get(id(config))  # a frozen config says the same every call
            if hit is not None and hit[0]() is config:
                return hit[1]  # type: ignore[no-any-return]
            if len(self._provenance) > 64:
                self._provenance.clear()
            prov = self.spec.provenance(config)
            try:  # weakly: the cache never keeps a config alive
                self._provenance[id(config)] = (weakref.ref(config), prov)
            except TypeError:
                pass
            return prov
        cached = self._provenance.get(key)
        if cached is None:
            cached = self._provenance[key] = self.spec.provenance(None)
        return cached

    # -- public ------------------------------------------------------------------------------
    def validate(self, *args: Any, _config: Any = None, **kwargs: Any) -> Dims:
        """Check a call's arguments (whatever the mode) and return its bound :class:`Dims`."""
        values = self._bind_values(args, kwargs)
        config = _config if _config is not None else self._config_for(values)
        return self.validate_values(values, config)

    def enforce(self, vals: Sequence[Any], config: Any, mode: int = modes.CHECK) -> tuple[int, ...]:
        """Run the checks of ``mode`` on arguments given positionally (every checked parameter, in
        signature order); return the bound dims in ``spec.symbols`` order or raise. Counts a call."""
        self._count()
        return self.run_checks(vals, config, mode)

    def run_checks(self, vals: Sequence[Any], config: Any, mode: int = modes.CHECK) -> tuple[int, ...]:
        """:meth:`enforce` without counting, for a caller that counted with :attr:`enter`.

        Traceable by torch.compile with ``fullgraph=True``: the checker's compares become guards,
        everything else (beartype, the report, strict value checks) runs at trace time only."""
        try:
            if not self.types_in_checker:
                self.check_types(*vals)
            dims = self._check(*vals, config)
        except BeartypeCallHintParamViolation:
            dims = None
        if dims is None:
            dims = self._reject(*vals, config)
        if mode == modes.STRICT and (self.spec.value_checks is not None or self.spec.value_rules):
            self._strict_checks(dims, *vals, config)
        return dims

    def _reject_positional(self, *vals_and_config: Any) -> tuple[int, ...]:
        """Raise the report of a call the fast checker rejected (arguments positionally, then the
        config); returns the dims only if the full check accepts the call after all."""
        config = vals_and_config[-1]
        values = dict(zip(self._param_names, vals_and_config[:-1], strict=True))
        self.fail(values, config)
        env, _, _ = explain_call(self.spec, values, config)
        return tuple(env[s] for s in self.spec.symbols)

    def _strict_positional(self, dims: tuple[int, ...], *vals_and_config: Any) -> dict[str, Any]:
        config = vals_and_config[-1]
        values = dict(zip(self._param_names, vals_and_config[:-1], strict=True))
        return self.run_value_checks(values, config, dict(zip(self.spec.symbols, dims, strict=True)),
                                     self.provenance(config))

    def validate_values(self, values: Mapping[str, Any], config: Any = None, *, strict: bool = False) -> Dims:
        """Check arguments given by name; ``strict`` adds the contract's value checks."""
        vals = tuple(map(values.get, self._param_names))
        dims = self.enforce(vals, config, modes.STRICT if strict else modes.CHECK)
        return Dims(dict(zip(self.spec.symbols, dims, strict=True)), self.provenance(config))

    def run_value_checks(self, values: Mapping[str, Any], config: Any, dims: dict[str, int],
                         prov: dict[str, str]) -> dict[str, Any]:
        """Strict mode: the contract's value rules (one read; their index arguments' host copies
        left in ``memo["host"]``), then its value checks (after a clean metadata check). Returns the
        call's :attr:`CallContext.memo` (what the checks left for the rest of the call's checks)."""
        ctx = CallContext(self.spec, values, config, dims, prov)
        violations = self.value_violations(ctx)
        if violations:
            self.rejections += 1
            with hooks.rejecting(self, values, config, stage="value checks"):
                raise_violations(self.name, violations, dims, prov)
        return ctx.memo

    def value_violations(self, ctx: CallContext) -> list[Violation]:
        """Strict mode's value checks of a call, found without raising: the value rules (one
        read), then, when they pass, ``value_checks=``."""
        found = self._strict_rules(ctx) if self.spec.value_rules else []
        if found or self.spec.value_checks is None:
            return found
        return hook_violations(self.spec.value_checks(ctx), f"{self.name}: value_checks")

    def _strict_rules(self, ctx: CallContext) -> list[Violation]:
        """Strict mode's value rules: one read of every probe; during CUDA-graph capture (no
        read possible) they are captured as watch mode does (read with ``kc.raise_pending()``)."""
        wanted = {a for r in self.spec.value_rules for a in r.args}
        read = {a: ctx.values.get(a) for a in self._param_names if a in wanted}  # (in signature order)
        blind = without_data(read)
        if blind:
            skip_value_checks(self.name, blind)
            return []
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in read.values()) and \
                torch.cuda.is_current_stream_capturing():
            assert self._watch is not None
            self._watch.eager(ctx.values, dict(ctx.dims))
            return []
        for t in read.values():  # (the flag a later capture records into is made now, outside it)
            if isinstance(t, torch.Tensor) and t.is_cuda:
                watcher(t.device)
        violations, ctx.memo["host"] = read_rules(self.spec.value_rules, ctx.values, ctx.dims, host_copies=True,
                                                   name=self.name)
        return violations

    def explain(self, *args: Any, **kwargs: Any) -> tuple[Dims, list[Violation]]:
        """Every violation of a call (empty when it is valid), without raising."""
        values = self._bind_values(args, kwargs)
        tv = self.type_violations(values)
        if tv:
            return Dims({}, {}), tv
        d, prov, violations = explain_call(self.spec, values, self._config_for(values))
        return Dims(d, prov), violations

    def _config_for(self, values: Mapping[str, Any]) -> Any:
        if self.spec.config_arg is not None:
            config = values.get(self.spec.config_arg)
            if config is not None and made_in_trace(config):  # (only while dynamo traces)
                refuse_built_in_trace(self.spec, config)
            return config
        return self.spec.config

    def check(self, *vals: Any, _cfg: Any = None) -> tuple[int, ...] | None:
        """The generated fast checker on arguments given positionally: the bound dims in
        ``spec.symbols`` order, or None when the call breaks the contract (no report)."""
        return self._check(*vals, _cfg)

    def result_checker(self) -> Callable[..., bool] | None:
        """``check(result, dims, *checked arguments) -> bool`` for the return annotation (tensors or
        not), or None when there is nothing to check."""
        return self._check_return or self._check_plain_return

    def check_return(self, result: Any, dims: tuple[int, ...], *vals: Any) -> None:
        """Check a result against the return annotation (generated code), given the call's dims
        and its checked arguments positionally; raise the report."""
        check = self.result_checker()
        if check is not None and not check(result, dims, *vals):
            self.fail_return(result, dims, dict(zip(self._param_names, vals, strict=False)))

    def fail_return(self, result: Any, dims: tuple[int, ...], values: Mapping[str, Any] | None = None, *,
                    rolled_back: bool | None = None) -> None:
        """Raise the full report for a result the generated return checker rejected. The call ran:
        ``rolled_back`` says whether strict mode put back what it wrote (True), or nothing was
        (False: each argument it is declared to write may hold its writes, and the report says so)."""
        env = dict(zip(self.spec.symbols, dims, strict=True))
        violations = explain_return(self.spec, result, env, values)
        note = ROLLED_BACK if rolled_back else partial_writes(self.written) if rolled_back is False else ""
        if note:
            violations = [dataclasses.replace(v, details=(*v.details, note)) for v in violations]
        if violations:
            self.rejections += 1  # (a rejected result is a rejected call, as a rejected argument is)
            raise_violations(self.name, violations, env, self.provenance(None))
        warnings.warn(f"kda_contracts: the fast return checker of {self.name} rejected a result the full check "
                      "accepts; please report this with the result's shapes", RuntimeWarning, stacklevel=3)


def _is_generator(fn: Any) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def _plain_return_checker(hint: Any) -> Callable[[Any, tuple[int, ...]], bool]:
    """``check_return`` for a return annotation without tensors: ``res is None`` for ``-> None``;
    for a hint types alone decide, the isinstance tree of :func:`~kda_contracts._engine.reading.type_trees.read_types`
    (beartype's verdict, which torch.compile traces: a symbolic size returned as ``-> int`` is not
    specialised); else beartype's ``is_bearable`` on the result (at trace time under torch.compile)."""
    if hint is NoneType:
        return lambda res, dims, *args: res is None
    tree = read_types(hint)  # isinstance tests that give beartype's verdict, traced by dynamo (None: more decides)
    if tree is None:  # beartype, at trace time on the result alone (a Literal, a Protocol, a Callable ...)
        bearable = mark_constant_result(lambda res: is_bearable(res, hint, conf=_BEARTYPE_CONF))
        return lambda res, dims, *args: bearable(res)
    return lambda res, dims, *args: tree.match(res, {}, "return") is None


def _frozen(config: Any) -> bool:
    """A pydantic model declared frozen (its fields, and so the provenance it gives, never change)."""
    model_config = getattr(type(config), "model_config", None)
    return isinstance(model_config, dict) and model_config.get("frozen") is True
