"""The Mamba2 worked example (examples/selective_state_update.py, docs/guide-mamba2.md): its torch
reference against a naive per-(row, head) loop, padding and untouched slots at tolerance 0, the
message of every typical mistake, rejected calls that change nothing, the custom op and the op
under torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.utils import counters

import kda_contracts as kc
from examples.selective_state_update import selective_state_update

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def make_call(batch=4, nheads=4, dim=8, dstate=16, ngroups=2, pool=7, dtype=torch.float32, *, slots="int32",
              optional=True, dt_softplus=True, pad_slot_id=-1, seed=0):
    """A valid call. ``slots``: None (row i updates state[i]), "int32" or "int64" (distinct
    random slots, the second row padding). A, D, dt_bias and dt are stride-0 broadcasts of
    per-head values, as Mamba2 passes them."""
    g = torch.Generator().manual_seed(seed)
    call = {
        "state": torch.randn(pool if slots else batch, nheads, dim, dstate, generator=g).to(dtype),
        "x": torch.randn(batch, nheads, dim, generator=g).to(dtype),
        "dt": torch.randn(batch, nheads, generator=g).to(dtype)[..., None].expand(batch, nheads, dim),
        "A": -torch.rand(nheads, generator=g)[:, None, None].expand(nheads, dim, dstate),
        "B": torch.randn(batch, ngroups, dstate, generator=g).to(dtype),
        "C": torch.randn(batch, ngroups, dstate, generator=g).to(dtype),
        "dt_softplus": dt_softplus,
        "pad_slot_id": pad_slot_id,
        "out": torch.full((batch, nheads, dim), -7.0, dtype=dtype),  # a sentinel: every row must be written
    }
    if optional:
        call["D"] = torch.randn(nheads, dim, generator=g)
        call["z"] = torch.randn(batch, nheads, dim, generator=g).to(dtype)
        call["dt_bias"] = torch.randn(nheads, generator=g)[:, None].expand(nheads, dim)
    if slots:
        idx = torch.randperm(pool, generator=g)[:batch]
        idx[1] = pad_slot_id
        call["state_batch_indices"] = idx.to(getattr(torch, slots))
    return call


def clone(call):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}


def naive(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None,
          pad_slot_id=-1, out=None):
    """Row by row and head by head in float64, as the definition reads; returns (state, out)."""
    state = state.double().clone()
    batch, nheads, dim = x.shape
    per_group = nheads // B.shape[1]
    y = torch.zeros(batch, nheads, dim, dtype=torch.float64)
    for b in range(batch):
        slot = b if state_batch_indices is None else int(state_batch_indices[b])
        padded = state_batch_indices is not None and (slot == pad_slot_id or not 0 <= slot < state.shape[0])
        for h in range(nheads):
            g = h // per_group
            step = dt[b, h].double() + (dt_bias[h].double() if dt_bias is not None else 0)
            if dt_softplus:
                step = torch.tensor([math.log1p(math.exp(s)) for s in step.tolist()], dtype=torch.float64)
            old = torch.zeros(dim, A.shape[2], dtype=torch.float64) if padded else state[slot, h]
            new = old * torch.exp(step[:, None] * A[h].double()) + (step * x[b, h].double())[:, None] * B[b, g].double()
            if not padded:
                state[slot, h] = new
            y[b, h] = new @ C[b, g].double()
            if D is not None:
                y[b, h] += D[h].double() * x[b, h].double()
            if z is not None:
                zz = z[b, h].double()
                y[b, h] *= zz * torch.sigmoid(zz)
    return state, y


CASES = {
    "all optional, int32 slots": {},
    "no optional, no slots": dict(slots=None, optional=False, dt_softplus=False),
    "int64 slots, pad id 99": dict(slots="int64", pad_slot_id=99),
    "one group": dict(ngroups=1),
    "a group per head": dict(ngroups=4, nheads=4),
    "bfloat16": dict(dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", CASES)
def test_the_reference_matches_a_naive_loop(case):
    for seed in range(3):
        call = make_call(seed=seed, **CASES[case])
        want_state, want_out = naive(**clone(call))
        got = selective_state_update(**call, backend="torch")
        assert got is call["out"]
        tol = TOL[call["x"].dtype]
        torch.testing.assert_close(got.double(), want_out, **tol)
        torch.testing.assert_close(call["state"].double(), want_state, **tol)


def test_slots_no_row_names_and_padded_rows_are_untouched_at_tolerance_zero():
    call = make_call(batch=4, pool=9)
    before = call["state"].clone()
    selective_state_update(**call)
    idx = call["state_batch_indices"]
    written = {int(s) for s in idx if int(s) != -1}
    assert len(written) == 3
    for slot in range(9):
        assert torch.equal(call["state"][slot], before[slot]) == (slot not in written), slot


def test_a_padded_row_is_computed_from_a_zero_state():
    call = make_call(batch=3, pool=5)
    call["state_batch_indices"] = torch.tensor([4, -1, 0], dtype=torch.int32)
    lone = {k: (v[1:2] if k in ("x", "dt", "B", "C", "z", "out") else v) for k, v in clone(call).items()}
    lone["state"] = torch.zeros(1, *call["state"].shape[1:])
    lone["state_batch_indices"] = torch.tensor([0], dtype=torch.int32)
    selective_state_update(**call)
    selective_state_update(**lone)
    torch.testing.assert_close(call["out"][1:2], lone["out"])


@pytest.mark.kda_contracts("check")  # strict mode would reject the call before the reference ran
def test_in_check_mode_an_index_past_the_pool_is_treated_as_padding_never_read_or_written():
    call = make_call(batch=3, pool=5)
    call["state_batch_indices"] = torch.tensor([4, 5_000_000, -3], dtype=torch.int32)
    padded = clone(call)
    padded["state_batch_indices"] = torch.tensor([4, -1, -1], dtype=torch.int32)
    selective_state_update(**call)
    selective_state_update(**padded)
    assert torch.equal(call["state"], padded["state"]) and torch.equal(call["out"], padded["out"])


def test_duplicate_slots_in_check_mode_give_one_row_the_slot():
    call = make_call(batch=3, pool=5)
    call["state_batch_indices"] = torch.tensor([2, 2, 0], dtype=torch.int32)
    with kc.mode("check"):
        selective_state_update(**call)
    last = clone(make_call(batch=3, pool=5))
    last["state_batch_indices"] = torch.tensor([-1, 2, 0], dtype=torch.int32)
    selective_state_update(**last)
    assert torch.equal(call["state"], last["state"])  # the last row that names a slot wins it


# -- what the op shows ----------------------------------------------------------------------------
def test_the_op_is_listed_and_its_reference_is_its_only_backend():
    assert kc.ops()["selective_state_update"] is selective_state_update
    assert selective_state_update.explain_backends(**make_call()) == (
        "   torch: chosen (priority 0, the highest that supports this call)")


def test_its_custom_op_passes_opcheck_with_out_by_name():
    call = make_call()
    call = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in call.items()}
    assert str(selective_state_update.torch_op._opoverload._schema).endswith(
        "SymInt pad_slot_id=-1, Tensor(a12!)? out=None, str backend=\"auto\") -> ()")
    assert set(torch.library.opcheck(selective_state_update.torch_op, (), call).values()) == {"SUCCESS"}


# -- typical mistakes: the exact messages -----------------------------------------------------------
DIMS = ("  dims: pool=7 from state.shape[0]; nheads=4 from state.shape[1]; dim=8 from state.shape[2]; dstate=16 "
        "from state.shape[3]; batch=4 from x.shape[0]; ngroups=2 from B.shape[1]")


def dt_per_head(call):
    call["dt"] = call["dt"][..., 0]  # Mamba2's dt is [batch, nheads]


def D_per_head(call):
    call["D"] = call["D"][:, 0].contiguous()  # Mamba2's D parameter is [nheads]


def groups_that_do_not_divide_the_heads(call):
    call["B"], call["C"] = torch.randn(4, 3, 16), torch.randn(4, 3, 16)


def C_with_another_group_count(call):
    call["C"] = torch.randn(4, 1, 16)


def float_slot_indices(call):
    call["state_batch_indices"] = call["state_batch_indices"].float()


def no_indices_with_a_bigger_pool(call):
    del call["state_batch_indices"]


def two_rows_on_one_slot(call):
    call["state_batch_indices"] = torch.tensor([3, -1, 5, 3], dtype=torch.int32)


def slot_past_the_pool(call):
    call["state_batch_indices"] = torch.tensor([3, -1, 7, 0], dtype=torch.int32)


MISTAKES = {
    dt_per_head: [
        "selective_state_update(): 1 contract violation",
        "  [1] dt: ShapeError",
        "      expected [batch, nheads, dim] (rank 3)",
        "      got      [4, 4] (rank 2)",
        "      fix: `dt` looks per head ([4, 4]); the op takes it per channel: pass dt[..., None].expand(batch, "
        "nheads, dim) (a stride-0 view, no copy)",
        DIMS,
    ],
    D_per_head: [
        "selective_state_update(): 1 contract violation",
        "  [1] D: ShapeError",
        "      expected [nheads, dim] (rank 2)",
        "      got      [4] (rank 1)",
        "      fix: `D` looks per head ([4]); the op takes it per channel: pass D[:, None].expand(nheads, dim) "
        "(a stride-0 view, no copy)",
        DIMS,
    ],
    groups_that_do_not_divide_the_heads: [
        "selective_state_update(): 1 contract violation",
        "  [1] dims: ShapeError",
        "      expected nheads % ngroups == 0",
        "      got      ngroups=3, nheads=4",
        "      ngroups from B.shape[1]",
        "      nheads from state.shape[1]",
        "      fix: B and C hold one projection per group of nheads // ngroups heads: ngroups must divide nheads "
        "(check ngroups, and that B and C are split per tensor-parallel rank like the heads)",
        DIMS.replace("ngroups=2", "ngroups=3"),
    ],
    C_with_another_group_count: [
        "selective_state_update(): 1 contract violation",
        "  [1] C: ShapeError",
        "      expected [batch, ngroups, dstate] = [4, 2, 16]",
        "      got      [4, 1, 16]",
        "      dim 1 (ngroups): expected 2 (ngroups from B.shape[1]), got 1",
        DIMS,
    ],
    float_slot_indices: [
        "selective_state_update(): 1 contract violation",
        "  [1] state_batch_indices: DtypeError",
        "      expected int32 or int64",
        "      got      float32",
        "      fix: slot indices are integers: state_batch_indices.to(torch.int32) (padding stays pad_slot_id)",
        DIMS,
    ],
    no_indices_with_a_bigger_pool: [
        "selective_state_update(): 1 contract violation",
        "  [1] dims: ShapeError",
        "      expected pool == batch if state_batch_indices is None",
        "      got      batch=4, pool=7, state_batch_indices is None",
        "      batch from x.shape[0]",
        "      pool from state.shape[0]",
        "      fix: without state_batch_indices, row i updates state[i]: pass the slot of each row "
        "(state_batch_indices=...) or a state of exactly batch rows",
        DIMS,
    ],
    two_rows_on_one_slot: [
        "selective_state_update(): 1 contract violation",
        "  [1] state_batch_indices: ValueRangeError",
        "      expected a distinct slot per row (padding excepted)",
        "      got      1 slot(s) shared, e.g. slot 3 by rows 0, 3",
        "      fix: rows on one slot race on its state (all but one update is lost); give each request its own slot",
        DIMS,
    ],
    slot_past_the_pool: [
        "selective_state_update(): 1 contract violation",
        "  [1] state_batch_indices: ValueRangeError",
        "      expected slots in [0, pool=7), or pad_slot_id=-1 for padding",
        "      got      1 index(es) outside, e.g. state_batch_indices[2] = 7",
        "      fix: an index past the pool would read and write another request's state; check the slot "
        "allocator, and that padding uses pad_slot_id",
        DIMS,
    ],
}
VALUE_MISTAKES = (two_rows_on_one_slot, slot_past_the_pool)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda f: f.__name__)
def test_each_typical_mistake_has_its_exact_message(mistake):
    call = make_call()
    mistake(call)
    with kc.mode("strict"), pytest.raises(kc.ContractError) as err:
        selective_state_update(**call)
    assert str(err.value).splitlines() == MISTAKES[mistake]


@pytest.mark.parametrize("mistake", VALUE_MISTAKES, ids=lambda f: f.__name__)
def test_value_mistakes_are_strict_mode_checks(mistake):
    call = make_call()
    mistake(call)
    with kc.mode("check"):
        selective_state_update(**call)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda f: f.__name__)
def test_a_rejected_call_changes_no_tensor(mistake):
    call = make_call()
    mistake(call)
    before = clone(call)
    with kc.mode("strict"), pytest.raises(kc.ContractError):
        selective_state_update(**call)
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(call[name], value), name


def test_per_head_values_flattened_are_named_too():
    call = make_call()
    call["dt_bias"] = call["dt_bias"].reshape(-1)
    call["x"] = call["x"].reshape(4, 32)
    with pytest.raises(kc.ShapeError) as err:
        selective_state_update(**call)
    assert [line for line in str(err.value).splitlines() if "fix:" in line] == [
        "      fix: `x` looks flattened ([4, 32]): pass x.view(batch, nheads, dim)",
        "      fix: `dt_bias` looks flattened ([32]): pass dt_bias.view(nheads, dim)",
    ]


# -- under torch.compile ------------------------------------------------------------------------------
def decode_step(call):
    return selective_state_update(**call) + 1


@pytest.mark.kda_contracts("check")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_op_compiles_once_per_shape_class_over_dozens_of_calls(backend):
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(decode_step, fullgraph=True, backend=backend)
    for i in range(30):
        batch = 2 + i % 6
        call, ref = make_call(batch=batch, pool=9, seed=i), make_call(batch=batch, pool=9, seed=i)
        torch.testing.assert_close(step(call), decode_step(ref))
        assert torch.equal(call["state"], ref["state"])  # the in-place write survives compilation
    assert counters["stats"]["unique_graphs"] == 2  # a static first size, then one dynamic in batch
    bad = make_call(batch=5, pool=9)
    dt_per_head(bad)
    with pytest.raises(kc.ShapeError, match=r"`dt` looks per head"):
        step(bad)
    torch._dynamo.reset()
