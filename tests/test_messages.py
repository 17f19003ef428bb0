"""Golden error messages (as jaxtyping's test_messages.py does): the text users read is pinned
so it cannot silently regress. Each case is one of the mistakes the demo shows."""

import re

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts.testing import make_decode_call

TP1 = kc.KDAConfig.preset("kimi-linear-48b-a3b", index_dtype="int32")
B, N = 2, 4


@pytest.fixture(scope="module")
def call():
    return make_decode_call(TP1, B, N)


def message(fn):
    with pytest.raises(kc.ContractError) as info:
        fn()
    return str(info.value)


def assert_lines(text, *patterns):
    lines = text.splitlines()
    assert len(lines) == len(patterns), text
    for line, pat in zip(lines, patterns, strict=True):
        assert re.fullmatch(pat, line), f"{line!r} !~ {pat!r}"


DIMS_TP1 = (r"  dims: B=2 from mixed_qkv.shape\[0\]; H=32 from config \(num_heads=32\); HV=32 from config "
            r"\(num_v_heads=32\); K=128 from config \(head_k_dim=128\); V=128 from config \(head_v_dim=128\); "
            r"N=4 from initial_state.shape\[0\]")


def test_unflattened_a(call):
    bad = dict(call, a=call["a"].view(B, 32, 128))
    assert_lines(
        message(lambda: kc.validate_packed_decode(**bad, config=TP1)),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] a: ShapeError",
        r"      expected \[B, HV\*K\] \(rank 2\)",
        r"      got      \[2, 32, 128\] \(rank 3\)",
        r"      fix: `a` looks unflattened \(\[B, HV, K\] = \[2, 32, 128\]\); the kernel indexes it as hv\*K \+ k: "
        r"pass a.flatten\(1\) \(or a.reshape\(B, HV\*K\)\)",
        DIMS_TP1,
    )


def test_tp_mismatch_is_explained_once_with_the_implied_tp_size(call):
    text = message(lambda: kc.validate_packed_decode(**call, config=TP1.with_tp(2)))
    assert text.startswith("packed_decode(): 7 contract violations\n  [1] mixed_qkv: ShapeError\n"
                           "      expected [B, 2*H*K+HV*V] = [2, 6144]\n      got      [2, 12288]\n")
    assert text.count("fix:") == 1
    assert ("fix: initial_state carries HV=32 heads but the config expects 16 per rank (num_v_heads=32 / "
            "tp_size=2): the tensors look sharded for tp_size=1, the config for tp_size=2. Build the config with "
            "tp_size=1") in text
    assert "      dim 1 (HV): expected 16 (HV from config (num_v_heads=32 / tp_size=2)), got 32" in text


def test_kv_state_where_vk_is_declared():
    cfg = kc.KDAConfig(num_heads=4, head_k_dim=64, head_v_dim=128)
    kv = make_decode_call(cfg.model_copy(update={"state_layout": "KV"}).revalidate(), 2, 8)
    assert_lines(
        message(lambda: kc.validate_packed_decode(**kv, config=cfg)),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] initial_state: ShapeError",
        r"      expected \[N, HV, V, K\] = \[8, 4, 128, 64\]",
        r"      got      \[8, 4, 64, 128\]",
        r"      dim 2 \(V\): expected 128 \(V from config \(head_v_dim=128\)\), got 64",
        r"      dim 3 \(K\): expected 64 \(K from config \(head_k_dim=64\)\), got 128",
        r"      fix: initial_state looks like a KV-layout pool \[N, HV, K, V\], but this call declares VK; declare "
        r"it \(KDAConfig\(state_layout='KV'\) or state_layout='KV'\) or convert the pool with "
        r"initial_state.transpose\(-1, -2\).contiguous\(\) \(a bare transpose view breaks the slot strides\)",
        r"  dims: .*",
    )


def test_kv_state_without_a_config_is_still_diagnosed():
    cfg = kc.KDAConfig(num_heads=4, head_k_dim=64, head_v_dim=128, state_layout="KV")
    kv = make_decode_call(cfg, 2, 8)
    text = message(lambda: kc.validate_packed_decode(**kv))
    assert "fix: initial_state looks like a KV-layout pool [N, HV, K, V], but this call declares VK" in text


def test_int64_indices_where_the_config_pins_int32(call):
    bad = dict(call, ssm_state_indices=call["ssm_state_indices"].long())
    assert_lines(
        message(lambda: kc.validate_packed_decode(**bad, config=TP1)),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] ssm_state_indices: DtypeError",
        r"      expected int32 \(config index dtype\)",
        r"      got      int64",
        r"      fix: cast the indices once when you build the batch metadata: ssm_state_indices.to\(torch.int32\) "
        r"\(the config pins the index dtype the kernels were built for\)",
        DIMS_TP1,
    )


def test_non_contiguous_state(call):
    bad = dict(call, initial_state=call["initial_state"].transpose(-1, -2))
    assert_lines(
        message(lambda: kc.validate_packed_decode(**bad, config=TP1)),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] initial_state: LayoutError",
        r"      expected last 3 dims dense \(strides \[\*, 16384, 128, 1\]\)",
        r"      got      strides \[524288, 16384, 1, 128\]",
        r"      fix: each state slot \[HV, V, K\] must be dense \(the pool's slot stride may be anything\): a pool "
        r"made by .transpose\(\) or by slicing inside a slot is not; allocate it densely or pass "
        r"initial_state.contiguous\(\) and copy the result back",
        DIMS_TP1,
    )


def test_packed_width_with_no_integer_h(call):
    bad = dict(call, mixed_qkv=call["mixed_qkv"][:, :-3])
    assert_lines(
        message(lambda: kc.validate_packed_decode(**bad)),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] mixed_qkv: ShapeError",
        r"      expected \[B, 2\*H\*K\+HV\*V\] = \[2, \?\]",
        r"      got      \[2, 12285\]",
        r"      dim 1 \(2\*H\*K\+HV\*V\) = 12285 gives no whole H >= 0 with HV=32, K=128, V=128: "
        r"H = \(12285 - 4096\) / 256 = 31.9883",
        r"      fix: mixed_qkv must be exactly \[q heads \| k heads \| v heads\] = 2\*H\*K \+ HV\*V columns; .*",
        r"  dims: B=2 from mixed_qkv.shape\[0\]; HV=32 from initial_state.shape\[1\]; K=128 from "
        r"initial_state.shape\[3\]; V=128 from initial_state.shape\[2\]; N=4 from initial_state.shape\[0\]",
    )


def test_wrong_dtype_and_wrong_shape_are_reported_together(call):
    bad = dict(call, b=call["b"][:, :-1], A_log=call["A_log"].bfloat16())
    text = message(lambda: kc.validate_packed_decode(**bad))
    assert text.splitlines()[0] == "packed_decode(): 2 contract violations"
    assert "  [1] b: ShapeError" in text and "  [2] A_log: DtypeError" in text
    assert "      fix: cast it: A_log.to(torch.float32)" in text


def test_a_wrong_python_type(call):
    assert_lines(
        message(lambda: kc.validate_packed_decode(**dict(call, initial_state=None))),
        r"packed_decode\(\): 1 contract violation",
        r"  \[1\] initial_state: ArgumentTypeError",
        r"      expected a torch.Tensor shaped \[N, HV, V, K\]",
        r"      got      NoneType",
    )


def test_a_device_mismatch(call):
    bad = dict(call, dt_bias=call["dt_bias"].to("meta"))
    text = message(lambda: kc.validate_packed_decode(**bad))
    assert ("  [1] dt_bias: DeviceError\n      expected cpu (device of mixed_qkv)\n      got      meta\n"
            "      fix: move it: dt_bias.to('cpu')") in text


def test_scale_out_of_range(call):
    text = message(lambda: kc.validate_packed_decode(**dict(call, scale=-0.5)))
    assert "  [1] scale: ValueRangeError\n      expected finite and > 0\n      got      -0.5\n" in text


def test_annotation_errors_name_the_symbol_and_the_argument():
    with pytest.raises(kc.AnnotationError) as info:
        @kc.contract
        def f(x: kc.Float[torch.Tensor, "B Q*R"]) -> None: ...
    assert re.search(r"f: cannot bind dim 'Q' \(in x: 'B Q\*R'\), 'R' \(in x: 'B Q\*R'\): no required tensor has "
                     r"it as a plain dim", str(info.value))


def test_a_negative_int_that_binds_a_dim_is_reported_on_the_int_itself():
    @kc.contract(register=False)
    def f(x: Float[Tensor, "b"], b: int) -> None: ...

    with pytest.raises(kc.ContractError) as err:
        f(torch.zeros(2), -1)
    assert str(err.value).splitlines()[5:8] == ["  [2] b: ValueRangeError", "      expected >= 0", "      got      -1"]
    f(torch.zeros(2), 2)


def test_a_union_of_tensors_told_apart_by_dtype_alone_says_their_dtypes():
    from jaxtyping import Float32, Int32

    @kc.contract(register=False)
    def f(x: Float32[Tensor, "b"] | Int32[Tensor, "b"]) -> None: ...

    with pytest.raises(kc.DtypeError) as err:
        f(torch.zeros(2, dtype=torch.float64))
    assert str(err.value).splitlines()[2] == "      expected Tensor[b] (float32) | Tensor[b] (int32)"


def test_a_product_dim_whose_other_factor_is_zero_says_the_dim_is_left_undetermined():
    @kc.contract(register=False)
    def h(y: Float[Tensor, "b*c"], x: Float[Tensor, "c"]) -> None: ...

    with pytest.raises(kc.ShapeError) as err:
        h(torch.zeros(0), torch.zeros(0))
    assert str(err.value).splitlines()[4] == (
        "      dim 0 (b*c) = 0 leaves b undetermined with c=0: every b fits, and no other argument binds it")
    with pytest.raises(kc.ShapeError, match=re.escape("dim 0 (b*c) = 3 gives no whole b >= 0 with c=2: b = (3 - 0) / "
                                                      "2 = 1.5")):
        h(torch.zeros(3), torch.zeros(2))


def test_a_union_branch_of_any_dtype_says_so_rather_than_listing_every_dtype():
    from jaxtyping import Float32, Shaped

    @kc.contract(register=False)
    def f(x: Float32[Tensor, "b"] | Shaped[Tensor, "b"], y: Float[Tensor, "b"]) -> None: ...

    with pytest.raises(kc.ContractError) as err:
        f(torch.zeros(4), torch.zeros(3))
    assert str(err.value).splitlines()[2] == "      expected Tensor[b] (float32) | Tensor[b] (any dtype)"
