"""Which bytes a tensor's elements cover, decided exactly: do two tensors share memory
(:func:`overlap`), do a tensor's own elements share memory (:func:`self_overlap`), which
arguments of a call a write would clobber (:func:`alias_violations`, strict mode's aliasing check
for any op), and a view of a tensor without its broadcast (stride-0) repeats
(:func:`distinct_elements`, so value checks cost what the tensor occupies, not its logical size).

Addresses are absolute (``data_ptr()`` plus each element's offset times its size), so two
tensors over the same memory through different storages (``torch.from_numpy``,
``torch.from_dlpack``, a storage rebuilt from a pointer) are seen as the same memory; and the
answer is exact for any strided layout: rows interleaved with another tensor's rows do not
overlap it, and any shared byte is found.

How: a tensor is reduced to *runs* (its innermost dense dims merged into one run of bytes) at
start addresses ``base + sum(i_k * stride_k)``. Disjoint byte ranges are rejected at once. When a
layout is *nested* (each stride at least the extent of the dims inside it — every layout made by
slicing, transposing and narrowing a dense tensor), the run that starts last at or before any
address is found by arithmetic, so the other tensor's runs are tested against it chunk by chunk
in bounded memory. Other layouts (``as_strided`` interleavings and self-overlaps) are reduced to
their sorted, merged runs, built incrementally: memory grows with the distinct runs, never with
the logical size.

Example::

    >>> import torch
    >>> x = torch.zeros(4, 6)
    >>> overlap(x[:, ::2], x[:, 1::2]), overlap(x[:, ::2], x[1:, 2])
    (False, True)
    >>> self_overlap(torch.zeros(1, 3).expand(2, 3)), distinct_elements(torch.zeros(1, 3).expand(2, 3)).shape
    (True, torch.Size([1, 3]))
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

CHUNK = 1 << 17  # runs enumerated per step: bounds the memory of every test (a few MiB)
FINITE_CHUNK = 1 << 24  # elements all_finite checks at once (a 16 MiB mask)
_I64 = torch.int64


class NoAddressError(ValueError):
    """The tensor has no memory addresses (a meta tensor, a FakeTensor, a sparse or nested
    tensor, a subclass without storage), so which bytes it covers cannot be decided.

    Example::

        overlap(torch.empty(3, device="meta"), x)   # raises NoAddressError
    """


class ValueChecksSkipped(UserWarning):
    """Strict mode's value checks were skipped for a call whose tensors hold no data (meta or
    fake tensors: under ``FakeTensorMode``, ``torch.compile`` tracing, shape propagation); only
    the metadata checks ran.

    Example::

        warnings.simplefilter("error", ValueChecksSkipped)   # make a skipped check fail a test
    """


def has_addresses(t: Tensor) -> bool:
    """Whether ``t``'s elements live at memory addresses that can be compared (a strided tensor
    with storage; not meta, not fake).

    Example::

        >>> has_addresses(torch.zeros(2)), has_addresses(torch.zeros(2, device="meta"))
        (True, False)
    """
    if t.is_meta or t.layout != torch.strided or t.is_nested:
        return False
    if type(t) is not Tensor or torch._is_functional_tensor(t) or torch._C._functorch.is_functorch_wrapped_tensor(t):
        # a plain tensor is never fake; a subclass or a functional/functorch wrapper (of a fake) may be
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(t):
            return False
    try:
        t.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # a subclass without storage
        return False
    return True


def without_data(values: Mapping[str, Any]) -> list[str]:
    """The names of the tensors in ``values`` that hold no data (see :func:`has_addresses`).

    Example::

        >>> without_data({"x": torch.zeros(2), "y": torch.zeros(2, device="meta"), "n": 3})
        ['y']
    """
    return [n for n, v in values.items() if isinstance(v, Tensor) and not has_addresses(v)]


def skip_value_checks(function: str, names: Iterable[str]) -> None:
    """Warn (:class:`ValueChecksSkipped`) that ``function``'s strict value checks were skipped
    because the tensors ``names`` hold no data. The message is pinned by tests.

    Example::

        if without_data(values):
            skip_value_checks("my_op", without_data(values)); return []
    """
    warnings.warn(f"kda_contracts: {function}: strict mode's value checks skipped: no data in {', '.join(names)} "
                  "(meta or fake tensors, e.g. under FakeTensorMode); only the metadata checks ran",
                  ValueChecksSkipped, stacklevel=3)


def distinct_elements(t: Tensor) -> Tensor:
    """A view of ``t`` with every broadcast (stride-0) dim narrowed to size 1: every value of
    ``t`` is in it, and a value check over it costs what ``t`` occupies, not its logical size.
    For checks of *whether* some or all elements pass (finite, in range, the max); not for
    counts. Works on meta and fake tensors (it is a view).

    Example::

        >>> distinct_elements(torch.zeros(1, 4096).expand(2 ** 20, 4096)).shape
        torch.Size([1, 4096])
    """
    if t.layout != torch.strided:
        return t
    repeated = [st == 0 and s > 1 for s, st in zip(t.shape, t.stride(), strict=True)]
    if not any(repeated):
        return t
    return t[tuple(slice(0, 1) if r else slice(None) for r in repeated)]


def finite_flag(t: Tensor) -> Tensor:
    """A 0-dim bool tensor on ``t``'s device: whether every value of ``t`` is finite. No sync (read
    it, or stack several and read them at once); each broadcast value read once
    (:func:`distinct_elements`) and a bounded number of rows at a time, as :func:`all_finite`.

    Example::

        >>> finite_flag(torch.tensor([1.0, float("inf")]))
        tensor(False)
    """
    v = distinct_elements(t)
    if v.numel() <= FINITE_CHUNK or v.dim() == 0:
        return torch.isfinite(v).all()
    step = max(1, FINITE_CHUNK // max(1, v[0].numel()))
    return torch.stack([torch.isfinite(v[i:i + step]).all() for i in range(0, v.shape[0], step)]).all()


def all_finite(t: Tensor) -> bool:
    """Whether every value of ``t`` is finite, reading each broadcast value once
    (:func:`distinct_elements`) and, for a tensor of many rows, a bounded number of rows at a
    time (so a layout whose rows overlap allocates no more than a chunk). One sync.

    Example::

        >>> all_finite(torch.zeros(1, 4096, dtype=torch.bfloat16).expand(2 ** 20, 4096))
        True
    """
    return bool(finite_flag(t))


# -- the bytes a tensor covers ----------------------------------------------------------------------
ByteDims = tuple[tuple[int, int], ...]  # (size, byte stride) per dim


@dataclass(frozen=True)
class Region:
    """The bytes some elements of a strided tensor cover: runs of ``run`` bytes starting at
    ``b + sum(i_k * stride_k)`` for each ``b`` in ``bases`` and ``0 <= i_k < size_k``.

    ``dims`` holds ``(size, byte stride)``, strides positive and descending, sizes > 1 (stride-0
    and size-1 dims dropped: they add no byte). ``bases`` is sorted (one per written row, or the
    tensor's lowest address). ``nested``: every stride is at least the extent of the dims inside it
    and the bases are that far apart, so runs are disjoint and ordered like their indices."""

    device: torch.device
    bases: Tensor  # int64, sorted, on the CPU
    dims: ByteDims
    run: int
    nested: bool

    @property
    def count(self) -> int:
        """How many runs."""
        return self.bases.numel() * math.prod(s for s, _ in self.dims)

    @property
    def extent(self) -> int:
        """Bytes from a base to the end of its last run."""
        return self.run + sum((s - 1) * st for s, st in self.dims)

    def bounds(self) -> tuple[int, int]:
        """``[lo, hi)``: the bytes from the first to the end of the last run."""
        return int(self.bases[0]), int(self.bases[-1]) + self.extent

    def starts(self, lo: int, hi: int) -> Tensor:
        """Start addresses of runs ``lo`` to ``hi`` (ascending, for a nested region)."""
        flat = torch.arange(lo, hi, dtype=_I64)
        per = math.prod(s for s, _ in self.dims)
        addr = self.bases[flat // per] if self.bases.numel() > 1 else self.bases.expand(hi - lo).clone()
        rem = flat % per
        for size, stride in reversed(self.dims):
            addr += (rem % size) * stride
            rem //= size
        return addr

    def hits(self, first: Tensor, last: Tensor) -> Tensor:
        """Nested regions only: whether each byte range ``[first, last]`` meets a run. The run
        starting last at or before ``last`` is found digit by digit (the greatest index whose
        start fits); the range meets some run iff that run ends after ``first``."""
        i = torch.searchsorted(self.bases, last, right=True) - 1
        found = i >= 0
        start = self.bases[i.clamp(min=0)]
        rem = last - start
        for size, stride in self.dims:
            k = (rem // stride).clamp(0, size - 1)
            start = start + k * stride
            rem = rem - k * stride
        return found & (start + self.run > first)


def _dims_of(shape: Iterable[int], strides: Iterable[int], itemsize: int) -> tuple[int, ByteDims, int]:
    """``(shift, dims, run)``: the byte dims of a strided layout, sorted by stride, its dense inner
    dims merged into one run of bytes; ``shift`` moves the base to the lowest address when a
    stride is negative."""
    shift, dims = 0, []
    for size, stride in zip(shape, strides, strict=True):
        if size > 1 and stride != 0:
            if stride < 0:
                shift += (size - 1) * stride * itemsize
                stride = -stride
            dims.append((size, stride * itemsize))
    dims.sort(key=lambda d: d[1], reverse=True)
    run = itemsize
    while dims and dims[-1][1] == run:  # a dim dense with what is inside it extends the run
        run *= dims.pop()[0]
    merged: list[tuple[int, int]] = []
    for size, stride in reversed(dims):  # inner to outer: fold a dim that is dense over the next
        if merged and stride == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, stride))
    return shift, tuple(reversed(merged)), run


def _is_nested(dims: ByteDims, run: int) -> bool:
    inner = run
    for size, stride in reversed(dims):
        if stride < inner:
            return False
        inner += (size - 1) * stride
    return True


def region(t: Tensor, rows: Tensor | None = None) -> Region | None:
    """The bytes ``t``'s elements cover (``rows``: only those rows of dim 0; indices outside
    ``[0, t.shape[0])`` are ignored, repeats count once). None when they cover no byte.

    Example::

        >>> region(torch.zeros(4, 6)[:, :3]).dims
        ((4, 24),)
    """
    if t.numel() == 0:  # covers no byte, with or without addresses
        return None
    if not has_addresses(t):
        raise NoAddressError(f"a {'meta' if t.is_meta else type(t).__name__} tensor has no memory addresses")
    itemsize = t.element_size()
    shape, strides = list(t.shape), list(t.stride())
    if rows is None:
        shift, dims, run = _dims_of(shape, strides, itemsize)
        bases = torch.tensor([t.data_ptr() + shift], dtype=_I64)
        return Region(t.device, bases, dims, run, _is_nested(dims, run))
    if t.dim() == 0:
        raise ValueError("rows= needs a tensor of at least one dim")
    r = torch.unique(rows.detach().reshape(-1).to(device="cpu", dtype=_I64))
    r = r[(r >= 0) & (r < shape[0])]
    if r.numel() == 0:
        return None
    shift, dims, run = _dims_of(shape[1:], strides[1:], itemsize)
    bases = torch.sort(t.data_ptr() + shift + r * (strides[0] * itemsize)).values
    extent = run + sum((s - 1) * st for s, st in dims)
    apart = bases.numel() == 1 or int((bases[1:] - bases[:-1]).min()) >= extent
    return Region(t.device, bases, dims, run, apart and _is_nested(dims, run))


# -- deciding overlap -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Runs:
    """Sorted, disjoint byte ranges ``[starts[i], ends[i])``: a region that is not nested."""

    starts: Tensor
    ends: Tensor

    def hits(self, first: Tensor, last: Tensor) -> Tensor:
        i = torch.searchsorted(self.starts, last, right=True) - 1
        return (i >= 0) & (self.ends[i.clamp(min=0)] > first)


def _union(starts: Tensor, ends: Tensor) -> _Runs:
    order = torch.argsort(starts)
    s, e = starts[order], ends[order]
    reach = torch.cummax(e, 0).values
    new = torch.ones_like(s, dtype=torch.bool)
    new[1:] = s[1:] > reach[:-1]
    first = torch.nonzero(new).reshape(-1)
    last = torch.cat([first[1:] - 1, first.new_tensor([s.numel() - 1])])
    return _Runs(s[first], reach[last])


def _merged_runs(r: Region) -> _Runs:
    """``r``'s runs, sorted and merged, built chunk by chunk (each chunk at least as large as
    what is merged so far): memory grows with the distinct runs, work with ``r.count``."""
    acc = _Runs(torch.empty(0, dtype=_I64), torch.empty(0, dtype=_I64))
    lo = 0
    while lo < r.count:
        hi = min(r.count, lo + max(CHUNK, acc.starts.numel()))
        s = r.starts(lo, hi)
        acc = _union(torch.cat([acc.starts, s]), torch.cat([acc.ends, s + r.run]))
        lo = hi
    return acc


def _any_hit(probe: Region, target: Region | _Runs) -> bool:
    for lo in range(0, probe.count, CHUNK):
        s = probe.starts(lo, min(probe.count, lo + CHUNK))
        if bool(target.hits(s, s + (probe.run - 1)).any()):
            return True
    return False


def regions_overlap(p: Region | None, q: Region | None) -> bool:
    """Whether two regions share a byte (see :func:`overlap`)."""
    if p is None or q is None or p.device != q.device:
        return False
    (p0, p1), (q0, q1) = p.bounds(), q.bounds()
    if p1 <= q0 or q1 <= p0:
        return False
    small, big = (p, q) if p.count <= q.count else (q, p)
    for probe, target in ((small, big), (big, small)):
        if target.nested:  # bounded memory: the probe's runs, a chunk at a time
            return _any_hit(probe, target)
    return _any_hit(big, _merged_runs(small))


def overlap(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` share any byte of an element, by absolute address: exact for
    every strided layout, across storages (numpy and DLPack views of the same memory count);
    tensors on different devices, or empty ones, never overlap. Raises :class:`NoAddressError`
    for a tensor without addresses (meta, fake).

    Example::

        >>> buf = torch.zeros(3, 10)
        >>> overlap(buf[:, :6], buf[0, 6:].view(2, 2)), overlap(buf[:, :6], buf[1, 4:8])
        (False, True)
    """
    return regions_overlap(region(a), region(b))


def self_overlap(t: Tensor, rows: Tensor | None = None) -> bool:
    """Whether two elements of ``t`` (of its rows ``rows``, if given: indices along dim 0,
    outside ones ignored, repeats counted once) share a byte: an expanded or ``as_strided``
    tensor that must not be written in place. Exact; raises :class:`NoAddressError` like
    :func:`overlap`.

    Example::

        >>> x = torch.zeros(10)
        >>> self_overlap(x.as_strided((3, 4), (3, 1))), self_overlap(x.as_strided((3, 3), (3, 1)))
        (True, False)
    """
    r = region(t, rows)
    if r is None:
        return False
    inner = t.shape[1:] if rows is not None else t.shape
    inner_strides = t.stride()[1:] if rows is not None else t.stride()
    if any(st == 0 and s > 1 for s, st in zip(inner, inner_strides, strict=True)):
        return True
    if r.count <= 1 or r.nested:
        return False
    m = _merged_runs(r)
    return int((m.ends - m.starts).sum()) < r.count * r.run


# -- strict mode's aliasing check, for any op -------------------------------------------------------


