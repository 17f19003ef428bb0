"""KDAConfig: per-rank dims, validators, Kimi-Linear config.json, presets, JSON round-trip."""

import json
from pathlib import Path

import pytest

import kda_contracts as kc

DATA = Path(__file__).parent / "data"
KIMI_JSON = DATA / "kimi_linear_48b_a3b_config.json"


@pytest.mark.parametrize("tp,heads", [(1, 32), (2, 16), (4, 8), (8, 4)])
def test_kimi_linear_preset_gives_per_rank_heads(tp, heads):
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=tp)
    assert cfg.contract_dims() == {"H": heads, "HV": heads, "K": 128, "V": 128}
    assert cfg.gate == "softplus" and cfg.effective_lower_bound is None and cfg.use_qk_l2norm


def test_from_hf_config_reads_linear_attn_config():
    cfg = kc.KDAConfig.from_hf_config(KIMI_JSON, tp_size=2)
    assert (cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.tp_size) == (32, 128, 128, 2)
    assert cfg.local_num_heads == 16 and cfg.conv_kernel_size == 4 and cfg.hidden_size == 2304
    assert len(cfg.kda_layers) == 20
    assert cfg == kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2)


def test_from_hf_config_accepts_a_dict_and_overrides():
    raw = json.loads(KIMI_JSON.read_text())
    cfg = kc.KDAConfig.from_hf_config(raw, state_dtype="bfloat16")
    assert cfg.state_dtype == "bfloat16"


def test_from_hf_config_rejects_a_foreign_config_with_a_clear_message():
    with pytest.raises(ValueError, match=r"has no 'linear_attn_config' object; is it a Kimi-Linear config.json\? "
                                         r"\(model_type='llama'\)"):
        kc.KDAConfig.from_hf_config({"model_type": "llama", "hidden_size": 4096})
    with pytest.raises(ValueError, match="linear_attn_config lacks head_dim"):
        kc.KDAConfig.from_hf_config({"linear_attn_config": {"num_heads": 32}})


def test_bounded_gate_preset_and_lower_bound_from_config_json():
    k3 = kc.KDAConfig.preset("kimi-k3-like", tp_size=8)
    assert k3.local_num_heads == 12 and k3.effective_lower_bound == -5.0
    cfg = kc.KDAConfig.from_hf_config({"linear_attn_config": {"num_heads": 8, "head_dim": 64, "lower_bound": -5}})
    assert cfg.gate == "bounded" and cfg.lower_bound == -5.0


def test_scale_defaults_to_k_to_the_minus_half():
    assert kc.KDAConfig(num_heads=2, head_k_dim=64).scale == 64 ** -0.5
    assert kc.KDAConfig(num_heads=2, head_k_dim=64, scale=0.5).scale == 0.5


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_heads=32, head_k_dim=128, tp_size=3),
     r"num_heads=32 is not divisible by tp_size=3; heads are sharded evenly over ranks \(valid tp_size: 1, 2, 4, "),
    (dict(num_heads=4, num_v_heads=6, head_k_dim=8), r"num_v_heads=6 must be a multiple of num_heads=4"),
    (dict(num_heads=4, head_k_dim=8, gate="bounded"), r"gate='bounded' needs lower_bound"),
    (dict(num_heads=4, head_k_dim=8, gate="bounded", lower_bound=1.0), r"lower_bound must be a finite float < 0"),
    (dict(num_heads=4, head_k_dim=8, lower_bound=-5.0), r"lower_bound=-5.0 is only used by the bounded gate"),
    (dict(num_heads=0, head_k_dim=8), r"num_heads: Input should be greater than 0 \(got 0\)$"),
    (dict(num_heads=4, head_k_dim=8, state_layout="kv"), r"state_layout: Input should be 'VK' or 'KV' \(got 'kv'\)$"),
    (dict(num_heads=4, head_k_dim=8, state_dtype="float64"),
     r"state_dtype: Input should be 'float32', 'bfloat16' or 'float16' \(got 'float64'\)$"),
    (dict(num_heads=4, head_k_dim=8, heads=4), r"heads: Extra inputs are not permitted \(got 4\)$"),
])
def test_validators_explain_what_is_wrong(kwargs, message):
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: " + message):
        kc.KDAConfig(**kwargs)


def test_config_is_frozen():
    cfg = kc.KDAConfig(num_heads=4, head_k_dim=8)
    with pytest.raises(kc.ConfigError, match=r"num_heads: a config is frozen; make a changed copy with "
                                            r"cfg.model_copy\(update=\{'num_heads': ...\}\)"):
        cfg.num_heads = 8


@pytest.mark.parametrize("name", sorted(kc.PRESETS))
def test_json_round_trip_preserves_the_config_and_its_dims(name):
    cfg = kc.KDAConfig.preset(name, tp_size=2, state_dtype="bfloat16", index_dtype="int32")
    back = kc.KDAConfig.model_validate_json(cfg.model_dump_json())
    assert back == cfg and back.contract_dims() == cfg.contract_dims()
    assert back.contract_dtypes() == cfg.contract_dtypes()


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(kc.ConfigError, match=r"^unknown preset 'kimi'; known: kimi-k3-like, kimi-linear-48b-a3b$"):
        kc.KDAConfig.preset("kimi")


def test_with_tp_revalidates():
    with pytest.raises(kc.ConfigError, match="not divisible by tp_size=64"):
        kc.KDAConfig.preset("kimi-linear-48b-a3b").with_tp(64)
