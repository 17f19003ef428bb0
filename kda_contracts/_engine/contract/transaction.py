"""Strict mode's transaction: one object, used by contracted functions (plain, generators,
async), and by ops. Before the call it copies exactly what the call may write, values *and*
metadata (sizes, strides, storage offset, the storage itself); when the call is rejected, raises
or is interrupted, :meth:`Transaction.rollback` puts every saved tensor back as it was. Check
mode copies nothing (zero-copy): a call that fails there may leave its outputs partly written,
and the error says which.

What a call writes is declared: every argument marked ``kc.Spec(mutated=True)``, whole, unless an
op gives ``written=ctx -> {arg: None | rows}`` (rows: an index tensor along dim 0, e.g. the pool
slots a decode step updates), so a state pool of gigabytes is never copied, only its used slots.
``written=`` is also asked during CUDA-graph capture (for the aliasing check): it must not sync
then (name only what it writes whole).

Example::

    tx = Transaction.begin(values, {"out": None, "pool": used_slots})
    try:
        run()
    except BaseException:
        tx.rollback()          # every written element, and each tensor's shape and strides, as before
        raise
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import AnnotationError
from ..model.spec import CallContext

ROLLED_BACK = "strict mode rolled the call back: every tensor the call writes is as it was before the call"


def partial_writes(names: Iterable[str]) -> str:
    """The line a check-mode report adds when a call failed after it may have written: which
    arguments may hold partial writes (check mode keeps no copy to roll back)."""
    listed = ", ".join(sorted(names))
    return (f"check mode keeps no copy: {listed} may hold partial writes (strict mode rolls such a call back)"
            if listed else "")


def storage_id(t: torch.Tensor) -> int | None:
    """Which storage ``t`` views, by identity (meta and fake tensors too, whose addresses are all 0);
    None for a tensor with none (sparse, nested)."""
    if t.layout is not torch.strided or t.is_nested:
        return None
    try:
        return int(t.untyped_storage()._cdata)
    except (NotImplementedError, RuntimeError):
        return None


#: what a rejected strict-mode op call says of its rollback
RESTORED = "strict mode restored every tensor the op declares it writes"


def undeclared_hint(names: list[str]) -> str:
    """What strict mode says of arguments a call wrote though the op does not declare it writes them."""
    return (f"{RESTORED}; {', '.join(names)}, not declared, has no copy and keeps what the backend wrote (mark it "
            "kc.Spec(mutated=True) if the op writes it)")


@dataclass(frozen=True)
class Saved:
    """One tensor as it was: its storage, offset, sizes and strides, and a copy of its values
    (``rows``: only those rows along dim 0, the rest is not written)."""

    tensor: torch.Tensor
    rows: torch.Tensor | None
    copy: torch.Tensor
    storage: Any  # the untyped storage it viewed (a ``set_()`` or ``resize_`` may swap it)
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor, rows: torch.Tensor | None) -> Saved:
        with torch.no_grad():  # a copy, not a step of autograd (autograd=True ops write such tensors)
            if rows is None:
                copy = t.clone()
            else:
                # host rows: an asynchronous copy (from pageable memory the driver stages it at
                # once, so nothing waits for the device)
                rows = rows.to(device=t.device, dtype=torch.long, non_blocking=True)
                copy = t.index_select(0, rows)
        return cls(t, rows, copy, t.untyped_storage(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))

    def put_back(self) -> None:
        t = self.tensor
        if (tuple(t.shape), tuple(t.stride()), t.storage_offset()) != (self.size, self.stride, self.offset) or \
                t.untyped_storage().data_ptr() != self.storage.data_ptr():
            t.set_(self.storage, self.offset, self.size, self.stride)  # (a .t_(), resize_() or set_() in the call)
        if self.rows is None:
            t.copy_(self.copy)
        else:
            t.index_copy_(0, self.rows, self.copy)


def _no_data(t: torch.Tensor) -> bool:
    """A tensor whose values cannot be copied now: meta, fake, or on a stream being captured."""
    return t.is_meta or type(t).__name__ == "FakeTensor" or (t.is_cuda and torch.cuda.is_current_stream_capturing())


class Transaction:
    """What a strict-mode call may write, saved before it runs (see the module docstring)."""

    __slots__ = ("others", "saved")

    def __init__(self, saved: list[Saved], others: tuple[tuple[str, torch.Tensor, int], ...] = ()) -> None:
        self.saved = saved
        #: the call's other tensor arguments (not declared written) with their version counters
        self.others = others

    def __bool__(self) -> bool:
        return bool(self.saved)

    @classmethod
    def begin(cls, values: Mapping[str, Any], parts: Mapping[str, torch.Tensor | None]) -> Transaction | None:
        """Save ``parts`` (``{arg: None (whole) | rows}``) of the call's ``values``; None when
        nothing can be copied (fake or meta tensors, CUDA-graph capture: the call then runs as
        in check mode, and nothing can be rolled back)."""
        if any(isinstance(v, torch.Tensor) and _no_data(v) for v in values.values()):
            return None
        # (a view of a written tensor's storage shares its version counter: a write of the declared
        # tensor moves it, so such a view is left out)
        written = {storage_id(t) for name in parts if isinstance(t := values.get(name), torch.Tensor)} - {None}
        others = tuple((name, v, v._version) for name, v in values.items()
                       if name not in parts and isinstance(v, torch.Tensor) and not v.is_inference()
                       and storage_id(v) not in written)
        return cls([Saved.of(t, rows) for name, rows in parts.items()
                    if isinstance(t := values.get(name), torch.Tensor)], others)

    def undeclared(self) -> list[str]:
        """The arguments the call is not declared to write that it wrote in place through torch (their
        version counters moved; a write through a raw pointer, a Triton kernel's, moves none; one in
        the storage of a declared tensor is not told apart). They have no copy: a rollback cannot
        restore them."""
        return [name for name, t, version in self.others if t._version != version]

    def rollback(self) -> None:
        """Put every saved tensor back, values and metadata (bit for bit). One that cannot be put
        back is reported in a RuntimeWarning, never in place of the call's own error."""
        with torch.no_grad():  # a leaf that requires grad (autograd=True) may be written back too
            for s in self.saved:
                try:
                    s.put_back()
                except RuntimeError as exc:
                    warnings.warn(f"kda_contracts: strict mode could not roll a {s.size} tensor back: {exc}",
                                  RuntimeWarning, stacklevel=2)


def rollback(tx: Transaction | None) -> None:
    """:meth:`Transaction.rollback`, for a transaction that may not have begun (None)."""
    if tx is not None:
        tx.rollback()


def written_parts(written: Callable[[CallContext], Mapping[str, Any]] | None, who: str, ctx: CallContext
                  ) -> Mapping[str, Any]:
    """What a call writes: ``{arg: None (all) | rows}``, from ``written=`` (an op's) or, without
    it, every argument marked ``kc.Spec(mutated=True)``, whole."""
    mutated = [n for n, tp in ctx.spec.tensors.items() if tp.spec.mutated]
    if written is None:
        return dict.fromkeys(mutated)
    parts = dict(written(ctx))
    unknown = set(parts) - set(mutated)
    if unknown:
        raise AnnotationError(f"{who}: written= names {', '.join(sorted(unknown))}, not marked "
                              "kc.Spec(mutated=True)")
    return parts


def guarded(run: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """``run(...)`` (a contracted function, or its body runner) called as ``guarded(tx, ...)``:
    whatever propagates out of the call (a ``kc.check`` in the body, a contracted function it
    calls, the function's own error, a KeyboardInterrupt) rolls ``tx`` back first. ``kind``:
    ``"function"``, ``"async"`` (a coroutine function), ``"generator"`` or ``"async generator"``:
    a generator is guarded while it runs, from its first step to its last (closing it early is
    not a failure and rolls nothing back)."""
    if kind == "async":
        async def guarded_async(tx: Transaction, *args: Any, **kwargs: Any) -> Any:
            try:
                return await run(*args, **kwargs)
            except BaseException:
                tx.rollback()
                raise

        return guarded_async
    if kind == "generator":
        return lambda tx, *args, **kwargs: _generator_guarded(run(*args, **kwargs), tx)
    if kind == "async generator":
        return lambda tx, *args, **kwargs: _async_generator_guarded(run(*args, **kwargs), tx)

    def guarded_call(tx: Transaction, *args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except BaseException:
            tx.rollback()
            raise

    return guarded_call


def _generator_guarded(gen: Generator[Any, Any, Any], tx: Transaction) -> Generator[Any, Any, Any]:
    try:
        return (yield from gen)  # (send, throw and close reach the generator as they would)
    except GeneratorExit:
        raise
    except BaseException:
        tx.rollback()
        raise


async def _async_generator_guarded(agen: AsyncGenerator[Any, Any], tx: Transaction) -> AsyncGenerator[Any, Any]:
    sent: Any = None
    thrown: BaseException | None = None
    try:
        while True:
            try:
                item = await (agen.athrow(thrown) if thrown is not None else agen.asend(sent))
            except StopAsyncIteration:
                return
            thrown = None
            try:
                sent = yield item
            except GeneratorExit:
                await agen.aclose()
                raise
            except BaseException as exc:  # thrown in by the caller: on to the generator
                thrown = exc
    except GeneratorExit:
        raise
    except BaseException:
        tx.rollback()
        raise
