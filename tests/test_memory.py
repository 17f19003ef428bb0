"""kda_contracts._engine.rules.memory: which bytes tensors cover, decided exactly, across storages, in bounded
memory. The property tests compare against brute force: the set of byte addresses of every
element."""

from __future__ import annotations

import doctest
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kda_contracts as kc
from kda_contracts._engine.rules import memory
from kda_contracts._engine.rules.aliasing import alias_violations
from kda_contracts._engine.rules.memory import (
    NoAddressError,
    ValueChecksSkipped,
    distinct_elements,
    overlap,
    self_overlap,
)


# -- brute force -------------------------------------------------------------------------------------
def element_offsets(t: torch.Tensor) -> torch.Tensor:
    """The storage offset (in elements, from data_ptr) of every element of ``t``, flattened."""
    off = torch.zeros((), dtype=torch.int64)
    for d, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[d] = size
        off = off + (torch.arange(size) * stride).reshape(shape)
    return off.expand(t.shape).reshape(-1)


def byte_addresses(t: torch.Tensor) -> torch.Tensor:
    """Every byte address an element of ``t`` covers, one per (element, byte): repeats kept."""
    e = t.element_size()
    return (t.data_ptr() + element_offsets(t)[:, None] * e + torch.arange(e)).reshape(-1)


def brute_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(np.intersect1d(byte_addresses(a).numpy(), byte_addresses(b).numpy()).size)


def brute_self_overlap(t: torch.Tensor) -> bool:
    addr = byte_addresses(t)
    return torch.unique(addr).numel() < addr.numel()


# -- random strided views of one buffer --------------------------------------------------------------
DTYPES = (torch.uint8, torch.int16, torch.bfloat16, torch.float32, torch.float64)
BUFFER = 256  # bytes


@st.composite
def layouts(draw, buf: torch.Tensor) -> torch.Tensor:
    """A random ``as_strided`` view of ``buf`` (a dtype, sizes, strides — stride 0 and
    overlapping ones too — and an offset that keep it inside the buffer)."""
    dtype = draw(st.sampled_from(DTYPES))
    e = torch.empty((), dtype=dtype).element_size()
    start = draw(st.integers(0, 16)) * e
    flat = buf[start:].view(dtype)[: (BUFFER - start) // e]
    ndim = draw(st.integers(0, 3))
    sizes = [draw(st.integers(0, 5)) for _ in range(ndim)]
    strides = [draw(st.integers(0, 9)) for _ in range(ndim)]
    span = sum((s - 1) * st_ for s, st_ in zip(sizes, strides, strict=True) if s > 0)
    if span >= flat.numel():
        sizes = [min(s, 1) for s in sizes]
        span = 0
    return flat.as_strided(sizes, strides, draw(st.integers(0, flat.numel() - 1 - span)))


@st.composite
def derived(draw, t: torch.Tensor) -> torch.Tensor:
    """``t`` after random slices with steps, transposes, expands and unsqueezes, sometimes seen
    through numpy or DLPack (another storage object over the same memory)."""
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(("slice", "transpose", "expand", "unsqueeze")))
        if op == "slice" and t.dim():
            d = draw(st.integers(0, t.dim() - 1))
            lo, step = draw(st.integers(0, 3)), draw(st.integers(1, 3))
            t = t[(slice(None),) * d + (slice(lo, None, step),)]
        elif op == "transpose" and t.dim() >= 2:
            t = t.transpose(0, t.dim() - 1)
        elif op == "expand" and 1 in t.shape:
            t = t.expand(*[draw(st.integers(1, 4)) if s == 1 else s for s in t.shape])
        elif op == "unsqueeze":
            t = t.unsqueeze(draw(st.integers(0, t.dim())))
    wrap = draw(st.sampled_from(("torch", "numpy", "dlpack")))
    if wrap == "numpy" and t.dtype != torch.bfloat16 and t.numel():
        t = torch.from_numpy(t.numpy())
    elif wrap == "dlpack" and t.numel():
        t = torch.from_dlpack(t)
    return t


@st.composite
def view_pairs(draw):
    """Two views of one buffer: of two random layouts, or two slicings of one (interleaved rows
    and columns: the cases a bounding-range test gets wrong)."""
    buf = torch.zeros(BUFFER, dtype=torch.uint8)
    a = b = draw(layouts(buf))
    kind = draw(st.sampled_from(("two layouts", "one layout", "complementary slices")))
    if kind == "two layouts":
        b = draw(layouts(buf))
    elif kind == "complementary slices" and a.dim():
        d, step = draw(st.integers(0, a.dim() - 1)), draw(st.integers(2, 3))
        lo_a, lo_b = draw(st.permutations(range(step)))[:2]
        a, b = (a[(slice(None),) * d + (slice(lo, None, step),)] for lo in (lo_a, lo_b))
    return buf, draw(derived(a)), draw(derived(b))


@settings(max_examples=600)
@given(view_pairs())
def test_overlap_equals_brute_force_on_random_strided_views(case):
    _, a, b = case
    assert overlap(a, b) == brute_overlap(a, b)
    assert overlap(b, a) == overlap(a, b)


@settings(max_examples=300)
@given(view_pairs())
def test_the_answers_do_not_depend_on_the_chunk_size(case):
    _, a, b = case
    saved = memory.CHUNK
    memory.CHUNK = 2  # every enumeration and merge takes many steps
    try:
        assert (overlap(a, b), self_overlap(a)) == (brute_overlap(a, b), brute_self_overlap(a))
    finally:
        memory.CHUNK = saved


@settings(max_examples=400)
@given(view_pairs())
def test_self_overlap_equals_brute_force_on_random_strided_views(case):
    _, a, _ = case
    assert self_overlap(a) == brute_self_overlap(a)


def rows_byte_addresses(a: torch.Tensor, rows: list[int]) -> torch.Tensor:
    kept = sorted({r for r in rows if 0 <= r < a.shape[0]})
    return torch.cat([byte_addresses(a[r]) for r in kept]) if kept else torch.empty(0, dtype=torch.int64)


@settings(max_examples=300)
@given(view_pairs(), st.lists(st.integers(-2, 6), max_size=6))
def test_written_rows_overlap_equals_brute_force(case, rows):
    _, a, b = case
    if a.dim() == 0:
        return
    idx = torch.tensor(rows, dtype=torch.int64)
    addr = rows_byte_addresses(a, rows)
    want = bool(np.intersect1d(addr.numpy(), byte_addresses(b).numpy()).size)
    assert memory.regions_overlap(memory.region(a, idx), memory.region(b)) == want
    assert self_overlap(a, idx) == (torch.unique(addr).numel() < addr.numel())


# -- named cases ------------------------------------------------------------------------------------
def test_interleaved_columns_do_not_overlap_and_shared_ones_do():
    x = torch.zeros(64, 128)
    assert not overlap(x[:, ::2], x[:, 1::2])
    assert overlap(x[:, ::2], x[:, 2::4])
    assert not overlap(x[::2], x[1::2])
    assert overlap(x.t(), x[5, 7:8])


def test_a_tensor_in_the_padding_between_rows_does_not_overlap_them():
    buf = torch.zeros(4, 100, dtype=torch.bfloat16)
    rows, pad = buf[:, :60], buf[1, 60:]
    assert not overlap(rows, pad)
    assert overlap(rows, buf[1, 59:])


def test_numpy_and_dlpack_aliases_over_other_storages_overlap():
    pool = torch.zeros(8, 4, 16)
    via_numpy = torch.from_numpy(pool.numpy()[3, 1])
    via_dlpack = torch.from_dlpack(pool[5].view(torch.bfloat16))
    assert via_numpy.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    assert overlap(pool, via_numpy) and overlap(pool[3], via_numpy) and not overlap(pool[4], via_numpy)
    assert overlap(pool[5, 3], via_dlpack) and not overlap(pool[6], via_dlpack)


def test_a_tensor_rebuilt_from_the_same_memory_overlaps_it():
    x = torch.arange(24.0).reshape(4, 6)
    y = torch.empty(0).set_(x.untyped_storage(), 6, (2, 3), (3, 1))
    assert overlap(x[1], y) and not overlap(x[2:], y)


def test_empty_tensors_and_other_devices_never_overlap():
    x = torch.zeros(10)
    assert not overlap(x[:0], x) and not overlap(x, torch.zeros(0, device="meta"))
    here = memory.region(x)
    elsewhere = memory.Region(torch.device("cuda", 0), here.bases, here.dims, here.run, here.nested)
    assert memory.regions_overlap(here, here) and not memory.regions_overlap(here, elsewhere)


def test_meta_and_fake_tensors_have_no_addresses():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with pytest.raises(NoAddressError, match="meta tensor has no memory addresses"):
        overlap(torch.zeros(3, device="meta"), torch.zeros(3))
    with FakeTensorMode():
        fake = torch.zeros(3)
        with pytest.raises(NoAddressError, match="FakeTensor tensor has no memory addresses"):
            overlap(fake, fake)
    assert memory.without_data({"x": torch.zeros(1), "m": torch.zeros(1, device="meta")}) == ["m"]


def test_self_overlap_of_expanded_and_as_strided_tensors():
    x = torch.zeros(100)
    assert self_overlap(torch.zeros(1, 8).expand(4, 8))
    assert self_overlap(x.as_strided((4, 8), (4, 1)))
    assert not self_overlap(x.as_strided((4, 8), (8, 1)))
    assert not self_overlap(x.as_strided((3, 2), (1, 3)))  # interleaved, no shared element
    assert self_overlap(x.as_strided((3, 3), (1, 2)))  # offsets 0,2,4 / 1,3,5 / 2,4,6: shared
    assert not self_overlap(x.as_strided((2, 3), (3, 2)))  # 0,2,4 / 3,5,7: interleaved, none shared


def test_overlap_by_a_single_byte_is_found():
    buf = torch.zeros(64, dtype=torch.uint8)
    assert self_overlap(buf.as_strided((2, 3), (2, 1)))  # rows [0, 3) and [2, 5) share byte 2
    f = buf.view(torch.float32)
    assert overlap(f[1:2], buf[7:8]) and not overlap(f[1:2], buf[8:9])
    assert overlap(buf.as_strided((4, 3), (4, 1)), buf.as_strided((3,), (4,), 2))  # the 3rd byte of row 0
    assert not overlap(buf.as_strided((4, 3), (4, 1)), buf.as_strided((4,), (4,), 3))  # the gaps


def test_exact_on_large_tensors_in_bounded_memory():
    # 2**22 interleaved rows of 8 bytes: decided without materialising either tensor's offsets.
    x = torch.zeros(2 ** 22, 4)
    assert not overlap(x[:, :2], x[:, 2:])
    assert overlap(x[:, :2], x[-1, 1:3])
    y = torch.zeros(1, 4096, dtype=torch.bfloat16).expand(2 ** 20, 4096)
    assert not self_overlap(y[0]) and self_overlap(y)
    assert distinct_elements(y).shape == (1, 4096)


def test_distinct_elements_keeps_every_value_and_drops_repeats():
    base = torch.randn(3, 1, 5)
    x = base.expand(3, 7, 5)
    d = distinct_elements(x)
    assert d.shape == (3, 1, 5) and torch.equal(d, base)
    assert distinct_elements(base) is base


# -- alias_violations -------------------------------------------------------------------------------
def test_alias_violations_names_each_written_argument_and_what_it_overlaps():
    x = torch.zeros(4, 8)
    values = {"x": x, "w": torch.zeros(8), "out": x[1, :4], "n": 3}
    (v,) = alias_violations(values, ["out"])
    assert (v.kind, v.argument, v.got) == (kc.ValueRangeError, "out", "overlaps x")
    assert v.expected == "memory of its own (out is written: no byte shared with x)"
    assert v.hint == ("allocate out separately from x (a view, a numpy array or a DLPack capsule of the same "
                      "memory is the same memory)")


def test_alias_violations_with_written_rows_allows_reads_of_other_rows():
    pool = torch.zeros(8, 2, 4)
    idx = torch.tensor([1, 5, -1, 99])
    ok = {"pool": pool, "v": torch.from_numpy(pool.numpy()[2]), "idx": idx}
    assert alias_violations(ok, {"pool": idx}) == []
    bad = dict(ok, v=torch.from_numpy(pool.numpy()[5, 1]))
    (v,) = alias_violations(bad, {"pool": idx})
    assert (v.argument, v.got) == ("pool", "the rows this call writes overlap v")
    assert v.hint == ("v shares memory with rows of pool that the call overwrites: pass a copy of v, or keep it "
                      "out of the rows the call writes")


def test_a_whole_write_into_an_unwritten_row_of_another_written_argument_is_caught():
    pool = torch.zeros(8, 16)
    out = pool[6, :8]  # a slot this call does not update, but writing out would change it
    vs = alias_violations({"pool": pool, "out": out}, {"pool": torch.tensor([0, 1]), "out": None})
    assert [(v.argument, v.got) for v in vs] == [("out", "overlaps pool")]


def test_alias_violations_reports_a_self_overlapping_written_argument():
    out = torch.zeros(1, 8).expand(4, 8)
    (v,) = alias_violations({"out": out}, ["out"])
    assert (v.kind, v.argument) == (kc.LayoutError, "out")
    assert v.got == "elements that share memory (an expand()ed or as_strided layout)"


def test_alias_violations_skips_tensors_without_data_with_a_warning():
    values = {"x": torch.zeros(4, device="meta"), "out": torch.zeros(4)}
    with pytest.warns(ValueChecksSkipped, match=r"^kda_contracts: my_op: strict mode's value checks skipped: no data "
                                                r"in x \(meta or fake tensors, e.g. under FakeTensorMode\); "
                                                r"only the metadata checks ran$"):
        assert alias_violations(values, ["out"], function="my_op") == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert alias_violations({"x": torch.zeros(4), "out": torch.zeros(4)}, ["out"]) == []


def test_the_module_examples_run():
    failures, tried = doctest.testmod(memory, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert tried >= 10 and failures == 0
