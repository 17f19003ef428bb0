"""Strict mode's aliasing check, for any contract or op: what a call writes shares no byte with
another of its tensors (:func:`alias_violations`), the tensors inside containers included
(:func:`tensor_leaves`). Exact, by address (:mod:`.memory`).

Example::

    found = alias_violations(tensor_leaves(values), ["out"], function="acc")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from torch import Tensor

from ..errors import LayoutError, ValueRangeError, Violation
from .memory import has_addresses, region, regions_overlap, self_overlap, skip_value_checks, without_data


def _written_map(written: Mapping[str, Tensor | None] | Iterable[str]) -> dict[str, Tensor | None]:
    if isinstance(written, Mapping):
        return dict(written)
    return dict.fromkeys(written)


def _pair_violation(m: str, rows: Tensor | None, x: str) -> Violation:
    if rows is None:
        return Violation(ValueRangeError, m, f"memory of its own ({m} is written: no byte shared with {x})",
                         f"overlaps {x}",
                         hint=f"allocate {m} separately from {x} (a view, a numpy array or a DLPack capsule of "
                              "the same memory is the same memory)")
    return Violation(ValueRangeError, m, f"memory of its own where it is written (no byte shared with {x})",
                     f"the rows this call writes overlap {x}",
                     hint=f"{x} shares memory with rows of {m} that the call overwrites: pass a copy of {x}, "
                          f"or keep it out of the rows the call writes")


def _self_violation(m: str, rows: Tensor | None) -> Violation:
    what = "the rows this call writes share memory" if rows is not None else "elements that share memory"
    return Violation(LayoutError, m, "elements that share no byte (it is written in place)",
                     f"{what} (an expand()ed or as_strided layout)",
                     hint=f"write into a tensor with memory of its own ({m}.clone() or torch.empty_like({m}))")


def alias_violations(values: Mapping[str, Any], written: Mapping[str, Tensor | None] | Iterable[str], *,
                     function: str = "strict checks") -> list[Violation]:
    """Strict mode's aliasing check for any op: every argument the call writes must share no
    byte with any other tensor argument (whatever the storage: views, numpy, DLPack), and its
    written elements none with each other. Exact (:func:`overlap`); reads no tensor values but
    the rows.

    ``values``: the call's arguments by name (non-tensors are ignored). ``written``: the names of
    the arguments the call writes (``kc.Spec(mutated=True)``), or a mapping from each to the rows
    of dim 0 it writes (a 1-D integer tensor; negative and out-of-range entries are ignored, as
    padding) or None (all of it). With rows, another argument may overlap the rows the call does
    not write (it reads them as they are); the written argument's own write must still miss every
    other argument entirely (it would change that argument's contents).

    Returns one :class:`~kda_contracts.Violation` per overlapping pair (named after the written
    argument; ValueRangeError) and per self-overlapping written argument (LayoutError), in the
    order of ``written`` then ``values``. Tensors without data (meta, fake) are left out, with a
    :class:`ValueChecksSkipped` warning naming them and ``function``.

    Example::

        >>> x = torch.zeros(4, 8)
        >>> [v.got for v in alias_violations({"x": x[:, :4], "out": x[:, 4:]}, ["out"])]
        []
        >>> [v.got for v in alias_violations({"x": x, "out": x[1]}, ["out"])]
        ['overlaps x']
        >>> pool, idx = torch.zeros(8, 4), torch.tensor([1, 5, -1])
        >>> [v.got for v in alias_violations({"pool": pool, "v": pool[2], "idx": idx}, {"pool": idx})]
        []
    """
    wmap = _written_map(written)
    for m, rows in wmap.items():
        if rows is not None and not isinstance(rows, Tensor):
            raise TypeError(f"the rows written of {m} must be a tensor of indices, got {type(rows).__name__}")
    tensors = {n: v for n, v in values.items() if isinstance(v, Tensor)}
    blind = without_data({**tensors, **{f"{n}'s written rows": r for n, r in wmap.items() if r is not None}})
    if blind:
        skip_value_checks(function, blind)
    addressed = {n: t for n, t in tensors.items() if has_addresses(t)}
    if _apart(addressed, wmap):
        return []
    whole = {n: region(t) for n, t in addressed.items()}
    writes = {m: region(tensors[m], rows) if rows is not None else whole[m] for m, rows in wmap.items()
              if m in whole and (rows is None or has_addresses(rows))}
    order = list(writes)
    out: list[Violation] = []
    for m in order:
        if self_overlap(tensors[m], wmap[m]):
            out.append(_self_violation(m, wmap[m]))
        for x in whole:
            if x == m or (x in writes and order.index(x) < order.index(m)):
                continue  # a pair of written arguments is judged once
            # Both ways when both are written; a whole write is named first (its fix is its own).
            ways = sorted([(m, x)] + ([(x, m)] if x in writes else []), key=lambda p: wmap[p[0]] is not None)
            hit = next(((w, o) for w, o in ways if regions_overlap(writes[w], whole[o])), None)
            if hit is not None:
                out.append(_pair_violation(hit[0], wmap[hit[0]], hit[1]))
    return out


def _span(t: Tensor, rows: range | None = None) -> tuple[int, int] | None:
    """``[lo, hi)``: the bytes from ``t``'s lowest to its highest element (of rows ``rows`` of dim
    0, if given), from its metadata alone; None when it has no element."""
    if t.numel() == 0 or (rows is not None and not rows):
        return None
    size = t.element_size()
    lo = hi = t.data_ptr()
    for k, (n, st) in enumerate(zip(t.shape, t.stride(), strict=True)):
        first, last = (rows[0], rows[-1]) if rows is not None and k == 0 else (0, n - 1)
        a, b = first * st * size, last * st * size
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi + size


def _non_overlapping(t: Tensor) -> bool:
    """Whether no two elements of ``t`` can share a byte, by a sufficient test on its strides:
    sorted by stride, each (of a dim of size > 1) is at least the extent of the dims inside it."""
    extent = 1
    for n, st in sorted((d for d in zip(t.shape, t.stride(), strict=True) if d[0] > 1), key=lambda d: abs(d[1])):
        if abs(st) < extent:
            return False
        extent += (n - 1) * abs(st)
    return True


def _apart(tensors: Mapping[str, Tensor], wmap: Mapping[str, Tensor | None]) -> bool:
    """A sufficient condition for :func:`alias_violations` to find nothing, decided from metadata
    (no region is built): each written argument is laid out without overlap (nested strides)
    and the bytes from its lowest to its highest written element miss every other argument's
    span. Rows must be on the host (their bounds are read); otherwise False (the exact path
    decides)."""
    spans = {n: _span(t) for n, t in tensors.items()}
    for m, rows in wmap.items():
        t = tensors.get(m)
        if t is None:
            continue
        if not _non_overlapping(t):
            return False
        if rows is None:
            span = spans[m]
        else:
            if rows.device.type != "cpu" or rows.dtype.is_floating_point or rows.dtype.is_complex or t.dim() == 0:
                return False
            live = rows[(rows >= 0) & (rows < t.shape[0])] if rows.numel() else rows
            span = _span(t, range(int(live.min()), int(live.max()) + 1)) if live.numel() else None
        if span is None:
            continue
        for x, other in spans.items():
            if x != m and other is not None and other[0] < span[1] and span[0] < other[1]:
                return False
    return True


def tensor_leaves(values: Mapping[str, Any], depth: int = 4) -> dict[str, Tensor]:
    """Every tensor of a call by the path a report names it with: the arguments, and the tensors
    inside their lists, tuples, dicts, dataclasses, NamedTuples and pydantic models (``xs[0]``,
    ``cache['k']``, ``layer.weight``), ``depth`` levels down. The aliasing check judges them all:
    a tensor the call writes may not share memory with one inside a container either.

    Example::

        >>> buf = torch.zeros(3)
        >>> list(tensor_leaves({"xs": [buf], "out": buf}))
        ['xs[0]', 'out']
    """
    out: dict[str, Tensor] = {}

    def visit(path: str, v: Any, left: int) -> None:
        if isinstance(v, Tensor):
            out[path] = v
        elif left <= 0 or isinstance(v, (str, bytes)):
            return
        elif isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            for i, item in enumerate(v):
                visit(f"{path}[{i}]", item, left - 1)
        elif isinstance(v, Mapping):
            for k, item in v.items():
                visit(f"{path}[{k!r}]", item, left - 1)
        else:
            for name in _field_names(v):
                visit(f"{path}.{name}", getattr(v, name, None), left - 1)

    for name, value in values.items():
        visit(name, value, depth)
    return out


def _field_names(v: Any) -> tuple[str, ...]:
    """The fields of a dataclass instance, NamedTuple or pydantic model (else none)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return tuple(f.name for f in dataclasses.fields(v))
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return tuple(v._fields)
    fields = getattr(type(v), "model_fields", None)
    return tuple(fields) if isinstance(fields, Mapping) else ()
