"""Enforcement modes: ``off``, ``check`` (the default), ``strict`` and ``watch``.

The mode in force is, in order: the innermost ``with kc.mode(...)`` of the current thread or
asyncio task (a :class:`contextvars.ContextVar`, so threads and tasks do not leak into each
other), else the process default, which starts as ``$KDA_CONTRACTS_MODE`` (empty or unset:
``check``) and can be changed with :func:`set_default_mode`.

A ``$KDA_CONTRACTS_MODE`` that names no mode does not break ``import kda_contracts`` (the pytest
plugin is imported in every pytest session of the environment); instead the first read of the
process default (a contracted call, :func:`get_mode`, ``@kc.contract`` without ``mode=``) raises
an AnnotationError naming the variable and the allowed values, until :func:`set_default_mode` picks one.

- ``off``: nothing is checked. A contract decorated while the mode is ``off`` returns the
  original function object; a contract called while ``off`` costs one mode read.
- ``check``: shapes, dtypes, devices, strides and scalar ranges; never reads tensor values, so it
  never syncs the device.
- ``strict``: ``check`` plus value checks that need tensor contents (index range, duplicate
  slots, aliasing, finiteness).
- ``watch``: ``check`` plus the contract's declared value rules (``value_rules=``), evaluated on
  the tensors' device without a host sync (CUDA: folded into a per-device flag, reported at a
  later call, at ``kc.raise_pending()`` or when a ``with kc.mode("watch")`` block exits; CPU:
  synchronously, before the function runs). No snapshot, no rollback.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import warnings
from collections.abc import Callable, Generator
from contextvars import ContextVar, Token
from typing import Any, Literal, TypeVar

from .compile.marks import mark_constant_result
from .errors import AnnotationError
from .source import define, precompiled

ModeName = Literal["off", "check", "strict", "watch"]
# (generated code tests ``mode == 2`` for strict, ``mode == 3`` for watch, truthiness for the checks)
OFF, CHECK, STRICT, WATCH = 0, 1, 2, 3
ENV_VAR = "KDA_CONTRACTS_MODE"
_BY_NAME: dict[str, int] = {"off": OFF, "check": CHECK, "strict": STRICT, "watch": WATCH}
_NAMES = {v: k for k, v in _BY_NAME.items()}

F = TypeVar("F", bound=Callable[..., object])
#: run when a ``with kc.mode("watch")`` block exits without an exception (the watch machinery,
#: which stands above this module, registers ``raise_pending`` here)
ON_WATCH_EXIT: list[Callable[[], None]] = []


def parse_mode(name: str, origin: str = "mode") -> int:
    """The mode number of ``"off"``/``"check"``/``"strict"``/``"watch"``; AnnotationError naming ``origin``
    otherwise."""
    try:
        return _BY_NAME[name.strip().lower()]
    except (KeyError, AttributeError):
        raise AnnotationError(f"{origin}: unknown mode {name!r}; "
                         "expected one of 'off', 'check', 'strict', 'watch'") from None


def default_from_environment(raw: str | None) -> tuple[int | None, str]:
    """The process default a ``$KDA_CONTRACTS_MODE`` of ``raw`` asks for, as ``(mode, "")``, or
    ``(None, why)`` when it names no mode. Empty (or blank) means unset: ``check``.

    Example::

        >>> default_from_environment(" Strict ")
        (2, '')
    """
    if raw is None or not raw.strip():
        return CHECK, ""
    try:
        return parse_mode(raw, ENV_VAR), ""
    except AnnotationError as err:
        return None, (f"{err} (empty or unset means 'check'). Set it to one of those or unset it, or choose the "
                      "mode in code with kc.set_default_mode(...) or `with kc.mode(...)`")


# The process default: a mode number, or None while $KDA_CONTRACTS_MODE names no mode (the
# first read raises _default_problem, so a typo is never silently some other mode).
_default, _default_problem = default_from_environment(os.environ.get(ENV_VAR))
# The mode of the innermost `with kc.mode(...)` / `@kc.mode` here (unset or None: the process default).
_local: ContextVar[int | None] = ContextVar("kda_contracts_mode", default=None)
# The tokens that restore `_local` for the `with kc.mode(...)` blocks still open here, as a linked
# list (innermost token, the rest or None). Kept per context rather than on the mode object, so
# one object can be entered by many threads and tasks at once.
_Opened = tuple[Token[int | None], Any]
_outer: ContextVar[_Opened | None] = ContextVar("kda_contracts_mode_outer", default=None)


class _Mirror:
    """The mode in force where it was last set, as a plain attribute: what code compiled with
    torch.compile is guarded on (dynamo cannot read a ContextVar, but it guards on a global
    object's attribute), so a graph traced in one mode is never reused in another."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


MIRROR = _Mirror()
_GUARDED_READ = precompiled("""
def guarded():
    _kc_at_trace()  # (run at trace time: counts the call, makes the mirror the mode in force here)
    return _kc_mirror.value  # what compiled code is guarded on
""", "<kda_contracts mode read, as dynamo traces it>")


def guarded_on_mode(read: Callable[[], int]) -> Callable[[], int]:
    """``read`` (a mode read: :func:`current_mode`, a contract's counting read) made a
    constant-result function whose traced stand-in returns :data:`MIRROR`'s value, so dynamo
    guards compiled code on the mode: a graph traced under ``kc.mode("off")`` is traced again,
    checks and all, when the same function is called in ``check`` mode. Eager calls run ``read``."""
    def at_trace() -> int:
        m = read()
        MIRROR.value = m
        if not _TRACED:
            _TRACED.append(True)
        return m

    fn = mark_constant_result(read, at_trace=at_trace)
    ns = {"_kc_at_trace": fn._torchdynamo_inline, "_kc_mirror": MIRROR}  # type: ignore[attr-defined]
    fn._torchdynamo_inline = define(_GUARDED_READ, "", "guarded", ns)  # type: ignore[attr-defined]
    return fn


def _sync() -> None:
    """Keep :data:`MIRROR` the mode in force here (after any change of it)."""
    m = _local.get()
    MIRROR.value = (_default if m is None else m) or 0


# which threads and asyncio tasks have `with kc.mode(...)` blocks open, and the innermost one's mode
_OPEN: dict[tuple[int, int], list[int]] = {}
_OPEN_LOCK = threading.Lock()
_WARNED: list[bool] = []
_TRACED: list[bool] = []  # a mode read was traced by torch.compile in this process (see guarded_on_mode)


def _owner() -> tuple[int, int]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        task = None
    return threading.get_ident(), id(task)


def _opened(value: int) -> None:
    """Note an open block; warn once when blocks of different modes are open in several threads or
    tasks at once (compiled code is guarded on the mode set last in the process, see MIRROR)."""
    me = _owner()
    with _OPEN_LOCK:
        others = {stack[-1] for owner, stack in _OPEN.items() if stack and owner != me}
        _OPEN.setdefault(me, []).append(value)
    if others - {value} and _TRACED and not _WARNED:
        _WARNED.append(True)
        warnings.warn("kc.mode: different modes are in force in several threads or asyncio tasks at once; code "
                      "compiled with torch.compile is guarded on the mode set last in the process, so a compiled "
                      "function may run in another thread's mode. Pin the mode of such functions "
                      "(kc.contract(mode=...), kc.op(mode=...)) or keep one mode while they run",
                      RuntimeWarning, stacklevel=3)


def _closed() -> None:
    me = _owner()
    with _OPEN_LOCK:
        stack = _OPEN.get(me)
        if stack:
            stack.pop()
            if not stack:
                del _OPEN[me]


def current_mode() -> int:
    """The mode number in force here (0 off, 1 check, 2 strict, 3 watch). The hot path's one flag read.

    Under torch.compile the mode is read once, when the function is traced (dynamo cannot trace
    a ContextVar); a compiled function keeps the mode it was compiled in.
    """
    m = _local.get()
    return _default if m is None else m  # type: ignore[return-value]  # never None: see below


def _current_mode_or_explain() -> int:
    """:func:`current_mode` in a process whose ``$KDA_CONTRACTS_MODE`` names no mode: reading
    the default raises the explanation until :func:`set_default_mode` chooses one."""
    m = _local.get()
    if m is None:
        if _default is None:
            raise AnnotationError(_default_problem)
        return _default
    return m


# Only such a process pays for the check (here and in counting_mode); elsewhere the default is
# never None (replace_default refuses it).
if _default_problem:
    current_mode = _current_mode_or_explain


# let dynamo evaluate the mode at trace time instead of tracing ContextVar.get, and guard on it
current_mode = guarded_on_mode(current_mode)
_sync()


def counting_mode(counter: Any, fixed: int | None = None) -> Callable[[], int]:
    """A per-contract :func:`current_mode` (or ``fixed``, a pinned mode) that also advances
    ``counter.calls`` whenever the mode is not ``off``: a contract's mode read and call count in
    one call, so counting costs no extra call on the eager hot path.

    Under torch.compile it is read like :func:`current_mode` (once, when the function is
    traced; dynamo neither traces nor guards on it), so ``calls`` counts traces there: one per
    compiled shape class, never one per run of the compiled code. Keep in step with
    :func:`current_mode`.

    Example::

        enter = counting_mode(contract)
        if enter():           # the mode, and contract.calls += 1 unless it is off
            ...
    """
    if fixed is not None:
        pinned = fixed

        def enter_pinned() -> int:
            counter.calls += 1
            return pinned

        return mark_constant_result(enter_pinned)
    local = _local
    if _default_problem:  # $KDA_CONTRACTS_MODE names no mode: read the default through a check
        def enter_or_explain() -> int:
            m = local.get()
            if m is None:
                if _default is None:
                    raise AnnotationError(_default_problem)
                m = _default
            if m:
                counter.calls += 1
            return m

        return guarded_on_mode(enter_or_explain)

    def enter() -> int:
        m = local.get()
        if m is None:
            m = _default
        if m:
            counter.calls += 1
        return m  # type: ignore[return-value]  # never None: see current_mode

    return guarded_on_mode(enter)


def get_mode() -> ModeName:
    """The name of the mode in force here.

    Example::

        >>> with kc.mode("strict"):
        ...     kc.get_mode()
        'strict'
    """
    return _NAMES[current_mode()]  # type: ignore[return-value]


def set_default_mode(name: ModeName) -> None:
    """Set the process-wide default (what applies outside any ``with kc.mode(...)``).

    Example::

        kc.set_default_mode("off")     # e.g. in a benchmark's setup
    """
    global _default
    _default = parse_mode(name)
    _sync()


def replace_default(value: int | None) -> int | None:
    """Set the process default to a mode number, or back to None (what a ``$KDA_CONTRACTS_MODE``
    naming no mode leaves); return the previous one. For save/restore (the pytest plugin).

    Example::

        previous = replace_default(STRICT)
        ...
        replace_default(previous)
    """
    global _default
    if value is None and not _default_problem:
        raise ValueError("replace_default(None): only a process whose $KDA_CONTRACTS_MODE names no mode has none")
    previous, _default = _default, value
    _sync()
    return previous


class mode:
    """Set the enforcement mode for a block or a function: ``with kc.mode("strict"): ...`` or
    ``@kc.mode("off")``. Local to the current thread / asyncio task; nests. One object can be
    entered by any number of threads and tasks at once, and re-entered.

    On an async function, a generator function or an async generator function the mode holds
    while the body runs, at every resumption, and the caller's mode is restored whenever the
    body is suspended (at an ``await`` that suspends, at a ``yield``).

    Example::

        with kc.mode("strict"):
            kc.packed_decode(...)     # also checks index range and duplicate slots

        @kc.mode("off")
        async def serve(request): ...
    """

    __slots__ = ("value",)

    def __init__(self, name: ModeName) -> None:
        self.value = parse_mode(name)

    def __repr__(self) -> str:
        return f"kc.mode({_NAMES[self.value]!r})"

    def __enter__(self) -> mode:
        _outer.set((_local.set(self.value), _outer.get()))
        MIRROR.value = self.value
        _opened(self.value)
        return self

    def __exit__(self, *exc: object) -> None:
        outer = _outer.get()
        if outer is None:
            raise RuntimeError(f"{self!r}: exited without a matching enter in this thread / task (a with-block "
                               "around a yield, resumed elsewhere? decorate the generator with @kc.mode instead)")
        token, rest = outer
        _outer.set(rest)
        try:
            _local.reset(token)
        except ValueError:  # entered in another context: a with-block across a yield, resumed elsewhere
            old = token.old_value
            _local.set(None if old is Token.MISSING else old)
        _sync()
        _closed()
        if self.value == WATCH and exc[0] is None:  # a violation still pending is raised here
            for hook in ON_WATCH_EXIT:
                hook()

    def __call__(self, fn: F) -> F:
        if not callable(fn) or inspect.isclass(fn):  # (a class would become a function of its constructor)
            raise AnnotationError(f"@{self!r} takes a function (a coroutine or generator function too), got "
                                  f"{fn!r}: for a class, decorate its methods, or use `with {self!r}:`")
        if inspect.isasyncgenfunction(fn):
            wrapper = _async_generator_in_mode(fn, self.value)
        elif inspect.iscoroutinefunction(fn):
            wrapper = _coroutine_in_mode(fn, self.value)
        elif inspect.isgeneratorfunction(fn):
            wrapper = _generator_in_mode(fn, self.value)
        else:
            wrapper = _function_in_mode(fn, self.value)
        return functools.wraps(fn)(wrapper)  # type: ignore[return-value]


def _function_in_mode(fn: Callable[..., Any], value: int) -> Callable[..., Any]:
    def run_in_mode(*args: Any, **kwargs: Any) -> Any:
        token = _local.set(value)
        MIRROR.value = value
        try:
            return fn(*args, **kwargs)
        finally:
            _local.reset(token)
            _sync()

    return run_in_mode


class _Suspended:
    """The mode state of one decorated generator or coroutine body between its resumptions: the
    mode it runs in (its own ``with kc.mode`` blocks spanning a ``yield`` included) and what those
    blocks restore. Swapped in for each step of the body and back out after it."""

    __slots__ = ("mode", "outer")

    def __init__(self, value: int) -> None:
        self.mode: int | None = value
        self.outer: _Opened | None = None

    def resume(self) -> tuple[Token[int | None], Token[_Opened | None]]:
        tokens = _local.set(self.mode), _outer.set(self.outer)
        _sync()
        return tokens

    def suspend(self, tokens: tuple[Token[int | None], Token[_Opened | None]]) -> None:
        self.mode, self.outer = _local.get(), _outer.get()
        _outer.reset(tokens[1])
        _local.reset(tokens[0])
        _sync()


def _steps(it: Any, body: _Suspended) -> Generator[Any, Any, Any]:
    """``yield from it`` (PEP 380: send, throw, close, the return value), with ``body``'s mode in
    force while ``it`` runs and the caller's back in force whenever ``it`` is suspended."""
    send: Any = None
    thrown: BaseException | None = None
    while True:
        tokens = body.resume()
        try:
            item = it.send(send) if thrown is None else it.throw(thrown)
        except StopIteration as stop:
            return stop.value
        finally:
            body.suspend(tokens)
        thrown = None
        try:
            send = yield item
        except GeneratorExit:
            tokens = body.resume()
            try:
                it.close()
            finally:
                body.suspend(tokens)
            raise
        except BaseException as exc:
            send, thrown = None, exc


class _Awaiting:
    """Awaits a step iterator (``await _Awaiting(_steps(coro, body))``)."""

    __slots__ = ("steps",)

    def __init__(self, steps: Generator[Any, Any, Any]) -> None:
        self.steps = steps

    def __await__(self) -> Generator[Any, Any, Any]:
        return self.steps


def _generator_in_mode(fn: Callable[..., Any], value: int) -> Callable[..., Any]:
    def run_in_mode(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        return (yield from _steps(fn(*args, **kwargs), _Suspended(value)))

    return run_in_mode


def _coroutine_in_mode(fn: Callable[..., Any], value: int) -> Callable[..., Any]:
    async def run_in_mode(*args: Any, **kwargs: Any) -> Any:
        return await _Awaiting(_steps(fn(*args, **kwargs), _Suspended(value)))

    return run_in_mode


def _async_generator_in_mode(fn: Callable[..., Any], value: int) -> Callable[..., Any]:
    # `async for` over the body, one asend/athrow/aclose at a time, each stepped by _steps.
    async def run_in_mode(*args: Any, **kwargs: Any) -> Any:
        agen, body = fn(*args, **kwargs), _Suspended(value)
        send: Any = None
        thrown: BaseException | None = None
        while True:
            step = agen.asend(send) if thrown is None else agen.athrow(thrown)
            thrown = None
            try:
                item = await _Awaiting(_steps(step, body))
            except StopAsyncIteration:
                return
            try:
                send = yield item
            except GeneratorExit:
                await _Awaiting(_steps(agen.aclose(), body))
                raise
            except BaseException as exc:
                send, thrown = None, exc

    return run_in_mode
