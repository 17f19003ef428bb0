"""Watch mode's fused check kernel against the torch probes it replaces: the same first bad element,
value, count and extra for every built-in rule, on the CPU under the Triton interpreter (the
kernel's CUDA run is in tests/test_watch_cuda.py). Cases are fixed (seeded), not drawn at random."""

from __future__ import annotations

import os

import pytest
import torch

import kda_contracts as kc
from kda_contracts._engine.rules import fused
from kda_contracts._engine.rules.reading import probes

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available(),
                                reason="the kernel runs on CUDA, or on the CPU under TRITON_INTERPRET=1")
pytest.importorskip("triton")

NAN, INF = float("nan"), float("inf")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (compiled on a GPU, interpreted here)


def kernel_row(rules, values, dims, *, serial=5, flag=None):
    """The flag the kernel leaves (recorded, serial, slot, element, value, count, extra), or None."""
    values = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    slots, rest = fused.plan(rules, values, dims)
    assert not rest, "every rule here takes a kernel slot"
    flag = torch.zeros(7, dtype=torch.float64) if flag is None else flag
    flag = flag.to(DEVICE)
    state = fused.FusedState(DEVICE, flag, None)
    fused.launch(state, [s for _, s in slots], serial)  # (one launch per fused.SLOTS rules)
    at = fused.OWN_WORDS  # (the first stream's row)
    assert state.scratch[at:at + fused.ROW].tolist() == fused.FusedState(
        DEVICE, flag, None).scratch[at:at + fused.ROW].tolist(), "the scratch is left as found"
    return flag.tolist() if flag[0] else None, [i for i, _ in slots]


def probe_row(rules, values, dims):
    for i, p in probes(rules, values, dims):
        if p[0] >= 0:
            return i, p.tolist()
    return None


def same(a, b):
    return all((x != x and y != y) or x == y for x, y in zip(a, b, strict=True))


def check(rules, values, dims=None):
    dims = dims or {}
    got, order = kernel_row(rules, values, dims)
    want = probe_row(rules, values, dims)
    if want is None:
        assert got is None
        return None
    assert got is not None and got[1] == 5
    assert order[int(got[2])] == want[0], (got, want)
    assert same(got[3:], want[1]), (got, want)
    return got


i32 = torch.int32


@pytest.mark.parametrize("idx", [[0, 1, 2, 3], [0, 9, 2, 11], [-1, 3, -1, 12], [7], [], [-5, -1], [8, 8, 9]],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("ignore", [True, False])
def test_in_range(idx, ignore):
    rule = kc.InRange("i", high="N", ignore_negative=ignore)
    check([rule], {"i": torch.tensor(idx, dtype=i32)}, {"N": 8})
    check([kc.InRange("i", low=0, high=4)], {"i": torch.tensor(idx, dtype=torch.int64)})


@pytest.mark.parametrize("idx", [[0, 1, 2, 3], [0, 1, 0, 3], [-1, 2, -1, 2], [5, 5, 5, 5], [3], [],
                                 [*range(200), 150, *range(300, 400), 7]], ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("ignore", [True, False])
def test_distinct(idx, ignore):
    check([kc.Distinct("i", ignore_negative=ignore)], {"i": torch.tensor(idx, dtype=i32)})


@pytest.mark.parametrize("where", [None, (0, 0), (3, 5), (2, 1999)])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_finite_over_a_row_slice_of_a_wider_tensor(where, bad, dtype):
    wide = torch.randn(4, 3000, generator=torch.Generator().manual_seed(1)).to(dtype)
    x = wide[:, 500:2500]  # rows 3000 apart
    if where is not None:
        x[where] = bad
    assert fused.slot_of(kc.Finite("x"), {"x": x}, {}) not in (None, ())
    check([kc.Finite("x")], {"x": x})


def test_finite_of_a_broadcast_and_of_integers():
    x = torch.ones(3).expand(4, 3).clone()
    x[2, 1] = NAN
    check([kc.Finite("x")], {"x": x})
    check([kc.Finite("x")], {"x": torch.ones(1, 3).expand(4, 3)})
    assert fused.slot_of(kc.Finite("x"), {"x": torch.ones(3, dtype=i32)}, {}) == ()
    assert fused.slot_of(kc.Finite("x"), {"x": torch.ones(3, 4).t()}, {}) is None  # (a torch probe)


@pytest.mark.parametrize("case", ["clean", "nan", "inf", "padding-row", "past-the-pool", "only-skips"])
def test_finite_rows(case):
    pool = torch.randn(6, 2, 3, 4, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor([4, -1, 1, 5], dtype=i32)
    only = torch.tensor([True, True, True, False])
    if case == "nan":
        pool[1, 1, 2, 3] = NAN
    if case == "inf":
        pool[5, 0, 0, 0] = -INF
        pool[4, 1, 1, 1] = INF
    if case == "padding-row":
        pool[0] = NAN  # no index names it
    if case == "past-the-pool":
        idx[1] = 9
    if case == "only-skips":
        pool[5, 0, 0, 0] = NAN
    for rule, vals in [(kc.FiniteRows("p", "i"), {"p": pool, "i": idx}),
                       (kc.FiniteRows("p", "i", only="o"), {"p": pool, "i": idx, "o": only})]:
        check([rule], vals)


@pytest.mark.parametrize("cu", [[0, 3, 5, 9], [1, 3, 5, 9], [0, 3, 2, 9], [0, 3, 5, 8], [0], [4, 4, 1, 0]])
def test_offsets(cu):
    x = torch.tensor(cu, dtype=i32)
    for rule in [kc.StartsAt("cu", 0), kc.EndsAt("cu", "T"), kc.NonDecreasing("cu")]:
        check([rule], {"cu": x}, {"T": 9})
    check([kc.NonDecreasing("cu")], {"cu": x.float()})


def test_the_first_rule_that_finds_something_is_recorded_and_a_recorded_flag_is_kept():
    rules = [kc.StartsAt("cu", 0), kc.InRange("i", high="N", ignore_negative=True), kc.Distinct("i"),
             kc.Finite("x"), kc.NonDecreasing("cu"), kc.EndsAt("cu", "T"), kc.Finite("y"), kc.Finite("z"),
             kc.Distinct("j")]  # 9 rules: two launches
    x, y, z = torch.zeros(3), torch.zeros(2, 2), torch.zeros(5)
    vals = {"cu": torch.tensor([0, 2, 5], dtype=i32), "i": torch.tensor([1, 2, 1], dtype=i32), "x": x, "y": y,
            "z": z, "j": torch.tensor([4, 4], dtype=i32)}
    got, order = kernel_row(rules, vals, {"N": 4, "T": 5})
    assert order[int(got[2])] == 2 and got[3:6] == [2.0, 1.0, 1.0]  # Distinct("i"): i[2] = 1, once
    vals["i"] = torch.tensor([1, 2, 3], dtype=i32)
    got, order = kernel_row(rules, vals, {"N": 4, "T": 5})
    assert order[int(got[2])] == 8 and got[3:] == [1.0, 4.0, 1.0, 0.0]  # the second launch's Distinct("j")
    held = torch.tensor([1.0, 3.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    got, _ = kernel_row(rules, vals, {"N": 4, "T": 5}, flag=held.clone())
    assert got == held.tolist()  # an earlier violation is kept


def test_a_clean_call_leaves_the_flag_empty():
    rules = [kc.InRange("i", high="N", ignore_negative=True), kc.Distinct("i"), kc.Finite("x")]
    got, _ = kernel_row(rules, {"i": torch.tensor([0, -1, 3], dtype=i32), "x": torch.ones(4, 4)}, {"N": 4})
    assert got is None


def test_the_decode_ops_rules_all_take_kernel_slots():
    from kda_contracts.ops._packed.checks import VALUE_RULES
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    call = make_decode_call(cfg, 3, 8)
    slots, rest = fused.plan(VALUE_RULES, call, {"N": 8})
    assert not rest and len(slots) == len(VALUE_RULES) == fused.SLOTS
    call["ssm_state_indices"][2] = 8
    call["initial_state"][call["ssm_state_indices"][0]].view(-1)[7] = NAN
    check(list(VALUE_RULES), call, {"N": 8})


def test_finite_rows_of_rows_longer_than_a_chunk_count_each_row_once():
    pool = torch.randn(6, 3, 4000, generator=torch.Generator().manual_seed(3))  # 12,000 elements a row: 2 chunks
    pool[4, 0, 5] = NAN
    pool[4, 2, 3999] = INF  # the same row, the other chunk
    pool[1, 2, 100] = -INF
    idx = torch.tensor([2, 4, 1, 4 - 5, 0], dtype=i32)
    got = check([kc.FiniteRows("p", "i")], {"p": pool, "i": idx})
    assert got[3:] == [1.0, NAN, 2.0, 4.0] or (got[3] == 1.0 and got[4] != got[4] and got[5:] == [2.0, 4.0])
    assert fused.grid_of([fused.slot_of(kc.FiniteRows("p", "i"), {"p": pool, "i": idx}, {})]) == 10
