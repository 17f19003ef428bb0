"""Specification tests for ``kda_kernels.interface``: what every packed-decode backend shares.

The layouts, the q/k/v split, the padding-safe row scatter and the backend signature, each pinned
on its own; the backends' agreement with the oracle is tested in their own files.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch
from kda_kernels import fla_decode, helion_decode, reference, triton_decode
from kda_kernels.interface import (
    DecodeArgs,
    DecodeBackend,
    DecodeDims,
    check_layout,
    decode_dims,
    row_slots,
    scatter_rows,
    split_qkv,
    state_as_vk,
    state_kv,
    valid_rows,
)

# --- layouts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_check_layout_returns_a_known_layout(layout: str) -> None:
    assert check_layout(layout) == layout


@pytest.mark.parametrize("layout", ["vk", "kv", "", "VKV", None])
def test_check_layout_rejects_anything_else_naming_it(layout: str) -> None:
    with pytest.raises(ValueError, match=rf"^state_layout must be 'VK' or 'KV', got {layout!r}$"):
        check_layout(layout)


def test_state_kv_reads_k_last_in_vk_and_v_last_in_kv() -> None:
    state = torch.zeros(5, 2, 3, 7)
    assert state_kv(state, "VK") == (7, 3)
    assert state_kv(state, "KV") == (3, 7)


def test_state_kv_rejects_an_unknown_layout() -> None:
    with pytest.raises(ValueError, match="got 'vk'"):
        state_kv(torch.zeros(1, 1, 2, 2), "vk")


def test_state_as_vk_is_the_pool_itself_or_a_transposed_view_that_writes_through() -> None:
    state = torch.zeros(2, 3, 4, 5)  # KV: K=4, V=5
    assert state_as_vk(state, "VK") is state
    vk = state_as_vk(state, "KV")
    assert vk.shape == (2, 3, 5, 4) and vk.data_ptr() == state.data_ptr()
    vk[1, 2, 0, 3] = 1.0  # v=0, k=3
    assert state[1, 2, 3, 0] == 1.0 and state.sum() == 1.0


def test_decode_dims_reads_every_dim_once() -> None:
    state, indices = torch.zeros(9, 4, 3, 16), torch.zeros(2, dtype=torch.int32)
    assert decode_dims(state, indices, 2, "VK") == DecodeDims(2, 2, 4, 16, 3, 9)
    assert decode_dims(state, indices, 2, "KV") == DecodeDims(2, 2, 4, 3, 16, 9)


# --- the q/k/v split ------------------------------------------------------------------------------


def test_split_qkv_returns_q_k_v_views_in_that_order() -> None:
    H, HV, K, V = 2, 4, 3, 5
    x = torch.arange(2 * (2 * H * K + HV * V), dtype=torch.float32).view(2, -1)
    q, k, v = split_qkv(x, H, HV, K, V)
    assert (q.shape, k.shape, v.shape) == ((2, H, K), (2, H, K), (2, HV, V))
    assert torch.equal(q[1, 1], x[1, K : 2 * K])
    assert torch.equal(k[1, 0], x[1, H * K : H * K + K])
    assert torch.equal(v[1, 3], x[1, 2 * H * K + 3 * V : 2 * H * K + 4 * V])
    assert all(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in (q, k, v))


def test_split_qkv_keeps_a_padded_row_stride_and_the_dtype() -> None:
    H, HV, K, V = 1, 2, 4, 2
    wide = torch.randn(3, 2 * H * K + HV * V + 5, dtype=torch.bfloat16)
    x = wide[:, : 2 * H * K + HV * V]
    q, k, v = split_qkv(x, H, HV, K, V)
    assert {t.dtype for t in (q, k, v)} == {torch.bfloat16}
    assert q.stride(0) == k.stride(0) == v.stride(0) == wide.stride(0)
    assert torch.equal(v[2, 1], x[2, 2 * H * K + V :])


# --- rows that may touch the pool -----------------------------------------------------------------


def test_valid_rows_are_those_with_an_index_in_0_to_n() -> None:
    assert valid_rows(torch.tensor([0, 7, 8, -1, 100]), 8).tolist() == [True, True, False, False, False]


def test_row_slots_send_invalid_rows_to_the_first_valid_rows_slot() -> None:
    rs = row_slots(torch.tensor([-1, 9, 4, 2], dtype=torch.int32), 8)
    assert rs.valid.tolist() == [False, False, True, True]
    assert rs.slots.tolist() == [4, 4, 4, 2] and rs.slots.dtype == torch.int64
    assert rs.donor.tolist() == [2] and rs.any_valid.tolist() == [True]


def test_row_slots_send_every_row_to_slot_0_when_none_is_valid() -> None:
    rs = row_slots(torch.tensor([-1, 8]), 8)
    assert rs.slots.tolist() == [0, 0] and rs.any_valid.tolist() == [False]


def _pool(n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # Distinct, non-trivial bytes in every slot (NaN included) so bit equality means untouched.
    pool = torch.randn(n, 2, 3).to(dtype)
    pool[0, 0, 0] = float("nan")
    return pool


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_scatter_rows_writes_valid_rows_and_skips_padding_and_out_of_range(index_dtype: torch.dtype) -> None:
    pool = _pool()
    before = pool.clone()
    rows = torch.randn(5, 2, 3)
    indices = torch.tensor([3, -1, 6, 1, -7], dtype=index_dtype)
    scatter_rows(pool, indices, rows)
    assert torch.equal(pool[3], rows[0]) and torch.equal(pool[1], rows[3])
    untouched = [0, 2, 4, 5]
    assert torch.equal(_bits(pool[untouched]), _bits(before[untouched]))


def test_scatter_rows_with_no_valid_index_leaves_the_pool_bit_identical() -> None:
    pool = _pool()
    before = pool.clone()
    scatter_rows(pool, torch.tensor([-1, 6, 1000]), torch.randn(3, 2, 3))
    assert torch.equal(_bits(pool), _bits(before))


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_scatter_rows_casts_rows_to_the_pool_dtype(pool_dtype: torch.dtype) -> None:
    pool = torch.zeros(4, 3, dtype=pool_dtype)
    rows = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    scatter_rows(pool, torch.tensor([2, 0]), rows)
    assert pool.dtype == pool_dtype
    assert torch.equal(pool[[2, 0]], rows.to(pool_dtype)) and pool[[1, 3]].eq(0).all()


def test_scatter_rows_writes_through_a_strided_view_of_the_pool() -> None:
    base = torch.zeros(4, 3, 2)
    view = base.transpose(1, 2)  # [4, 2, 3], not contiguous
    scatter_rows(view, torch.tensor([1, -1]), torch.ones(2, 2, 3))
    assert base[1].eq(1).all() and base[[0, 2, 3]].eq(0).all()


@pytest.mark.parametrize("shape", [(0, 2, 3), (4, 2, 3)], ids=["empty_pool", "empty_batch"])
def test_scatter_rows_is_a_noop_for_an_empty_pool_or_batch(shape: tuple[int, ...]) -> None:
    pool = torch.zeros(shape)
    batch = 0 if shape[0] else 2
    scatter_rows(pool, torch.full((batch,), 0), torch.ones(batch, 2, 3))
    assert pool.eq(0).all()


def test_scatter_rows_never_syncs_with_the_host() -> None:
    if not torch.cuda.is_available():
        pytest.skip("sync detection needs a CUDA device")
    pool = torch.zeros(8, 4, device="cuda")
    indices = torch.tensor([5, -1, 9], device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        scatter_rows(pool, indices, torch.ones(3, 4, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert pool[5].eq(1).all() and pool.sum() == 4


# --- the backend signature ------------------------------------------------------------------------


def _args(batch: int = 2, layout: str = "VK") -> tuple[tuple, dict]:
    H, HV, K, V, N = 1, 2, 4, 3, 5
    state = torch.zeros(N, HV, V, K) if layout == "VK" else torch.zeros(N, HV, K, V)
    args = (torch.zeros(batch, 2 * H * K + HV * V), torch.zeros(batch, HV * K), torch.zeros(batch, HV),
            torch.zeros(HV), torch.zeros(HV * K), 0.5, state, torch.zeros(batch, 1, HV, V),
            torch.arange(batch))
    return args, dict(num_heads=H, use_qk_l2norm=True, lower_bound=None, state_layout=layout)


def test_a_backend_receives_the_arguments_in_order_with_the_dims_and_its_options() -> None:
    seen: list[tuple[DecodeArgs, dict]] = []

    @DecodeBackend
    def run(call: DecodeArgs, **options: object) -> None:
        seen.append((call, options))

    args, kwargs = _args(layout="KV")
    run(*args, **kwargs, config="c")
    (call, options), = seen
    assert all(x is y for x, y in zip(call[:9], args, strict=True))
    assert call[9:13] == (1, True, None, "KV")
    assert call.dims == DecodeDims(batch=2, num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=3, num_slots=5)
    assert options == {"config": "c"}


def test_a_backend_is_not_run_for_an_empty_batch() -> None:
    run = DecodeBackend(lambda call: pytest.fail("ran on an empty batch"))
    args, kwargs = _args(batch=0)
    run(*args, **kwargs)


def test_a_backend_rejects_an_unknown_layout_before_running() -> None:
    run = DecodeBackend(lambda call: pytest.fail("ran with a bad layout"))
    args, kwargs = _args()
    with pytest.raises(ValueError, match="got 'kv'"):
        run(*args, **{**kwargs, "state_layout": "kv"})


@pytest.mark.parametrize("backend", [reference.packed_decode, triton_decode.packed_decode,
                                     helion_decode.packed_decode, helion_decode.launch, fla_decode.packed_decode])
def test_every_backend_has_the_interface_signature_and_its_own_name_and_docs(backend: DecodeBackend) -> None:
    assert isinstance(backend, DecodeBackend)
    params = list(inspect.signature(backend).parameters)
    assert params[:9] == ["mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "state", "out", "indices"]
    assert params[9:13] == ["num_heads", "use_qk_l2norm", "lower_bound", "state_layout"]
    assert backend.__name__ == backend.run.__name__ and backend.__doc__ == backend.run.__doc__


def test_the_interface_and_the_reference_import_no_kernel_language() -> None:
    code = ("import sys, kda_kernels.interface, kda_kernels.reference; "
            "print(sorted(m for m in ('triton', 'helion', 'fla') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_in_compiled_code_a_backend_runs_through_one_custom_op_that_passes_opcheck() -> None:
    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    call = make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)
    args = ("kda_kernels.reference.packed_decode", *(call[k] for k in (
        "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices")),
        cfg.num_heads, True, None, "VK", None)
    assert reference.packed_decode.key == args[0]
    result = torch.library.opcheck(torch.ops.kda_kernels.packed_decode.default, args)
    assert set(result.values()) == {"SUCCESS"}
    # the op is the backend: same bits as calling it directly
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}
    torch.ops.kda_kernels.packed_decode(*args)
    reference.packed_decode(ref["mixed_qkv"], ref["a"], ref["b"], ref["A_log"], ref["dt_bias"], ref["scale"],
                            ref["initial_state"], ref["out"], ref["ssm_state_indices"], num_heads=cfg.num_heads,
                            use_qk_l2norm=True, lower_bound=None)
    assert torch.equal(call["out"], ref["out"]) and torch.equal(call["initial_state"], ref["initial_state"])


def test_under_compile_a_tuning_option_other_than_the_oob_counter_is_refused() -> None:
    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    call = make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)

    def step(c):
        reference.packed_decode(c["mixed_qkv"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["scale"],
                                c["initial_state"], c["out"], c["ssm_state_indices"], num_heads=2,
                                use_qk_l2norm=True, lower_bound=None, config="tuned")
        return c["out"]

    torch._dynamo.reset()
    # raised in traced code: dynamo reports it as an "observed exception" carrying the message
    refused = (TypeError, torch._dynamo.exc.Unsupported)
    with pytest.raises(refused, match=r"takes no option but oob_counter= \(got config\)"):
        torch.compile(step, fullgraph=True, backend="eager")(call)


def test_backends_made_by_one_factory_get_distinct_keys_and_compiled_code_runs_each() -> None:
    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call

    ran: list[int] = []

    def make(tag: int) -> DecodeBackend:
        def run(call) -> None:
            ran.append(tag)
        return DecodeBackend(run)

    first, second = make(1), make(2)
    assert first.key != second.key and second.key == first.key + "#2"
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    call = make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)
    args = [call[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
                              "ssm_state_indices")]
    for backend, tag in ((first, 1), (second, 2)):
        torch._dynamo.reset()
        torch.compile(lambda *a, be=backend: be(*a, num_heads=2, use_qk_l2norm=True, lower_bound=None),
                      fullgraph=True, backend="eager")(*args)
        assert ran[-1] == tag


# --- the pool's GPU -------------------------------------------------------------------------------
# Triton and Helion launch on the current CUDA device; a call whose tensors sit on another GPU runs
# with that GPU made current for the call (as torch's own ops do), and the caller's current device
# is left as it was.

TWO_GPUS = torch.cuda.device_count() >= 2 and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def test_a_cpu_call_never_asks_cuda_for_its_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise AssertionError("asked for the current CUDA device")

    monkeypatch.setattr(torch.cuda, "current_device", refuse)
    seen: list[DecodeDims] = []
    backend = DecodeBackend(lambda call: seen.append(call.dims))
    args, kwargs = _args()
    backend(*args, **kwargs)
    backend.launch(tuple(seen[0]), *args[:9], True, None, "VK")
    assert seen == [seen[0]] * 2


def test_a_pool_on_another_gpu_is_run_with_that_gpu_current(monkeypatch: pytest.MonkeyPatch) -> None:
    # (on the CPU, with CUDA's answers faked; the two-GPU tests below run it for real)
    from kda_kernels import interface

    class Pool:  # what _elsewhere reads of a CUDA pool
        is_cuda = True

        def __init__(self, index: int) -> None:
            self.index = index

        def get_device(self) -> int:
            return self.index

    entered: list[torch.device] = []

    class Guard:
        def __init__(self, device: torch.device) -> None:
            entered.append(device)

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            entered.append(None)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Guard)
    for gpus, pool, elsewhere in ((1, 0, False), (2, 0, False), (2, 1, True)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        monkeypatch.setattr(interface, "_SEVERAL_GPUS", [])
        assert interface._elsewhere(Pool(pool)) is elsewhere
    assert interface._elsewhere(torch.zeros(1)) is False  # a CPU pool
    ran: list[str] = []
    interface._run_on(torch.device("cuda", 1), lambda call, **options: ran.append(call + str(options)), "call",
                      {"config": 1})
    assert entered == [torch.device("cuda", 1), None] and ran == ["call{'config': 1}"]

    # both ways into a backend go through it, and the guard is left when the backend raises
    monkeypatch.setattr(interface, "_elsewhere", lambda state: True)
    inside: list[int] = []

    def run(call: DecodeArgs, **options: object) -> None:
        inside.append(len(entered))
        if options:
            raise RuntimeError("a failing kernel")

    backend = DecodeBackend(run)
    args, kwargs = _args()
    entered.clear()
    backend(*args, **kwargs)
    backend.launch((2, 1, 2, 4, 3, 5), *args[:9], True, None, "VK")
    with pytest.raises(RuntimeError, match="a failing kernel"):
        backend(*args, **kwargs, config="c")
    assert inside == [1, 3, 5] and entered == [torch.device("cpu"), None] * 3  # entered with the pool's device


def _on_second_gpu(name: str) -> tuple[DecodeBackend, dict]:
    """The backend and options of a case of the two-GPU test."""
    if name == "helion" and not helion_decode.is_available()[0]:
        pytest.skip(helion_decode.is_available()[1])
    if name == "fla" and not fla_decode.is_available()[0]:
        pytest.skip(fla_decode.is_available()[1])
    if name == "triton-kv-shared":
        cfg = triton_decode.DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True, state_eviction="")
        return triton_decode.packed_decode, {"config": cfg}
    return {"reference": reference.packed_decode, "triton": triton_decode.packed_decode,
            "helion": helion_decode.packed_decode, "fla": fla_decode.packed_decode}[name], {}


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA devices")
@pytest.mark.parametrize("name", ["reference", "triton", "triton-kv-shared", "helion", "fla"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_a_call_whose_tensors_sit_on_the_second_gpu_runs_there_while_the_first_is_current(
        name: str, layout: str) -> None:
    from kda_oracle import assert_close_to_oracle, assert_pool_untouched_except, make_decode_case, run_kernel

    if name == "triton-kv-shared" and layout == "VK":
        pytest.skip("the shared-memory tile is the KV layout's")
    backend, options = _on_second_gpu(name)
    fla_safe = name == "fla"  # fla's kernel takes in-range indices only (the adapter drops the others)
    case = make_decode_case(batch=9, num_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=128,
                            state_dtype=torch.bfloat16, act_dtype=torch.bfloat16, state_layout=layout,
                            indices=[3, -1, 17, 40, 0, 11, -5, 8, 2] if not fla_safe else [3, 17, 0, 11, 8, 2],
                            num_slots=18, device="cuda:1")
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        ref_out, ref_state = run_kernel(reference.packed_decode, case)
    out, state = run_kernel(backend, case, **options)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    assert out.device == state.device == torch.device("cuda", 1)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
    assert_pool_untouched_except(case.state, state, [s for s in case.indices.tolist() if 0 <= s < 18])


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA devices")
def test_the_op_on_the_second_gpu_matches_the_reference_there_with_auto() -> None:
    import kda_contracts as kc
    from kda_contracts.testing import make_decode_call

    torch.cuda.set_device(0)
    for layout in ("VK", "KV"):
        cfg = kc.KDAConfig(num_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, state_layout=layout)
        for batch in (1, 64, 256):  # the KV pool's shared-memory tile from B·HV = 2048 (Triton 3.6)
            call = make_decode_call(cfg, batch, 2 * batch + 8, state_dtype=torch.bfloat16, device="cuda:1")
            ref = dict(call, initial_state=call["initial_state"].clone(), out=call["out"].clone())
            out, state = kc.packed_decode(**call, config=cfg)
            ref_out, ref_state = kc.packed_decode(**ref, config=cfg, backend="torch")
            assert torch.cuda.current_device() == 0 and out.device == torch.device("cuda", 1)
            torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-3, rtol=2**-7)
            torch.testing.assert_close(state.float(), ref_state.float(), atol=2e-3, rtol=2**-7)
