"""KDAConfig / GDNConfig at their edges: a changed copy is validated afresh, fields are strict
(True is not 1, "4" is not 4), layer indices are 1-based and distinct, and every bad config —
made, copied, assigned to, a preset, a Hugging Face file — is one kc.ConfigError (an
AnnotationError and a ValueError) listing each problem by field, pydantic's error as its cause."""

import json
import re

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import kda_contracts as kc


def _small(**kw):
    return kc.KDAConfig(**{"num_heads": 2, "head_k_dim": 8, **kw})


# -- A6: model_copy(update=) validates and the dims follow --------------------------------------
def test_model_copy_recomputes_the_dims_and_what_was_derived():
    cfg = _small()
    wider = cfg.model_copy(update={"num_heads": 4})
    assert wider.contract_dims() == {"H": 4, "HV": 4, "K": 8, "V": 8}
    assert wider.local_num_heads == 4 and wider.contract_dim_source("H") == "num_heads=4"
    k64 = cfg.model_copy(update={"head_k_dim": 64})
    assert k64.scale == 64 ** -0.5 and k64.head_v == 64
    # what was given stays given
    assert _small(num_v_heads=4, scale=0.5).model_copy(update={"head_k_dim": 16}).scale == 0.5


def test_model_copy_refuses_an_update_that_makes_a_bad_config():
    cfg = _small(num_v_heads=4)
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: num_v_heads=4 must be a multiple of num_heads=3"):
        cfg.model_copy(update={"num_heads": 3})
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: heads: Extra inputs are not permitted"):
        cfg.model_copy(update={"heads": 3})
    assert cfg.model_copy() == cfg and cfg.model_copy(deep=True) == cfg


def test_a_gdn_config_copy_stays_a_gdn_config():
    cfg = kc.GDNConfig.preset("qwen3-next-80b-a3b")
    tp2 = cfg.model_copy(update={"tp_size": 2})
    assert type(tp2) is kc.GDNConfig and tp2.contract_dims()["HV"] == 16
    with pytest.raises(kc.ConfigError, match=r"^invalid GDNConfig: GDN has only the softplus gate"):
        cfg.model_copy(update={"gate": "bounded", "lower_bound": -5.0})


# -- A7: strict fields ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    (dict(num_heads=True), r"num_heads: Input should be a valid integer \(got True\)$"),
    (dict(head_k_dim=True), r"head_k_dim: Input should be a valid integer \(got True\)$"),
    (dict(num_heads="4"), r"num_heads: Input should be a valid integer \(got '4'\)$"),
    (dict(num_heads=4.0), r"num_heads: Input should be a valid integer \(got 4.0\)$"),
    (dict(tp_size="2"), r"tp_size: Input should be a valid integer \(got '2'\)$"),
    (dict(use_qk_l2norm="no"), r"use_qk_l2norm: Input should be a valid boolean \(got 'no'\)$"),
    (dict(use_qk_l2norm=1), r"use_qk_l2norm: Input should be a valid boolean \(got 1\)$"),
    (dict(scale=float("inf")), r"scale: Input should be a finite number \(got inf\)$"),
    (dict(scale=float("nan")), r"scale: Input should be a finite number \(got nan\)$"),
    (dict(scale="0.5"), r"scale: Input should be a valid number \(got '0.5'\)$"),
    (dict(kda_layers=(0, -1, 1)), r"kda_layers: layer indices are 1-based \(>= 1\), got 0, -1$"),
    (dict(kda_layers=(1, 2, 2, 3, 3)), r"kda_layers: layer 2, 3 listed more than once$"),
    (dict(kda_layers=(1, True)), r"kda_layers\[1\]: Input should be a valid integer \(got True\)$"),
])
def test_fields_are_strict(kwargs, message):
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: " + message):
        _small(**kwargs)


def test_gdn_layers_are_checked_like_kda_layers():
    with pytest.raises(kc.ConfigError, match=r"^invalid GDNConfig: gdn_layers: layer 4 listed more than once$"):
        kc.GDNConfig(num_heads=2, head_k_dim=8, gdn_layers=[4, 4])
    with pytest.raises(kc.ConfigError, match=r"^invalid GDNConfig: num_heads: Input should be a valid integer"):
        kc.GDNConfig(num_heads=False, head_k_dim=8)


def test_numpy_scalars_and_json_lists_are_fine():
    cfg = kc.KDAConfig(num_heads=np.int64(4), head_k_dim=np.int32(8), tp_size=np.int64(2),
                       use_qk_l2norm=np.bool_(False), scale=np.float64(0.5), kda_layers=[1, np.int64(3)])
    assert cfg.contract_dims() == {"H": 2, "HV": 2, "K": 8, "V": 8}
    assert type(cfg.num_heads) is int and cfg.use_qk_l2norm is False and cfg.kda_layers == (1, 3)
    assert kc.KDAConfig.model_validate_json(cfg.model_dump_json()) == cfg


# -- B2: one ConfigError for every bad config ---------------------------------------------------
def test_config_error_is_an_annotation_error_and_a_value_error_with_the_pydantic_cause():
    assert issubclass(kc.ConfigError, kc.AnnotationError) and issubclass(kc.ConfigError, ValueError)
    assert "ConfigError" in kc.__all__
    with pytest.raises(kc.ConfigError) as info:
        kc.KDAConfig(num_heads=-1, head_k_dim="x", heads=3)
    err = info.value
    assert isinstance(err.__cause__, ValidationError)
    assert str(err) == ("invalid KDAConfig: 3 problems\n"
                        "  - num_heads: Input should be greater than 0 (got -1)\n"
                        "  - head_k_dim: Input should be a valid integer (got 'x')\n"
                        "  - heads: Extra inputs are not permitted (got 3)")
    assert err.problems == (("num_heads", "Input should be greater than 0 (got -1)"),
                            ("head_k_dim", "Input should be a valid integer (got 'x')"),
                            ("heads", "Extra inputs are not permitted (got 3)"))
    assert "errors.pydantic.dev" not in str(err)


@pytest.mark.parametrize("make,message", [
    (lambda: kc.KDAConfig(), r"^invalid KDAConfig: 2 problems\n  - num_heads: Field required\n"
                             r"  - head_k_dim: Field required$"),
    (lambda: kc.KDAConfig(num_heads=4, num_v_heads=6, head_k_dim=8), r"num_v_heads=6 must be a multiple of"),
    (lambda: kc.KDAConfig(num_heads=4, head_k_dim=8, gate="tanh"),
     r"^invalid KDAConfig: gate: Input should be 'softplus' or 'bounded' \(got 'tanh'\)$"),
    (lambda: kc.KDAConfig.model_validate({"num_heads": 2}), r"^invalid KDAConfig: head_k_dim: Field required$"),
    (lambda: kc.KDAConfig.model_validate_json('{"num_heads": 1'), r"^invalid KDAConfig: Invalid JSON"),
    (lambda: kc.KDAConfig.model_validate(5), r"^invalid KDAConfig: Input should be a valid dictionary"),
    (lambda: kc.KDAConfig.preset("nope"), r"^unknown preset 'nope'; known: kimi-k3-like, kimi-linear-48b-a3b$"),
    (lambda: kc.KDAConfig.preset(5), r"^unknown preset 5; known: "),
    (lambda: kc.KDAConfig.preset(["x"]), r"^unknown preset \['x'\]; known: "),
    (lambda: kc.GDNConfig.preset("kimi-linear-48b-a3b"), r"^unknown preset 'kimi-linear-48b-a3b'; known: qwen3-next"),
    (lambda: _small().with_tp(0), r"^invalid KDAConfig: tp_size: Input should be greater than 0 \(got 0\)$"),
    (lambda: _small().with_tp(3), r"^invalid KDAConfig: num_heads=2 is not divisible by tp_size=3"),
    (lambda: _small().contract_dim_source("Q"), r"^KDAConfig fixes no dim 'Q'; it fixes H, HV, K, V$"),
])
def test_every_bad_config_is_a_config_error(make, message):
    with pytest.raises(kc.ConfigError, match=message):
        make()


def test_assigning_or_deleting_a_field_is_a_config_error():
    cfg = _small()
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: tp_size: a config is frozen; make a changed copy"):
        cfg.tp_size = 2
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: num_heads: a config is frozen"):
        del cfg.num_heads
    with pytest.raises(kc.ConfigError, match=r"^KDAConfig has no field 'heads' \(and a config is frozen\)$"):
        cfg.heads = 2
    assert cfg.tp_size == 1


def test_from_hf_config_errors_are_config_errors(tmp_path):
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(kc.ConfigError, match=rf"^no Hugging Face config file at '{missing}'$") as info:
        kc.KDAConfig.from_hf_config(missing)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    with pytest.raises(kc.ConfigError, match=rf"^the Hugging Face config file '{garbage}' is not JSON: "):
        kc.GDNConfig.from_hf_config(garbage)
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([1, 2]))
    with pytest.raises(kc.ConfigError, match=r"holds a JSON list, not an object$"):
        kc.KDAConfig.from_hf_config(listed)
    with pytest.raises(kc.ConfigError, match=r"^cannot read the Hugging Face config file '.*': \[Errno 21\]"):
        kc.KDAConfig.from_hf_config(tmp_path)  # a directory
    with pytest.raises(kc.ConfigError, match=r"a config.json path, a dict or a config object .*, not int$"):
        kc.KDAConfig.from_hf_config(5)
    with pytest.raises(kc.ConfigError, match=r", not the class KDAConfig$"):
        kc.KDAConfig.from_hf_config(kc.KDAConfig)
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: the config dict has no 'linear_attn_config'"):
        kc.KDAConfig.from_hf_config({})
    with pytest.raises(kc.ConfigError, match=r"^invalid GDNConfig: the config dict lacks linear_num_key_heads"):
        kc.GDNConfig.from_hf_config({})


@pytest.mark.parametrize("block,message", [
    ({"num_heads": 8, "head_dim": 64, "kda_layers": 5}, r"kda_layers: Input should be a valid tuple \(got 5\)$"),
    ({"num_heads": 8, "head_dim": 64, "kda_layers": [0, 1]}, r"kda_layers: layer indices are 1-based"),
    ({"num_heads": 8, "head_dim": 64, "lower_bound": "x"}, r"lower_bound: Input should be a valid number \(got 'x'\)$"),
    ({"num_heads": "8", "head_dim": 64}, r"num_heads: Input should be a valid integer \(got '8'\)$"),
])
def test_from_hf_config_values_are_checked_as_strictly(block, message):
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: " + message):
        kc.KDAConfig.from_hf_config({"linear_attn_config": block})


def test_existing_value_error_handlers_still_catch_a_config_error():
    with pytest.raises(ValueError):
        kc.KDAConfig(num_heads=32, head_k_dim=128, tp_size=3)
    with pytest.raises(kc.AnnotationError):
        kc.KDAConfig.preset("nope")


# -- B8: the config protocol's own errors are AnnotationErrors naming the problem -----------------
class _RaisingDims:
    def contract_dims(self):
        raise RuntimeError("boom")


class _ListDims:
    def contract_dims(self):
        return [1, 2]


class _RaisingSource:
    def contract_dims(self):
        return {"H": 2}

    def contract_dim_source(self, sym):
        raise KeyError(sym)


@pytest.mark.parametrize("make,message", [
    (lambda: kc.config_dims(5), r"^int is not a config: pass an object with contract_dims\(\), a pydantic model"),
    (lambda: kc.config_dims(kc.KDAConfig), r"^KDAConfig is a class, not a config: pass an instance of it$"),
    (lambda: kc.config_dims(_RaisingDims()), r"^_RaisingDims.contract_dims\(\) raised RuntimeError: boom$"),
    (lambda: kc.config_dims(_ListDims()), r"^_ListDims.contract_dims\(\) returned list, not a mapping of dims$"),
    (lambda: kc.config_dim_source(_small(), "Q"), r"^KDAConfig fixes no dim 'Q'; it fixes H, HV, K, V$"),
    (lambda: kc.config_dim_source({"H": 2}, "Q"), r"^dict fixes no dim 'Q'; it fixes H$"),
    (lambda: kc.config_dim_source(kc.KDAConfig, "H"), r"^KDAConfig is a class, not a config"),
    (lambda: kc.config_dim_source(_RaisingSource(), "H"),
     r"^_RaisingSource.contract_dim_source\('H'\) raised KeyError: 'H'$"),
])
def test_config_protocol_errors_are_annotation_errors(make, message):
    with pytest.raises(kc.AnnotationError, match=message):
        make()


def test_a_raising_contract_dims_keeps_its_cause():
    with pytest.raises(kc.AnnotationError) as info:
        kc.config_dims(_RaisingDims())
    assert isinstance(info.value.__cause__, RuntimeError)
    assert kc.config_dim_source({"H": 2}, "H") == "dict.H=2"


# -- A8: GDN's ops refuse a KDA layer's config (GDN runs its softplus gate whatever it says) -------
def _gdn_decode_call(B=2, H=2, HV=4, K=8, V=8, N=4):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(mixed_qkv=r(B, 2 * H * K + HV * V), a=r(B, HV), b=r(B, HV), A_log=r(HV), dt_bias=r(HV),
                scale=K ** -0.5, initial_state=0.1 * r(N, HV, V, K), out=torch.zeros(B, 1, HV, V),
                ssm_state_indices=torch.arange(B), use_qk_l2norm_in_kernel=True)


def _gdn_prefill_call(lengths=(3, 5), H=2, HV=4, K=8, V=8, N=4):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    T = sum(lengths)
    return dict(mixed_qkv=r(T, 2 * H * K + HV * V), a=r(T, HV), b=r(T, HV), A_log=r(HV), dt_bias=r(HV),
                scale=K ** -0.5, initial_state=0.1 * r(N, HV, V, K), out=torch.zeros(T, HV, V),
                cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32), ssm_state_indices=torch.arange(2),
                has_initial_state=torch.tensor([True, False]), use_qk_l2norm_in_kernel=True)


BOUNDED = dict(num_heads=2, num_v_heads=4, head_k_dim=8, gate="bounded", lower_bound=-5.0)
LAYERED = dict(num_heads=2, num_v_heads=4, head_k_dim=8, kda_layers=(1, 2, 3))
GDN_OPS = {
    "decode": (_gdn_decode_call, kc.gdn_packed_decode, kc.validate_gdn_packed_decode),
    "prefill": (_gdn_prefill_call, kc.gdn_packed_prefill, kc.validate_gdn_packed_prefill),
}


@pytest.mark.parametrize("op", sorted(GDN_OPS))
@pytest.mark.parametrize("fields,what", [
    (BOUNDED, r"gate='bounded' \(lower_bound=-5.0\), KDA's bounded gate"),
    (LAYERED, r"kda_layers=\(1, 2, 3\), the layers of a KDA model"),
])
@pytest.mark.parametrize("how", ["run", "validate"])
def test_a_gdn_op_refuses_a_kda_layer_config(op, fields, what, how):
    make, run, validate = GDN_OPS[op]
    call, cfg = make(), kc.KDAConfig(**fields)
    before = call["initial_state"].clone()
    with pytest.raises(kc.ValueRangeError) as info:
        (run if how == "run" else validate)(**call, config=cfg)
    err = info.value
    assert [v.argument for v in err.violations] == ["config"]
    assert re.search(r"fix: the config is a KDA layer's: " + what + r"\. GDN runs only its softplus gate", str(err))
    assert "pass a GDNConfig" in str(err) and "call kc.packed_decode / kc.packed_prefill" in str(err)
    assert torch.equal(call["initial_state"], before)  # refused before anything ran


@pytest.mark.parametrize("op", sorted(GDN_OPS))
def test_a_gdn_op_takes_a_softplus_kda_config_and_a_gdn_config(op):
    make, run, validate = GDN_OPS[op]
    for cfg in (kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8),
                kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, gdn_layers=(1, 2)), None):
        assert validate(**make(), config=cfg).HV == 4
        run(**make(), config=cfg)


def test_model_copy_derives_again_what_a_round_trip_marked_given():
    # from the review: a config read back from JSON counts every field as given, so an update of
    # head_k_dim kept the old head_v_dim and scale
    c = kc.KDAConfig(num_heads=4, head_k_dim=128)
    back = kc.KDAConfig.model_validate_json(c.model_dump_json())
    assert back == c
    for cfg in (c, back):
        copy = cfg.model_copy(update={"head_k_dim": 64})
        assert copy.contract_dims() == {"H": 4, "HV": 4, "K": 64, "V": 64} and copy.scale == 64 ** -0.5
    given = kc.KDAConfig(num_heads=4, head_k_dim=128, head_v_dim=64)  # a value that is not the derived one stays
    assert given.model_copy(update={"head_k_dim": 32}).contract_dims()["V"] == 64
