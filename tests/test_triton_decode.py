"""Specification tests for the Triton backend, ``kda_kernels.triton_decode``.

Each case runs the kernel (under the Triton interpreter on CPU, see ``conftest.py``) and the
PyTorch reference ``kda_kernels.reference`` on fresh copies of the same pool and compares them
with ``kda_oracle.TOLERANCES``. Shapes are tiny: the interpreter costs ~0.5 ms per program.
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch
from kda_kernels import reference, triton_decode, triton_kv_shared
from kda_kernels.triton_decode import (
    ConfigUnsupported,
    DecodeConfig,
    is_available,
    packed_decode,
    pick_config,
    picked_configs,
)
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
        DecodeConfig(block_v=8, num_warps=1, guard="mask"),
        DecodeConfig(block_v=4, num_warps=1, tiles=2, num_stages=2, guard="mask", load_cache=".cg", store_cache=".cs"),
        DecodeConfig(block_v=8, num_warps=1, guard="mask", grid="v_fastest"),
        DecodeConfig(block_v=4, num_warps=2, tiles=2, grid="head_fastest"),
        DecodeConfig(block_v=8, num_warps=1, act_eviction="evict_last", store_eviction=""),
        DecodeConfig(block_v=16, num_warps=1, max_registers=96),
        DecodeConfig(block_v=4, num_warps=1, tiles=2, act_eviction="evict_last", v_eviction=""),
        DecodeConfig(block_v=4, num_warps=1, guard="mask", grid="v_fastest", fused_output=True),
        DecodeConfig(block_v=8, num_warps=2, tiles=2, num_stages=2, fused_output=True),
        DecodeConfig(block_v=4, num_warps=1, early_load=True),
        DecodeConfig(block_v=8, num_warps=1, guard="mask", grid="v_fastest", early_load=True, fused_output=True),
    ],
    ids=lambda c: f"bv{c.block_v}-t{c.tiles}-s{c.num_stages}-{c.guard}{c.load_cache}{c.store_cache}-{c.grid}"
    f"{'-v' + str(c.v_eviction) if c.v_eviction is not None else ''}{'-fused' if c.fused_output else ''}"
    f"{'-early' if c.early_load else ''}",
)
def test_matches_reference_for_launch_configs(config: DecodeConfig) -> None:
    # V=16 split into several tiles and tile groups, including a group that runs past V.
    _assert_matches_reference(_case(head_v_dim=16, indices=[6, -1, 2]), config)


@pytest.mark.parametrize("state_layout", ["VK", "KV"])
@pytest.mark.parametrize("head_k_dim", [16, 12], ids=["K16", "K12"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_output_matches_reference(state_layout: str, head_k_dim: int, state_dtype: torch.dtype) -> None:
    # the output summed from the decayed tile (h q + u k.q): K=12 pads the K vectors, V=20 leaves a
    # partial tile; padding and an out-of-range index
    case = _case(head_k_dim=head_k_dim, head_v_dim=20, state_layout=state_layout, state_dtype=state_dtype,
                 indices=[6, -1, 2, 9])
    _assert_matches_reference(case, DecodeConfig(block_v=8, num_warps=1, fused_output=True))
    _assert_matches_reference(case, DecodeConfig(block_v=8, num_warps=1, guard="mask", early_load=True))


def test_early_load_needs_one_tile_per_program() -> None:
    case = _case(indices=[1, 0])
    with pytest.raises(ValueError, match=r"early_load needs one tile per program \(tiles=1\)"):
        _run_triton(case, DecodeConfig(block_v=4, num_warps=1, tiles=2, early_load=True))


def test_fused_output_and_early_load_are_constexprs_of_the_tile_kernel_only() -> None:
    # the chunked KV tile sums both from the decayed chunk already and has no single tile to load
    # early: the knobs do not recompile it
    cases = {(layout, ck, *((True,) if watched else ())): triton_decode._plan(
        ((2, 1, 1, 16, 16, 8), 64, 16, 1, 256, torch.float32, layout, False, True, False, False, -1,
         DecodeConfig(block_v=8, num_warps=1, kv_chunk=ck, fused_output=True, early_load=True), watched))[1][-3:]
        for layout, ck in (("VK", 0), ("KV", 0), ("KV", 8)) for watched in (False, True)}
    # (watch mode's checks need whole tiles: a chunked shape runs as one tile there)
    assert cases == {("VK", 0): (True, True, False), ("KV", 0): (True, True, False), ("KV", 8): (False, False, False),
                     ("VK", 0, True): (True, True, True), ("KV", 0, True): (True, True, True),
                     ("KV", 8, True): (True, True, True)}


@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(block_v=16, num_warps=1, kv_chunk=4),
        DecodeConfig(block_v=8, num_warps=1, kv_chunk=8, guard="mask", v_eviction="evict_first"),
        DecodeConfig(block_v=16, num_warps=1, kv_chunk=16, grid="v_fastest", state_eviction=""),
        DecodeConfig(block_v=16, num_warps=1, kv_chunk=4, kv_first_eviction=""),
        DecodeConfig(block_v=8, num_warps=1, kv_chunk=8, guard="mask", kv_first_eviction="evict_first"),
    ],
    ids=["bv16-ck4", "bv8-ck8-mask", "bv16-ck16-vfastest", "bv16-ck4-first-unhinted", "bv8-ck8-mask-first-ev1"],
)
@pytest.mark.parametrize("head_k_dim", [16, 12], ids=["K16", "K12"])
def test_chunked_kv_tiles_match_reference(config: DecodeConfig, head_k_dim: int) -> None:
    # two passes over chunks of K rows; K=12 leaves a partial chunk, V=20 a partial tile; padding and
    # an out-of-range index
    case = _case(head_k_dim=head_k_dim, head_v_dim=20, state_layout="KV", indices=[6, -1, 2, 9])
    _assert_matches_reference(case, config)


@pytest.mark.parametrize("head_k_dim", [4, 16], ids=["K4", "K16"])
def test_a_chunk_taller_than_a_power_of_two_k_stays_inside_its_head(head_k_dim: int) -> None:
    # the picked chunk is 32 rows: with K = 4 or 16 it used to read and write past the head's tile
    # (K a power of two leaves the K mask off), into the next head and slot
    case = _case(head_k_dim=head_k_dim, head_v_dim=8, state_layout="KV", indices=[6, -1, 2, 9],
                 state_dtype=torch.bfloat16)
    _assert_matches_reference(case, DecodeConfig(block_v=8, num_warps=1, kv_chunk=32, kv_first_eviction=""))


def test_16bit_kv_state_takes_the_chunked_tile_with_an_unhinted_first_pass_from_1024_request_heads() -> None:
    # measured on an H200 (pick_config's docstring); GDN keeps the earlier shapes (evict_last, from 8192)
    # (from 2048 request-heads the shared-memory tile comes first where it can run: test_triton_kv_shared.py)
    for batch, hv in ((32, 32), (256, 4), (1024, 32)):
        cfg = pick_config(batch, hv, 128, torch.bfloat16, "KV", kv_shared=batch * hv < 2048)
        assert (cfg.block_v, cfg.num_warps, cfg.kv_chunk, cfg.kv_first_eviction) == (128, 1, 32, "")
    assert pick_config(16, 32, 128, torch.bfloat16, "KV").kv_chunk == 0
    assert pick_config(32, 32, 128, torch.bfloat16, "KV", gdn=True, kv_shared=False).kv_chunk == 0
    assert pick_config(256, 32, 128, torch.bfloat16, "KV", gdn=True, kv_shared=False).kv_first_eviction == "evict_last"


def test_fp32_vk_state_takes_8_row_tiles_stored_before_the_output_from_128_to_1024_request_heads() -> None:
    # measured on an H200 (pick_config's docstring): 8 rows, request-major, branch guard, fused output
    # (whose tile is stored before the output rows); 4 masked rows below, 8 with no state hint from 4096
    r8 = DecodeConfig(block_v=8, num_warps=1, fused_output=True)
    for batch, hv in ((8, 16), (8, 32), (64, 4), (64, 16), (256, 4)):
        assert pick_config(batch, hv, 128, torch.float32, "VK") == r8
    r4 = DecodeConfig(block_v=4, num_warps=1, guard="mask", grid="v_fastest", fused_output=True)
    assert pick_config(8, 4, 128, torch.float32, "VK") == r4  # 32 request-heads
    assert pick_config(64, 32, 128, torch.float32, "VK") == r4  # 2048
    assert pick_config(256, 16, 128, torch.float32, "VK").state_eviction == ""  # 4096
    # GDN keeps the shapes it was measured with (no fused output); 16-bit state is not fused
    assert pick_config(64, 4, 128, torch.float32, "VK", gdn=True) == r4._replace(fused_output=False)
    assert not any(pick_config(b, 32, 128, torch.bfloat16, "VK").fused_output for b in (1, 8, 64, 256, 1024))


@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "bounded"])
@pytest.mark.parametrize("use_qk_l2norm", [True, False], ids=["l2norm", "raw"])
def test_chunked_kv_tiles_match_reference_for_gates_and_norms(lower_bound: float | None, use_qk_l2norm: bool) -> None:
    case = _case(state_layout="KV", lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm, num_heads=1)
    _assert_matches_reference(case, DecodeConfig(block_v=8, num_warps=1, kv_chunk=8))


@pytest.mark.parametrize("num_v_heads", [16, 32])
def test_grouped_grid_visits_every_head_and_tile_once(num_v_heads: int) -> None:
    # groups of 16 heads: one group (HV=16) and two (HV=32), with GVA and padding
    case = _case(num_heads=4, num_v_heads=num_v_heads, head_v_dim=8, indices=[3, -1])
    _assert_matches_reference(case, DecodeConfig(block_v=4, num_warps=1, grid="grouped"))


def test_matches_reference_at_production_head_dims_with_every_picked_config() -> None:
    # K = V = 128 as in Kimi-Linear; every launch shape pick_config can choose (both layouts), on one
    # request. (The grouped order needs HV % 16 == 0 and falls back to flat here; see the grouped test.)
    for layout in ("VK", "KV"):
        case = make_decode_case(batch=1, num_heads=1, num_v_heads=1, head_k_dim=128, head_v_dim=128,
                                state_layout=layout)
        for config in picked_configs():
            why = config.kv_shared and layout == "KV" and triton_kv_shared.unsupported(128, 128, torch.float32,
                                                                                     config.block_v, config.num_warps,
                                                                                     config.kv_chunk)
            if why:  # the Gluon kernel (under the interpreter): refused, saying why (test_triton_kv_shared.py)
                with pytest.raises(ConfigUnsupported, match=re.escape("cannot run here: " + why)):
                    _run_triton(case, config)
            else:
                _assert_matches_reference(case, config)


# --- memory safety ------------------------------------------------------------------------------


# Both guards (a branch, or masked pool accesses) must keep every bad index off the pool.
_GUARDS = {
    "branch": DecodeConfig(block_v=4, num_warps=1, guard="branch", grid="head_fastest"),
    "mask": DecodeConfig(block_v=4, num_warps=1, guard="mask", grid="v_fastest"),
}


@pytest.mark.parametrize("guard", list(_GUARDS))
def test_padding_rows_give_zero_output_and_leave_the_pool_bit_identical(guard: str) -> None:
    case = _case(indices=[-1, 4, -7], slot_pad=2)
    out, state = _run_triton(case, _GUARDS[guard])
    assert out[0].eq(0).all() and out[2].eq(0).all()
    assert_pool_untouched_except(case.state, state, [4])
    _assert_matches_reference(case, _GUARDS[guard])


@pytest.mark.parametrize("guard", list(_GUARDS))
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_out_of_range_indices_are_zeroed_counted_and_never_touch_the_pool(index_dtype: torch.dtype, guard: str) -> None:
    big = torch.iinfo(index_dtype).max
    case = _case(num_slots=5, indices=[5, 1, big, -1, 6], index_dtype=index_dtype, slot_pad=3)
    counter = torch.zeros(1, dtype=torch.int32)
    out, state = run_kernel(packed_decode, case, oob_counter=counter, config=_GUARDS[guard])
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
        run_kernel(packed_decode, case, oob_counter=counter)
    assert counter.item() == 12


def test_empty_batch_is_a_noop() -> None:
    case = _case(batch=0)
    out, state = _run_triton(case)
    assert out.shape[0] == 0
    assert_pool_untouched_except(case.state, state, [])


@pytest.mark.parametrize("guard", list(_GUARDS))
def test_empty_pool_gives_zero_output(guard: str) -> None:
    case = _case(num_slots=0, indices=[0, 3, -1])
    out, _ = _run_triton(case, _GUARDS[guard])
    assert out.eq(0).all()


# --- availability and configuration -------------------------------------------------------------


def test_is_available_names_the_interpreter_when_it_is_selected() -> None:
    ok, why = is_available()
    assert ok and "TRITON_INTERPRET" in why


def test_unknown_state_layout_is_rejected() -> None:
    case = _case()
    with pytest.raises(ValueError, match="state_layout must be 'VK' or 'KV', got 'kv'"):
        run_kernel(packed_decode, case, state_layout="kv")


@pytest.mark.parametrize("batch", [1, 8, 64, 256, 512])
@pytest.mark.parametrize("num_v_heads", [4, 32])
def test_picked_config_tiles_never_exceed_the_value_dim(batch: int, num_v_heads: int) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        cfg = pick_config(batch, num_v_heads, 128, dtype)
        assert cfg.block_v & (cfg.block_v - 1) == 0 and cfg.block_v * cfg.tiles <= 128


# --- the fast eager launch (the compiled-kernel cache) ----------------------------------------------
# The interpreter has no compiled kernel, so these tests drive the fast path with a stand-in for the
# JIT function and the CompiledKernel it returns; benchmarks/triton_launch.py checks the real one on
# a GPU (bit-identical to kernel[grid], also in a CUDA graph).

_N_PARAMS = triton_decode._N_RUNTIME_ARGS + triton_decode._N_CONSTEXPRS


class _FakeCompiled:
    """Stands in for triton's CompiledKernel: a signature naming every parameter, and a launcher."""

    def __init__(self, signature_len: int = _N_PARAMS, fail: bool = False) -> None:
        self.src = SimpleNamespace(signature={f"p{i}": "i32" for i in range(signature_len)})
        for name in list(self.src.signature)[triton_decode._N_RUNTIME_ARGS :]:
            self.src.signature[name] = "constexpr"
        self.function = object()
        self.packed_metadata = (1, 2)
        self.launches: list[tuple] = []
        self.fail = fail

    def run(self, *args: object) -> None:
        if self.fail:
            raise TypeError("launcher takes other arguments")
        self.launches.append(args)


class _FakeJIT:
    """Stands in for the JIT function: ``kernel[grid](*args, num_warps=...)`` records the call."""

    def __init__(self, compiled: _FakeCompiled, fail: bool = False) -> None:
        self.compiled, self.fail = compiled, fail
        self.calls: list[tuple] = []

    def __getitem__(self, grid: tuple) -> object:
        def launch(*args: object, **kwargs: object) -> _FakeCompiled:
            if self.fail:
                raise ValueError("pointer argument cannot be accessed from Triton (cpu tensor?)")
            self.calls.append((grid, args, kwargs))
            return self.compiled

        return launch


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch):
    """Installs a fake JIT function and launch environment (device 0, stream 1234, no hooks)."""

    def install(compiled: _FakeCompiled | None = None, hooks: object = None) -> _FakeJIT:
        jit = _FakeJIT(compiled if compiled is not None else _FakeCompiled())
        runtime = SimpleNamespace(launch_enter_hook=hooks, launch_exit_hook=None)
        monkeypatch.setattr(triton_decode, "_packed_decode_kernel", jit)
        monkeypatch.setitem(triton_decode._fast_launch, "enabled", True)
        monkeypatch.setitem(triton_decode._fast_launch, "cache", {})
        monkeypatch.setitem(triton_decode._fast_launch, "env", (lambda: 0, lambda device: 1234, runtime))
        return jit

    return install


def _call(case: DecodeCase, out: torch.Tensor | None = None, **kwargs: object) -> None:
    packed_decode(
        case.mixed_qkv,
        case.a,
        case.b,
        case.A_log,
        case.dt_bias,
        case.scale,
        case.state,
        case.new_out() if out is None else out,
        case.indices,
        num_heads=case.num_heads,
        use_qk_l2norm=case.use_qk_l2norm,
        lower_bound=case.lower_bound,
        state_layout=case.state_layout,
        **kwargs,  # type: ignore[arg-type]
    )


def test_fast_launch_reuses_the_compiled_kernel_with_every_argument_in_order(fake_kernel) -> None:
    jit = fake_kernel()
    case = _case()
    counter, out = torch.zeros(1, dtype=torch.int32), case.new_out()
    for _ in range(3):
        _call(case, out, oob_counter=counter)
    assert len(jit.calls) == 1  # one normal launch, then the compiled kernel's launcher
    grid, args, kwargs = jit.calls[0][0], jit.calls[0][1], jit.calls[0][2]
    assert kwargs == {"num_warps": pick_config(3, 4, 8, torch.float32).num_warps}
    assert len(args) == _N_PARAMS and args[8] is counter
    launches = jit.compiled.launches
    assert len(launches) == 2
    for launch in launches:
        assert launch[:9] == (*grid, 1234, jit.compiled.function, (1, 2), None, None, None)
        assert len(launch[9:]) == _N_PARAMS
        # (the tensors as their addresses: the launcher takes an int as a pointer as is)
        assert all(x == (y.data_ptr() if isinstance(y, torch.Tensor) else y) for x, y in zip(launch[9:], args,
                                                                                               strict=True))


@pytest.mark.parametrize(
    "change",
    ["act_dtype", "index_dtype", "misaligned", "one_head", "row_stride", "layout", "counter", "config"],
)
def test_every_specialization_change_takes_the_normal_launch_first(fake_kernel, change: str) -> None:
    jit = fake_kernel()
    case = _case(num_heads=2, num_v_heads=4)
    _call(case)
    kwargs: dict[str, object] = {}
    if change == "act_dtype":
        case = _case(act_dtype=torch.bfloat16)
    elif change == "index_dtype":
        case = _case(index_dtype=torch.int32)
    elif change == "misaligned":  # a pointer off a 16-byte boundary is specialized differently
        case = _case()
        wide = torch.zeros(case.mixed_qkv.shape[0], case.mixed_qkv.shape[1] + 1)
        wide[:, 1:] = case.mixed_qkv
        case = dataclasses.replace(case, mixed_qkv=wide[:, 1:])
    elif change == "one_head":  # an int argument equal to 1 becomes a constexpr
        case = _case(num_heads=1)
    elif change == "row_stride":  # an int argument divisible by 16, or not
        case = _case(row_pad=5)
    elif change == "layout":
        case = _case(state_layout="KV")
    elif change == "counter":
        kwargs["oob_counter"] = torch.zeros(1, dtype=torch.int32)
    else:
        kwargs["config"] = DecodeConfig(block_v=8, num_warps=2)
    _call(case, **kwargs)
    assert len(jit.calls) == 2 and not jit.compiled.launches
    _call(case, **kwargs)
    assert len(jit.calls) == 2 and len(jit.compiled.launches) == 1


def test_int_spec_separates_exactly_what_triton_specializes_ints_on() -> None:
    libtriton = pytest.importorskip("triton._C.libtriton")
    from triton.backends.compiler import BaseBackend

    values = [0, 1, 2, 15, 16, 17, 32, 4096, 524288, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 1, 2**40, 2**63 - 1]
    values += [2**63, 2**64 - 16, -1, -16, -(2**31), -(2**31) - 1, -(2**31) - 16]
    triton_keys = [libtriton.native_specialize_impl(BaseBackend, v, False, True, True) for v in values]
    ours = [triton_decode._int_spec(v) for v in values]
    for i in range(len(values)):
        for j in range(len(values)):
            assert (ours[i] == ours[j]) == (triton_keys[i] == triton_keys[j]), (values[i], values[j])


def test_a_failing_launcher_falls_back_to_the_normal_launch_and_switches_the_fast_path_off(fake_kernel) -> None:
    jit = fake_kernel(_FakeCompiled(fail=True))
    case = _case()
    _call(case)
    with pytest.warns(RuntimeWarning, match="launcher failed"):
        _call(case)
    assert len(jit.calls) == 2 and not triton_decode._fast_launch["enabled"]
    _call(case)
    assert len(jit.calls) == 3


def test_a_caller_error_raised_by_both_launches_leaves_the_fast_path_on(fake_kernel) -> None:
    jit = fake_kernel(_FakeCompiled(fail=True))
    case = _case()
    _call(case)
    jit.fail = True
    with pytest.raises(ValueError, match="cpu tensor"):
        _call(case)
    assert triton_decode._fast_launch["enabled"]


def test_an_unexpected_compiled_kernel_switches_the_fast_path_off(fake_kernel) -> None:
    jit = fake_kernel(_FakeCompiled(signature_len=triton_decode._N_RUNTIME_ARGS))
    case = _case()
    with pytest.warns(RuntimeWarning, match="signature"):
        _call(case)
    _call(case)
    assert len(jit.calls) == 2 and not triton_decode._fast_launch["enabled"]


def test_launch_hooks_send_every_call_through_the_normal_launch(fake_kernel) -> None:
    jit = fake_kernel(hooks=SimpleNamespace(calls=[print]))
    case = _case()
    for _ in range(3):
        _call(case)
    assert len(jit.calls) == 3 and not jit.compiled.launches


def test_the_interpreter_takes_the_normal_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(triton_decode._fast_launch, "enabled", True)
    monkeypatch.setitem(triton_decode._fast_launch, "cache", {})
    monkeypatch.setitem(triton_decode._fast_launch, "env", None)
    _assert_matches_reference(_case())
    assert not triton_decode._fast_launch["enabled"] and not triton_decode._fast_launch["cache"]


def test_a_watched_launch_is_capped_at_the_unwatched_registers_only_where_that_saves_a_wave(monkeypatch) -> None:
    """Watch mode's checks add a rare path whose registers count for the whole kernel: a grid the
    unwatched kernel runs in one wave of resident programs keeps its register count (capped); a
    grid of many waves is left alone (a cap there only spills)."""
    from types import SimpleNamespace

    assert triton_decode._waves(64, 1, 4096, 132) == 1 and triton_decode._waves(70, 1, 4096, 132) == 2

    def fake(counts: dict[bool, int]) -> None:
        class Compiled:
            def __init__(self, watched: bool) -> None:
                self.n_regs = counts[watched]

            def _init_handles(self) -> None:
                pass

        monkeypatch.setattr(triton_decode._packed_decode_kernel, "warmup",
                            lambda *args, grid, **options: Compiled(bool(args[-1])), raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
            multi_processor_count=132))

    def plan(batch: int, counts: dict[bool, int]) -> dict:
        fake(counts)
        triton_decode._plans.clear()
        pkey = ((batch, 32, 32, 128, 128, 4 * batch), 2 * 32 * 128 + 32 * 128, 32 * 128, 32, 128 * 128 * 32,
                torch.float32, "VK", False, True, False, False, -1, None, True)
        watched = triton_decode._plan(pkey)
        args = (torch.zeros(1),) * 15
        return triton_decode._register_capped(pkey, watched, args)[2]

    assert plan(8, {False: 64, True: 70}) == {"num_warps": 1, "maxnreg": 64}  # (4,096 programs: 1 wave -> 2)
    assert "maxnreg" not in plan(8, {False: 64, True: 64})  # (no wave lost)
    assert "maxnreg" not in plan(1024, {False: 64, True: 70})  # (many waves either way)
