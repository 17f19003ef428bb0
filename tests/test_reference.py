"""Specification tests for the PyTorch reference backend, ``kda_kernels.reference``.

Numbers are checked against the loop oracle in ``kda_oracle.py`` (written from docs/semantics.md)
and against flash-linear-attention's naive recurrent KDA; tolerances are
``kda_oracle.TOLERANCES``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from kda_kernels.interface import split_qkv
from kda_kernels.reference import kda_gate, packed_decode
from kda_oracle import (
    DecodeCase,
    assert_close_to_oracle,
    assert_pool_untouched_except,
    make_decode_case,
    oracle_kda_gate,
    run_kernel,
    run_oracle,
    valid_slots,
)

HEADS = [(1, 1), (2, 2), (2, 4)]  # (H, HV); the last one is GVA
DIMS = [(4, 4), (8, 4), (4, 16)]  # (K, V), K != V included so layout mix-ups show
LAYOUTS = ["VK", "KV"]
GATES = [None, -5.0]  # softplus, bounded sigmoid
LOW_PRECISION = [torch.float32, torch.bfloat16, torch.float16]


def _case(**overrides: object) -> DecodeCase:
    """A small GVA case with K != V; keyword arguments override make_decode_case's."""
    kwargs: dict[str, object] = dict(batch=3, num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4)
    kwargs.update(overrides)
    return make_decode_case(**kwargs)  # type: ignore[arg-type]


def _assert_matches_oracle(case: DecodeCase) -> None:
    out, state = run_kernel(packed_decode, case)
    ref_out, ref_state = run_oracle(case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state.contiguous(), ref_state)


# --- agreement with the oracle ----------------------------------------------------------------


@pytest.mark.parametrize("use_qk_l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("lower_bound", GATES, ids=["softplus", "bounded"])
@pytest.mark.parametrize("state_layout", LAYOUTS)
@pytest.mark.parametrize("head_k_dim,head_v_dim", DIMS, ids=lambda d: str(d))
@pytest.mark.parametrize("num_heads,num_v_heads", HEADS, ids=lambda h: str(h))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_oracle_across_shapes_layouts_and_gates(
    batch: int,
    num_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    state_layout: str,
    lower_bound: float | None,
    use_qk_l2norm: bool,
) -> None:
    case = make_decode_case(
        batch=batch,
        num_heads=num_heads,
        num_v_heads=num_v_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        state_layout=state_layout,
        lower_bound=lower_bound,
        use_qk_l2norm=use_qk_l2norm,
        seed=batch,
    )
    _assert_matches_oracle(case)


@pytest.mark.parametrize("use_qk_l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("lower_bound", GATES, ids=["softplus", "bounded"])
@pytest.mark.parametrize("state_layout", LAYOUTS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("act_dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("state_dtype", LOW_PRECISION, ids=str)
def test_matches_oracle_across_dtypes(
    state_dtype: torch.dtype,
    act_dtype: torch.dtype,
    index_dtype: torch.dtype,
    state_layout: str,
    lower_bound: float | None,
    use_qk_l2norm: bool,
) -> None:
    # The oracle rounds the state and out to the same dtypes, so only rounding of nearly equal
    # fp32 values can differ: one unit of the dtype at most (see kda_oracle.TOLERANCES).
    case = _case(
        state_dtype=state_dtype,
        act_dtype=act_dtype,
        index_dtype=index_dtype,
        state_layout=state_layout,
        lower_bound=lower_bound,
        use_qk_l2norm=use_qk_l2norm,
    )
    out, state = run_kernel(packed_decode, case)
    assert out.dtype == act_dtype and state.dtype == state_dtype
    _assert_matches_oracle(case)


@pytest.mark.parametrize("state_layout", LAYOUTS)
def test_matches_oracle_with_padded_row_and_slot_strides(state_layout: str) -> None:
    _assert_matches_oracle(_case(row_pad=5, slot_pad=7, state_layout=state_layout))


@pytest.mark.parametrize("seed", range(4))
def test_matches_oracle_on_random_slots_of_a_large_pool(seed: int) -> None:
    case = _case(batch=8, num_slots=1000, seed=seed)
    assert len(set(case.indices.tolist())) == 8  # random permutation: no duplicates
    _assert_matches_oracle(case)


def test_matches_oracle_when_softplus_takes_its_linear_branch() -> None:
    case = _case(a_shift=100.0)
    assert (oracle_kda_gate(case.a, case.dt_bias, case.A_log, None) < -20.0).all()
    out, _ = run_kernel(packed_decode, case)
    assert out.isfinite().all()
    _assert_matches_oracle(case)


def test_l2norm_epsilon_is_inside_the_square_root() -> None:
    # With |k|² ~ 1e-6 the epsilon is as large as the sum, so its placement changes k by ~30%.
    case = _case(use_qk_l2norm=True)
    case = dataclasses.replace(case, mixed_qkv=case.mixed_qkv * 1e-3)
    _assert_matches_oracle(case)


# --- padding and out-of-range indices ----------------------------------------------------------


@pytest.mark.parametrize("padding", [-1, -7], ids=["minus_one", "minus_seven"])
def test_padding_rows_give_zero_output(padding: int) -> None:
    case = _case(indices=[3, padding, 5], num_slots=8)
    out, _ = run_kernel(packed_decode, case)
    assert out[1].eq(0).all()
    assert out[0].ne(0).any() and out[2].ne(0).any()


@pytest.mark.parametrize(
    "index_dtype,out_of_range",
    [(torch.int32, 8), (torch.int32, 2**31 - 1), (torch.int64, 9), (torch.int64, 2**40)],
    ids=["int32_N", "int32_max", "int64_N_plus_1", "int64_huge"],
)
def test_out_of_range_rows_give_zero_output(index_dtype: torch.dtype, out_of_range: int) -> None:
    case = _case(indices=[out_of_range, 2, out_of_range], num_slots=8, index_dtype=index_dtype)
    out, _ = run_kernel(packed_decode, case)
    assert out[0].eq(0).all() and out[2].eq(0).all()
    assert out[1].ne(0).any()


@pytest.mark.parametrize("state_dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize(
    "indices", [[-1, 4, 8, 0], [4, -1, 0, 12], [8, -1, 3, -2]], ids=["padding_first", "valid_first", "mixed"]
)
def test_only_the_slots_of_valid_indices_change(indices: list[int], state_dtype: torch.dtype) -> None:
    # slot_pad: the bytes between slots are part of the pool and must survive too.
    case = _case(batch=4, indices=indices, num_slots=8, slot_pad=3, state_dtype=state_dtype)
    _, state = run_kernel(packed_decode, case)
    assert_pool_untouched_except(case.state, state, valid_slots(case.indices, 8))


@pytest.mark.parametrize(
    "indices", [[-1, 4, 8, 0], [4, -1, 0, 12], [8, -1, 3, -2]], ids=["padding_first", "valid_first", "mixed"]
)
def test_valid_rows_among_padding_and_out_of_range_rows_match_oracle(indices: list[int]) -> None:
    _assert_matches_oracle(_case(batch=4, indices=indices, num_slots=8))


@pytest.mark.parametrize("indices", [[-1, -1, -1], [-1, 8, 100]], ids=["padding", "padding_and_out_of_range"])
def test_batch_without_valid_rows_leaves_the_pool_bit_identical_and_zeroes_out(indices: list[int]) -> None:
    case = _case(indices=indices, num_slots=8, slot_pad=2)
    out, state = run_kernel(packed_decode, case)
    assert out.eq(0).all()
    assert_pool_untouched_except(case.state, state, [])


def test_empty_batch_is_a_noop() -> None:
    case = _case(batch=0, num_slots=5)
    out, state = run_kernel(packed_decode, case)
    assert out.shape == (0, 1, 4, 4)
    assert_pool_untouched_except(case.state, state, [])


def test_empty_pool_gives_zero_output() -> None:
    case = _case(indices=[0, -1, 3], num_slots=0)
    out, state = run_kernel(packed_decode, case)
    assert out.eq(0).all() and state.numel() == 0


# --- other properties of the call ------------------------------------------------------------


def test_returns_none() -> None:
    case = _case()
    assert (
        packed_decode(
            case.mixed_qkv,
            case.a,
            case.b,
            case.A_log,
            case.dt_bias,
            case.scale,
            case.clone_state(),
            case.new_out(),
            case.indices,
            num_heads=2,
            use_qk_l2norm=True,
            lower_bound=None,
        )
        is None
    )


def test_inputs_other_than_out_and_state_are_not_modified() -> None:
    case = _case()
    before = [t.clone() for t in (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.indices)]
    run_kernel(packed_decode, case)
    after = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.indices)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_kv_layout_is_the_transpose_of_vk() -> None:
    vk = _case(state_layout="VK")
    kv = dataclasses.replace(vk, state=vk.state.transpose(-1, -2).contiguous(), state_layout="KV")
    out_vk, state_vk = run_kernel(packed_decode, vk)
    out_kv, state_kv = run_kernel(packed_decode, kv)
    assert torch.equal(out_vk, out_kv)
    assert torch.equal(state_vk.transpose(-1, -2), state_kv)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_output_comes_from_the_fp32_state_before_rounding(state_dtype: torch.dtype) -> None:
    low = _case(state_dtype=state_dtype)
    # The same starting values held in fp32: the fp32 run never rounds the state.
    full = dataclasses.replace(low, state=low.state.float())
    out_low, state_low = run_kernel(packed_decode, low)
    out_full, state_full = run_kernel(packed_decode, full)
    assert torch.equal(out_low, out_full)
    assert torch.equal(state_low, state_full.to(state_dtype))


def test_unknown_state_layout_is_rejected() -> None:
    case = dataclasses.replace(_case(), state_layout="vk")
    with pytest.raises(ValueError, match=r"^state_layout must be 'VK' or 'KV', got 'vk'$"):
        run_kernel(packed_decode, case)


# --- the helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize("lower_bound", GATES, ids=["softplus", "bounded"])
def test_kda_gate_matches_the_oracle_gate(lower_bound: float | None) -> None:
    case = _case(act_dtype=torch.bfloat16)
    g = kda_gate(case.a, case.dt_bias, case.A_log, lower_bound)
    assert g.dtype == torch.float32 and g.shape == (3, 4, 8)
    torch.testing.assert_close(g, oracle_kda_gate(case.a, case.dt_bias, case.A_log, lower_bound))


def test_softplus_gate_is_exactly_linear_above_20_and_finite_for_huge_logits() -> None:
    # Above the threshold softplus(x) is x itself; log(1 + exp(x)) would overflow to inf.
    x = torch.tensor([[20.5, 25.0, 100.0, 1e4]])
    A_log = torch.tensor([math.log(3.0)])
    g = kda_gate(x, torch.zeros(4), A_log, lower_bound=None)
    assert torch.equal(g, (-A_log.exp() * x).view(1, 1, 4))


def test_bounded_gate_is_lower_bound_times_sigmoid_of_a_times_logit() -> None:
    # A = 2 and dt_bias = 0.25: g = -5 * sigmoid(2 * (a + 0.25)).
    a = torch.tensor([[-0.25, 0.25, 50.0, -50.0]])
    g = kda_gate(a, torch.full((4,), 0.25), torch.tensor([math.log(2.0)]), lower_bound=-5.0)
    expected = torch.tensor([[[-2.5, -5.0 / (1.0 + math.exp(-1.0)), -5.0, 0.0]]])
    torch.testing.assert_close(g, expected, atol=1e-6, rtol=1e-6)


# --- against flash-linear-attention -------------------------------------------------------------


@pytest.mark.parametrize("use_qk_l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("lower_bound", GATES, ids=["softplus", "bounded"])
@pytest.mark.parametrize("state_layout", LAYOUTS)
@pytest.mark.parametrize("num_heads,num_v_heads", [(1, 1), (2, 4)], ids=["mha", "gva"])
def test_matches_fla_naive_recurrent_kda(
    num_heads: int, num_v_heads: int, state_layout: str, lower_bound: float | None, use_qk_l2norm: bool
) -> None:
    naive = pytest.importorskip("fla.ops.kda.naive")
    K, V = 8, 4
    case = make_decode_case(
        batch=3,
        num_heads=num_heads,
        num_v_heads=num_v_heads,
        head_k_dim=K,
        head_v_dim=V,
        state_layout=state_layout,
        lower_bound=lower_bound,
        use_qk_l2norm=use_qk_l2norm,
    )
    out, state = run_kernel(packed_decode, case)

    # fla takes [B, T, heads, dim] with T = 1, the activated gate and beta, a [B, HV, K, V]
    # state, and does not normalise q/k itself.
    q, k, v = split_qkv(case.mixed_qkv, num_heads, num_v_heads, K, V)
    if use_qk_l2norm:
        q, k = (x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    g = oracle_kda_gate(case.a, case.dt_bias, case.A_log, lower_bound)
    slots = case.indices.long()
    initial = case.state[slots].float()
    if state_layout == "VK":
        initial = initial.transpose(-1, -2)
    ref_out, ref_state = naive.naive_recurrent_kda(
        q.unsqueeze(1),
        k.unsqueeze(1),
        v.unsqueeze(1),
        g.unsqueeze(1),
        torch.sigmoid(case.b).unsqueeze(1),
        scale=case.scale,
        initial_state=initial,
        output_final_state=True,
    )
    if state_layout == "VK":
        ref_state = ref_state.transpose(-1, -2)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[slots], ref_state, atol=1e-5, rtol=1e-5)
