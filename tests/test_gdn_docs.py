"""GDN packed decode in `kda-contracts docs`, its mistakes catalogue and the demo: the Qwen3-Next
shapes per TP degree, the backends table (whatever the op lists), the pictures, and each known
GDN mistake with the exact message the library raises for it (golden)."""

import json
import xml.etree.ElementTree as ET

import pytest
import torch

import kda_contracts as kc
from kda_contracts._app.docs import FILES, generate
from kda_contracts._engine.contract import decorator as enforce
from kda_contracts.ops._packed.mistakes import Attempt, Mistake
from kda_contracts.ops.gdn_decode import docs as gdn_docs
from kda_contracts.ops.gdn_decode.diagrams import gate_svg
from kda_contracts.ops.gdn_decode.mistakes import MISTAKES, reproduce
from kda_contracts.testing import make_gdn_decode_call

QWEN = kc.GDNConfig.preset("qwen3-next-80b-a3b")
KIMI = kc.KDAConfig.preset("kimi-linear-48b-a3b")
SVG_NS = "{http://www.w3.org/2000/svg}"
BY_KEY = {m.key: m for m in MISTAKES}

# The whole message of each GDN mistake, as the library raises it for Qwen3-Next-80B-A3B TP1.
GOLDEN = {
    "gdn-kda-shaped-a": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] a: ShapeError\n'
        '      expected [B, HV] = [4, 32]\n'
        '      got      [4, 4096]\n'
        '      dim 1 (HV): expected 32 (HV from config (num_v_heads=32)), got 4096\n'
        "      fix: `a` has KDA's per-key-channel gate shape [B, HV*K] (HV=32, K=128); GDN's gate is one scalar "
        'per value head, [B, HV]. If this is a KDA (Kimi-Linear) layer call kc.packed_decode; if it is a '
        "GDN (Qwen3-Next) layer, the tensor comes from the wrong projection (GDN's a_proj/dt_bias have HV "
        'outputs)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-kda-shaped-dt-bias": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] dt_bias: ShapeError\n'
        '      expected [HV] = [32]\n'
        '      got      [4096]\n'
        '      dim 0 (HV): expected 32 (HV from config (num_v_heads=32)), got 4096\n'
        "      fix: `dt_bias` has KDA's per-key-channel gate shape [HV*K] (HV=32, K=128); GDN's gate is one "
        'scalar per value head, [HV]. If this is a KDA (Kimi-Linear) layer call kc.packed_decode; if it '
        "is a GDN (Qwen3-Next) layer, the tensor comes from the wrong projection (GDN's a_proj/dt_bias "
        'have HV outputs)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-a-per-key-head": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] a: ShapeError\n'
        '      expected [B, HV] (rank 2)\n'
        '      got      [4, 16, 2] (rank 3)\n'
        '      fix: `a` looks unflattened ([4, 16, 2]); pass a.reshape(4, 32)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-swapped-head-dims": (
        'gdn_packed_decode(): 2 contract violations\n'
        '  [1] initial_state: ShapeError\n'
        '      expected [N, HV, V, K] = [8, 32, 256, 128]\n'
        '      got      [8, 32, 128, 256]\n'
        '      dim 2 (V): expected 256 (V from config (head_v_dim=256)), got 128\n'
        '      dim 3 (K): expected 128 (K from config (head_k_dim=128)), got 256\n'
        '      fix: the tensors fit K=256, V=128, the config says K=128 (head_k_dim), V=256 (head_v_dim): the '
        'key and value head dims are swapped. With HV = 2H the width of mixed_qkv, 2*H*K + HV*V = '
        '2H(K+V), is the same either way, so only the state and out shapes show it; build q/k heads of '
        "head_k_dim and v heads, out and the state's V axis of head_v_dim\n"
        '  [2] out: ShapeError\n'
        '      expected [B, 1, HV, V] = [4, 1, 32, 256]\n'
        '      got      [4, 1, 32, 128]\n'
        '      dim 3 (V): expected 256 (V from config (head_v_dim=256)), got 128\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=256 from config (head_v_dim=256); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-tp1-pool": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] initial_state: ShapeError\n'
        '      expected [N, HV, V, K] = [8, 16, 128, 128]\n'
        '      got      [8, 32, 128, 128]\n'
        '      dim 1 (HV): expected 16 (HV from config (num_v_heads=32 / tp_size=2)), got 32\n'
        '      fix: initial_state carries HV=32 heads but the config and every other tensor have 16 per rank '
        '(num_v_heads=32 / tp_size=2): the pool looks allocated for tp_size=1, the rank for tp_size=2. '
        "Allocate the pool with the rank's heads (cfg.local_num_v_heads = 16), not the model's\n"
        '  dims: B=4 from mixed_qkv.shape[0]; H=8 from config (num_heads=16 / tp_size=2); HV=16 from config '
        '(num_v_heads=32 / tp_size=2); K=128 from config (head_k_dim=128); V=128 from config '
        '(head_v_dim=128); N=8 from initial_state.shape[0]'
    ),
    "gdn-kv-for-vk": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] initial_state: ShapeError\n'
        '      expected [N, HV, V, K] = [8, 32, 256, 128]\n'
        '      got      [8, 32, 128, 256]\n'
        '      dim 2 (V): expected 256 (V from config (head_v_dim=256)), got 128\n'
        '      dim 3 (K): expected 128 (K from config (head_k_dim=128)), got 256\n'
        '      fix: initial_state looks like a KV-layout pool [N, HV, K, V], but this call declares VK; declare '
        "it (GDNConfig(state_layout='KV') or state_layout='KV') or convert the pool with "
        'initial_state.transpose(-1, -2).contiguous() (a bare transpose view breaks the slot strides)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=256 from config (head_v_dim=256); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-int16-indices": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] ssm_state_indices: DtypeError\n'
        '      expected int32 or int64\n'
        '      got      int16\n'
        '      fix: slot indices must be int32 or int64 (kernels turn them into slot offsets), not int16: build '
        'them with dtype=torch.int32, or cast once when you build the batch metadata: '
        'ssm_state_indices.to(torch.int32)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-float-indices": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] ssm_state_indices: DtypeError\n'
        '      expected int32 or int64\n'
        '      got      float32\n'
        '      fix: slot indices must be int32 or int64 (kernels turn them into slot offsets), not float32: '
        'build them with dtype=torch.int32, or cast once when you build the batch metadata: '
        'ssm_state_indices.to(torch.int32)\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-padding-past-pool": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] ssm_state_indices: ValueRangeError\n'
        '      expected < N=8 (negatives are padding)\n'
        '      got      1 value(s) >= N=8 (max 8); the first: ssm_state_indices[3] = 8\n'
        "      fix: an index past the pool would read and write another request's memory; check the slot "
        'allocator and the pool this layer uses\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
    "gdn-duplicate-slots": (
        'gdn_packed_decode(): 1 contract violation\n'
        '  [1] ssm_state_indices: ValueRangeError\n'
        '      expected distinct values (negatives are padding)\n'
        '      got      1 duplicate value(s); the first: ssm_state_indices[1] = 4, also at ssm_state_indices[0]\n'
        '      fix: two requests on one slot race on its state (a lost update); give each request its own slot, '
        'mark padding with -1\n'
        '  dims: B=4 from mixed_qkv.shape[0]; H=16 from config (num_heads=16); HV=32 from config '
        '(num_v_heads=32); K=128 from config (head_k_dim=128); V=128 from config (head_v_dim=128); N=8 '
        'from initial_state.shape[0]'
    ),
}


@pytest.fixture(scope="module")
def files():
    return generate(KIMI, "kimi-linear-48b-a3b, tp_size=1")


# -- the catalogue ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.key)
def test_each_gdn_mistake_raises_exactly_its_golden_message(mistake):
    r = reproduce(mistake, QWEN)
    assert r.error == mistake.error.kind_name
    assert r.message == GOLDEN[mistake.key]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.key)
def test_each_gdn_mistake_is_caught_as_its_kind_at_every_tp_degree(mistake, tp):
    r = reproduce(mistake, QWEN.with_tp(tp))
    assert r.error == mistake.error.kind_name
    assert r.message.startswith("gdn_packed_decode(): ")


def test_the_catalogue_covers_the_known_gdn_mistakes():
    assert set(GOLDEN) == set(BY_KEY)
    assert set(BY_KEY) >= {"gdn-kda-shaped-a", "gdn-kda-shaped-dt-bias", "gdn-swapped-head-dims", "gdn-a-per-key-head",
                           "gdn-tp1-pool", "gdn-kv-for-vk", "gdn-int16-indices", "gdn-float-indices",
                           "gdn-padding-past-pool", "gdn-duplicate-slots"}
    assert all(k.startswith("gdn-") for k in BY_KEY)  # errors.md holds KDA's catalogue too: no anchor clash


def test_every_gdn_mistake_comes_with_a_fix():
    for m in MISTAKES:
        assert "fix: " in reproduce(m, QWEN).message, m.key


def test_a_mistake_left_uncaught_is_reported_not_documented():
    valid = Mistake("valid", "no mistake", "-", "-", "-", kc.ShapeError,
                    lambda cfg: Attempt(make_gdn_decode_call(cfg, 4, 8), cfg))
    with pytest.raises(AssertionError, match="'valid' was not caught"):
        reproduce(valid, QWEN)


def test_kdas_catalogue_holds_the_reverse_a_gdn_shaped_gate_given_to_kda():
    from kda_contracts.ops.packed_decode import mistakes as kda_mistakes

    entry = next(m for m in kda_mistakes.MISTAKES if m.key == "gate-per-value-head")
    message = kda_mistakes.reproduce(entry, KIMI).message
    assert message.splitlines()[1:5] == [
        "  [1] a: ShapeError", "      expected [B, HV*K] = [4, 4096]", "      got      [4, 32]",
        "      dim 1 (HV*K): expected 4096, got 32"]
    assert ("fix: `a` has GDN's per-value-head gate shape [B, HV] (HV=32); KDA's gate has one logit per key "
            "channel, [B, HV*K] with K=128. If this is a GDN (Qwen3-Next) layer call kc.gdn_packed_decode") in message


def test_the_tp_mistake_needs_a_config_that_can_be_sharded():
    one_head = kc.GDNConfig(num_heads=1, num_v_heads=1, head_k_dim=16)
    with pytest.raises(ValueError, match="allow no tp_size > 1"):
        reproduce(BY_KEY["gdn-tp1-pool"], one_head)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_gdn_test_call_is_valid_at_every_tp_degree(tp):
    cfg = QWEN.with_tp(tp)
    call = make_gdn_decode_call(cfg, batch=3, pool=5)
    dims = kc.validate_gdn_packed_decode(**call, config=cfg, strict=True)
    assert (dims.H, dims.HV, dims.K, dims.V) == (16 // tp, 32 // tp, 128, 128)
    assert call["a"].shape == (3, 32 // tp) and call["dt_bias"].dtype == torch.float32


# -- the reference page ------------------------------------------------------------------------------
def test_the_reference_shows_gdn_shapes_for_qwen3_next_at_tp1_and_tp2(files):
    md = files["contracts.md"]
    assert "| argument | shape | TP1 | TP2 | TP4 | TP8 |" in md
    assert "| `mixed_qkv` | `[B, 2*H*K+HV*V]` | `[B, 8192]` | `[B, 4096]` | `[B, 2048]` | `[B, 1024]` |" in md
    assert "| `a` | `[B, HV]` | `[B, 32]` | `[B, 16]` | `[B, 8]` | `[B, 4]` |" in md
    assert "| `dt_bias` | `[HV]` | `[32]` | `[16]` | `[8]` | `[4]` |" in md
    assert ("| `initial_state (KV)` | `[N, HV, K, V]` | `[N, 32, 128, 128]` | `[N, 16, 128, 128]` | "
            "`[N, 8, 128, 128]` | `[N, 4, 128, 128]` |") in md
    assert "| dim `H` | — | 16 | 8 | 4 | 2 |" in md


def test_the_gdn_contracts_are_shown_for_qwen3_next_not_for_the_kimi_docs_config(files):
    md = files["contracts.md"]
    assert "## gdn_packed_decode[VK]" not in md  # no section for the Kimi config
    op = md.split("## gdn_packed_decode\n", 1)[1]
    assert "### Variant VK: `gdn_packed_decode[VK]`" in op and "### Variant KV: `gdn_packed_decode[KV]`" in op
    assert "| `mixed_qkv` | `[B, 2*H*K+HV*V]` | `[B, 8192]` |" in op  # 2*16*128 + 32*128, not Kimi's 12288
    assert "| `H` | 16 | solved from mixed_qkv.shape[1] = 2*H*K+HV*V | from config (num_heads=16) |" in op
    doc = json.loads(files["contracts.json"])
    assert not any(c["key"].startswith("gdn_packed_decode") for c in doc["contracts"])
    assert doc["gdn_packed_decode"]["config"]["dims"] == {"H": 16, "HV": 32, "K": 128, "V": 128}


def test_the_gdn_signature_shows_every_keyword_with_its_default(files):
    signature = ("`gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, "
                 "use_qk_l2norm_in_kernel=False, *, config=None, state_layout=None, backend='auto')`")
    assert signature in files["contracts.md"]


def test_the_gdn_backends_table_lists_whatever_the_op_lists():
    op = kc.gdn_packed_decode
    before = generate(KIMI, "tp1")["contracts.md"]
    assert all(f"| `{b.name}` | {b.priority} |" in before for b in op.backends())
    op.register_backend(kc.Backend(name="docs-probe", kernel="kda_kernels.gdn_reference:gdn_packed_decode",
                                   devices=("cuda",), priority=7, requires=("triton",), op=op.name,
                                   description="a backend registered by this test"))
    try:
        md = generate(KIMI, "tp1")["contracts.md"].split("## gdn_packed_decode\n", 1)[1]
        assert "| `docs-probe` | 7 | cuda | any | — | triton | a backend registered by this test | all |" in md
    finally:
        op.unregister_backend("docs-probe")
    assert generate(KIMI, "tp1")["contracts.md"] == before


def test_the_reference_embeds_the_gdn_pictures_and_files_include_them(files):
    for name in gdn_docs.FILES:
        assert f"]({name})" in files["contracts.md"] and name in files and name in FILES
    assert "2·H·K + HV·V = 8192 columns" in files["gdn_mixed_qkv.svg"]
    assert "GVA: value head hv uses q/k head hv // 2 (HV/H = 2)" in files["gdn_mixed_qkv.svg"]
    assert "HV=32, K=128, V=128" in files["gdn_state_pool_kv.svg"]


def test_errors_md_holds_the_gdn_catalogue_after_kdas(files):
    md = files["errors.md"]
    kda, gdn = md.split("\n# GDN packed decode (Qwen3-Next)\n", 1)
    assert '<a id="unflattened-a"></a>' in kda
    for m in MISTAKES:
        assert f'<a id="{m.key}"></a>' in gdn and f"**Fix:** {m.fix}." in gdn
        assert GOLDEN[m.key] in gdn


def test_a_fresh_registry_still_documents_gdn_once(monkeypatch):
    """What a process sees that has only the built-in contracts: GDN's from its op, never twice."""
    builtin = [k for k in enforce._REGISTRY if k.startswith(("packed_decode[", "gdn_packed_decode["))]
    monkeypatch.setattr(enforce, "_REGISTRY", {k: enforce._REGISTRY[k] for k in builtin})
    md = generate(KIMI, "tp1")["contracts.md"]
    assert md.count("## gdn_packed_decode\n") == 1 and md.count("## GDN packed decode (Qwen3-Next)\n") == 1


# -- pictures ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [QWEN, QWEN.with_tp(8), kc.GDNConfig(num_heads=4, num_v_heads=8, head_k_dim=64,
                                                                      head_v_dim=128)],
                         ids=["qwen-tp1", "qwen-tp8", "gva-k-ne-v"])
def test_the_gate_picture_is_well_formed_svg(cfg):
    root = ET.fromstring(gate_svg(cfg))
    width = float(root.get("width"))
    for el in root.iter(f"{SVG_NS}rect"):
        assert float(el.get("x")) + float(el.get("width")) <= width + 0.5  # nothing drawn off the canvas


def test_the_gate_picture_contrasts_gdn_with_kda():
    svg = gate_svg(QWEN.with_tp(2))
    assert "GDN's a is [B, HV] = [B, 16], KDA's is [B, HV·K] = [B, 2048]" in svg
    assert "16 columns, 128× narrower than KDA's row" in svg
    assert "S[hv] ← exp(g) · S[hv] (the whole 128×128 matrix)" in svg
