"""The Kimi-Linear KDA layer (kda_contracts.models.kimi_linear): built from a config.json, decoding
under continuous batching, matching an independent whole-sequence recurrence, sharded TP2, and
its contracts catching TP mismatches with a message that says so."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from continuous_batching import run_continuous_batching

import kda_contracts as kc
from kda_contracts.models.kimi_linear import KimiDeltaAttention, layer_dims, random_weights, shard_weights

DATA = Path(__file__).parent / "data"
TINY = DATA / "kimi_linear_tiny_config.json"
REAL = DATA / "kimi_linear_48b_a3b_config.json"
# K != V and grouped value heads (HV = 2H): shapes the tiny Kimi config cannot exercise.
GVA = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32, index_dtype="int32")


def tiny_config(tp_size: int = 1) -> kc.KDAConfig:
    return kc.KDAConfig.from_hf_config(TINY, tp_size=tp_size)


def build(config: kc.KDAConfig, rank: int = 0, seed: int = 0) -> KimiDeltaAttention:
    layer = KimiDeltaAttention(config, tp_rank=rank, backend="torch")
    layer.load_weights(**random_weights(config, seed=seed, rank=rank))
    return layer


# -- an independent reference: the whole sequence at once, in float64 --------------------------------
def reference_sequence(w: dict[str, torch.Tensor], cfg: kc.KDAConfig, x: torch.Tensor, eps: float) -> torch.Tensor:
    """A TP1 layer's outputs for one request's tokens ``x [T, D]`` from zero states.

    Shares no code with the layer: the conv is one F.conv1d over the sequence (not a rolling
    state), the recurrence a loop over time on [HV, V, K] matrices, all in float64.
    """
    H, HV, K, V = cfg.num_heads, cfg.num_v_heads or cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim or cfg.head_k_dim
    w = {k: t.double() for k, t in w.items()}
    x = x.double()
    T = x.shape[0]
    qkv = x @ w["qkv_proj"].T  # [T, C]
    taps = w["conv1d"].shape[1]
    conv = F.conv1d(qkv.T.unsqueeze(0), w["conv1d"].unsqueeze(1), padding=taps - 1, groups=qkv.shape[1])
    conv = F.silu(conv[0, :, :T].T)  # causal: output t sees inputs t-taps+1 .. t
    q = conv[:, : H * K].view(T, H, K)
    k = conv[:, H * K : 2 * H * K].view(T, H, K)
    v = conv[:, 2 * H * K :].view(T, HV, V)
    q, k = (z / torch.sqrt((z * z).sum(-1, keepdim=True) + 1e-6) for z in (q, k))
    q, k = (z.repeat_interleave(HV // H, dim=1) for z in (q, k))  # value head hv reads q/k head hv // (HV/H)
    a = (x @ w["f_a_proj"].T @ w["f_b_proj"].T).view(T, HV, K) + w["dt_bias"].view(HV, K)
    g = -w["A_log"].exp().view(HV, 1) * F.softplus(a)
    beta = torch.sigmoid(x @ w["b_proj"].T)  # [T, HV]
    S = torch.zeros(HV, V, K, dtype=torch.float64)
    outs = []
    for t in range(T):
        S = S * g[t].exp().unsqueeze(1)
        u = beta[t].unsqueeze(1) * (v[t] - torch.einsum("hvk,hk->hv", S, k[t]))
        S = S + torch.einsum("hv,hk->hvk", u, k[t])
        outs.append(torch.einsum("hvk,hk->hv", S, q[t] * K**-0.5))
    o = torch.stack(outs)  # [T, HV, V]
    gate = torch.sigmoid((x @ w["g_a_proj"].T @ w["g_b_proj"].T).view(T, HV, V))
    o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * w["o_norm"] * gate
    return (o.reshape(T, HV * V) @ w["o_proj"].T).float()


# -- the config ---------------------------------------------------------------------------------
def test_tiny_config_has_the_field_layout_of_the_real_kimi_linear_config():
    def keys(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict):
                out |= keys(v, prefix + k + ".")
        return out

    tiny, real = json.loads(TINY.read_text()), json.loads(REAL.read_text())
    assert keys(tiny) == keys(real)
    assert tiny["hidden_size"] == 64 and tiny["linear_attn_config"]["num_heads"] == 4


@pytest.mark.parametrize(("tp_size", "per_rank"), [(1, (4, 4, 192)), (2, (2, 2, 96))])
def test_a_layer_built_from_config_json_has_per_rank_dims(tp_size, per_rank):
    layer = KimiDeltaAttention.from_hf_config(TINY, tp_size=tp_size, tp_rank=tp_size - 1)
    h, hv, c = per_rank
    assert layer.contract_dims() == {"H": h, "HV": hv, "K": 16, "V": 16, "D": 64, "C": c, "W": 3}
    assert tuple(layer.qkv_proj.weight.shape) == (c, 64) and tuple(layer.o_proj.weight.shape) == (64, hv * 16)


def test_the_decode_contract_binds_d_c_and_w_from_the_layer_config():
    layer = build(tiny_config())
    ssm, conv = layer.new_state_pools(4)
    dims = KimiDeltaAttention.decode.__kda_contract__.validate(layer, torch.randn(2, 64), ssm, conv,
                                                                torch.tensor([0, 1]))
    assert (dims.D, dims.C, dims.W, dims.N) == (64, 192, 3, 4)
    assert dims.provenance["D"] == "from config (hidden_size=64)"
    assert dims.provenance["W"] == "from config (conv_kernel_size=4 - 1)"
    assert dims.provenance["HV"] == "from config (num_v_heads=4)"


# -- decode against the reference ---------------------------------------------------------------------
def batching_against_reference(layers, full_weights, cfg, *, prompts_via_prefill, dtype=torch.int64):
    """(per-request outputs, references) of a continuous-batching run through ``layers``."""
    run = run_continuous_batching(layers, prompts_via_prefill=prompts_via_prefill, dtype=dtype)
    eps = layers[0].rms_norm_eps
    return run.outputs, [reference_sequence(full_weights, cfg, x, eps) for x in run.inputs]


@pytest.mark.parametrize("prompts_via_prefill", [False, True], ids=["decode-only", "prefill-then-decode"])
@pytest.mark.parametrize("config", [tiny_config(), GVA], ids=["tiny-kimi", "gva-k8-v12"])
def test_decoding_token_by_token_matches_the_whole_sequence_reference(config, prompts_via_prefill):
    layer = build(config)
    outs, refs = batching_against_reference([layer], random_weights(config), config,
                                         prompts_via_prefill=prompts_via_prefill,
                                         dtype=torch.int32 if config.index_dtype == "int32" else torch.int64)
    for got, want in zip(outs, refs, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", [tiny_config(), GVA], ids=["tiny-kimi", "gva-k8-v12"])
def test_simulated_tp2_shards_sum_to_the_tp1_output(config):
    tp2 = config.with_tp(2)
    layers = [build(tp2, rank=r) for r in range(2)]
    assert layers[0].contract_dims()["HV"] * 2 == layer_dims(config)["HV"]
    outs, refs = batching_against_reference(layers, random_weights(config), config, prompts_via_prefill=True,
                                         dtype=torch.int32 if config.index_dtype == "int32" else torch.int64)
    for got, want in zip(outs, refs, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_random_weights_of_a_rank_are_the_shard_of_the_tp1_weights():
    full = random_weights(tiny_config(), seed=3)
    for rank in range(2):
        mine = random_weights(tiny_config(2), seed=3, rank=rank)
        for name, t in shard_weights(full, tiny_config(2), rank).items():
            assert torch.equal(mine[name], t), name


def test_padding_rows_and_free_slots_are_left_untouched():
    layer = build(tiny_config())
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_()
    conv.normal_()
    before = ssm.clone(), conv.clone()
    y = layer.decode(torch.randn(3, 64), ssm, conv, torch.tensor([-1, 4, -1]))
    assert y[0].eq(0).all() and y[2].eq(0).all() and y[1].ne(0).any()
    for pool, old in zip((ssm, conv), before, strict=True):
        assert torch.equal(pool[:4], old[:4]) and torch.equal(pool[5], old[5])
        assert not torch.equal(pool[4], old[4])


def test_conv_update_shifts_the_window_and_returns_silu_of_the_taps():
    layer = build(tiny_config())
    _, conv = layer.new_state_pools(2)
    conv.normal_()
    old = conv[1].clone()
    x = torch.randn(1, 192)
    y = layer.conv_update(x, conv, torch.tensor([1]))
    window = torch.cat([old, x.T], dim=1)  # [C, 4]
    torch.testing.assert_close(y[0], F.silu((window * layer.conv1d).sum(1)))
    torch.testing.assert_close(conv[1], window[:, 1:])


# -- contracts: TP mismatches and other mistakes ---------------------------------------------------
def test_tp1_weights_loaded_into_a_tp2_layer_are_rejected_as_a_tp_mismatch():
    layer = KimiDeltaAttention(tiny_config(2), tp_rank=0)
    with pytest.raises(kc.ShapeError) as err:
        layer.load_weights(**random_weights(tiny_config(1)))
    assert str(err.value).startswith("KimiDeltaAttention.load_weights(): 8 contract violations")
    assert "      fix: TP mismatch: qkv_proj, conv1d, f_b_proj, b_proj, A_log, dt_bias, g_b_proj and o_proj are " \
           "sized for tp_size=1 (HV=4, C=192 per rank) but this layer's config is for tp_size=2 (HV=2, C=96; " \
           "num_v_heads=4 / tp_size=2)." in str(err.value)


def test_tp1_pools_given_to_a_tp2_layer_are_rejected_as_a_tp_mismatch():
    layer = build(tiny_config(2))
    ssm, conv = build(tiny_config(1)).new_state_pools(4)
    before = ssm.clone(), conv.clone()
    with pytest.raises(kc.ShapeError, match=(
            r"(?s)KimiDeltaAttention\.decode\(\): 2 contract violations\n"
            r"  \[1\] ssm_states: ShapeError\n"
            r"      expected \[N, HV, V, K\] = \[4, 2, 16, 16\]\n"
            r"      got      \[4, 4, 16, 16\]\n"
            r"      dim 1 \(HV\): expected 2 \(HV from config \(num_v_heads=4 / tp_size=2\)\), got 4\n"
            r"      fix: TP mismatch: ssm_states and conv_states are sized for tp_size=1 \(HV=4, C=192 per rank\) "
            r"but this layer's config is for tp_size=2 \(HV=2, C=96; num_v_heads=4 / tp_size=2\)\. .*"
            r"  \[2\] conv_states: ShapeError\n"
            r"      expected \[N, C, W\] = \[4, 96, 3\]")):
        layer.decode(torch.randn(2, 64), ssm, conv, torch.tensor([0, 1]))
    assert torch.equal(ssm, before[0]) and torch.equal(conv, before[1])  # a rejected call writes nothing


def test_tp2_pools_given_to_a_tp1_layer_name_tp_size_2():
    layer = build(tiny_config(1))
    ssm, conv = KimiDeltaAttention(tiny_config(2)).new_state_pools(4)
    with pytest.raises(kc.ShapeError, match=r"TP mismatch: ssm_states and conv_states are sized for tp_size=2 "
                                            r"\(HV=2, C=96 per rank\) but this layer's config is for tp_size=1"):
        layer.prefill(torch.randn(1, 3, 64), ssm, conv, torch.tensor([0]))
    with pytest.raises(kc.ShapeError, match=r"TP mismatch: ssm_states and conv_states are sized for tp_size=2"):
        layer.check_state_pools(ssm, conv)


def test_a_conv_pool_of_the_wrong_width_names_conv_kernel_size():
    layer = build(tiny_config())
    ssm, _ = layer.new_state_pools(4)
    with pytest.raises(kc.ShapeError, match=r"(?s)dim 2 \(W\): expected 3 \(W from config \(conv_kernel_size=4 - 1\)\)"
                                            r", got 4.*fix: a conv-state slot keeps the last W = conv_kernel_size - 1"):
        layer.decode(torch.randn(2, 64), ssm, torch.zeros(4, 192, 4), torch.tensor([0, 1]))


@pytest.mark.kda_contracts("strict")
def test_strict_mode_rejects_duplicate_slots_before_any_state_is_written():
    layer = build(tiny_config())
    ssm, conv = layer.new_state_pools(4)
    conv.normal_()
    before = conv.clone()
    with pytest.raises(kc.ValueRangeError, match=r"1 duplicate slot\(s\)"):
        layer.decode(torch.randn(2, 64), ssm, conv, torch.tensor([2, 2]))
    assert torch.equal(conv, before)


def test_importing_kda_contracts_does_not_import_the_models():
    code = "import sys, kda_contracts; print('kda_contracts.models' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_the_decode_loop_example_runs_briefly_on_cpu(capsys, monkeypatch):
    path = Path(__file__).parents[1] / "examples" / "decode_loop.py"
    spec = importlib.util.spec_from_file_location("decode_loop_example", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    assert module.main(["--steps", "4", "--warmup", "1", "--repeats", "1", "--max-batch", "3", "--slots", "4",
                        "--max-new", "3"]) == 0
    out = capsys.readouterr().out
    assert "auto picks: torch: chosen" in out
    assert re.search(r"check +4 steps, \d+ decode tokens in [\d.]+ s: [\d,]+ tok/s", out)
    assert re.search(r"off +4 steps", out) and "4/4 steps" in out  # the progress line reached the end
    assert re.search(r"contract checks \(check\): [\d.]+ us/step of host time .* "
                     r"A/B: the check run's decode time is [-+][\d.]+% vs the off run", out)
