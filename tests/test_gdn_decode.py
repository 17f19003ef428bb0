"""GDN packed decode (Qwen3-Next): the op built with kc.op, its torch reference against an
independent per-request loop and flash-linear-attention's naive GDN, its config and its hints."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kda_contracts as kc

DATA = Path(__file__).parent / "data"
QWEN = DATA / "qwen3_next_80b_a3b_config.json"


def make_call(B=6, H=2, HV=4, K=8, V=16, N=10, layout="VK", state_dtype=torch.float32, act=torch.float32,
              idx_dtype=torch.int64, indices=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, dt=act: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    shape = (N, HV, V, K) if layout == "VK" else (N, HV, K, V)
    idx = torch.tensor(indices if indices is not None else list(range(B)), dtype=idx_dtype)
    return dict(mixed_qkv=r(len(idx), 2 * H * K + HV * V), a=r(len(idx), HV), b=r(len(idx), HV),
                A_log=r(HV, dt=torch.float32) * 0.5, dt_bias=r(HV, dt=torch.float32), scale=K ** -0.5,
                initial_state=r(*shape, dt=state_dtype) * 0.1, out=torch.full((len(idx), 1, HV, V), 7.0, dtype=act),
                ssm_state_indices=idx)


def oracle(c, H, layout, l2norm):
    """Independent per-request, per-value-head loop from the SPEC (fp32; VK slot matrices)."""
    st = c["initial_state"].clone()
    N, HV = st.shape[:2]
    V = c["out"].shape[-1]
    K = (c["mixed_qkv"].shape[1] - HV * V) // (2 * H)
    out = torch.zeros(c["out"].shape, dtype=torch.float32)
    for i, slot in enumerate(c["ssm_state_indices"].tolist()):
        if slot < 0 or slot >= N:
            continue
        row = c["mixed_qkv"][i].float()
        for hv in range(HV):
            h = hv // (HV // H)
            q, k = row[h * K:(h + 1) * K], row[H * K + h * K:H * K + (h + 1) * K]
            v = row[2 * H * K + hv * V:2 * H * K + (hv + 1) * V]
            if l2norm:
                q, k = q / math.sqrt(float((q * q).sum()) + 1e-6), k / math.sqrt(float((k * k).sum()) + 1e-6)
            x = float(c["a"][i, hv]) + float(c["dt_bias"][hv])
            sp = x if x > 20 else math.log1p(math.exp(x))
            g = -math.exp(float(c["A_log"][hv])) * sp
            beta = torch.sigmoid(c["b"][i, hv].float()).to(c["b"].dtype).float()
            S = st[slot, hv].float() if layout == "VK" else st[slot, hv].float().T
            S = S * math.exp(g)
            S = S + torch.outer(beta * (v - S @ k), k)
            out[i, 0, hv] = S @ (q * c["scale"])
            st[slot, hv] = (S if layout == "VK" else S.T).to(st.dtype)
    return out, st


@pytest.mark.parametrize("layout", ["VK", "KV"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("l2norm", [True, False])
def test_reference_matches_per_request_loop(layout, state_dtype, idx_dtype, l2norm):
    H, N = 4, 12  # GVA: HV = 2H
    c = make_call(H=H, HV=2 * H, K=16, V=32, N=N, layout=layout, state_dtype=state_dtype, idx_dtype=idx_dtype,
                  indices=[3, -1, 11, 0, 12, 40, 7, -5])
    want_out, want_state = oracle(c, H, layout, l2norm)
    before = c["initial_state"].clone()
    with kc.mode("check"):  # strict mode would reject the out-of-range indices the kernel must survive
        out, state = kc.gdn_packed_decode(*c.values(), l2norm, state_layout=layout)
    assert out is c["out"] and state is c["initial_state"]
    tol = dict(rtol=1e-5, atol=1e-5) if state_dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), want_out, **tol)
    torch.testing.assert_close(state.float(), want_state.float(), **tol)
    assert out[[1, 4, 5, 7]].eq(0).all()  # padding and out-of-range rows are zero
    untouched = [s for s in range(N) if s not in (3, 11, 0, 7)]
    assert torch.equal(state[untouched], before[untouched])  # nothing outside the used slots changes


@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_empty_batch_is_a_no_op(layout):
    c = make_call(layout=layout, indices=[])
    before = c["initial_state"].clone()
    out, state = kc.gdn_packed_decode(*c.values(), True, state_layout=layout)
    assert out.shape[0] == 0 and torch.equal(state, before)


def test_bf16_activations_and_strict_mode():
    c = make_call(act=torch.bfloat16, state_dtype=torch.bfloat16, indices=[4, -1, 2])
    want_out, _ = oracle(c, 2, "VK", True)
    with kc.mode("strict"):
        out, _ = kc.gdn_packed_decode(*c.values(), True)
    torch.testing.assert_close(out.float(), want_out, rtol=3e-2, atol=3e-2)


def test_matches_fla_naive_recurrent_gdn():
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive", reason="flash-linear-attention not installed")
    H, HV, K, V = 2, 4, 16, 16
    c = make_call(H=H, HV=HV, K=K, V=V, layout="KV", indices=[0, 1, 2, 3])
    B = 4
    st0 = c["initial_state"].clone()
    kc.gdn_packed_decode(*c.values(), True, state_layout="KV")
    m = c["mixed_qkv"]
    q, k, v = m[:, :H * K].view(B, H, K), m[:, H * K:2 * H * K].view(B, H, K), m[:, 2 * H * K:].view(B, HV, V)
    q, k = (F.normalize(x, dim=-1, eps=1e-6).repeat_interleave(HV // H, 1) for x in (q, k))
    g = -c["A_log"].exp() * F.softplus(c["a"] + c["dt_bias"])
    o, s = naive.naive_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], torch.sigmoid(c["b"])[:, None],
                                                  g[:, None], scale=c["scale"], initial_state=st0[:4],
                                                  output_final_state=True)
    torch.testing.assert_close(c["out"], o.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c["initial_state"][:4], s.float(), rtol=1e-4, atol=1e-4)


def test_validate_returns_dims_and_strict_value_checks():
    c = make_call(indices=[1, 1, 2])
    dims = kc.validate_gdn_packed_decode(*c.values(), True, strict=False)
    assert tuple(dims.values()) == (3, 2, 4, 8, 16, 10)
    before = {k: v.clone() for k, v in c.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(kc.ContractError, match="1 duplicate value"):
        kc.validate_gdn_packed_decode(*c.values(), True, strict=True)
    c["ssm_state_indices"] = torch.tensor([1, 10, 2])
    c["a"][0, 0] = float("nan")
    with kc.mode("strict"), pytest.raises(kc.ContractError) as e:
        kc.gdn_packed_decode(*c.values(), True)
    assert "1 value(s) >= N=10 (max 10)" in str(e.value) and "a: ValueRangeError" in str(e.value)
    assert all(torch.equal(c[k], before[k]) for k in ("out", "initial_state"))  # rejected: nothing written


def test_layout_keyword_contradicting_config():
    cfg = kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    c = make_call()
    with pytest.raises(kc.ContractError, match=r"'VK' \(config state_layout\)"):
        kc.gdn_packed_decode(*c.values(), True, config=cfg, state_layout="KV")


def test_op_is_registered_with_its_backends():
    op = kc.ops()["gdn_packed_decode"]
    assert op is kc.gdn_packed_decode and [b.name for b in op.backends()] == ["triton", "helion", "fla", "torch"]


# --- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp,h,hv", [(1, 16, 32), (2, 8, 16), (4, 4, 8), (8, 2, 4)])
def test_qwen3_next_config_and_presets(tp, h, hv):
    cfg = kc.GDNConfig.from_hf_config(QWEN, tp_size=tp)
    assert (cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v) == (h, hv, 128, 128)
    assert cfg == kc.GDNConfig.preset("qwen3-next-80b-a3b", tp_size=tp)
    assert cfg.hidden_size == 2048 and len(cfg.gdn_layers) == 36 and 4 not in cfg.gdn_layers
    assert math.isclose(cfg.scale, 128 ** -0.5)


def test_config_rejects_kda_fields_and_non_qwen_json():
    with pytest.raises(ValueError, match="GDN has only the softplus gate"):
        kc.GDNConfig(num_heads=2, head_k_dim=8, gate="bounded", lower_bound=-5.0)
    with pytest.raises(ValueError, match=r"lacks linear_num_key_heads.*model_type='kimi_linear'"):
        kc.GDNConfig.from_hf_config(DATA / "kimi_linear_48b_a3b_config.json")


# --- hints (golden) -------------------------------------------------------------------------------
def _fixes(c, **kw):
    with pytest.raises(kc.ContractError) as e:
        kc.gdn_packed_decode(*c.values(), True, **kw)
    return [line.strip()[5:] for line in str(e.value).splitlines() if line.strip().startswith("fix: ")]


QCFG = dict(H=16, HV=32, K=128, V=128, N=4, indices=[0, 2])


def test_hint_kda_shaped_gate_given_to_gdn():
    c = make_call(**QCFG)
    c["a"], c["dt_bias"] = torch.randn(2, 32 * 128), torch.randn(32 * 128)
    fixes = _fixes(c, config=kc.GDNConfig.preset("qwen3-next-80b-a3b"))
    assert fixes[0] == ("`a` has KDA's per-key-channel gate shape [B, HV*K] (HV=32, K=128); GDN's gate is one "
                        "scalar per value head, [B, HV]. If this is a KDA (Kimi-Linear) layer call kc.packed_decode; "
                        "if it is a GDN (Qwen3-Next) layer, the tensor comes from the wrong projection (GDN's "
                        "a_proj/dt_bias have HV outputs)")
    assert fixes[1].startswith("`dt_bias` has KDA's per-key-channel gate shape [HV*K] (HV=32, K=128)")


def test_hint_gdn_shaped_gate_given_to_kda():
    c = make_call(H=32, HV=32, K=128, V=128, N=4, indices=[0, 2])
    with pytest.raises(kc.ContractError) as e:
        kc.packed_decode(*c.values(), True, config=kc.KDAConfig.preset("kimi-linear-48b-a3b"))
    assert ("fix: `a` has GDN's per-value-head gate shape [B, HV] (HV=32); KDA's gate has one logit per key "
            "channel, [B, HV*K] with K=128. If this is a GDN (Qwen3-Next) layer call kc.gdn_packed_decode; if it "
            "is a KDA layer, the tensor comes from the wrong projection") in str(e.value)


def test_hint_swapped_head_dims_in_gva():
    # config K=64, V=128; tensors built with K=128, V=64: with HV = 2H the width is the same.
    cfg = kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=128)
    c = make_call(H=2, HV=4, K=128, V=64, N=4, indices=[0, 1])
    c["scale"] = cfg.scale
    fixes = _fixes(c, config=cfg)
    assert fixes[0].startswith("the tensors fit K=128, V=64, the config says K=64 (head_k_dim), V=128 "
                               "(head_v_dim): the key and value head dims are swapped. With HV = 2H")


def test_hint_unflattened_gate():
    c = make_call(indices=[0, 1])
    c["a"] = c["a"].view(2, 4, 1)
    assert _fixes(c)[0] == "`a` looks unflattened ([2, 4, 1]); pass a.reshape(2, 4)"


def test_hint_tp_mismatch():
    c = make_call(H=8, HV=16, K=128, V=128, N=4, indices=[0, 1])  # sharded for TP2
    fixes = _fixes(c, config=kc.GDNConfig.preset("qwen3-next-80b-a3b"))
    assert fixes[0].startswith("initial_state carries HV=16 heads but the config expects 32 per rank "
                               "(num_v_heads=32): the tensors look sharded for tp_size=2, the config for tp_size=1")


def test_hint_layout():
    c = make_call(K=8, V=16, layout="KV", indices=[0, 1])
    assert _fixes(c, state_layout="VK")[0].startswith(
        "initial_state looks like a KV-layout pool [N, HV, K, V], but this call declares VK")


def test_hint_index_dtype():
    c = make_call(**QCFG)
    fixes = _fixes(c, config=kc.GDNConfig.preset("qwen3-next-80b-a3b", index_dtype="int32"))
    assert fixes[0].startswith("cast the indices once when you build the batch metadata: "
                               "ssm_state_indices.to(torch.int32)")
