"""The shared-memory KV tile (``kda_kernels.triton_kv_shared``, a Gluon kernel behind the Triton backend).

Gluon kernels do not run under the Triton interpreter, so on the CPU these tests check what can be
checked there: the kernel compiles for sm_90 (offline, with the ptxas Triton ships) without register
spills and with the shared memory the plan expects, ``backend="auto"`` falls back to the chunked
Triton tile where the Gluon kernel cannot run, and an explicit ``DecodeConfig(kv_shared=True)``
says why it cannot. On a CUDA device the kernel runs against the reference here (and every picked launch shape in
``benchmarks/gpu_abuse.py``; ``test_triton_decode.py``'s every-picked-config test runs on the CPU,
where it checks the refusal).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from kda_kernels import reference, triton_decode, triton_kv_shared
from kda_kernels.triton_decode import ConfigUnsupported, DecodeConfig, pick_config, picked_configs
from kda_oracle import assert_close_to_oracle, assert_pool_untouched_except, make_decode_case, run_kernel, valid_slots

triton = pytest.importorskip("triton")
# Gluon imported now, while the interpreter is on (conftest): importing it later, in a test that turns
# TRITON_INTERPRET off, would trip Gluon's import-time assertion on Triton's interpreted helpers
pytest.importorskip("triton.experimental.gluon.language")

SHARED = [c for c in picked_configs() if c.kv_shared]
CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
MEASURED = triton_kv_shared.auto_unmeasured() is None


def test_auto_takes_the_shared_tile_for_kv_from_2048_request_heads_16_bit_4096_fp32_and_gdn_from_half() -> None:
    bf16 = DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True, state_eviction="")
    fp32 = DecodeConfig(block_v=64, num_warps=1, kv_chunk=16, kv_shared=True, state_eviction="")
    assert pick_config(64, 32, 128, torch.bfloat16, "KV") == bf16
    assert pick_config(512, 4, 128, torch.float16, "KV") == bf16
    assert pick_config(256, 16, 128, torch.float32, "KV") == fp32
    assert not pick_config(32, 32, 128, torch.bfloat16, "KV").kv_shared  # 1024: the chunked tile
    assert not pick_config(64, 32, 128, torch.float32, "KV").kv_shared
    # GDN from half those sizes (its other KV shapes trail further)
    assert pick_config(32, 32, 128, torch.bfloat16, "KV", gdn=True) == bf16
    assert pick_config(64, 32, 128, torch.float32, "KV", gdn=True) == fp32
    assert not pick_config(16, 32, 128, torch.bfloat16, "KV", gdn=True).kv_shared
    assert not pick_config(32, 32, 128, torch.float32, "KV", gdn=True).kv_shared
    assert not pick_config(1024, 32, 128, torch.bfloat16, "VK").kv_shared
    # where it cannot run, the shapes picked before it
    assert pick_config(1024, 32, 128, torch.bfloat16, "KV", kv_shared=False).kv_chunk == 32
    assert set(SHARED) == {bf16, fp32}


def _plan(batch: int, hv: int, k: int, v: int, dtype: torch.dtype, config: DecodeConfig | None = None,
          gpu: int = -1) -> tuple:
    """The Triton backend's plan of a KV call, its pool on ``gpu`` (-1: the CPU)."""
    pkey = ((batch, hv, hv, k, v, 4 * batch), 2 * hv * k + hv * v, hv * k, hv, hv * k * v, dtype, "KV", False,
            True, False, False, gpu, config, False)
    return triton_decode._plan(pkey)


@pytest.mark.skipif(CUDA, reason="checks the fallback where Gluon cannot run (the interpreter)")
def test_under_the_interpreter_auto_falls_back_to_the_chunked_tile() -> None:
    # (the chunked tile itself is checked against the reference in test_triton_decode.py)
    for batch, hv, dtype, chunk in ((64, 32, torch.bfloat16, 32), (1024, 32, torch.float16, 32),
                                    (256, 16, torch.float32, 0)):
        cfg = pick_config(batch, hv, 128, dtype, "KV")
        assert cfg.kv_shared
        _, constexprs, _, _, kernel = _plan(batch, hv, 128, 128, dtype)
        assert kernel is None and constexprs[26] == chunk  # the Triton kernel, KV_CHUNK (0: the fp32 tile)
        assert constexprs[9] == pick_config(batch, hv, 128, dtype, "KV", kv_shared=False).block_v


@pytest.mark.skipif(CUDA, reason="checks the refusal where Gluon cannot run (the interpreter)")
def test_an_explicit_shared_config_says_why_it_cannot_run_under_the_interpreter() -> None:
    cfg = DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True)
    with pytest.raises(ConfigUnsupported, match=re.escape(f"{cfg} cannot run here: the Triton interpreter "
                                                          "(TRITON_INTERPRET) does not run Gluon kernels")):
        _plan(64, 32, 128, 128, torch.bfloat16, cfg)


@pytest.mark.parametrize(
    "k,v,dtype,block_v,num_warps,chunk,why",
    [
        (96, 128, torch.bfloat16, 128, 2, 16, "K = 96 is not a power of two"),
        (128, 96, torch.bfloat16, 64, 2, 16, "V = 96 is not a multiple of block_v = 64"),
        (128, 128, torch.bfloat16, 16, 4, 16, "block_v = 16 is narrower than 4 warps of 16-byte vectors (32 columns)"),
        (128, 128, torch.bfloat16, 128, 2, 256, "K = 128 is not a multiple of kv_chunk = 256"),
        (128, 128, torch.bfloat16, 128, 2, 2, "kv_chunk = 2 rows is fewer than a warp's rows of the chunk layout (4)"),
        (256, 256, torch.float32, 256, 2, 16,
         "a [256, 256] tile needs more than the 232448 bytes of shared memory a program may use"),
        (128, 128, torch.bfloat16, 128, 2, 16, None),
        (64, 64, torch.float32, 64, 1, 16, None),
    ],
)
def test_shapes_the_shared_tile_cannot_take_are_named(k: int, v: int, dtype: torch.dtype, block_v: int,
                                                       num_warps: int, chunk: int, why: str | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_kv_shared.unsupported(k, v, dtype, block_v, num_warps, chunk) == why


def test_a_slot_stride_or_base_address_off_16_bytes_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    why = triton_kv_shared.unsupported(128, 128, torch.bfloat16, 128, 2, 16, slot_stride=128 * 128 + 5)
    assert why == ("the pool's slots are 16389 elements apart, not a multiple of 16 bytes (the tile is copied in "
                   "16-byte vectors)")
    assert triton_kv_shared.unsupported(128, 128, torch.bfloat16, 128, 2, 16, slot_stride=128 * 128 + 8) is None
    assert triton_kv_shared.unsupported(128, 128, torch.float32, 64, 1, 16, slot_stride=128 * 128 + 4) is None
    pool = torch.zeros(4 * 128 * 128 + 1, dtype=torch.bfloat16)
    assert triton_kv_shared.misaligned(pool[:-1]) is None
    assert triton_kv_shared.misaligned(pool[1:]) == ("the pool's base address is not 16-byte aligned (the tile is "
                                                     "copied in 16-byte vectors)")


def test_a_misaligned_pool_takes_autos_other_shape_and_an_explicit_config_is_refused() -> None:
    # (_launch asks for this plan when the plan it holds is the shared-memory tile's and the pool's
    # base address is off 16 bytes)
    pool = torch.zeros(4 * 128 * 128 + 1, dtype=torch.bfloat16)[1:]
    pkey = ((64, 32, 32, 128, 128, 4), 2 * 32 * 128 + 32 * 128, 32 * 128, 32, 128 * 128, torch.bfloat16, "KV", False,
            True, False, False, -1, None, False)
    _, constexprs, _, _, kernel = triton_decode._misaligned_plan(pkey, pool)
    assert kernel is None and constexprs[26] == 32  # the chunked Triton tile
    cfg = pick_config(64, 32, 128, torch.bfloat16, "KV")
    why = "the pool's base address is not 16-byte aligned"
    with pytest.raises(ConfigUnsupported, match=re.escape(f"{cfg} cannot run here: {why}")):
        triton_decode._misaligned_plan((*pkey[:-2], cfg, False), pool)


def _compile_for_sm90(cases: list[dict]) -> list[dict]:
    """Each case compiled for sm_90 offline, in a fresh process with the interpreter off (see
    kv_shared_offline.py: in this one Triton's own helpers are interpreted functions)."""
    script = os.path.join(os.path.dirname(__file__), "kv_shared_offline.py")
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, script, json.dumps(cases)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _case(cfg: DecodeConfig, dtype: torch.dtype, **flags: bool) -> dict:
    return dict(config=cfg._asdict(), dtype=str(dtype).removeprefix("torch."), **flags)


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """Every picked shared config for each state dtype, and the GDN gate, bounded gate and counter."""
    cases = {f"{c.block_v}-{c.num_warps}-{dt}": _case(c, dt) for c in SHARED
             for dt in (torch.bfloat16, torch.float16, torch.float32)}
    pick = pick_config(1024, 32, 128, torch.bfloat16, "KV")
    cases["gdn"] = _case(pick, torch.bfloat16, gdn=True)
    cases["bounded-counted"] = _case(pick, torch.bfloat16, bounded=True, counted=True)
    for cfg, dt, flags in REGISTER_CASES:
        cases[_register_name(cfg, dt, flags)] = _case(cfg, dt, **flags)
    for name, (cfg, dt, layout) in STORE_ORDER_CASES.items():  # the Triton kernel (test_triton_decode.py's)
        cases[name] = _case(cfg, dt, triton=True) | {"layout": layout}
    return dict(zip(cases, _compile_for_sm90(list(cases.values())), strict=True))


# the Triton kernel's global stores in program order ("tile": the pool, "row": the output rows; the
# last "row" is the zero output of a padding or out-of-range index)
STORE_ORDER_CASES = {
    "fused-VK": (pick_config(64, 4, 128, torch.float32, "VK"), torch.float32, "VK"),
    "fused-KV": (pick_config(8, 32, 128, torch.float32, "KV"), torch.float32, "KV"),
    "unfused-VK": (pick_config(64, 32, 128, torch.bfloat16, "VK"), torch.bfloat16, "VK"),
}


@pytest.mark.parametrize("name", list(STORE_ORDER_CASES))
def test_with_the_fused_output_the_tile_is_stored_before_the_output_rows(name: str,
                                                                         compiled: dict[str, dict]) -> None:
    # the compiler keeps global stores in program order: the tile first lets its stores go out while
    # the output's sum is still reduced across lanes; unfused, the output (summed from the updated
    # tile) goes first, as measured
    cfg = STORE_ORDER_CASES[name][0]
    assert cfg.fused_output == name.startswith("fused")
    first = ["tile", "row"] if cfg.fused_output else ["row", "tile"]
    assert compiled[name]["stores"][:2] == first, compiled[name]


# the register tile (DecodeConfig.kv_registers): measured, not picked by auto (docs/lab-notes.md)
REGISTER_CASES = [
    (DecodeConfig(block_v=16, num_warps=1, kv_registers=True), torch.bfloat16, {"counted": True}),
    (DecodeConfig(block_v=32, num_warps=2, kv_registers=True), torch.bfloat16, {"gdn": True}),
    (DecodeConfig(block_v=64, num_warps=2, kv_registers=True), torch.float32, {"bounded": True}),
    (DecodeConfig(block_v=32, num_warps=1, kv_registers=True), torch.float32, {}),  # 128 per thread: the limit
]


def _register_name(cfg: DecodeConfig, dtype: torch.dtype, flags: dict) -> str:
    return f"regs-{cfg.block_v}-{cfg.num_warps}-{dtype}-" + "-".join(sorted(flags))


@pytest.mark.parametrize("cfg,dtype,flags", REGISTER_CASES,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_the_register_tile_compiles_for_sm90_with_no_shared_memory_barriers_or_layout_conversions(
        cfg: DecodeConfig, dtype: torch.dtype, flags: dict, compiled: dict[str, dict]) -> None:
    usage = compiled[_register_name(cfg, dtype, flags)]
    # the K-vectors are loaded in the tile's row layout: nothing moves between lanes through shared memory
    assert usage["shared"] == 0 and usage["cp_async"] == 0 and usage["conversions"] == 0, usage
    assert usage["stack"] == 0 and usage["local"] == 0, usage  # no spills (ptxas reports them as stack)
    if not flags.get("counted"):  # (the counter's atomic, on the out-of-range path only, may bring barriers)
        assert usage["barriers"] == 0, usage
    assert usage["stores"][0] == "tile", usage  # the tile before the output rows


def test_the_register_tile_and_the_shared_tile_exclude_each_other() -> None:
    cfg = DecodeConfig(block_v=16, num_warps=1, kv_chunk=16, kv_shared=True, kv_registers=True)
    with pytest.raises(ValueError, match=re.escape(f"{cfg}: kv_shared and kv_registers exclude each other")):
        _plan(8, 32, 128, 128, torch.float32, cfg)


def test_the_register_tile_needs_no_shared_memory_or_aligned_slots_but_must_fit_in_registers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    # slots 5 elements off 16 bytes, and a tile the shared-memory kernel could not take: fine in registers
    assert triton_kv_shared.unsupported(128, 128, torch.bfloat16, 16, 1, 128, slot_stride=128 * 128 + 5,
                                        registers=True) is None
    assert triton_kv_shared.unsupported(256, 256, torch.float32, 256, 16, 256) is not None  # shared memory
    assert triton_kv_shared.unsupported(256, 256, torch.float32, 256, 16, 256, registers=True) is None  # 128 each
    # ... but not more state elements per thread than fit in registers (more spill)
    assert triton_kv_shared.unsupported(256, 256, torch.float32, 256, 2, 256, registers=True) == (
        "a [256, 256] tile on 2 warp(s) holds 1024 state elements per thread, more than the 128 that fit in "
        "registers without spilling")
    assert triton_kv_shared.unsupported(128, 128, torch.bfloat16, 64, 1, 128, registers=True).startswith(
        "a [128, 64] tile on 1 warp(s) holds 256 state elements per thread")
    # the layout's own limits still hold, worded for the register tile
    assert triton_kv_shared.unsupported(96, 128, torch.bfloat16, 16, 1, 96, registers=True) == \
        "K = 96 is not a power of two"
    assert triton_kv_shared.unsupported(128, 128, torch.float32, 4, 2, 128, registers=True) == \
        "block_v = 4 is narrower than 2 warps of 16-byte vectors (8 columns)"
    assert triton_kv_shared.unsupported(4, 16, torch.float32, 16, 1, 4, registers=True) == \
        "K = 4 rows is fewer than a warp's rows of the chunk layout (8)"


def test_only_plans_that_copy_the_tile_need_an_aligned_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    # _launch sends a pool off 16 bytes elsewhere only for plans in _copies_tile (the cp.async copy)
    monkeypatch.setattr(triton_kv_shared, "unsupported", lambda *a, **k: None)
    monkeypatch.setattr(triton_decode, "_plans", {})
    shared = _plan(64, 32, 128, 128, torch.bfloat16, DecodeConfig(128, 2, kv_chunk=16, kv_shared=True))
    regs = _plan(64, 32, 128, 128, torch.bfloat16, DecodeConfig(16, 1, kv_registers=True))
    assert shared[4] is regs[4] is triton_kv_shared.kernel() and shared[3] != regs[3]
    assert shared[3] in triton_decode._copies_tile and regs[3] not in triton_decode._copies_tile


@pytest.mark.skipif(CUDA, reason="checks the refusal where Gluon cannot run (the interpreter)")
def test_an_explicit_register_tile_says_why_it_cannot_run_under_the_interpreter() -> None:
    cfg = DecodeConfig(block_v=16, num_warps=1, kv_registers=True)
    with pytest.raises(ConfigUnsupported, match=re.escape(f"{cfg} cannot run here: the Triton interpreter "
                                                          "(TRITON_INTERPRET) does not run Gluon kernels")):
        _plan(8, 32, 128, 128, torch.float32, cfg)
    assert not any(c.kv_registers for c in picked_configs())  # measured, not picked


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cfg", SHARED, ids=lambda c: f"bv{c.block_v}-w{c.num_warps}-ck{c.kv_chunk}")
def test_every_picked_shared_config_compiles_for_sm90(cfg: DecodeConfig, dtype: torch.dtype,
                                                     compiled: dict[str, dict]) -> None:
    usage = compiled[f"{cfg.block_v}-{cfg.num_warps}-{dtype}"]
    assert usage["shared"] == triton_kv_shared.shared_bytes(128, cfg.block_v, dtype), usage
    assert usage["cp_async"] > 0 and usage["local"] == 0, usage
    if MEASURED:  # the release it was timed with: no spills (CI's torch 2.11 job runs this file)
        assert usage["stack"] == 0, usage


@pytest.mark.skipif(not MEASURED, reason=f"spills are checked with Triton {triton_kv_shared.MEASURED_TRITON}")
def test_the_gdn_gate_bounded_gate_and_counter_compile_for_sm90_without_spills(compiled: dict[str, dict]) -> None:
    for name in ("gdn", "bounded-counted"):
        assert compiled[name]["stack"] == 0 and compiled[name]["local"] == 0, (name, compiled[name])


def test_auto_picks_the_shared_tile_only_with_the_triton_release_it_was_timed_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(triton_kv_shared, "MEASURED_TRITON", ("0.1.",))
    assert triton_kv_shared.auto_unmeasured() == f"timed with Triton 0.1 only (installed: {triton.__version__})"
    _, constexprs, _, _, kernel = _plan(1024, 32, 128, 128, torch.bfloat16)
    assert kernel is None and constexprs[26] == 32  # auto: the chunked Triton tile
    # an explicit config still runs it (compiled only when launched: the plan names the kernel)
    cfg = pick_config(1024, 32, 128, torch.bfloat16, "KV")
    assert _plan(1024, 32, 128, 128, torch.bfloat16, cfg)[4] is triton_kv_shared.kernel()
    monkeypatch.setattr(triton_kv_shared, "MEASURED_TRITON", (triton.__version__[:4],))
    assert triton_kv_shared.auto_unmeasured() is None
    assert _plan(1024, 32, 128, 128, torch.bfloat16)[4] is triton_kv_shared.kernel()


def test_the_plan_is_the_pools_gpus_on_a_machine_with_two_kinds_of_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPU 0 can run the shared-memory tile, GPU 1 (say an sm_75 card) cannot: each call's plan is made
    # for its pool's GPU and kept under it, so the first GPU's decision is not reused on the other
    seen = []

    def unsupported(*args: object, **kwargs: object) -> str | None:
        seen.append(args[-2])
        return "cp.async needs sm_80 or later" if args[-2] == torch.device("cuda", 1) else None

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton_kv_shared, "auto_unmeasured", lambda: None)
    monkeypatch.setattr(triton_kv_shared, "unsupported", unsupported)
    monkeypatch.setattr(triton_decode, "_plans", {})
    assert _plan(1024, 32, 128, 128, torch.bfloat16, gpu=0)[4] is triton_kv_shared.kernel()
    _, constexprs, _, _, kernel = _plan(1024, 32, 128, 128, torch.bfloat16, gpu=1)
    assert kernel is None and constexprs[26] == 32  # auto: the chunked Triton tile
    assert seen == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert {key[11] for key in triton_decode._plans} == {0, 1}  # kept apart (_launch looks plans up by key)
    cfg = pick_config(1024, 32, 128, torch.bfloat16, "KV")
    with pytest.raises(ConfigUnsupported, match=r"cannot run here: cp.async needs sm_80 or later"):
        _plan(1024, 32, 128, 128, torch.bfloat16, cfg, gpu=1)
    # and a launch's key holds its pool's device (the CPU's -1 under the interpreter)
    monkeypatch.setattr(triton_decode, "_plans", {})
    case = make_decode_case(batch=2, num_slots=4, num_heads=1, num_v_heads=1, head_k_dim=16, head_v_dim=16,
                            state_layout="KV", device="cuda" if CUDA else "cpu")
    run_kernel(triton_decode.packed_decode, case)
    assert [key[11] for key in triton_decode._plans] == [case.state.get_device()]


# --- on a CUDA device -----------------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="the Gluon kernel runs on a CUDA device only (the CPU tests above compile it)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "k,v,cfg",
    [
        (128, 128, DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True, state_eviction="")),
        (128, 128, DecodeConfig(block_v=64, num_warps=1, kv_chunk=16, kv_shared=True, state_eviction="")),
        (128, 128, DecodeConfig(block_v=128, num_warps=4, kv_chunk=32, kv_shared=True)),
        (64, 128, DecodeConfig(block_v=32, num_warps=1, kv_chunk=8, kv_shared=True, act_eviction="evict_last")),
        (128, 64, DecodeConfig(block_v=64, num_warps=2, kv_chunk=64, kv_shared=True, store_eviction="evict_first")),
        (128, 128, DecodeConfig(block_v=16, num_warps=1, kv_registers=True)),
        (64, 128, DecodeConfig(block_v=32, num_warps=2, kv_registers=True, act_eviction="evict_last")),
    ],
    ids=["bf16-pick", "fp32-pick", "w4-ck32", "K64-bv32-ck8", "V64-ck64", "regs-bv16", "regs-K64-bv32-w2"],
)
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "bounded"])
def test_on_cuda_the_shared_tile_matches_the_reference_with_padding_and_out_of_range_indices(
        k: int, v: int, cfg: DecodeConfig, dtype: torch.dtype, lower_bound: float | None) -> None:
    case = make_decode_case(batch=9, num_heads=2, num_v_heads=4, head_k_dim=k, head_v_dim=v, state_dtype=dtype,
                            act_dtype=torch.bfloat16, state_layout="KV", lower_bound=lower_bound,
                            indices=[3, -1, 17, 40, 0, 11, -5, 8, 2], num_slots=18, slot_pad=8, row_pad=8,
                            device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, state = run_kernel(triton_decode.packed_decode, case, oob_counter=counter, config=cfg)
    ref_out, ref_state = run_kernel(reference.packed_decode, case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
    assert_pool_untouched_except(case.state, state, valid_slots(case.indices, case.state.shape[0]))
    assert out[1].eq(0).all() and out[3].eq(0).all() and out[6].eq(0).all()
    assert counter.item() == 1  # the index 40 >= N = 18


@pytest.mark.skipif(not CUDA, reason="the Gluon kernel runs on a CUDA device only (the CPU tests above compile it)")
def test_on_cuda_gdn_through_the_shared_tile_matches_the_reference() -> None:
    from kda_kernels.gdn_reference import gdn_packed_decode as gdn_reference

    cfg = pick_config(1024, 32, 128, torch.bfloat16, "KV")
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, HV, K, V, N = 6, 2, 4, 128, 128, 12
    rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=g)  # noqa: E731
    qkv, a, b = rnd(B, 2 * H * K + HV * V).bfloat16(), rnd(B, HV).bfloat16(), rnd(B, HV).bfloat16()
    A_log, dt_bias = rnd(HV), rnd(HV)
    pool = (0.1 * rnd(N, HV, K, V)).bfloat16()
    idx = torch.tensor([5, -1, 2, 30, 0, 7], dtype=torch.int32, device="cuda")
    got, ref = pool.clone(), pool.clone()
    out, ref_out = torch.full((B, 1, HV, V), 7.0, device="cuda").bfloat16(), torch.zeros(B, 1, HV, V).bfloat16().cuda()
    triton_decode.gdn_packed_decode(qkv, a, b, A_log, dt_bias, K**-0.5, got, out, idx, num_heads=H,
                                    use_qk_l2norm=True, lower_bound=None, state_layout="KV", config=cfg)
    gdn_reference(qkv, a, b, A_log, dt_bias, K**-0.5, ref, ref_out, idx, num_heads=H, use_qk_l2norm=True,
                  state_layout="KV")
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(got, ref)
    assert_pool_untouched_except(pool, got, [5, 2, 0, 7])
    assert out[1].eq(0).all() and out[3].eq(0).all()


@pytest.mark.skipif(not CUDA or not MEASURED, reason="auto takes the Gluon kernel on CUDA with Triton 3.6")
@pytest.mark.parametrize("misfit", ["odd slot stride", "base off 16 bytes"])
def test_on_cuda_a_pool_the_tile_cannot_copy_takes_the_chunked_tile_with_auto(misfit: str) -> None:
    case = make_decode_case(batch=64, num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                            state_dtype=torch.bfloat16, act_dtype=torch.bfloat16, state_layout="KV", device="cuda",
                            slot_pad=5 if misfit == "odd slot stride" else 0, indices=[-1, 200, *range(2, 64)],
                            num_slots=70)
    pool = case.clone_state()
    if misfit == "base off 16 bytes":  # the same pool one element further on in a larger buffer
        buf = torch.empty(pool.numel() + 1, dtype=pool.dtype, device="cuda")
        pool = buf[1:].view(pool.shape).copy_(pool)
        assert triton_kv_shared.misaligned(pool) is not None
    ref_pool, out, ref_out = pool.clone(), case.new_out(), case.new_out()
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.scale)
    kw = dict(num_heads=32, use_qk_l2norm=True, lower_bound=None, state_layout="KV")
    triton_decode.packed_decode(*args, pool, out, case.indices, **kw)
    reference.packed_decode(*args, ref_pool, ref_out, case.indices, **kw)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(pool, ref_pool)
    with pytest.raises(ConfigUnsupported, match="cannot run here: the pool's"):
        triton_decode.packed_decode(*args, pool, out, case.indices, **kw,
                                    config=pick_config(64, 32, 128, torch.bfloat16, "KV"))


@pytest.mark.skipif(not CUDA, reason="the Gluon kernel runs on a CUDA device only")
def test_on_cuda_the_register_tile_runs_on_a_pool_off_16_bytes() -> None:
    # no cp.async: a pool whose base address is off 16 bytes runs (the loads narrow)
    case = make_decode_case(batch=5, num_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=128,
                            state_dtype=torch.float32, act_dtype=torch.bfloat16, state_layout="KV", device="cuda",
                            indices=[3, -1, 0, 9, 5], num_slots=8)
    buf = torch.empty(case.state.numel() + 1, dtype=case.state.dtype, device="cuda")
    pool = buf[1:].view(case.state.shape).copy_(case.state)
    assert triton_kv_shared.misaligned(pool) is not None
    before = buf.clone()[1:].view(case.state.shape)  # the same storage layout, for the untouched check
    ref_pool, out, ref_out = pool.clone(), case.new_out(), case.new_out()
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.scale)
    kw = dict(num_heads=2, use_qk_l2norm=True, lower_bound=None, state_layout="KV")
    triton_decode.packed_decode(*args, pool, out, case.indices, **kw,
                                config=DecodeConfig(block_v=16, num_warps=1, kv_registers=True))
    reference.packed_decode(*args, ref_pool, ref_out, case.indices, **kw)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(pool, ref_pool)
    assert_pool_untouched_except(before, pool, [3, 0, 5])


@pytest.mark.skipif(not CUDA, reason="the Gluon kernel runs on a CUDA device only")
def test_on_cuda_auto_runs_the_shared_tile_and_the_fast_launch_reuses_it() -> None:
    case = make_decode_case(batch=64, num_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                            state_dtype=torch.bfloat16, act_dtype=torch.bfloat16, state_layout="KV", device="cuda")
    for _ in range(3):
        out, state = run_kernel(triton_decode.packed_decode, case)
    ref_out, ref_state = run_kernel(reference.packed_decode, case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
    plans = [p for k, p in triton_decode._plans.items() if k[0][:2] == (64, 32) and k[6] == "KV"]
    assert plans and plans[-1][4] is triton_kv_shared.kernel()
    assert any(key[1] == plans[-1][3] for key in triton_decode._fast_launch["cache"])
