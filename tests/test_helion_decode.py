"""Specification tests for the Helion backend, ``kda_kernels.helion_decode``.

Every case runs the Helion kernel and the PyTorch reference ``kda_kernels.reference`` on fresh
copies of the same pool and compares them with ``kda_oracle.TOLERANCES`` (1e-5 fp32, 2e-3 bf16,
5e-4 fp16, plus one unit of rounding for the low-precision dtypes). Two ways to run on CPU:

- eager: ``helion.RefMode.EAGER`` runs the kernel body as PyTorch ops (the tile loop in Python);
  it is passed as a setting, since ``HELION_INTERPRET=1`` and ``TRITON_INTERPRET=1`` (set in
  ``conftest.py``) cannot be combined;
- compiled: Helion generates Triton for an explicit config and the Triton interpreter runs it.
  Shapes are tiny: the interpreter costs ~0.5 ms per program and each new specialisation
  (dtypes, constexpr flags, B == 1) costs a compile of about a second.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from kda_kernels import helion_decode, reference
from kda_oracle import (
    TOLERANCES,
    DecodeCase,
    assert_close_to_oracle,
    assert_pool_untouched_except,
    make_decode_case,
    run_kernel,
    valid_slots,
)

pytestmark = pytest.mark.skipif(not helion_decode.is_available()[0], reason=helion_decode.is_available()[1])

LAYOUTS = ["VK", "KV"]
GATES = [None, -5.0]  # softplus, bounded sigmoid
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _case(**overrides: object) -> DecodeCase:
    """A small GVA case (H=2, HV=4) with K != V, and V = 8: two tiles for the compiled runner."""
    kwargs: dict[str, object] = dict(batch=3, num_heads=2, num_v_heads=4, head_k_dim=4, head_v_dim=8)
    kwargs.update(overrides)
    return make_decode_case(**kwargs)  # type: ignore[arg-type]


def _eager() -> Callable[..., None]:
    return functools.partial(helion_decode.launch, kernel=helion_decode.decode_kernel(eager=True))


def _compiled() -> Callable[..., None]:
    import helion

    # BLOCK_V = 4 splits V = 8 into two tiles, so the V-tile indexing is exercised.
    config = helion.Config(block_sizes=[4], num_warps=1)
    return functools.partial(helion_decode.launch, kernel=helion_decode.decode_kernel(config))


RUNNERS = {"eager": _eager, "compiled": _compiled}


def _assert_matches_reference(kernel: Callable[..., None], case: DecodeCase) -> tuple[torch.Tensor, torch.Tensor]:
    out, state = run_kernel(kernel, case)
    ref_out, ref_state = run_kernel(reference.packed_decode, case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
    return out, state


# --- agreement with the reference -------------------------------------------------------------


@pytest.mark.parametrize("lower_bound", GATES, ids=["softplus", "bounded"])
@pytest.mark.parametrize("state_layout", LAYOUTS)
@pytest.mark.parametrize("mode", RUNNERS)
def test_matches_reference_for_both_gates_and_layouts(mode: str, state_layout: str, lower_bound: float | None) -> None:
    case = _case(state_layout=state_layout, lower_bound=lower_bound, row_pad=3, slot_pad=5)
    _assert_matches_reference(RUNNERS[mode](), case)


@pytest.mark.parametrize("mode", RUNNERS)
def test_matches_reference_without_qk_l2norm(mode: str) -> None:
    _assert_matches_reference(RUNNERS[mode](), _case(use_qk_l2norm=False))


@pytest.mark.parametrize("mode", RUNNERS)
@pytest.mark.parametrize("state_dtype", DTYPES[1:], ids=str)
def test_matches_reference_with_low_precision_state_and_activations(state_dtype: torch.dtype, mode: str) -> None:
    case = _case(state_dtype=state_dtype, act_dtype=state_dtype, index_dtype=torch.int32)
    out, state = _assert_matches_reference(RUNNERS[mode](), case)
    assert out.dtype == state_dtype and state.dtype == state_dtype


@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_eager_matches_reference_with_fp32_activations_for_every_state_dtype(state_dtype: torch.dtype) -> None:
    _assert_matches_reference(_eager(), _case(state_dtype=state_dtype))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_compiled_matches_reference_for_both_index_dtypes(index_dtype: torch.dtype) -> None:
    _assert_matches_reference(_compiled(), _case(index_dtype=index_dtype, num_slots=40))


@pytest.mark.parametrize("num_heads,num_v_heads", [(1, 1), (4, 4), (1, 4)], ids=["H1", "HV4", "GVA1to4"])
def test_eager_matches_reference_across_head_counts(num_heads: int, num_v_heads: int) -> None:
    _assert_matches_reference(_eager(), _case(num_heads=num_heads, num_v_heads=num_v_heads))


def test_compiled_matches_reference_for_a_single_request() -> None:
    # Helion compiles B == 1 separately from B >= 2 (its size buckets are 0, 1 and 2+).
    _assert_matches_reference(_compiled(), _case(batch=1))


def test_compiled_matches_reference_for_dims_that_are_not_powers_of_two() -> None:
    # K = 12 is padded to a 16-wide tile and V = 6 ends in a partial tile: both are masked.
    _assert_matches_reference(_compiled(), _case(head_k_dim=12, head_v_dim=6))


def test_compiled_matches_reference_when_softplus_takes_its_linear_branch() -> None:
    out, _ = _assert_matches_reference(_compiled(), _case(a_shift=100.0))
    assert out.isfinite().all()


@pytest.mark.parametrize("state_layout", LAYOUTS)
def test_public_entry_point_matches_reference_with_its_pinned_config(state_layout: str) -> None:
    _assert_matches_reference(helion_decode.packed_decode, _case(state_layout=state_layout))


# --- padding, out-of-range indices, empty batches ---------------------------------------------


@pytest.mark.parametrize("mode", RUNNERS)
@pytest.mark.parametrize(
    "index_dtype,indices",
    [(torch.int32, [-1, 8, 2, 2**31 - 1, -7]), (torch.int64, [9, -1, 2**40, 5, -(2**40)])],
    ids=["int32", "int64"],
)
def test_padding_and_out_of_range_rows_give_zero_output_and_leave_the_pool_bit_identical(
    index_dtype: torch.dtype, indices: list[int], mode: str
) -> None:
    case = _case(batch=5, indices=indices, num_slots=8, slot_pad=3, index_dtype=index_dtype)
    out, state = _assert_matches_reference(RUNNERS[mode](), case)
    valid = [i for i, s in enumerate(indices) if 0 <= s < 8]
    invalid = [i for i in range(5) if i not in valid]
    assert out[invalid].eq(0).all()
    assert out[valid].ne(0).any(dim=-1).all()
    assert_pool_untouched_except(case.state, state, valid_slots(case.indices, 8))


@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_compiled_kernel_writes_only_the_slots_of_valid_indices(state_dtype: torch.dtype) -> None:
    case = _case(batch=4, indices=[6, -1, 0, 9], num_slots=8, slot_pad=2, state_dtype=state_dtype)
    _, state = run_kernel(_compiled(), case)
    assert_pool_untouched_except(case.state, state, [6, 0])


@pytest.mark.parametrize("mode", RUNNERS)
def test_batch_without_valid_rows_zeroes_out_and_leaves_the_pool_bit_identical(mode: str) -> None:
    case = _case(indices=[-1, 8, -3], num_slots=8, slot_pad=2)
    out, state = run_kernel(RUNNERS[mode](), case)
    assert out.eq(0).all()
    assert_pool_untouched_except(case.state, state, [])


@pytest.mark.parametrize("mode", [*RUNNERS, "public"])
def test_empty_batch_is_a_noop(mode: str) -> None:
    kernel = helion_decode.packed_decode if mode == "public" else RUNNERS[mode]()
    case = _case(batch=0, num_slots=5)
    out, state = run_kernel(kernel, case)
    assert out.shape == (0, 1, 4, 8)
    assert_pool_untouched_except(case.state, state, [])


@pytest.mark.parametrize("mode", RUNNERS)
def test_empty_pool_gives_zero_output(mode: str) -> None:
    case = _case(indices=[0, -1, 3], num_slots=0)
    out, state = run_kernel(RUNNERS[mode](), case)
    assert out.eq(0).all() and state.numel() == 0


# --- configuration: pinned, never autotuned ---------------------------------------------------


def test_every_state_dtype_and_head_regime_has_a_pinned_config() -> None:
    import helion

    keys = {(dtype, regime) for dtype in DTYPES for regime in ("many_heads", "few_heads")}
    assert set(helion_decode.PINNED_CONFIGS) == keys
    assert all(isinstance(helion_decode.PINNED_CONFIGS[key], helion.Config) for key in keys)


@pytest.mark.parametrize(
    "num_v_heads,regime", [(32, "many_heads"), (16, "many_heads"), (12, "few_heads"), (4, "few_heads")]
)
def test_head_regime_splits_at_sixteen_value_heads(num_v_heads: int, regime: str) -> None:
    assert helion_decode.head_regime(num_v_heads) == regime
    assert (
        helion_decode.pinned_config(torch.float32, num_v_heads)
        == helion_decode.PINNED_CONFIGS[
            (torch.float32, regime)  # type: ignore[index]
        ]
    )


def test_compiled_kernel_has_exactly_its_config_and_cannot_autotune_or_fall_back_to_eager() -> None:
    import helion

    config = helion_decode.pinned_config(torch.bfloat16, 32)
    kernel = helion_decode.decode_kernel(config)
    assert kernel.configs == [config]
    assert kernel.settings.force_autotune is False
    assert kernel.settings.ref_mode is helion.RefMode.OFF
    assert kernel.settings.static_shapes is False  # new B or N: no recompile (past B == 1)


def test_decode_kernel_without_a_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"needs a helion\.Config unless eager=True \(no run-time autotuning\)"):
        helion_decode.decode_kernel(None)


def test_unpinned_state_dtype_is_refused_with_the_supported_list() -> None:
    with pytest.raises(ValueError, match=r"no pinned helion config for state dtype torch\.float64; supported: "):
        helion_decode.pinned_config(torch.float64, 32)


def test_unknown_state_layout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"state_layout must be 'VK' or 'KV', got 'vk'"):
        run_kernel(_eager(), _case(state_layout="vk"))


def test_supported_lists_both_layouts_and_all_state_dtypes() -> None:
    assert helion_decode.SUPPORTED["state_layouts"] == ("VK", "KV")
    assert set(helion_decode.SUPPORTED["state_dtypes"]) == set(TOLERANCES)  # type: ignore[arg-type]


def test_is_available_names_the_helion_and_torch_versions() -> None:
    ok, why = helion_decode.is_available()
    assert ok
    assert why.startswith("helion ") and f"torch {torch.__version__}" in why
