"""`kda-contracts docs`: shape docs generated from the registered contracts and backends, the SVG
pictures, the error catalogue, and the drift check CI runs."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts.__main__ import main
from kda_contracts._app.docs import FILES, describe, generate
from kda_contracts._engine.contract import decorator as enforce
from kda_contracts._engine.tools.docs import GENERATED_MARK, check, describe_contract, render_contract, write
from kda_contracts.ops._packed.svg import mixed_qkv_svg, state_pool_svg
from kda_contracts.ops.packed_decode.contract import PACKED_DECODE_ARGS
from kda_contracts.ops.packed_decode.mistakes import MISTAKES, reproduce

ROOT = Path(__file__).resolve().parents[1]
KIMI = kc.KDAConfig.preset("kimi-linear-48b-a3b")
BUILTIN = ("packed_decode[VK]", "packed_decode[KV]")
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def builtin_only(monkeypatch):
    """The registry as a fresh `kda-contracts` process sees it (other tests register more)."""
    monkeypatch.setattr(enforce, "_REGISTRY", {k: enforce._REGISTRY[k] for k in BUILTIN})


def _files(cfg=KIMI, label="kimi-linear-48b-a3b, tp_size=1"):
    return generate(cfg, label, {k: kc.registered_contracts()[k] for k in BUILTIN})


# -- what the docs say ---------------------------------------------------------------------------
def test_generation_is_deterministic():
    assert _files() == _files()


def test_the_committed_docs_are_what_a_fresh_process_generates():
    """What CI's `kda-contracts docs --check` does, in a process of its own."""
    proc = subprocess.run([sys.executable, "-m", "kda_contracts", "docs", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\n(run `kda-contracts docs` and commit docs/generated)"


def test_every_packed_decode_argument_is_documented_with_symbolic_and_concrete_shapes():
    doc = describe(KIMI.with_tp(2), "tp2", {k: kc.registered_contracts()[k] for k in BUILTIN})
    vk = next(c for c in doc["contracts"] if c["key"] == "packed_decode[VK]")
    args = {a["name"]: a for a in vk["arguments"]}
    assert set(args) == {*PACKED_DECODE_ARGS, "state_layout"}  # the variant selector is an argument too
    assert args["mixed_qkv"]["shape"] == "[B, 2*H*K+HV*V]"
    assert args["mixed_qkv"]["concrete_shape"] == "[B, 6144]"
    assert args["initial_state"]["concrete_shape"] == "[N, 16, 128, 128]"
    assert args["initial_state"]["layout"]["concrete_strides"] == "[*, 16384, 128, 1]"
    assert args["out"]["same_dtype_as"] == "mixed_qkv"
    assert args["A_log"]["dtypes"] == ["float32"]
    assert args["scale"]["range"] == "finite and > 0" and args["scale"]["match_config"]["attr"] == "scale"


def test_the_kv_contract_documents_the_other_state_layout():
    doc = describe(KIMI, "tp1", {k: kc.registered_contracts()[k] for k in BUILTIN})
    kv = next(c for c in doc["contracts"] if c["key"] == "packed_decode[KV]")
    state = next(a for a in kv["arguments"] if a["name"] == "initial_state")
    assert state["shape"] == "[N, HV, K, V]" and state["layout"]["strides"] == "[*, K*V, V, 1]"


def test_dims_say_where_they_are_bound_from_with_and_without_a_config():
    doc = describe(KIMI.with_tp(2), "tp2", {k: kc.registered_contracts()[k] for k in BUILTIN})
    dims = {d["symbol"]: d for d in doc["contracts"][0]["dims"]}
    assert dims["H"]["bound_without_config"] == "solved from mixed_qkv.shape[1] = 2*H*K+HV*V"
    assert dims["H"]["bound_with_config"] == "from config (num_heads=32 / tp_size=2)"
    assert dims["H"]["value"] == 16 and dims["B"]["value"] is None
    assert "a.shape[1] (HV*K)" in dims["HV"]["appears_in"]


def test_cross_argument_constraints_are_listed_and_evaluated_for_the_config():
    doc = describe(KIMI, "tp1", {k: kc.registered_contracts()[k] for k in BUILTIN})
    where = {w["constraint"]: w for w in doc["contracts"][0]["where"]}
    assert where["HV % H == 0"]["holds_for_config"] is True
    assert where["N >= 1"]["holds_for_config"] is None  # N is per call


def test_backends_are_documented_without_anything_machine_dependent(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    files = _files()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _files() == files  # the Triton interpreter switch (CI sets it) must not leak into the docs
    doc = json.loads(files["contracts.json"])
    backends = {b["name"]: b for b in doc["backends"]}
    assert set(backends) >= {"torch", "triton", "helion", "fla"}
    assert backends["triton"]["devices"] == ["cuda"] and "available" not in backends["triton"]


def test_a_decorated_function_with_a_static_config_is_documented(builtin_only):
    cfg = kc.KDAConfig(num_heads=4, head_k_dim=16)

    @kc.contract(config=cfg, where=["pow2(K)"])
    def toy_forward(x: Float[Tensor, "B D"], state: Float[Tensor, "N HV V K"],
                    idx: Int[Tensor, "B"]) -> Float[Tensor, "B D"]:
        return x

    md = generate(KIMI, "tp1")["contracts.md"]
    assert "## test_a_decorated_function_with_a_static_config_is_documented.<locals>.toy_forward" in md
    assert "| `state` | `[N, HV, V, K]` | `[N, 4, 16, 16]` |" in md  # its own config, not the docs config
    assert "from config (num_v_heads=4)" in md
    assert "`pow2(K)` (ShapeError; holds for this config)" in md
    assert "Returns: `return` `[B, D]`" in md


def test_an_axis_after_a_variadic_dim_is_counted_from_the_back():
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B *batch D"], w: Float[Tensor, "D E"]) -> None: ...

    dims = {d["symbol"]: d for d in describe_contract("f", f.__kda_contract__, None)["dims"]}
    assert dims["B"]["appears_in"] == ["x.shape[0]"]
    assert dims["D"]["appears_in"] == ["x.shape[-1]", "w.shape[0]"]


def test_a_contract_renders_without_its_heading_and_catalogue_link_for_a_docstring():
    def positive(ctx):
        """Strict mode: every value is positive."""
        return []

    @kc.contract(register=False, value_checks=positive)
    def f(x: Float[Tensor, "B"]) -> None: ...

    described = describe_contract("f", f.__kda_contract__, None)
    full, bare = render_contract(described), render_contract(described, heading=False, errors_page=None)
    assert full[:4] == ["## f", "", f"`{described['signature']}`", ""] and full[4:-2] == bare[:-2]
    assert full[-2].endswith("every value is positive. See [errors.md](errors.md) for their messages.")
    assert bare[-2].endswith("every value is positive.")


def test_the_docs_config_sets_the_concrete_shapes():
    md = _files(kc.KDAConfig.preset("kimi-k3-like", tp_size=8), "k3 tp8")["contracts.md"]
    assert "| `mixed_qkv` | `[B, 2*H*K+HV*V]` | `[B, 4608]` |" in md  # 12 heads * 128 * 3
    assert ("`lower_bound` | `float \\| None` | `finite and < 0` (None skips it); equals config "
            "`effective_lower_bound` | `-5.0`") in md


# -- pictures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [KIMI, KIMI.with_tp(8), kc.KDAConfig.preset("kimi-k3-like"),
                                 kc.KDAConfig(num_heads=4, num_v_heads=8, head_k_dim=64, head_v_dim=128)],
                         ids=["kimi-tp1", "kimi-tp8", "k3-96-heads", "gva-k-ne-v"])
def test_every_picture_is_well_formed_svg(cfg):
    for svg in (mixed_qkv_svg(cfg), state_pool_svg(cfg, "VK"), state_pool_svg(cfg, "KV")):
        root = ET.fromstring(svg)
        assert root.tag == f"{SVG_NS}svg"
        width = float(root.get("width"))
        for el in root.iter(f"{SVG_NS}rect"):
            assert float(el.get("x")) + float(el.get("width")) <= width + 0.5  # nothing drawn off the canvas


def test_the_packed_row_draws_every_head_boundary_for_32_heads():
    root = ET.fromstring(mixed_qkv_svg(KIMI))
    thin = [el for el in root.iter(f"{SVG_NS}line") if el.get("stroke-width") == "0.6"]
    assert len(thin) == 3 * 31  # q, k, v: 31 inner boundaries each
    texts = "".join(el.text or "" for el in root.iter(f"{SVG_NS}text"))
    assert "2·H·K + HV·V = 12288 columns" in texts and "32 heads × K=128" in texts


def test_the_packed_row_groups_heads_too_narrow_to_draw():
    svg = mixed_qkv_svg(kc.KDAConfig(num_heads=512, head_k_dim=16))
    assert "boundaries drawn every 8 heads" in svg  # 0.6 px per head: every 8th (4.8 px apart)


def test_the_state_pictures_mark_the_contiguous_axis_of_each_layout():
    assert "contiguous: K (stride 1)" in state_pool_svg(KIMI, "VK")
    assert "contiguous: V (stride 1)" in state_pool_svg(KIMI, "KV")
    with pytest.raises(ValueError, match="layout"):
        state_pool_svg(KIMI, "VV")


def test_the_reference_embeds_the_pictures():
    md = _files()["contracts.md"]
    for name in ("mixed_qkv.svg", "state_pool_vk.svg", "state_pool_kv.svg"):
        assert f"]({name})" in md


# -- the error catalogue -------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [KIMI, KIMI.with_tp(8), kc.KDAConfig.preset("kimi-k3-like", tp_size=4)],
                         ids=["kimi-tp1", "kimi-tp8", "k3-tp4"])
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.key)
def test_every_known_mistake_is_caught_as_its_kind(mistake, cfg):
    r = reproduce(mistake, cfg)
    assert r.error == mistake.error.kind_name
    assert r.message.startswith("packed_decode(): ")


def test_the_catalogue_covers_the_known_mistakes():
    keys = {m.key for m in MISTAKES}
    assert keys >= {"unflattened-a", "tp-mismatch", "kv-for-vk", "int64-indices", "strided-state", "bad-width",
                    "alog-dtype", "device", "scale"}


def test_the_catalogue_shows_the_real_message_and_the_fix():
    md = _files()["errors.md"]
    for m in MISTAKES:
        assert f'<a id="{m.key}"></a>' in md and f"**Fix:** {m.fix}." in md
    # the real text, as the library raises it now
    assert "fix: `a` looks unflattened ([B, HV, K] = [4, 32, 128])" in md
    assert "the tensors look sharded for tp_size=2, the config for tp_size=1" in md


# -- writing and checking ------------------------------------------------------------------------
def test_check_passes_on_what_write_wrote(tmp_path):
    files = _files()
    write(files, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    assert check(files, tmp_path) == []


def test_check_reports_a_changed_a_missing_and_a_stale_file(tmp_path):
    files = _files()
    write(files, tmp_path)
    (tmp_path / "errors.md").write_text("edited by hand\n", encoding="utf-8")
    (tmp_path / "mixed_qkv.svg").unlink()
    (tmp_path / "old.md").write_text(f"<!-- {GENERATED_MARK} -->\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("mine, not generated\n", encoding="utf-8")
    problems = check(files, tmp_path)
    assert len(problems) == 3
    assert any("errors.md: differs" in p for p in problems)
    assert any("mixed_qkv.svg: missing" in p for p in problems)
    assert any("old.md: stale" in p for p in problems)
    write(files, tmp_path)  # regenerating fixes all three and leaves the user's file alone
    assert check(files, tmp_path) == [] and (tmp_path / "notes.md").exists() and not (tmp_path / "old.md").exists()


def test_write_touches_only_files_that_changed(tmp_path):
    files = _files()
    assert len(write(files, tmp_path)) == len(FILES)
    assert write(files, tmp_path) == []


def test_a_drifted_contract_fails_the_check(tmp_path, builtin_only):
    assert main(["docs", "--out", str(tmp_path)]) == 0
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 0

    @kc.contract
    def new_kernel(x: Float[Tensor, "B D"]) -> None: ...

    assert main(["docs", "--check", "--out", str(tmp_path)]) == 1  # a new contract is not documented yet


def test_the_cli_check_lists_each_drifted_file_and_how_to_regenerate(tmp_path, capsys, builtin_only):
    assert main(["docs", "--out", str(tmp_path), "--tp", "2"]) == 0
    assert main(["docs", "--check", "--out", str(tmp_path), "--tp", "2"]) == 0
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 1  # generated for TP2, checked for TP1
    out = capsys.readouterr().out
    assert "contracts.md: differs" in out and f"regenerate with: kda-contracts docs --out {tmp_path}" in out


def test_a_config_json_path_is_documented_by_its_file_name_only(tmp_path, builtin_only):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"linear_attn_config": {"num_heads": 8, "head_dim": 64}}), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["docs", "--config", str(cfg), "--tp", "2", "--out", str(out)]) == 0
    md = (out / "contracts.md").read_text(encoding="utf-8")
    assert "**config.json, tp_size=2**" in md and str(tmp_path) not in md
    assert "`[B, 768]`" in md  # 2*4*64 + 4*64


def test_module_option_documents_the_contracts_a_module_decorates(tmp_path, monkeypatch, builtin_only):
    (tmp_path / "my_kernels_for_docs.py").write_text(
        "import kda_contracts as kc\nfrom kda_contracts import Float, Tensor\n\n"
        "@kc.contract\ndef my_norm(x: Float[Tensor, 'B D'], w: Float[Tensor, 'D']) -> None: ...\n",
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert main(["docs", "--module", "my_kernels_for_docs", "--out", str(out)]) == 0
    assert "## my_norm" in (out / "contracts.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("argv", [["docs", "--config", "no-such-preset"], ["docs", "--module", "no_such_module_x"]])
def test_a_bad_docs_command_line_exits_2(argv, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "kda-contracts docs:" in capsys.readouterr().err


def test_every_contract_registered_in_this_session_can_be_documented():
    # Whatever other test modules decorated (optional tensors, Shaped, int binders, ...).
    doc = describe(KIMI, "tp1")
    assert {c["key"] for c in doc["contracts"]} >= set(BUILTIN)
    json.dumps(doc)


def test_generated_json_matches_the_markdown_config():
    doc = json.loads(_files(KIMI.with_tp(4), "kimi, tp_size=4")["contracts.json"])
    assert doc["config"]["dims"] == {"H": 8, "HV": 8, "K": 128, "V": 128}
    assert doc["generator"] == GENERATED_MARK
    assert torch.__version__ not in json.dumps(doc) and kc.__version__ not in json.dumps(doc)
