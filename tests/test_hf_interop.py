"""Hugging Face interop without transformers' modules: configs read from a dict, a config.json or a
config object (transformers' when installed, a SimpleNamespace stand-in otherwise), Kimi-Linear's
weights_from_hf, the cache-state conversions, and the hints for Hugging Face's layouts.
(tests/test_hf_transformers.py runs the layers against transformers' own modules.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

import pytest
import torch

import kda_contracts as kc
from kda_contracts.models import kimi_linear, qwen3_next
from kda_contracts.models.hf_interop import set_hf_cache_states, states_from_hf, states_to_hf

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

KIMI_FIELDS = dict(model_type="kimi_linear", hidden_size=32, num_hidden_layers=3, rms_norm_eps=1e-5,
                   linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=4,
                   layer_types=["linear_attention", "linear_attention", "full_attention"])
QWEN_FIELDS = dict(model_type="qwen3_next", hidden_size=32, num_hidden_layers=4, rms_norm_eps=1e-6,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                   linear_value_head_dim=12, linear_conv_kernel_dim=3,
                   layer_types=["linear_attention"] * 3 + ["full_attention"])


def _object(fields):
    """A transformers config object when transformers is installed, else a stand-in with attributes."""
    if not HAS_TRANSFORMERS:
        return SimpleNamespace(**fields)
    import transformers

    cls = transformers.KimiLinearConfig if fields["model_type"] == "kimi_linear" else transformers.Qwen3NextConfig
    return cls(**{k: v for k, v in fields.items() if k != "model_type"})


def _sources(fields, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return {"dict": dict(fields), "path": path, "str path": str(path), "object": _object(fields),
            "namespace": SimpleNamespace(**fields)}


SOURCES = ["dict", "path", "str path", "object", "namespace"]


# -- configs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", SOURCES)
def test_kimi_config_from_a_dict_path_or_object(source, tmp_path):
    cfg = kc.KDAConfig.from_hf_config(_sources(KIMI_FIELDS, tmp_path)[source], tp_size=2)
    assert cfg == kc.KDAConfig(num_heads=2, head_k_dim=8, hidden_size=32, conv_kernel_size=4, kda_layers=(1, 2),
                               tp_size=2)
    layer = kimi_linear.KimiDeltaAttention.from_hf_config(_sources(KIMI_FIELDS, tmp_path)[source], device="meta")
    assert layer.config == cfg.with_tp(1) and layer.rms_norm_eps == 1e-5


@pytest.mark.parametrize("source", SOURCES)
def test_qwen3_next_config_from_a_dict_path_or_object(source, tmp_path):
    cfg = kc.GDNConfig.from_hf_config(_sources(QWEN_FIELDS, tmp_path)[source], tp_size=2)
    assert cfg == kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32,
                               conv_kernel_size=3, gdn_layers=(1, 2, 3), tp_size=2)
    layer = qwen3_next.Qwen3NextGatedDeltaNet.from_hf_config(_sources(QWEN_FIELDS, tmp_path)[source], tp_size=2,
                                                            tp_rank=1, device="meta")
    assert layer.config == cfg and layer.rms_norm_eps == 1e-6


def test_kimi_config_reads_the_checkpoint_block_and_transformers_fields_alike():
    block = {"linear_attn_config": {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4, "kda_layers": [1, 2]},
             "hidden_size": 32}
    both = {**block, **KIMI_FIELDS}  # a KimiLinearConfig built from a checkpoint's config.json keeps both
    assert kc.KDAConfig.from_hf_config(block) == kc.KDAConfig.from_hf_config(KIMI_FIELDS) \
        == kc.KDAConfig.from_hf_config(both)
    with pytest.raises(ValueError, match=r"linear_attn_config.num_heads=2 disagrees with linear_num_heads=4"):
        kc.KDAConfig.from_hf_config({**both, "linear_num_heads": 4})
    with pytest.raises(ValueError, match=r"Nor has it transformers' KimiLinearConfig fields linear_num_heads"):
        kc.KDAConfig.from_hf_config(SimpleNamespace(model_type="llama", hidden_size=8))


def test_a_layer_refuses_a_config_whose_activation_is_not_silu():
    with pytest.raises(ValueError, match=r"hidden_act='gelu': Qwen3NextGatedDeltaNet's short conv applies SiLU"):
        qwen3_next.Qwen3NextGatedDeltaNet.from_hf_config({**QWEN_FIELDS, "hidden_act": "gelu"}, device="meta")


def test_a_config_of_no_known_kind_is_refused_with_what_is_accepted():
    with pytest.raises(TypeError, match=r"a config.json path, a dict or a config object .*not int"):
        kc.GDNConfig.from_hf_config(3)


# -- weights --------------------------------------------------------------------------------------------
def _kimi_hf_state_dict(w, prefix="", checkpoint=False):
    """Kimi weights under transformers' module names, or the checkpoint files' (checkpoint=True)."""
    C, HK = w["qkv_proj"].shape[0], w["qkv_proj"].shape[0] // 3
    q, k, v = w["qkv_proj"].split(HK)
    sd = {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v, "b_proj.weight": w["b_proj"],
          "g_a_proj.weight": w["g_a_proj"], "g_b_proj.weight": w["g_b_proj"], "o_norm.weight": w["o_norm"],
          "o_proj.weight": w["o_proj"]}
    gate = "" if checkpoint else "forget_gate."
    sd |= {gate + "f_a_proj.weight": w["f_a_proj"], gate + "f_b_proj.weight": w["f_b_proj"],
           gate + "dt_bias": w["dt_bias"], gate + "A_log": w["A_log"].view(1, 1, -1, 1)}
    conv = w["conv1d"].unsqueeze(1)
    if checkpoint:
        sd |= dict(zip(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"), conv.split(C // 3), strict=True))
    else:
        sd["conv1d.weight"] = conv
    return {prefix + name: t for name, t in sd.items()}


@pytest.mark.parametrize("checkpoint", [False, True], ids=["module names", "checkpoint names"])
def test_kimi_weights_from_hf_round_trip_and_shard(checkpoint):
    cfg = kc.KDAConfig.from_hf_config(KIMI_FIELDS)
    w = kimi_linear.random_weights(cfg, seed=3)
    prefix = "model.layers.0.self_attn."
    got = kimi_linear.weights_from_hf(_kimi_hf_state_dict(w, prefix, checkpoint), prefix)
    assert got.keys() == w.keys() and all(torch.equal(got[n], w[n]) for n in w)
    layer = kimi_linear.KimiDeltaAttention(cfg.with_tp(2), tp_rank=1)
    layer.load_weights(**kimi_linear.shard_weights(got, layer.config, 1))
    assert torch.equal(layer.qkv_proj.weight, kimi_linear.random_weights(cfg.with_tp(2), seed=3, rank=1)["qkv_proj"])
    with pytest.raises(KeyError, match=r"'model.layers.1.self_attn.q_proj.weight'.* is not in the state dict; is "
                                       r"'model.layers.1.self_attn.' the prefix of a Kimi-Linear KDA layer"):
        kimi_linear.weights_from_hf(_kimi_hf_state_dict(w, prefix), "model.layers.1.self_attn.")


def test_kimi_a_log_as_hugging_face_stores_it_gets_a_reshape_fix():
    cfg = kc.KDAConfig.from_hf_config(KIMI_FIELDS)
    layer = kimi_linear.KimiDeltaAttention(cfg)
    w = kimi_linear.random_weights(cfg)
    with pytest.raises(kc.ShapeError) as err:
        layer.load_weights(**{**w, "A_log": w["A_log"].view(1, 1, 2, 1)})
    assert err.value.violations[0].hint == (
        "A_log looks like Hugging Face's KimiLinearForgetGate.A_log [1, 1, 2, 1] ([1, 1, H, 1]): the layer takes "
        "one decay per value head, [HV] = [2]: pass A_log.reshape(-1), or load the checkpoint with "
        "weights_from_hf(state_dict, prefix), which reshapes it")
    with pytest.raises(kc.ShapeError, match=r"nn\.Conv1d's weight \[48, 1, 4\].*pass conv1d\.squeeze\(1\)"):
        layer.load_weights(**{**w, "conv1d": w["conv1d"].unsqueeze(1)})


# -- states -------------------------------------------------------------------------------------------
def _qwen_layer():
    cfg = kc.GDNConfig.from_hf_config(QWEN_FIELDS)
    layer = qwen3_next.Qwen3NextGatedDeltaNet(cfg)
    layer.load_weights(**qwen3_next.random_weights(cfg))
    return layer


def test_states_to_hf_and_back_is_exact_and_touches_only_the_slots():
    layer = _qwen_layer()  # K=8 != V=12: the layouts differ by shape
    ssm, conv = layer.new_state_pools(5)
    ssm.normal_(), conv.normal_()
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    recurrent, conv_hf = states_to_hf(layer, ssm, conv, slots)
    assert recurrent.shape == (3, 4, 8, 12) and conv_hf.shape == (3, 80, 3) and recurrent.is_contiguous()
    assert torch.equal(recurrent[0], ssm[3].transpose(-1, -2)) and torch.equal(conv_hf[2, :, 1:], conv[0])
    assert recurrent[1].eq(0).all() and conv_hf[1].eq(0).all() and conv_hf[..., 0].eq(0).all()
    ssm2, conv2 = layer.new_state_pools(5)
    states_from_hf(layer, recurrent, conv_hf, ssm2, conv2, slots)
    for pool, old in ((ssm2, ssm), (conv2, conv)):
        assert torch.equal(pool[[3, 0]], old[[3, 0]]) and pool[[1, 2, 4]].eq(0).all()


def test_states_from_hf_casts_to_the_pool_dtype():
    layer = _qwen_layer()
    ssm, conv = layer.new_state_pools(2, state_dtype=torch.bfloat16)
    recurrent = torch.randn(1, 4, 8, 12, dtype=torch.float64)
    states_from_hf(layer, recurrent, torch.randn(1, 80, 3), ssm, conv, torch.tensor([1]))
    assert torch.equal(ssm[1], recurrent[0].transpose(-1, -2).to(torch.bfloat16))


def test_our_layouts_handed_to_states_from_hf_get_a_hint():
    layer = _qwen_layer()
    ssm, conv = layer.new_state_pools(2)
    slots = torch.tensor([0])
    with pytest.raises(kc.ShapeError) as err:
        states_from_hf(layer, ssm[:1], torch.randn(1, 80, 3), ssm, conv, slots)  # ours, [B, HV, V, K]
    assert err.value.violations[0].hint.startswith(
        "recurrent_state looks like our VK layout [B, HV, V, K] = [1, 4, 12, 8]; a Hugging Face cache holds "
        "[B, HV, K, V] (KV)")
    with pytest.raises(kc.ShapeError) as err:
        states_from_hf(layer, torch.randn(1, 4, 8, 12), conv[:1], ssm, conv, slots)  # k-1 columns
    assert err.value.violations[0].hint.startswith(
        "conv_state has k-1 = 2 columns, our pool's; a Hugging Face cache keeps the last k = conv_kernel_size = 3")


def test_a_kv_pool_handed_to_a_layer_gets_the_layout_hint():
    layer = _qwen_layer()
    _, conv = layer.new_state_pools(2)
    kv_pool = torch.zeros(2, 4, 8, 12)  # [N, HV, K, V]
    with pytest.raises(kc.ShapeError) as err:
        layer.decode(torch.randn(1, 32), kv_pool, conv, torch.tensor([0]))
    assert err.value.violations[0].hint.startswith(
        "ssm_states looks like a KV-layout pool [N, HV, K, V] = [2, 4, 8, 12] (fla's and Hugging Face's "
        "recurrent-state layout), but this layer keeps its states as [N, HV, V, K] (VK, sglang's): convert it once "
        "with .transpose(-1, -2).contiguous()")
    kimi = kimi_linear.KimiDeltaAttention(kc.KDAConfig.from_hf_config(KIMI_FIELDS))  # K == V: only strides tell
    _, conv = kimi.new_state_pools(2)
    with pytest.raises(kc.LayoutError) as err:
        kimi.check_state_pools(torch.zeros(2, 2, 8, 8).transpose(-1, -2), conv)
    assert err.value.violations[0].hint.startswith("ssm_states is a transposed view (its last dim is strided")


def test_set_hf_cache_states_fills_a_fresh_cache_then_copies_into_it():
    class FakeCache:  # the four methods a transformers cache has, as the helper uses them
        def __init__(self):
            self.conv = self.rec = None

        def get_conv_state(self, i):
            return self.conv

        def get_recurrent_state(self, i):
            return self.rec

        def update_conv_state(self, t, i):
            self.conv = t.clone()

        def update_recurrent_state(self, t, i):
            self.rec = t.clone()

    cache, rec, conv = FakeCache(), torch.randn(1, 4, 8, 12), torch.randn(1, 80, 3)
    set_hf_cache_states(cache, 0, rec, conv)
    held = cache.rec
    set_hf_cache_states(cache, 0, rec * 2, conv * 2)
    assert cache.rec is held and torch.equal(held, rec * 2) and torch.equal(cache.conv, conv * 2)


def test_importing_the_library_does_not_import_transformers():
    import subprocess

    code = ("import sys, kda_contracts, kda_contracts.models, kda_contracts.models.hf_interop; "
            "sys.exit('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
