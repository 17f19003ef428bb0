"""The packed-prefill contracts: every mistake of both catalogues is caught with its pinned message
and fix, the value rules of strict mode (``cu_seqlens`` offsets, slots) are pinned, and the docs
parts render."""

from __future__ import annotations

import pytest
import torch

import kda_contracts as kc
from kda_contracts.ops._packed.prefill import make_prefill_call
from kda_contracts.ops.gdn_prefill import mistakes as gdn_mistakes
from kda_contracts.ops.packed_prefill import mistakes as kda_mistakes

# key (without its op prefix) -> the violation line, the expected line, a piece of the fix
SHARED = {
    "int64-cu-seqlens": ("[1] cu_seqlens: DtypeError", "expected int32", "cu_seqlens must be int32"),
    "cu-seqlens-without-zero": ("[1] cu_seqlens: ShapeError", "expected [B+1] = [5]",
                                "it needs B+1 offsets starting with 0"),
    "padded-activations": ("[1] mixed_qkv: ShapeError", "expected [T, 2*H*K+HV*V] (rank 2)",
                           "looks padded per sequence ([2, 5,"),
    "decode-shaped-out": ("[1] out: ShapeError", "expected [T, HV, V] (rank 3)", "prefill writes one row per token"),
    "int-mask": ("[1] has_initial_state: DtypeError", "expected bool", "pass has_initial_state.bool()"),
    "cu-seqlens-offset": ("[1] cu_seqlens: ValueRangeError", "expected cu_seqlens[0] == 0 (its first element)",
                          "must subtract its first offset"),
    "lengths-not-offsets": ("[1] cu_seqlens: ValueRangeError",
                            "expected non-decreasing values",
                            "pass cumulative offsets, not the lengths"),
    "duplicate-slots": ("[1] ssm_state_indices: ValueRangeError", "expected distinct values (negatives are padding)",
                        "give each its own slot"),
    "index-past-pool": ("[1] ssm_state_indices: ValueRangeError", "expected < N=8 (negatives are padding)",
                        "an index past the pool"),
}
KDA_PINS = {"prefill-gdn-shaped-a": ("[1] a: ShapeError", "expected [T, HV*K] = [10, 4096]", None),
            "prefill-token-rows": ("[1] a: ShapeError", "expected [T, HV*K] = [10, 4096]", "`a` has 9 rows"),
            **{"prefill-" + k: v for k, v in SHARED.items()}}
GDN_PINS = {"gdn-prefill-kda-shaped-a": ("[1] a: ShapeError", "expected [T, HV] = [10, 32]", None),
            "gdn-prefill-token-rows": ("[1] a: ShapeError", "expected [T, HV] = [10, 32]", "`a` has 9 rows"),
            **{"gdn-prefill-" + k: v for k, v in SHARED.items()}}
CASES = [(kda_mistakes, "kimi-linear-48b-a3b", m, KDA_PINS) for m in kda_mistakes.MISTAKES] + \
        [(gdn_mistakes, "qwen3-next-80b-a3b", m, GDN_PINS) for m in gdn_mistakes.MISTAKES]


def test_every_mistake_has_a_pin():
    assert {m.key for _, _, m, _ in CASES} == {*KDA_PINS, *GDN_PINS}


@pytest.mark.parametrize("catalogue, preset, mistake, pins", CASES, ids=[c[2].key for c in CASES])
def test_each_mistake_is_caught_with_its_pinned_message(catalogue, preset, mistake, pins):
    cfg = (kc.GDNConfig if catalogue is gdn_mistakes else kc.KDAConfig).preset(preset)
    r = catalogue.reproduce(mistake, cfg)
    lines = [line.strip() for line in r.message.splitlines()]
    op = "gdn_packed_prefill" if catalogue is gdn_mistakes else "packed_prefill"
    assert lines[0].startswith(f"{op}(): ")
    violation, expected, fix = pins[mistake.key]
    assert (lines[1], lines[2]) == (violation, expected)
    assert r.error == mistake.error.__name__
    if fix is not None:
        assert fix in r.message


CFG = kc.KDAConfig(num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
DIMS = ("  dims: T=5 from mixed_qkv.shape[0]; H=1 from config (num_heads=1); HV=2 from config (num_v_heads=2); "
        "K=4 from config (head_k_dim=4); V=4 from config (head_v_dim=4); N=4 from initial_state.shape[0]; "
        "B=2 from ssm_state_indices.shape[0]")


def _message(strict=False, **changes):
    call = {**make_prefill_call(CFG, [2, 3], pool=4), **changes}
    with pytest.raises(kc.ContractError) as info, kc.mode("strict" if strict else "check"):
        kc.packed_prefill(**call, config=CFG)
    return str(info.value)


def test_int64_cu_seqlens_is_a_dtype_error():
    assert _message(cu_seqlens=torch.tensor([0, 2, 5])) == "\n".join([
        "packed_prefill(): 1 contract violation",
        "  [1] cu_seqlens: DtypeError",
        "      expected int32",
        "      got      int64",
        "      fix: cu_seqlens must be int32, as the varlen kernels (flash-attention, flash-linear-attention) take it: "
        "build it once per batch with dtype=torch.int32 (torch.cumsum gives int64: cast it)",
        DIMS])


def test_cu_seqlens_not_starting_at_zero_is_caught_in_strict_mode_only():
    bad = torch.tensor([1, 3, 5], dtype=torch.int32)
    assert _message(strict=True, cu_seqlens=bad) == "\n".join([
        "packed_prefill(): 1 contract violation",
        "  [1] cu_seqlens: ValueRangeError",
        "      expected cu_seqlens[0] == 0 (its first element)",
        "      got      cu_seqlens[0] = 1",
        "      fix: cu_seqlens are offsets into the packed tokens, [0, len0, len0+len1, ...]; a batch sliced out of a "
        "larger one must subtract its first offset (cu - cu[0])",
        DIMS])
    kc.validate_packed_prefill(**{**make_prefill_call(CFG, [2, 3], pool=4), "cu_seqlens": bad}, config=CFG,
                               strict=False)  # shapes and dtypes are right: check mode passes it


def test_a_per_token_tensor_with_another_t_is_a_shape_error():
    call = make_prefill_call(CFG, [2, 3], pool=4)
    assert _message(b=call["b"][:4]) == "\n".join([
        "packed_prefill(): 1 contract violation",
        "  [1] b: ShapeError",
        "      expected [T, HV] = [5, 2]",
        "      got      [4, 2]",
        "      dim 0 (T): expected 5 (T from mixed_qkv.shape[0]), got 4",
        "      fix: `b` has 4 rows, mixed_qkv 5: every per-token tensor (mixed_qkv, a, b, out) has one row per packed "
        "token, T = cu_seqlens[-1]; build them from the same packed batch",
        DIMS])


def test_duplicate_slots_are_caught_in_strict_mode():
    assert _message(strict=True, ssm_state_indices=torch.tensor([2, 2], dtype=torch.int32)) == "\n".join([
        "packed_prefill(): 1 contract violation",
        "  [1] ssm_state_indices: ValueRangeError",
        "      expected distinct values (negatives are padding)",
        "      got      1 duplicate value(s); the first: ssm_state_indices[1] = 2, also at ssm_state_indices[0]",
        "      fix: two sequences on one slot race on its state (a lost update); give each its own slot, mark padding "
        "with -1",
        DIMS])


def test_a_rejected_strict_call_leaves_the_pool_and_out_untouched():
    call = make_prefill_call(CFG, [2, 3], pool=4)
    before, out = call["initial_state"].clone(), call["out"].clone()
    with pytest.raises(kc.ContractError), kc.mode("strict"):
        kc.packed_prefill(**{**call, "cu_seqlens": torch.tensor([0, 2, 4], dtype=torch.int32)}, config=CFG)
    assert torch.equal(call["initial_state"], before) and torch.equal(call["out"], out)


def test_gdn_prefill_checks_the_same_rules():
    cfg = kc.GDNConfig(num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
    call = make_prefill_call(cfg, [2, 3], pool=4, gdn=True)
    ends = r"expected cu_seqlens\[-1\] == T=5 \(its last element\)\n +got +cu_seqlens\[2\] = 4"
    with pytest.raises(kc.ValueRangeError, match=ends), kc.mode("strict"):
        kc.gdn_packed_prefill(**{**call, "cu_seqlens": torch.tensor([0, 2, 4], dtype=torch.int32)}, config=cfg)
    dims = kc.validate_gdn_packed_prefill(**call, config=cfg, strict=True)
    assert (dims.T, dims.B, dims.H, dims.HV) == (5, 2, 1, 2)


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_watch_mode_checks_the_same_rules_and_on_the_cpu_raises_before_the_kernel(gdn):
    cfg = (kc.GDNConfig if gdn else kc.KDAConfig)(num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
    op = kc.gdn_packed_prefill if gdn else kc.packed_prefill
    call = make_prefill_call(cfg, [2, 3], pool=4, gdn=gdn)
    before, out = call["initial_state"].clone(), call["out"].clone()
    with kc.mode("watch"):
        op(**call, config=cfg)  # a valid call: nothing reported
        for bad, match in ((torch.tensor([1, 3, 5], dtype=torch.int32), r"cu_seqlens\[0\] = 1"),
                           (torch.tensor([0, 4, 2], dtype=torch.int32), r"cu_seqlens\[2\] = 2 after 4")):
            done = {**call, "cu_seqlens": bad, "initial_state": before.clone(), "out": out.clone()}
            with pytest.raises(kc.ValueRangeError, match=match):
                op(**done, config=cfg)
            assert torch.equal(done["initial_state"], before) and torch.equal(done["out"], out)  # (no kernel ran)
    kc.raise_pending()  # nothing left pending


def test_a_new_sequence_may_start_in_a_slot_holding_nan_but_a_continuing_one_may_not():
    call = make_prefill_call(CFG, [2, 3], pool=4)
    slot = int(call["ssm_state_indices"][1])
    call["initial_state"][slot] = float("nan")
    with kc.mode("strict"):
        kc.packed_prefill(**{**call, "has_initial_state": torch.tensor([True, False])}, config=CFG)  # overwritten
        assert torch.isfinite(call["initial_state"][slot]).all()
        call["initial_state"][slot] = float("nan")
        with pytest.raises(kc.ValueRangeError, match=r"names where has_initial_state\n +got +NaN or Inf in a used "
                                                     r"row: 1 row\(s\); the first: initial_state\[" + str(slot)):
            kc.packed_prefill(**{**call, "has_initial_state": torch.tensor([True, True])}, config=CFG)


def test_the_generated_docs_document_both_prefill_ops():
    from kda_contracts._app.docs import generate

    files = generate(kc.KDAConfig.preset("kimi-linear-48b-a3b"), "kimi-linear-48b-a3b, tp_size=1")
    for title in ("## KDA packed prefill (Kimi-Linear)", "## packed_prefill", "## gdn_packed_prefill"):
        assert title in files["contracts.md"]
    for key in ("prefill-int64-cu-seqlens", "gdn-prefill-kda-shaped-a"):
        assert f'<a id="{key}"></a>' in files["errors.md"]
