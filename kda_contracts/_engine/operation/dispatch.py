"""The generated ``__call__`` of an op: read the mode, run the contract's generated checker (as
the ``@kc.contract`` wrapper does), look the backend up by a key of what the backends declare
(device type, the dtypes some backend restricts, the optional arguments some backend cares
about, the variant, the dims when some backend has ``where=``), run it, and in strict mode run
the op's ``after`` checks. Regenerated whenever the op's backends change.

Example::

    cls.__call__ = build_dispatcher(op)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from beartype.roar import BeartypeCallHintParamViolation

from .. import modes
from ..codegen.check_cache import CachedDims, compared_arguments
from ..codegen.checker import checked_parameters
from ..codegen.snippets import Names
from ..codegen.wrapper import formal_parameters
from ..compile.marks import mark_constant_result, outside_compile
from ..contract.transaction import partial_writes
from ..errors import AnnotationError, ContractError, Violation, raise_violations
from ..source import define
from .backends import BackendError, CallInfo, signature_problem
from .protocol import OpParts
from .strict import kept_in_arguments, lost_result_violation
from .table import BackendTable, Chosen


@dataclass(frozen=True)
class KeyLayout:
    """What the selection key holds, in order: the backend asked for, the device type, the
    dtypes of ``dtype_args``, whether each of ``absent_args`` is None, the variant, the dims
    (or None when no backend has ``where=``)."""

    symbols: dict[str | None, tuple[str, ...]]  # per variant
    dtype_args: tuple[str, ...]
    absent_args: tuple[str, ...]
    with_dims: bool

    def info(self, key: tuple[Any, ...]) -> CallInfo:
        i = 2
        dtypes = {n: d for n, d in zip(self.dtype_args, key[i:i + len(self.dtype_args)], strict=True) if d is not None}
        i += len(self.dtype_args)
        absent = frozenset(n for n, a in zip(self.absent_args, key[i:i + len(self.absent_args)], strict=True) if a)
        variant, dims = key[-2], key[-1]
        return CallInfo(device_type="cuda" if key[1] is True else key[1], dtypes=dtypes, absent=absent, variant=variant,
                        dims={} if dims is None else dict(zip(self.symbols[variant], dims, strict=True)))


def key_layout(o: OpParts) -> KeyLayout:
    backends = o.table.registry.values()
    tensors = o.contract.spec.tensors
    dtype_args: list[str] = []
    absent: list[str] = []
    for b in backends:
        d_args, a_args = b.key_args(o.table.floating)
        dtype_args += [n for n in d_args if n not in dtype_args]
        absent += [n for n in a_args if n not in absent]
    unknown = [n for n in dtype_args if n not in tensors]
    if unknown:  # never silent: a dtype restriction on something not a plain tensor argument
        raise TypeError(f"{o.name}: backend dtypes= name {', '.join(unknown)}, not tensor arguments of the op")
    return KeyLayout({v: c.spec.symbols for v, c in o.contracts.items()}, tuple(dtype_args), tuple(absent),
                     any(b._constraints for b in backends))


def _device_of(*vals: Any) -> str:
    return next((v.device.type for v in vals if isinstance(v, torch.Tensor)), "cpu")


def build_dispatcher(o: OpParts) -> Any:
    """The op's ``__call__`` (source generated for its signature and backends)."""
    layout = key_layout(o)
    o._key_layout = layout
    c = o.contract
    spec = c.spec
    n = Names([*o.signature.parameters, o.name if o.name.isidentifier() else "op"])
    parts, call = formal_parameters(o.signature, n, (f"backend={n('default_backend')}",))
    plain_list = checked_parameters(spec)
    plain = ", ".join(plain_list)
    sep = ", " if plain else ""
    cfg = spec.config_arg if spec.config_arg is not None else n("static_cfg")
    fixed = modes.parse_mode(o.options.mode, f"op(mode={o.options.mode!r})") if o.options.mode else None
    ns: dict[str, Any] = {
        n("default_backend"): "auto",
        n("static_cfg"): spec.config,
        n("select"): make_select(o),
        n("devof"): _device_of,
        n("offdims"): o._dims_off,
    }
    for i, p in enumerate(o.signature.parameters.values()):
        if p.default is not inspect.Parameter.empty:
            ns[n("default", i)] = p.default
    mode, dims, res, v, chosen = n("mode"), n("dims"), n("res"), n("v"), n("b")
    lines = [f"def __call__({n('self')}, {', '.join(parts)}):" if parts else f"def __call__({n('self')}):"]
    lines += _check_lines(o, n, ns, fixed, plain, sep, cfg)
    checked_select, by_key = _select_lines(o, layout, n, ns, v, dims)
    lines += [f"        {line}" for line in checked_select]
    if _off_dims_needed(o, layout) and o.unchecked_dims is not None:
        ns[n("unchecked")] = o.unchecked_dims
        lines += ["    else:", f"        {dims} = {n('unchecked')}({v}{sep}{plain})"]
    elif _off_dims_needed(o, layout):
        lines += ["    else:", f"        {dims} = {n('offdims')}({v}{sep}{plain}, {cfg})"]
    else:
        lines += ["    else:", f"        {dims} = None"]
    lines.append(f"        {by_key}")  # (mode off: by key; its dims, if any, are read without the cache's help)
    lines += _run_lines(o, n, ns, call, plain, cfg)
    if o.returns is None and not o.returns_none and any(vc.result_checker() is not None for vc in o.contracts.values()):
        # check and watch mode here, and strict mode in compiled code (where its transaction runs the backend
        # alone); eager strict mode checks the result inside its transaction (rolled back)
        ns[n("check_returns")] = {k: vc.result_checker() or _any_result for k, vc in o.contracts.items()}
        ns[n("compiling")] = torch.compiler.is_compiling
        ns[n("fail_return")] = outside_compile(
            lambda vk, r, *vc: o.contracts[vk].fail_return(r, o.contracts[vk]._check(*vc) or (),
                                                           dict(zip(o.contracts[vk]._param_names, vc, strict=False)),
                                                           rolled_back=False))
        lines += [f"    if ({mode} == 1 or {mode} == 3 or {mode} == 2 and {n('compiling')}()) and "
                  f"not {n('check_returns')}[{v}]({res}, {dims}{sep}{plain}):",
                  f"        {n('fail_return')}({v}, {res}{sep}{plain}, {cfg})"]
    if o.returns_none:  # an in-place kernel may return its outputs; anything else would be lost
        ns[n("kept")], ns[n("lost")] = kept_in_arguments, outside_compile(functools.partial(lost_result, o))
        ns[n("compiling")] = torch.compiler.is_compiling
        lines += [f"    if {res} is not None and {mode} and {mode} != 2 and not {n('compiling')}() and "
                  f"not {n('kept')}({res}, ({plain}{',' if plain else ''})):",
                  f"        {n('lost')}({chosen}.name, {res})"]
    lines.append(f"    return {'None' if o.returns_none else _returns_source(o.returns, res)}")
    src = "\n".join(lines) + "\n"
    fn = define(src, f"<kda_contracts op {o.name}>", "__call__", ns)
    fn.__qualname__ = o.name  # (Python's own arity errors name the op: "scale_rows() missing 1 required ...")
    fn.__kda_source__ = src
    return fn


def _check_lines(o: OpParts, n: Names, ns: dict[str, Any], fixed: int | None, plain: str, sep: str,
                 cfg: str) -> list[str]:
    """The mode read and the checks: each contract's generated checker inlined (per variant, the
    checker of the call's variant), the beartype shim first for hints the checker cannot decide,
    strict mode's value checks, watch mode's step."""
    c = o.contract
    mode, dims, v = n("mode"), n("dims"), n("v")
    lines: list[str] = []
    if o.variant_of is not None:
        ns[n("variant")] = o.variant_of
        ns[n("contracts")] = o.contracts
        cs = o.contracts
        ns.update({
            # each variant's mode read (counting its contract's calls) and generated checker, in one lookup
            n("entries"): {k: (modes.counting_mode(vc, fixed), vc._check) for k, vc in cs.items()},
            n("rejects"): {k: vc._reject for k, vc in cs.items()},
            n("stricts"): {k: vc._strict_checks for k, vc in cs.items()},
            n("types"): {k: vc.check_types for k, vc in cs.items()},  # (marked in Contract.__init__)
            n("TypeViolation"): BeartypeCallHintParamViolation,
        })
        ns[n("badv")] = outside_compile(o._bad_variant)
        ns[n("vfailed")] = outside_compile(functools.partial(o._hook_failed, "variant", o._variant_expected))
        ns[n("unhashable")] = functools.partial(_unhashable_variant, ns[n("badv")])
        ns[n("own_errors")] = (ContractError, AnnotationError)
        assert o._variant_raw is not None  # (variant_of is its guarded form)
        ns[n("variant")] = o._variant_raw
        # variant= called here, in the dispatcher's own guard (no wrapper frame): an exception it raises
        # (other than a ContractError or AnnotationError of its own) is the op's BackendError for a hook
        # that raised; a result that cannot be a variant's key (unhashable: layout=["BDL"]) names no variant
        lines += ["    try:", f"        {v} = {n('variant')}({', '.join(o._variant_params)})",
                  f"    except {n('own_errors')}:", "        raise", f"    except Exception as {n('exc')}:",
                  f"        {n('vfailed')}({n('exc')})", "        raise  # (unreachable: it raised)",
                  "    try:", f"        {n('entry')} = {n('entries')}.get({v})", "    except TypeError:",
                  f"        {n('unhashable')}({v})", "        raise", f"    if {n('entry')} is None:",
                  f"        {n('badv')}({v})", f"    {n('enter')}, {n('check')} = {n('entry')}",
                  f"    {mode} = {n('enter')}()", f"    if {mode}:"]
        if not all(vc.types_in_checker for vc in cs.values()):  # hints the checker cannot decide
            lines += ["        try:", f"            {n('types')}[{v}]({plain})",
                      f"        except {n('TypeViolation')}:", f"            {n('rejects')}[{v}]({plain}{sep}{cfg})"]
        # each variant's generated checker, inlined as for a single contract (no run_checks frame)
        lines += [f"        {dims} = {n('check')}({plain}{sep}{cfg})", f"        if {dims} is None:",
                  f"            {dims} = {n('rejects')}[{v}]({plain}{sep}{cfg})"]
        if any(_strict_values(vc) for vc in cs.values()):
            lines += [f"        if {mode} == 2:",
                      f"            {n('memo')} = {n('stricts')}[{v}]({dims}, {plain}{sep}{cfg})"]
        if any(vc._watch is not None for vc in cs.values()):
            ns[n("watches")] = {k: vc._watch.deferred if vc._watch else _no_watch for k, vc in cs.items()}
            lines += [f"        if {mode} == 3:", f"            {n('wp')} = {n('watches')}[{v}]({dims}{sep}{plain})"]
    else:
        ns.update({
            n("enter"): modes.counting_mode(c, fixed),
            n("types"): c.check_types,  # (marked in Contract.__init__)
            n("TypeViolation"): BeartypeCallHintParamViolation,
            n("check"): c._check,
            n("reject"): c._reject,
            n("strict"): c._strict_checks,
        })
        lines += [f"    {v} = None", f"    {mode} = {n('enter')}()", f"    if {mode}:"]
        if not c.types_in_checker:
            lines += ["        try:", f"            {n('types')}({plain})", f"        except {n('TypeViolation')}:",
                      f"            {n('reject')}({plain}{sep}{cfg})"]
        lines += [f"        {dims} = {n('check')}({plain}{sep}{cfg})",
                  f"        if {dims} is None:", f"            {dims} = {n('reject')}({plain}{sep}{cfg})"]
        if _strict_values(c):
            lines += [f"        if {mode} == 2:", f"            {n('memo')} = {n('strict')}({dims}, {plain}{sep}{cfg})"]
        if c._watch is not None:
            ns[n("watch")] = c._watch.deferred
            lines += [f"        if {mode} == 3:", f"            {n('wp')} = {n('watch')}({dims}{sep}{plain})"]
    return lines


def _run_lines(o: OpParts, n: Names, ns: dict[str, Any], call: list[str], plain: str, cfg: str) -> list[str]:
    """Run the chosen backend: in strict mode inside a transaction (snapshot, run, after-checks,
    rollback); otherwise directly, a backend's own exception becoming a BackendError."""
    mode, dims, res, v, chosen = n("mode"), n("dims"), n("res"), n("v"), n("b")
    # what strict mode's value checks left for the rest of the call's checks (CallContext.memo)
    memo = n("memo") if any(_strict_values(vc) for vc in o.contracts.values()) else "None"
    direct = f"{chosen}.run({', '.join(call)})"
    extras = f"{chosen}.run({dims}, {v}{', ' if call else ''}{', '.join(call)})"
    # watch mode: the step's pending check kernel goes to the backend's kernel, when it checks the
    # rules itself (its watched runner), or is launched before the backend runs
    wp = n("wp")
    own = n("own")
    watched = (f"{chosen}.watched({own}, {dims}, {v}{', ' if call else ''}{', '.join(call)})"
               if any(vc._watch is not None for vc in o.contracts.values()) else None)
    ns.update({n("transact"): o._transact, n("ContractError"): ContractError, n("failed"): outside_compile(o._failed)})
    # strict mode: snapshot what the op writes, run, check after, roll back on failure (eager only)
    # (no closure here: a lambda over the arguments would turn every one into a cell, on every call)
    pos = [a for a in call if "=" not in a and not a.startswith("**")]
    kws = [f"{a.split('=')[0]!r}: {a.split('=')[0]}" for a in call if "=" in a] + \
        [a for a in call if a.startswith("**")]
    return [f"    if {mode} == 2:",
            f"        {res} = {n('transact')}({chosen}, {dims}, {v}, ({plain}{',' if plain else ''}), {cfg}, "
            f"({', '.join(pos)}{',' if pos else ''}), {{{', '.join(kws)}}}, {memo})",
            "    else:", "        try:",
            *([f"            if {mode} == 3 and {wp} is not None and "
               f"({own} := {wp}.hand({chosen}.watched)) is not None:",
               f"                {res} = {watched}", f"            elif {chosen}.direct:"] if watched else
              [f"            if {chosen}.direct:"]),
            f"                {res} = {direct}", "            else:",
            f"                {res} = {extras}",
            f"        except {n('ContractError')}:", "            raise",
            f"        except Exception as {n('exc')}:",
            f"            {n('failed')}({chosen}.name, {n('exc')}, ({plain}{',' if plain else ''}), {cfg}, {v})"]


def _unhashable_variant(bad: Callable[[Any], Any], key: Any) -> None:
    """A ``variant=`` result the variants' lookup refused as unhashable (``layout=["BDL"]``): refused
    as naming no variant (``bad``), as a ContractError; under torch.compile, and for a str (every key of
    ``variants=`` is one), the lookup's TypeError goes on."""
    if isinstance(key, str) or torch.compiler.is_compiling():
        return
    try:
        hash(key)
    except TypeError:
        bad(key)


def lost_result(o: OpParts, backend: str, res: Any) -> None:
    """A ``-> None`` op whose backend returned a result of its own, in check mode: refused."""
    raise_violations(o.name, [lost_result_violation(o, backend, res, partial_writes(o.contract.written)
                                                    or "the op writes no tensor in place")], {}, {})


def _any_result(result: Any, dims: Any, *args: Any) -> bool:
    return True


def _no_watch(dims: Any, *args: Any) -> None:
    """The watch step of a variant that declares no value rules."""


def _strict_values(c: Any) -> bool:
    """Whether strict mode reads values before the backend: value checks or value rules."""
    return c.spec.value_checks is not None or bool(c.spec.value_rules)


def _off_dims_needed(o: OpParts, layout: KeyLayout) -> bool:
    """Whether mode ``off`` must still read the dims: some backend's support or kernel needs them."""
    if layout.with_dims:
        return True
    for b in o.table.registry.values():
        if not callable(b.kernel) or "dims" in signature_problem(b.kernel, o.table.params)[1]:
            return True
        if getattr(b, "wants_dims", False):
            return True
    return False


def _select_lines(o: OpParts, layout: KeyLayout, n: Names, ns: dict[str, Any], v: str,
                  dims: str) -> tuple[list[str], str]:
    """``(lines, by_key)``: how a checked call chooses its backend, and the ``select`` line (cached
    by the selection key). For a call the check cache answered (its dims a CachedDims), the op's last
    choice first, when it was made for the same dims object and backend= (no key built: the entry
    fixes every argument the key reads). Under torch.compile the checker is traced and returns a
    plain tuple, so only ``select`` is traced."""
    chosen, key = n("b"), _key_source(o, layout, n, v, dims)
    by_key = f"{chosen} = {n('select')}(({key}), backend)"
    if not _last_choice_applies(o, layout):
        return [by_key], by_key
    ns.update({n("type"): type, n("Cached"): CachedDims, n("last"): o.table.last,
               n("note"): remembering(o.table, ns[n("select")])})
    m = n("m")
    return [f"if {n('type')}({dims}) is {n('Cached')}:", f"    {m} = {n('last')}[0]",
            f"    if {dims} is {m}[0] and backend is {m}[1]:", f"        {chosen} = {m}[2]", "    else:",
            f"        {chosen} = {n('note')}({dims}, backend, ({key}))", "else:", f"    {by_key}"], by_key


def _last_choice_applies(o: OpParts, layout: KeyLayout) -> bool:
    """Whether the dims object of a call the check cache answered fixes the call's selection key:
    every variant's cache compares each argument the key reads (the device's, the dtypes', those
    whose None-ness counts)."""
    dev_arg = _device_arg(o)
    reads = {dev_arg, *layout.dtype_args, *layout.absent_args}
    return dev_arg is not None and all(reads <= compared_arguments(c._check) for c in o.contracts.values())


def _device_arg(o: OpParts) -> str | None:
    """The argument whose device type the selection key reads: the first tensor that cannot be None."""
    return next((t for t, tp in o.contract.spec.tensors.items() if not tp.optional), None)


def _key_source(o: OpParts, layout: KeyLayout, n: Names, v: str, dims: str) -> str:
    tensors = o.contract.spec.tensors
    dev_arg = _device_arg(o)
    params = [p.name for p in o.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    # the device type, read cheaply (t.device.type builds a torch.device, ~0.3 µs): True for CUDA
    dev = (f"({dev_arg}.is_cuda or {dev_arg}.is_cpu and 'cpu' or {dev_arg}.device.type)"
           if dev_arg is not None else f"{n('devof')}({', '.join(params)})")
    parts = ["backend", dev]
    for a in layout.dtype_args:
        parts.append(f"{a}.dtype" if not tensors[a].optional else f"({a}.dtype if {a} is not None else None)")
    parts += [f"{a} is None" for a in layout.absent_args]
    parts += [v, dims if layout.with_dims else "None"]
    return ", ".join(parts)


def _returns_source(returns: str | Sequence[str] | None, res: str) -> str:
    if returns is None:
        return res
    if isinstance(returns, str):
        return returns
    return "(" + ", ".join(returns) + ("," if len(returns) == 1 else "") + ")"


def bootstrap(o: OpParts) -> Callable[..., Any]:
    """An op's ``__call__`` until its first call: load the plug-ins (their backends change what a
    selection key must hold), generate the real dispatcher, and call it. Under torch.compile the
    preparation runs at trace time, untraced."""

    built: list[bool] = []

    def prepare() -> None:  # once per bootstrap: a rebuilt dispatcher would fail compiled code's guards
        if not built:
            o.table.load_plugins()
            o._dispatch = build_dispatcher(o)
            built.append(True)

    prepared = mark_constant_result(prepare)

    def first_call(self: OpParts, *args: Any, **kwargs: Any) -> Any:
        prepared()
        dispatch = o._dispatch
        if not torch.compiler.is_compiling():  # from now on, the dispatcher itself (eager)
            type(self).__call__ = dispatch  # type: ignore[method-assign, assignment]
        return dispatch(self, *args, **kwargs)  # type: ignore[misc]

    return first_call


def make_select(o: OpParts) -> Callable[[tuple[Any, ...], str], Chosen]:
    """``select(key, backend)``: the cached choice of backend. Under torch.compile the choice is
    made once, at trace time, without the (possibly symbolic) dims; a backend whose support
    depends on the dims is then refused rather than judged on the traced sizes."""
    table = o.table
    layout = o._key_layout

    def info_of(key: tuple[Any, ...]) -> CallInfo:
        return layout.info(key)

    lookup = table.selected.get  # the cache is cleared in place, never replaced

    def miss(key: tuple[Any, ...], backend: str) -> Chosen:
        return table.select_cached(key, backend, lambda: info_of(key))

    def select(key: tuple[Any, ...], backend: str) -> Chosen:
        try:
            hit = lookup(key)  # (no closure over key here: that would make it a cell on every call)
        except TypeError:  # an unhashable backend= (or key part): chosen, refused with the reason, not cached
            b = table.choose(backend, info_of(key))
            return Chosen.of(b.name, table.runner(b), b.name in table.direct)
        return hit if hit is not None else miss(key, backend)

    def static(key: tuple[Any, ...], backend: str) -> str:  # (the key without its dims)
        info = info_of((*key, None))
        b = table.choose(backend, info, dims_free=backend == "auto")
        if b._constraints:
            raise_violations(o.name, [Violation(
                BackendError, "backend", "a backend whose support does not depend on the dims, under torch.compile",
                f"{b.name!r}, which needs {', '.join(b.where)}",
                hint=f"call {o.name} outside the compiled region, or pass a backend= without where= constraints")],
                {}, {})
        table.runner(b)
        return b.name

    static_outside = outside_compile(static)

    def traced(key: tuple[Any, ...], backend: str) -> Chosen:
        name = static_outside(key[:-1], backend)  # the dims (maybe symbolic) would be specialised
        return Chosen.of(name, table.runners[name], name in table.direct)

    select._torchdynamo_inline = traced  # type: ignore[attr-defined]
    return select


def remembering(table: BackendTable, select: Callable[[tuple[Any, ...], str], Chosen]) -> Callable[..., Chosen]:
    """``note(dims, backend, key)``: ``select(key, backend)``, kept as the op's last choice
    (``table.last``) for a call whose dims (a CachedDims) fix its key. Eager only."""
    last = table.last

    def note(dims: Any, backend: str, key: tuple[Any, ...]) -> Chosen:
        chosen = select(key, backend)
        last[0] = (dims, backend, chosen)
        return chosen

    return note
