"""The Qwen3-Next GDN layer (kda_contracts.models.qwen3_next): built from the Qwen3-Next config.json
(scaled down), decoding under continuous batching to match an independent per-request recurrence,
TP2 equal to TP1 (in process and over gloo on two processes, outputs and states), and its contracts
rejecting mis-sharded weights and wrong-rank pools with a message that says so."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from continuous_batching import run_continuous_batching
from tp_harness import NCCL_PAIR, process_group, spawn

import kda_contracts as kc
from kda_contracts.models import Qwen3NextGatedDeltaNet
from kda_contracts.models.linear_attention import conv_channel_shard
from kda_contracts.models.qwen3_next import random_weights, shard_weights, weights_from_hf

REAL = Path(__file__).parent / "data" / "qwen3_next_80b_a3b_config.json"
# The real config.json scaled down: K != V and GVA (HV = 2H) as in the real model, tiny for speed.
TINY = {**json.loads(REAL.read_text()), "hidden_size": 32, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12}


def tiny_config(tp_size: int = 1) -> kc.GDNConfig:
    return kc.GDNConfig.from_hf_config(TINY, tp_size=tp_size)


def build(config: kc.GDNConfig, rank: int = 0, seed: int = 0, backend: str = "torch", **kwargs):
    layer = Qwen3NextGatedDeltaNet(config, tp_rank=rank, backend=backend, rms_norm_eps=TINY["rms_norm_eps"], **kwargs)
    layer.load_weights(**random_weights(config, seed=seed, rank=rank))
    return layer


# -- an independent reference: one request, token by token, head by head ----------------------------
def reference_request(w: dict[str, torch.Tensor], raw: dict, x: torch.Tensor) -> tuple:
    """A TP1 layer's outputs for one request's tokens ``x [T, D]`` from zero states, and its final
    states (``S [HV, V, K]``, conv window ``[C, W]``). Shares no code with the layer: the HF rows
    are picked by explicit index arithmetic, the conv is one F.conv1d over the sequence, the
    recurrence a loop over tokens on [HV, V, K] matrices; float64 throughout."""
    H, HV = raw["linear_num_key_heads"], raw["linear_num_value_heads"]
    K, V, taps, eps = raw["linear_key_head_dim"], raw["linear_value_head_dim"], raw["linear_conv_kernel_dim"], \
        raw["rms_norm_eps"]
    g = HV // H
    w = {n: t.double() for n, t in w.items()}
    x = x.double()
    T = x.shape[0]
    per_key_head = 2 * K + 2 * g * V  # HF rows of one key head in in_proj_qkvz: q, k, v (g heads), z (g heads)
    rows = {"q": [], "k": [], "v": [], "z": []}
    for h in range(H):
        base = h * per_key_head
        rows["q"] += range(base, base + K)
        rows["k"] += range(base + K, base + 2 * K)
        rows["v"] += range(base + 2 * K, base + 2 * K + g * V)
        rows["z"] += range(base + 2 * K + g * V, base + per_key_head)
    proj = {n: x @ w["in_proj_qkvz"][torch.tensor(r)].T for n, r in rows.items()}
    b_rows = torch.tensor([h * 2 * g + j for h in range(H) for j in range(g)])  # b of value head h*g+j ...
    b, a = x @ w["in_proj_ba"][b_rows].T, x @ w["in_proj_ba"][b_rows + g].T  # ... and its a, g rows later: [T, HV]
    qkv = torch.cat([proj["q"], proj["k"], proj["v"]], dim=1)  # [T, C]
    C = qkv.shape[1]
    conv = F.conv1d(qkv.T.unsqueeze(0), w["conv1d"].unsqueeze(1), padding=taps - 1, groups=C)
    conv = F.silu(conv[0, :, :T].T)  # causal: output t sees inputs t-taps+1 .. t
    window = torch.cat([torch.zeros(C, taps - 1, dtype=torch.float64), qkv.T], dim=1)[:, -(taps - 1):]
    key_head = torch.arange(HV) // g  # the key head each value head reads
    q = conv[:, :H * K].view(T, H, K)[:, key_head]  # [T, HV, K]
    k = conv[:, H * K:2 * H * K].view(T, H, K)[:, key_head]
    v = conv[:, 2 * H * K:].view(T, HV, V)
    q, k = (u / torch.sqrt((u * u).sum(-1, keepdim=True) + 1e-6) for u in (q, k))
    decay = torch.exp(-w["A_log"].exp() * F.softplus(a + w["dt_bias"]))  # [T, HV]
    beta = torch.sigmoid(b)
    S = torch.zeros(HV, V, K, dtype=torch.float64)
    ys = []
    for t in range(T):
        S = S * decay[t].view(HV, 1, 1)
        u = beta[t].view(HV, 1) * (v[t] - torch.einsum("hvk,hk->hv", S, k[t]))
        S = S + torch.einsum("hv,hk->hvk", u, k[t])
        o = torch.einsum("hvk,hk->hv", S, q[t] * K**-0.5)
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * w["norm"] * F.silu(proj["z"][t].view(HV, V))
        ys.append(o.flatten() @ w["out_proj"].T)
    return torch.stack(ys).float(), S.float(), window.float()


def assert_matches_reference(run, full_weights):
    for r, (x, got) in enumerate(zip(run.inputs, run.outputs, strict=True)):
        want, S, window = reference_request(full_weights, TINY, x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"request {r}")
        (ssm, conv), = run.final_states[r]
        torch.testing.assert_close(ssm, S, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conv, window, atol=1e-6, rtol=1e-6)


# -- the config -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tp_size", "per_rank"), [(1, (16, 32, 8192)), (2, (8, 16, 4096)), (8, (2, 4, 1024))])
def test_a_layer_built_from_the_qwen3_next_config_json_has_per_rank_dims(tp_size, per_rank):
    layer = Qwen3NextGatedDeltaNet.from_hf_config(REAL, tp_size=tp_size, tp_rank=tp_size - 1, device="meta")
    h, hv, c = per_rank
    assert layer.contract_dims() == {"H": h, "HV": hv, "K": 128, "V": 128, "D": 2048, "C": c, "W": 3}
    assert layer.rms_norm_eps == 1e-6 and layer.config == kc.GDNConfig.from_hf_config(REAL, tp_size=tp_size)
    assert tuple(layer.in_proj_qkvz.weight.shape) == (c + hv * 128, 2048)  # q, k, v and z of the rank's heads
    assert tuple(layer.in_proj_ba.weight.shape) == (2 * hv, 2048)
    assert tuple(layer.out_proj.weight.shape) == (2048, hv * 128)


def test_the_decode_contract_binds_its_dims_from_the_layer_config():
    layer = build(tiny_config(2))
    ssm, conv = layer.new_state_pools(4)
    dims = Qwen3NextGatedDeltaNet.decode.__kda_contract__.validate(layer, torch.randn(2, 32), ssm, conv,
                                                                    torch.tensor([0, 1]))
    assert (dims.HV, dims.K, dims.V, dims.D, dims.C, dims.W, dims.N) == (2, 8, 12, 32, 40, 3, 4)
    assert dims.provenance["HV"] == "from config (num_v_heads=4 / tp_size=2)"
    assert dims.provenance["C"] == "from config (2*H*K+HV*V = 40, the q/k/v conv channels per rank)"


def test_the_layer_takes_a_gdn_config_only():
    with pytest.raises(TypeError, match=r"Qwen3NextGatedDeltaNet takes a GDNConfig .*got KDAConfig"):
        Qwen3NextGatedDeltaNet(kc.KDAConfig(num_heads=2, head_k_dim=8, hidden_size=32))


# -- decode against the reference ---------------------------------------------------------------------
@pytest.mark.parametrize("prompts_via_prefill", [False, True], ids=["decode-only", "prefill-then-decode"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_continuous_batching_matches_the_per_request_recurrence(prompts_via_prefill, index_dtype):
    run = run_continuous_batching([build(tiny_config())], prompts_via_prefill=prompts_via_prefill,
                                  dtype=index_dtype, seed=int(prompts_via_prefill))
    assert_matches_reference(run, random_weights(tiny_config()))


def test_simulated_tp2_shards_sum_to_the_tp1_output_and_hold_its_states():
    layers = [build(tiny_config(2), rank=r) for r in range(2)]
    run = run_continuous_batching(layers, prompts_via_prefill=True, seed=2)
    full = random_weights(tiny_config())
    for r, x in enumerate(run.inputs):
        want, S, window = reference_request(full, TINY, x)
        torch.testing.assert_close(run.outputs[r], want, atol=1e-5, rtol=1e-5)
        for rank, (ssm, conv) in enumerate(run.final_states[r]):
            torch.testing.assert_close(ssm, S[2 * rank:2 * rank + 2], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(conv, conv_channel_shard(window, tiny_config(2), rank), atol=1e-6, rtol=1e-6)


def test_random_weights_of_a_rank_are_the_shard_of_the_tp1_weights():
    full = random_weights(tiny_config(), seed=3)
    for rank in range(2):
        mine = random_weights(tiny_config(2), seed=3, rank=rank)
        for name, t in shard_weights(full, tiny_config(2), rank).items():
            assert torch.equal(mine[name], t), name


def test_a_hugging_face_state_dict_loads_through_weights_from_hf():
    w = random_weights(tiny_config(), seed=4)
    prefix = "model.layers.0.linear_attn."
    hf = {prefix + "in_proj_qkvz.weight": w["in_proj_qkvz"], prefix + "in_proj_ba.weight": w["in_proj_ba"],
          prefix + "conv1d.weight": w["conv1d"].unsqueeze(1), prefix + "A_log": w["A_log"],
          prefix + "dt_bias": w["dt_bias"], prefix + "norm.weight": w["norm"],
          prefix + "out_proj.weight": w["out_proj"]}
    layer = build(tiny_config(2), rank=1)
    layer.load_weights(**shard_weights(weights_from_hf(hf, prefix), layer.config, 1))
    assert torch.equal(layer.in_proj_qkvz.weight, random_weights(tiny_config(2), seed=4, rank=1)["in_proj_qkvz"])
    with pytest.raises(KeyError, match=r"'model.layers.1.linear_attn.in_proj_qkvz.weight' is not in the state dict"):
        weights_from_hf(hf, "model.layers.1.linear_attn.")


def test_padding_rows_and_free_slots_are_left_untouched():
    layer = build(tiny_config())
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_()
    conv.normal_()
    before = ssm.clone(), conv.clone()
    y = layer.decode(torch.randn(3, 32), ssm, conv, torch.tensor([-1, 4, -1], dtype=torch.int32))
    assert y[0].eq(0).all() and y[2].eq(0).all() and y[1].ne(0).any()
    for pool, old in zip((ssm, conv), before, strict=True):
        assert torch.equal(pool[:4], old[:4]) and torch.equal(pool[5], old[5])
        assert not torch.equal(pool[4], old[4])


# -- TP2 over gloo, two processes ---------------------------------------------------------------------
def _tp_worker(rank: int, world: int, port: int, backend: str, mode: str) -> None:
    """One rank: its shard (contracts bound to its per-rank config) against TP1 built in-process,
    outputs after the all-reduce and its share of both pools, under continuous batching."""
    with process_group(rank, world, port, backend, mode) as device:
        kernel = "auto" if backend == "nccl" else "torch"
        cfg = tiny_config(world)
        layer = build(cfg, rank=rank, tp_group=dist.group.WORLD, device=device, backend=kernel)
        tp1 = build(tiny_config(), device=device, backend=kernel)
        for attempt in (lambda: layer.check_state_pools(*tp1.new_state_pools(2)),
                        lambda: layer.load_weights(**random_weights(tiny_config()))):
            with pytest.raises(kc.ShapeError, match=f"TP mismatch: .* config is for tp_size={world}"):
                attempt()
        shard_pools, full_pools = layer.new_state_pools(6), tp1.new_state_pools(6)
        gen = torch.Generator().manual_seed(5)
        schedule = [[0], [0, 1], [1, -1, 0], [2, 1, -1], [-1, 2], [3, 2, 4, -1], [4, 3]]  # join, leave, pad
        for step, slots in enumerate(schedule):
            idx = torch.tensor(slots, device=device)
            if step in (0, 1):  # requests on slots 0 and 1 join with a prompt; 2, 3, 4 on fresh slots
                idx_new = torch.tensor([step], device=device)
                prompt = torch.randn(1, 3, 32, generator=gen).to(device)
                torch.testing.assert_close(layer.prefill(prompt, *shard_pools, idx_new),
                                           tp1.prefill(prompt, *full_pools, idx_new), atol=1e-5, rtol=1e-5)
            x = torch.randn(len(slots), 32, generator=gen).to(device)
            torch.testing.assert_close(layer.decode(x, *shard_pools, idx), tp1.decode(x, *full_pools, idx),
                                       atol=1e-5, rtol=1e-5)
        hv = cfg.local_num_v_heads
        torch.testing.assert_close(shard_pools[0], full_pools[0][:, rank * hv:(rank + 1) * hv], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(shard_pools[1], conv_channel_shard(full_pools[1].transpose(0, 1), cfg, rank)
                                   .transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_tp2_over_gloo_gives_the_tp1_outputs_and_states():
    spawn(_tp_worker, "gloo")


@pytest.mark.skipif(not NCCL_PAIR, reason="needs two GPUs and NCCL")
def test_tp2_over_nccl_gives_the_tp1_outputs_and_states():
    spawn(_tp_worker, "nccl")


# -- contracts: TP mismatches and loading mistakes ------------------------------------------------
def test_tp1_weights_loaded_into_a_tp2_layer_are_rejected_as_a_tp_mismatch():
    layer = Qwen3NextGatedDeltaNet(tiny_config(2), tp_rank=1)
    for param in layer.parameters():
        param.fill_(7.0)
    with pytest.raises(kc.ShapeError) as err:
        layer.load_weights(**random_weights(tiny_config(1)))
    assert str(err.value) == (
        "Qwen3NextGatedDeltaNet.load_weights(): 6 contract violations\n"
        "  [1] in_proj_qkvz: ShapeError\n"
        "      expected [C+HV*V, D] = [64, 32]\n"
        "      got      [128, 32]\n"
        "      dim 0 (C+HV*V): expected 64, got 128\n"
        "      fix: TP mismatch: in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias and out_proj are sized for "
        "tp_size=1 (HV=4, C=80 per rank) but this layer's config is for tp_size=2 (HV=2, C=40; num_v_heads=4 / "
        "tp_size=2). Build the layer, its weights (shard_weights(weights, config, rank)) and its pools "
        "(layer.new_state_pools(n)) from one GDNConfig, e.g. GDNConfig.from_hf_config(path, tp_size=2); the other "
        "shape violations follow from this one\n"
        "  [2] in_proj_ba: ShapeError\n"
        "      expected [2*HV, D] = [4, 32]\n"
        "      got      [8, 32]\n"
        "      dim 0 (2*HV): expected 4, got 8\n"
        "  [3] conv1d: ShapeError\n"
        "      expected [C, W+1] = [40, 4]\n"
        "      got      [80, 4]\n"
        "      dim 0 (C): expected 40 (C from config (2*H*K+HV*V = 40, the q/k/v conv channels per rank)), got 80\n"
        "  [4] A_log: ShapeError\n"
        "      expected [HV] = [2]\n"
        "      got      [4]\n"
        "      dim 0 (HV): expected 2 (HV from config (num_v_heads=4 / tp_size=2)), got 4\n"
        "  [5] dt_bias: ShapeError\n"
        "      expected [HV] = [2]\n"
        "      got      [4]\n"
        "      dim 0 (HV): expected 2 (HV from config (num_v_heads=4 / tp_size=2)), got 4\n"
        "  [6] out_proj: ShapeError\n"
        "      expected [D, HV*V] = [32, 24]\n"
        "      got      [32, 48]\n"
        "      dim 1 (HV*V): expected 24, got 48\n"
        "  dims: C=40 from config (2*H*K+HV*V = 40, the q/k/v conv channels per rank); HV=2 from config "
        "(num_v_heads=4 / tp_size=2); V=12 from config (head_v_dim=12); D=32 from config (hidden_size=32); "
        "W=3 from config (conv_kernel_size=4 - 1)")
    assert all(param.eq(7.0).all() for param in layer.parameters())  # nothing was copied


def test_tp2_pools_given_to_a_tp1_layer_are_rejected_and_left_untouched():
    layer = build(tiny_config(1))
    ssm, conv = Qwen3NextGatedDeltaNet(tiny_config(2)).new_state_pools(4)
    conv.normal_()
    before = ssm.clone(), conv.clone()
    with pytest.raises(kc.ShapeError, match=(
            r"(?s)Qwen3NextGatedDeltaNet\.decode\(\): 2 contract violations\n"
            r"  \[1\] ssm_states: ShapeError\n"
            r"      expected \[N, HV, V, K\] = \[4, 4, 12, 8\]\n"
            r"      got      \[4, 2, 12, 8\]\n"
            r"      dim 1 \(HV\): expected 4 \(HV from config \(num_v_heads=4\)\), got 2\n"
            r"      fix: TP mismatch: ssm_states and conv_states are sized for tp_size=2 \(HV=2, C=40 per rank\) "
            r"but this layer's config is for tp_size=1 \(HV=4, C=80; num_v_heads=4\)\. .*"
            r"  \[2\] conv_states: ShapeError\n"
            r"      expected \[N, C, W\] = \[4, 80, 3\]")):
        layer.decode(torch.randn(2, 32), ssm, conv, torch.tensor([0, 1]))
    assert torch.equal(ssm, before[0]) and torch.equal(conv, before[1])  # a rejected call writes nothing
    with pytest.raises(kc.ShapeError, match=r"TP mismatch: ssm_states and conv_states are sized for tp_size=2"):
        layer.check_state_pools(ssm, conv)


def test_a_hugging_face_conv_weight_names_squeeze():
    w = random_weights(tiny_config())
    w["conv1d"] = w["conv1d"].unsqueeze(1)
    with pytest.raises(kc.ShapeError, match=r"(?s)conv1d: ShapeError\n      expected \[C, W\+1\] \(rank 2\)\n"
                                            r"      got      \[80, 1, 4\] \(rank 3\)\n      fix: conv1d looks like "
                                            r"nn\.Conv1d's weight \[80, 1, 4\] .*: pass conv1d\.squeeze\(1\)"):
        build(tiny_config()).load_weights(**w)


def test_a_kda_shaped_dt_bias_is_named_as_kimi_linear_s_gate():
    w = random_weights(tiny_config())
    w["dt_bias"] = torch.zeros(4 * 8)
    with pytest.raises(kc.ShapeError, match=r"fix: dt_bias has HV\*K = 32 entries, one per value head and key "
                                            r"channel: that is KDA's \(Kimi-Linear's\) per-channel gate\. GDN has "
                                            r"one decay per value head: dt_bias is \[HV\] = \[4\]"):
        build(tiny_config()).load_weights(**w)


def test_a_conv_pool_of_the_wrong_width_names_conv_kernel_size():
    layer = build(tiny_config())
    ssm, _ = layer.new_state_pools(4)
    with pytest.raises(kc.ShapeError, match=r"(?s)dim 2 \(W\): expected 3 \(W from config \(conv_kernel_size=4 - 1\)\)"
                                            r", got 4.*fix: a conv-state slot keeps the last W = conv_kernel_size - 1"):
        layer.decode(torch.randn(2, 32), ssm, torch.zeros(4, 80, 4), torch.tensor([0, 1]))


@pytest.mark.kda_contracts("strict")
def test_strict_mode_rejects_duplicate_slots_before_any_state_is_written():
    layer = build(tiny_config())
    ssm, conv = layer.new_state_pools(4)
    conv.normal_()
    before = conv.clone()
    with pytest.raises(kc.ValueRangeError, match=r"1 duplicate slot\(s\)"):
        layer.decode(torch.randn(2, 32), ssm, conv, torch.tensor([2, 2]))
    assert torch.equal(conv, before)


# -- shared with the Kimi-Linear layer (kda_contracts.models.linear_attention) ----------------------
def build_kimi():
    from kda_contracts.models.kimi_linear import KimiDeltaAttention
    from kda_contracts.models.kimi_linear import random_weights as kimi_weights

    cfg = kc.KDAConfig(num_heads=2, head_k_dim=8, hidden_size=32)
    layer = KimiDeltaAttention(cfg, backend="torch")
    layer.load_weights(**kimi_weights(cfg))
    return layer


@pytest.mark.parametrize("layer_of", [lambda: build(tiny_config()), lambda: build_kimi()], ids=["qwen3-next", "kimi"])
def test_an_empty_batch_is_a_no_op_for_both_layers(layer_of):
    layer = layer_of()
    D = layer.contract_dims()["D"]
    ssm, conv = layer.new_state_pools(3)
    conv.normal_()
    before = ssm.clone(), conv.clone()
    empty = torch.empty(0, dtype=torch.int64)
    assert layer.decode(torch.randn(0, D), ssm, conv, empty).shape == (0, D)
    assert layer.prefill(torch.randn(0, 2, D), ssm, conv, empty).shape == (0, 2, D)
    assert torch.equal(ssm, before[0]) and torch.equal(conv, before[1])

