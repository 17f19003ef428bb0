"""Specification tests for the Triton backend, ``kda_kernels.triton_decode``.

Each case runs the kernel (under the Triton interpreter on CPU, see ``conftest.py``) and the
PyTorch reference ``kda_kernels.reference`` on fresh copies of the same pool and compares them
with ``kda_oracle.TOLERANCES``. Shapes are tiny: the interpreter costs ~0.5 ms per program.
"""

from __future__ import annotations

import pytest
import torch
from kda_kernels import reference
from kda_kernels.triton_decode import DecodeConfig, is_available, packed_decode, pick_config
from kda_oracle import (
    DecodeCase,
    assert_close_to_oracle,
    assert_pool_untouched_except,
    make_decode_case,
    run_kernel,
    valid_slots,
)

pytestmark = pytest.mark.skipif(not is_available()[0], reason=is_available()[1])


def _case(**overrides: object) -> DecodeCase:
    """A small GVA case with K != V; keyword arguments override make_decode_case's."""
    kwargs: dict[str, object] = dict(batch=3, num_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8)
    kwargs.update(overrides)
    if "indices" in overrides:
        kwargs["batch"] = len(overrides["indices"])  # type: ignore[arg-type]
    return make_decode_case(**kwargs)  # type: ignore[arg-type]


def _run_triton(case: DecodeCase, config: DecodeConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    def kernel(*args: object, **kwargs: object) -> None:
        packed_decode(*args, **kwargs, config=config)  # type: ignore[arg-type]

    return run_kernel(kernel, case)


def _assert_matches_reference(case: DecodeCase, config: DecodeConfig | None = None) -> None:
    out, state = _run_triton(case, config)
    ref_out, ref_state = run_kernel(reference.packed_decode, case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
    assert_pool_untouched_except(case.state, state, valid_slots(case.indices, case.state.shape[0]))


# --- agreement with the reference ---------------------------------------------------------------


@pytest.mark.parametrize("num_heads,num_v_heads", [(2, 2), (1, 4)], ids=["mha", "gva"])
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "bounded"])
@pytest.mark.parametrize("state_layout", ["VK", "KV"])
def test_matches_reference_for_gates_layouts_and_gva(
    state_layout: str, lower_bound: float | None, num_heads: int, num_v_heads: int
) -> None:
    _assert_matches_reference(
        _case(state_layout=state_layout, lower_bound=lower_bound, num_heads=num_heads, num_v_heads=num_v_heads)
    )


def test_matches_reference_without_qk_l2norm() -> None:
    _assert_matches_reference(_case(use_qk_l2norm=False))


def test_matches_reference_when_softplus_takes_its_linear_branch() -> None:
    _assert_matches_reference(_case(a_shift=30.0))


@pytest.mark.parametrize(
    "act_dtype,state_dtype",
    [
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.bfloat16),
    ],
    ids=lambda d: str(d).removeprefix("torch."),
)
def test_matches_reference_for_activation_and_state_dtypes(act_dtype: torch.dtype, state_dtype: torch.dtype) -> None:
    _assert_matches_reference(_case(act_dtype=act_dtype, state_dtype=state_dtype))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_matches_reference_for_index_dtypes(index_dtype: torch.dtype) -> None:
    _assert_matches_reference(_case(index_dtype=index_dtype))


@pytest.mark.parametrize("state_layout", ["VK", "KV"])
def test_matches_reference_with_padded_row_strides_and_slot_stride(state_layout: str) -> None:
    # slot_pad: the pool is a view with stride(0) > HV*V*K (a slice of a bigger buffer);
    # the gap bytes must survive bit-identically.
    _assert_matches_reference(_case(state_layout=state_layout, row_pad=3, slot_pad=5))


def test_matches_reference_when_dims_are_not_powers_of_two() -> None:
    # K=12 and V=20 exercise the masked tails of the K vector and of the last V tile.
    _assert_matches_reference(_case(head_k_dim=12, head_v_dim=20), DecodeConfig(block_v=8, num_warps=2))


@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(block_v=4, num_warps=1),
        DecodeConfig(block_v=4, num_warps=2, tiles=3, num_stages=2),
        DecodeConfig(block_v=8, num_warps=4, tiles=2, num_stages=3, state_eviction=""),
    ],
    ids=lambda c: f"bv{c.block_v}-t{c.tiles}-s{c.num_stages}",
)
def test_matches_reference_for_launch_configs(config: DecodeConfig) -> None:
    # V=16 split into several tiles and tile groups, including a group that runs past V.
    _assert_matches_reference(_case(head_v_dim=16, indices=[6, -1, 2]), config)


def test_matches_reference_at_production_head_dims_with_the_picked_configs() -> None:
    # K = V = 128 as in Kimi-Linear; every launch shape pick_config can choose, on one request.
    configs = {
        pick_config(batch, 32, 128, dtype)
        for batch in (1, 8, 64, 256, 512)
        for dtype in (torch.float32, torch.bfloat16)
    }
    case = make_decode_case(batch=1, num_heads=1, num_v_heads=1, head_k_dim=128, head_v_dim=128)
    for config in sorted(configs):
        _assert_matches_reference(case, config)


# --- memory safety ------------------------------------------------------------------------------


def test_padding_rows_give_zero_output_and_leave_the_pool_bit_identical() -> None:
    case = _case(indices=[-1, 4, -7], slot_pad=2)
    out, state = _run_triton(case)
    assert out[0].eq(0).all() and out[2].eq(0).all()
    assert_pool_untouched_except(case.state, state, [4])
    _assert_matches_reference(case)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_out_of_range_indices_are_zeroed_counted_and_never_touch_the_pool(index_dtype: torch.dtype) -> None:
    big = torch.iinfo(index_dtype).max
    case = _case(num_slots=5, indices=[5, 1, big, -1, 6], index_dtype=index_dtype, slot_pad=3)
    state, out = case.clone_state(), case.new_out()
    counter = torch.zeros(1, dtype=torch.int32)
    packed_decode(
        case.mixed_qkv,
        case.a,
        case.b,
        case.A_log,
        case.dt_bias,
        case.scale,
        state,
        out,
        case.indices,
        num_heads=case.num_heads,
        use_qk_l2norm=case.use_qk_l2norm,
        lower_bound=case.lower_bound,
        oob_counter=counter,
    )
    assert counter.item() == 3  # 5, big and 6; padding (-1) is not counted
    for row in (0, 2, 3, 4):
        assert out[row].eq(0).all()
    assert_pool_untouched_except(case.state, state, [1])
    ref_out, ref_state = run_kernel(reference.packed_decode, case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)


def test_oob_counter_accumulates_across_calls_and_ignores_valid_rows() -> None:
    case = _case(num_slots=4, indices=[3, 9, 0])
    counter = torch.full((1,), 10, dtype=torch.int32)
    for _ in range(2):
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
            num_heads=case.num_heads,
            use_qk_l2norm=True,
            lower_bound=None,
            oob_counter=counter,
        )
    assert counter.item() == 12


def test_empty_batch_is_a_noop() -> None:
    case = _case(batch=0)
    out, state = _run_triton(case)
    assert out.shape[0] == 0
    assert_pool_untouched_except(case.state, state, [])


def test_empty_pool_gives_zero_output() -> None:
    case = _case(num_slots=0, indices=[0, 3, -1])
    out, _ = _run_triton(case)
    assert out.eq(0).all()


# --- availability and configuration -------------------------------------------------------------


def test_is_available_names_the_interpreter_when_it_is_selected() -> None:
    ok, why = is_available()
    assert ok and "TRITON_INTERPRET" in why


def test_unknown_state_layout_is_rejected() -> None:
    case = _case()
    with pytest.raises(ValueError, match="state_layout must be 'VK' or 'KV', got 'kv'"):
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
            state_layout="kv",
        )


@pytest.mark.parametrize("batch", [1, 8, 64, 256, 512])
@pytest.mark.parametrize("num_v_heads", [4, 32])
def test_picked_config_tiles_never_exceed_the_value_dim(batch: int, num_v_heads: int) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        cfg = pick_config(batch, num_v_heads, 128, dtype)
        assert cfg.block_v & (cfg.block_v - 1) == 0 and cfg.block_v * cfg.tiles <= 128
