"""The KDA packed-decode contract: what it accepts, what it rejects, and that a rejected call
touches nothing."""

from typing import Annotated

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts.ops.packed_decode.adapters import BackendError
from kda_contracts.testing import make_decode_call

KIMI = kc.KDAConfig.preset("kimi-linear-48b-a3b")


def small_cfg(**kw):
    base = dict(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    base.update(kw)
    return kc.KDAConfig(**base)


def call_for(cfg, B=3, N=8, **kw):
    return make_decode_call(cfg, B, N, **kw)


def snapshot(call):
    return {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}


def bits(t):
    return t.contiguous().view(torch.uint8)


def assert_bit_identical(call, before):
    for k, v in before.items():
        assert torch.equal(bits(call[k]), bits(v)), k


# -- valid calls ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2])
def test_a_kimi_linear_call_passes_with_and_without_its_config(tp):
    cfg = KIMI.with_tp(tp)
    call = call_for(cfg, B=2, N=4)
    dims = kc.validate_packed_decode(**call, config=cfg)
    assert dict(dims) == {"B": 2, "H": 32 // tp, "HV": 32 // tp, "K": 128, "V": 128, "N": 4}
    assert dict(kc.validate_packed_decode(**call)) == dict(dims)


def test_without_a_config_dims_come_from_the_tensors_with_provenance():
    dims = kc.validate_packed_decode(**call_for(small_cfg()))
    assert dims.provenance == {
        "B": "from mixed_qkv.shape[0]",
        "H": "solved from mixed_qkv.shape[1] = 2*H*K+HV*V",
        "HV": "from initial_state.shape[1]",
        "K": "from initial_state.shape[3]",
        "V": "from initial_state.shape[2]",
        "N": "from initial_state.shape[0]",
    }
    assert (dims.H, dims.HV) == (2, 4)  # GVA: HV > H


def test_with_a_config_every_dim_it_fixes_is_bound_from_it():
    cfg = small_cfg(tp_size=2)
    dims = kc.validate_packed_decode(**call_for(cfg), config=cfg)
    assert dims.provenance["HV"] == "from config (num_v_heads=4 / tp_size=2)"
    assert (dims.H, dims.HV) == (1, 2)


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("state", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_every_supported_dtype_combination_passes(act, state, index):
    kc.validate_packed_decode(**call_for(small_cfg(), activation_dtype=act, state_dtype=state, index_dtype=index))


def test_a_pool_that_is_a_strided_slice_of_a_bigger_buffer_passes():
    call = call_for(small_cfg(), N=8)
    big = torch.zeros(16, *call["initial_state"].shape[1:])
    call["initial_state"] = big[::2]
    kc.validate_packed_decode(**call)


def test_an_empty_batch_passes():
    kc.validate_packed_decode(**call_for(small_cfg(), B=0))


def test_row_strided_activations_pass_when_the_last_dim_is_dense():
    call = call_for(small_cfg())
    wide = torch.zeros(call["mixed_qkv"].shape[0], call["mixed_qkv"].shape[1] + 7, dtype=call["mixed_qkv"].dtype)
    call["mixed_qkv"] = wide[:, :-7]
    kc.validate_packed_decode(**call)


def test_kv_layout_is_declared_by_the_config_or_keyword():
    cfg = small_cfg(state_layout="KV")
    call = call_for(cfg)
    assert tuple(call["initial_state"].shape[2:]) == (8, 16)
    kc.validate_packed_decode(**call, config=cfg)
    kc.validate_packed_decode(**call, state_layout="KV")
    with pytest.raises(kc.ShapeError):
        kc.validate_packed_decode(**call)  # VK by default, and K != V shows it


def test_a_layout_keyword_that_contradicts_the_config_is_rejected():
    cfg = small_cfg(state_layout="KV")
    with pytest.raises(kc.LayoutError, match=r"state_layout: LayoutError\n +expected 'KV' \(config state_layout\)"):
        kc.validate_packed_decode(**call_for(cfg), config=cfg, state_layout="VK")


# -- what sglang's hand-written validator checks, and more ----------------------------------------
def mutate(call, **changes):
    out = dict(call)
    for k, fn in changes.items():
        out[k] = fn(call[k]) if callable(fn) else fn
    return out


CASES = {
    "mixed_qkv rank": (dict(mixed_qkv=lambda t: t.unsqueeze(1)), kc.ShapeError, "mixed_qkv"),
    "mixed_qkv batch": (dict(mixed_qkv=lambda t: t[:-1]), kc.ShapeError, "mixed_qkv"),
    "mixed_qkv width": (dict(mixed_qkv=lambda t: t[:, :-1]), kc.ShapeError, "mixed_qkv"),
    "a unflattened": (dict(a=lambda t: t.view(t.shape[0], 4, 8)), kc.ShapeError, "a"),
    "a width": (dict(a=lambda t: t[:, :-8]), kc.ShapeError, "a"),
    "b width": (dict(b=lambda t: t[:, :-1]), kc.ShapeError, "b"),
    "A_log length": (dict(A_log=lambda t: t[:-1]), kc.ShapeError, "A_log"),
    "dt_bias length": (dict(dt_bias=lambda t: t[:-1]), kc.ShapeError, "dt_bias"),
    "state rank": (dict(initial_state=lambda t: t[0]), kc.ShapeError, "initial_state"),
    "out shape": (dict(out=lambda t: t.squeeze(1)), kc.ShapeError, "out"),
    "out heads": (dict(out=lambda t: t[:, :, :-1].contiguous()), kc.ShapeError, "out"),
    "indices length": (dict(ssm_state_indices=lambda t: t[:-1]), kc.ShapeError, "ssm_state_indices"),
    "indices rank": (dict(ssm_state_indices=lambda t: t[:, None]), kc.ShapeError, "ssm_state_indices"),
    "indices float": (dict(ssm_state_indices=lambda t: t.float()), kc.DtypeError, "ssm_state_indices"),
    "indices int16": (dict(ssm_state_indices=lambda t: t.short()), kc.DtypeError, "ssm_state_indices"),
    "A_log bf16": (dict(A_log=lambda t: t.bfloat16()), kc.DtypeError, "A_log"),
    "dt_bias fp64": (dict(dt_bias=lambda t: t.double()), kc.DtypeError, "dt_bias"),
    "state fp64": (dict(initial_state=lambda t: t.double()), kc.DtypeError, "initial_state"),
    "mixed_qkv int": (dict(mixed_qkv=lambda t: t.int()), kc.DtypeError, "mixed_qkv"),
    "out dtype": (dict(out=lambda t: t.float()), kc.DtypeError, "out"),
    "state slot strides": (dict(initial_state=lambda t: t.transpose(-1, -2)), kc.LayoutError, "initial_state"),
    "state head strides": (dict(initial_state=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),
                           kc.LayoutError, "initial_state"),
    "a last-dim stride": (dict(a=lambda t: t.view(t.shape[0], 4, 8).transpose(1, 2).flatten(1).T.contiguous().T),
                          kc.LayoutError, "a"),
    "out non-contiguous": (dict(out=lambda t: torch.zeros(t.shape[0], 1, t.shape[3], t.shape[2],
                                                          dtype=t.dtype).transpose(2, 3)), kc.LayoutError, "out"),
    "A_log strided": (dict(A_log=lambda t: torch.zeros(2 * t.shape[0])[::2]), kc.LayoutError, "A_log"),
    "device": (dict(b=lambda t: t.to("meta")), kc.DeviceError, "b"),
    "scale zero": (dict(scale=0.0), kc.ValueRangeError, "scale"),
    "scale nan": (dict(scale=float("nan")), kc.ValueRangeError, "scale"),
    "lower_bound positive": (dict(lower_bound=1.0), kc.ValueRangeError, "lower_bound"),
    "scale not a float": (dict(scale="0.1"), kc.ArgumentTypeError, "scale"),
    "l2norm not a bool": (dict(use_qk_l2norm_in_kernel=1), kc.ArgumentTypeError, "use_qk_l2norm_in_kernel"),
    "state not a tensor": (dict(initial_state=lambda t: t.tolist()), kc.ArgumentTypeError, "initial_state"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_broken_rule_raises_its_kind_naming_the_argument(case):
    changes, kind, arg = CASES[case]
    call = mutate(call_for(small_cfg(num_heads=4, num_v_heads=4, head_k_dim=8, head_v_dim=8)), **changes)
    with pytest.raises(kind) as info:
        kc.validate_packed_decode(**call)
    assert arg in [v.argument for v in info.value.violations]


def test_hv_must_be_a_multiple_of_h():
    # H=3 from the width with HV=4: 2*3*8 + 4*8 = 80 columns
    call = call_for(small_cfg(num_heads=4, num_v_heads=4, head_k_dim=8, head_v_dim=8))
    call["mixed_qkv"] = torch.zeros(3, 80, dtype=torch.bfloat16)
    with pytest.raises(kc.ShapeError, match=r"expected HV % H == 0\n +got +H=3, HV=4"):
        kc.validate_packed_decode(**call)


@pytest.mark.parametrize("field,value,arg", [
    ("scale", 0.5, "scale"),
    ("use_qk_l2norm_in_kernel", False, "use_qk_l2norm_in_kernel"),
    ("lower_bound", -5.0, "lower_bound"),
])
def test_scalars_must_agree_with_the_config(field, value, arg):
    cfg = small_cfg()
    call = dict(call_for(cfg), **{field: value})
    with pytest.raises(kc.ValueRangeError) as info:
        kc.validate_packed_decode(**call, config=cfg)
    assert [v.argument for v in info.value.violations] == [arg]


def test_a_bounded_gate_config_requires_its_lower_bound():
    cfg = small_cfg(gate="bounded", lower_bound=-5.0)
    call = call_for(cfg)
    assert call["lower_bound"] == -5.0
    kc.validate_packed_decode(**call, config=cfg)
    with pytest.raises(kc.ValueRangeError, match=r"lower_bound: ValueRangeError\n +expected -5.0"):
        kc.validate_packed_decode(**dict(call, lower_bound=None), config=cfg)


def test_config_dtypes_pin_state_activation_and_index_dtypes():
    cfg = small_cfg(state_dtype="bfloat16", activation_dtype="float16", index_dtype="int64")
    call = call_for(cfg, state_dtype=torch.bfloat16, activation_dtype=torch.float16, index_dtype=torch.int64)
    kc.validate_packed_decode(**call, config=cfg)
    bad = call_for(cfg)  # fp32 state, bf16 activations, int32 indices
    with pytest.raises(kc.DtypeError) as info:
        kc.validate_packed_decode(**bad, config=cfg)
    # out must match mixed_qkv's dtype, which it does: it is not blamed twice
    assert [v.argument for v in info.value.violations] == ["mixed_qkv", "a", "b", "initial_state",
                                                           "ssm_state_indices"]


# -- a rejected call touches nothing -----------------------------------------------------------------
@pytest.mark.parametrize("case", ["a unflattened", "state slot strides", "indices float", "scale zero",
                                  "out dtype", "mixed_qkv width"])
def test_a_rejected_packed_decode_leaves_every_tensor_bit_identical(case):
    changes, kind, _ = CASES[case]
    call = mutate(call_for(small_cfg(num_heads=4, num_v_heads=4, head_k_dim=8, head_v_dim=8)), **changes)
    before = snapshot(call)
    with pytest.raises(kind):
        kc.packed_decode(**call, backend="torch")
    assert_bit_identical(call, before)


def test_a_tp_mismatch_leaves_the_pool_and_out_untouched():
    call = call_for(KIMI, B=2, N=4)
    before = snapshot(call)
    with pytest.raises(kc.ShapeError):
        kc.packed_decode(**call, config=KIMI.with_tp(2), backend="torch")
    assert_bit_identical(call, before)


# -- dispatch ----------------------------------------------------------------------------------------
def test_packed_decode_returns_the_same_out_and_state_objects():
    call = call_for(small_cfg())
    out, state = kc.packed_decode(**call, backend="torch")
    assert out is call["out"] and state is call["initial_state"]
    assert out.abs().sum() > 0


def test_auto_backend_runs_the_reference_on_cpu():
    call = call_for(small_cfg())
    expected = snapshot(call)
    kc.packed_decode(**mutate(expected, scale=call["scale"], use_qk_l2norm_in_kernel=True, lower_bound=None),
                     backend="torch")
    kc.packed_decode(**call, backend="auto")
    assert torch.equal(call["out"], expected["out"]) and torch.equal(call["initial_state"],
                                                                     expected["initial_state"])


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(BackendError, match="unknown backend 'cuda-magic'; registered: "):
        kc.packed_decode(**call_for(small_cfg()), backend="cuda-magic")


def test_explain_backends_names_the_chosen_backend():
    text = kc.explain_backends(**call_for(small_cfg()))
    assert "torch: chosen" in text


def test_off_mode_skips_validation_but_still_runs_the_kernel():
    call = call_for(small_cfg())
    with kc.mode("off"):
        kc.packed_decode(**dict(call, scale=-1.0), backend="torch")  # not validated: the caller opted out
    assert call["out"].abs().sum() > 0


# -- strict mode ----------------------------------------------------------------------------------
def test_strict_mode_rejects_an_index_past_the_pool():
    call = call_for(small_cfg(), B=3, N=8)
    call["ssm_state_indices"] = torch.tensor([0, 8, 3], dtype=torch.int32)
    kc.validate_packed_decode(**call, strict=False)  # check mode does not read values
    with pytest.raises(kc.ValueRangeError, match=r"ssm_state_indices: ValueRangeError\n +expected < N=8 \(negatives "
                                                 r"are padding\)\n +got +1 value\(s\) >= N=8 \(max 8\)"):
        kc.validate_packed_decode(**call, strict=True)


def test_strict_mode_rejects_duplicate_slots_but_not_repeated_padding():
    call = call_for(small_cfg(), B=4, N=8)
    call["ssm_state_indices"] = torch.tensor([-1, 2, -1, 5], dtype=torch.int32)
    kc.validate_packed_decode(**call, strict=True)
    call["ssm_state_indices"] = torch.tensor([2, 2, -1, 5], dtype=torch.int32)
    with pytest.raises(kc.ValueRangeError, match="1 duplicate value"):
        with kc.mode("strict"):
            kc.packed_decode(**call, backend="torch")


def test_strict_mode_rejects_non_finite_inputs_and_out_aliasing_an_input():
    call = call_for(small_cfg())
    call["a"][0, 0] = float("nan")
    with pytest.raises(kc.ValueRangeError, match=r"a: ValueRangeError\n +expected finite values"):
        kc.validate_packed_decode(**call, strict=True)
    call = call_for(small_cfg(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8), B=1)
    call["out"] = call["mixed_qkv"][:, :16].view(1, 1, 2, 8)  # same dtype, overlapping memory
    with pytest.raises(kc.ContractError, match="overlaps mixed_qkv"):
        kc.validate_packed_decode(**call, strict=True)


# -- jaxtyping + beartype on the same call ----------------------------------------------------------------
def test_jaxtyping_beartype_rejects_the_valid_call_when_a_precedes_the_state_and_we_do_not():
    jaxtyping = pytest.importorskip("jaxtyping")
    from beartype import beartype

    @jaxtyping.jaxtyped(typechecker=beartype)
    def sglang_order(
        mixed_qkv: Float[Tensor, "B 2*H*K+HV*V"], a: Float[Tensor, "B HV*K"], b: Float[Tensor, "B HV"],
        A_log: Float[Tensor, "HV"], dt_bias: Float[Tensor, "HV*K"], scale: float,
        initial_state: Float[Tensor, "N HV V K"], out: Float[Tensor, "B 1 HV V"], ssm_state_indices: Int[Tensor, "B"],
    ) -> None: ...

    call = call_for(small_cfg())
    args = [call[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
                              "ssm_state_indices")]
    with pytest.raises(Exception) as info:  # jaxtyping cannot evaluate H*K before H, K, HV are bound
        sglang_order(*args)
    assert not isinstance(info.value, kc.ContractError)
    kc.validate_packed_decode(*args)  # ours: the same call is valid


def test_our_contract_decorator_accepts_the_same_sglang_order_signature():
    @kc.contract(where=["HV % H == 0"])
    def sglang_order(
        mixed_qkv: Float[Tensor, "B 2*H*K+HV*V"], a: Float[Tensor, "B HV*K"], b: Float[Tensor, "B HV"],
        A_log: Float[Tensor, "HV"], dt_bias: Float[Tensor, "HV*K"], scale: Annotated[float, kc.Range(gt=0)],
        initial_state: Float[Tensor, "N HV V K"], out: Float[Tensor, "B 1 HV V"], ssm_state_indices: Int[Tensor, "B"],
    ) -> int:
        return 7

    call = call_for(small_cfg())
    assert sglang_order(*[call[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state",
                                            "out", "ssm_state_indices")]) == 7


def test_strict_mode_checks_the_outputs_after_the_kernel(registry_guard):
    def bad_kernel(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx, **kw):
        out.fill_(1.0)  # writes the padding row too: breaks the kernel contract

    kc.adapters.register(kc.adapters.Adapter(name="sloppy", kernel=bad_kernel, devices=("cpu",)), replace=True)
    call = call_for(small_cfg(), B=3, N=8)
    call["ssm_state_indices"] = torch.tensor([0, -1, 3], dtype=torch.int32)
    with kc.mode("check"):
        kc.packed_decode(**call, backend="sloppy")  # check mode trusts the kernel
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError,
                                          match=r"packed_decode \(after backend 'sloppy'\)\(\): 1 contract violation"
                                                r"\n  \[1\] out: ValueRangeError\n +expected zero rows for padding"):
        kc.packed_decode(**call, backend="sloppy")


@pytest.fixture
def registry_guard():
    saved = dict(kc.adapters._REGISTRY)
    yield
    kc.adapters._REGISTRY.clear()
    kc.adapters._REGISTRY.update(saved)
    kc.adapters.refresh()
