"""Dumps for any op: ``kc.save_call`` writes a call of any op or ``@kc.contract`` function to one
``torch.save`` file that ``kda-contracts validate`` replays with the same verdict; with
``KDA_CONTRACTS_DUMP_DIR`` set, calls rejected in check or strict mode are saved there (bounded,
nothing on the happy path, never an exception but the call's own). The command's exit codes,
JSON and messages: ``tests/test_validate_dumps.py``."""

import json
import warnings

import pytest
import torch
from dump_ops import NORM_CONFIG, GatherConfig, dump_gather, dump_rmsnorm, dump_scale_rows

import kda_contracts as kc
from kda_contracts.__main__ import main
from kda_contracts._engine.tools.dump_reader import load_file, read_call_dump
from kda_contracts._engine.tools.dump_report import check_call
from kda_contracts.testing import make_decode_call

TP2 = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2)


def validate(path, capsys, *extra):
    code = main(["validate", str(path), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def validate_json(path, capsys, *extra):
    code, out, err = validate(path, capsys, "--json", *extra)
    assert err == "", err
    return code, json.loads(out)


def rows(b=4, d=8):
    return torch.randn(b, d), torch.randn(d), torch.empty(b, d)


def verdict_of(fn, *args, **kwargs):
    """The live verdict: None, or the (argument, kind) of each violation."""
    try:
        fn(*args, **kwargs)
    except kc.ContractError as err:
        return [(v.argument, v.kind.kind_name) for v in err.violations]
    return None


def replayed(path, **kw):
    report = check_call(read_call_dump(load_file(path)), **kw)
    return None if report.ok else [(v.argument, v.kind.kind_name) for v in report.violations]


# -- kc.save_call: round trips ----------------------------------------------------------------------
def test_a_valid_user_op_call_replays_as_valid_with_dims_and_the_backend_that_would_run_it(tmp_path, capsys):
    path = kc.save_call(dump_scale_rows, tmp_path / "ok.pt", *rows(d=8))
    code, out, _ = validate(path, capsys)
    assert code == 0
    assert "call:    dump_scale_rows (op dump_ops:dump_scale_rows), mode strict" in out  # pytest runs strict
    assert "VALID: the call meets the contract" in out
    assert "B = 4      from x.shape[0]" in out and "D = 8      from x.shape[1]" in out
    assert "    fast: chosen (priority 30, the highest that supports this call)" in out


def test_the_backends_table_is_the_ops_own_explanation(tmp_path, capsys):
    args = rows(d=6)
    code, out, _ = validate(kc.save_call(dump_scale_rows, tmp_path / "d6.pt", *args), capsys)
    assert code == 0
    table = out.split("backends (backend='auto'):\n")[1].rstrip("\n")
    assert table == dump_scale_rows.explain_backends(*args)
    assert "    fast: not chosen: needs D % 4 == 0 (got D=6)" in table
    assert "     gpu: not chosen: runs on cuda, not cpu" in table


def test_an_invalid_call_replays_every_violation_with_its_fix(tmp_path, capsys):
    x, w, _ = rows()
    path = kc.save_call(dump_scale_rows, tmp_path / "bad.pt", x.int(), w[:5], torch.empty(8, 4).t())
    code, text, _ = validate(path, capsys)
    assert code == 1
    assert "INVALID: 3 violations" in text
    assert [line.strip() for line in text.splitlines() if line.startswith("  [")] == \
        ["[1] w: ShapeError", "[2] x: DtypeError", "[3] out: LayoutError"]
    assert "fix: out is written in place, so a .contiguous() copy would take the writes and lose them" in text
    assert "backends: none would run it (dump_scale_rows validates before dispatching)" in text


LAYOUTS = {
    "contiguous": lambda b, d: torch.randn(b, d),
    "transposed": lambda b, d: torch.randn(d, b).t(),
    "sliced with an offset": lambda b, d: torch.randn(b + 3, d + 5)[2:2 + b, 3:3 + d],
    "expanded row": lambda b, d: torch.randn(1, d).expand(b, d),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("role", ["x", "out"])
def test_strides_offsets_and_expansion_survive_so_the_verdict_is_the_same(tmp_path, layout, role):
    for b, d in [(1, 4), (3, 8), (16, 12), (7, 64)]:
        x, w, out = rows(b, d)
        t = LAYOUTS[layout](b, d)
        call = (t, w, out) if role == "x" else (x, w, t)
        path = kc.save_call(dump_scale_rows, tmp_path / f"{b}x{d}.pt", *call)
        back = read_call_dump(load_file(path)).values[role]
        assert (back.shape, back.stride(), back.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
        assert torch.equal(back, t)
        with kc.mode("check"):
            assert replayed(path, strict=False) == verdict_of(dump_scale_rows.validate, *call)


def test_arguments_that_share_memory_still_share_it_after_the_round_trip(tmp_path):
    buf = torch.randn(8, 16)
    path = kc.save_call(dump_scale_rows, tmp_path / "alias.pt", buf[:4], torch.randn(16), buf[4:])
    v = read_call_dump(load_file(path)).values
    assert v["x"].untyped_storage().data_ptr() == v["out"].untyped_storage().data_ptr()
    assert v["out"].storage_offset() == 64


def test_a_contract_function_with_a_dataclass_config_round_trips(tmp_path, capsys):
    x, w = torch.randn(2, 3, 8), torch.randn(8)
    code, out, _ = validate(kc.save_call(dump_rmsnorm, tmp_path / "ok.pt", x, w, eps=1e-5), capsys)
    assert code == 0 and "call:    dump_rmsnorm (contract dump_ops:dump_rmsnorm)" in out
    assert "config:  NormConfig (dump_ops:NormConfig) fixing D=8" in out
    assert "backends" not in out  # a contract has none
    code, out, _ = validate(kc.save_call(dump_rmsnorm, tmp_path / "bad.pt", torch.randn(2, 4), torch.randn(4)), capsys)
    assert code == 1 and "x: ShapeError" in out and "D=8" in out.replace(" ", "")


def test_a_pydantic_config_argument_is_rebuilt_from_its_class(tmp_path, capsys):
    cfg = GatherConfig(slots=8, width=16)
    path = kc.save_call(dump_gather, tmp_path / "g.pt", torch.randn(8, 16), torch.tensor([0, 7]), torch.empty(2, 16),
                        config=cfg)
    dump = read_call_dump(load_file(path))
    assert dump.values["config"] == cfg and type(dump.values["config"]) is GatherConfig
    code, report = validate_json(path, capsys)
    assert code == 0
    assert report["config"] == {"class": "dump_ops:GatherConfig", "rebuilt": True,
                                "fields": {"slots": 8, "width": 16}}
    assert report["dims"]["N"] == {"value": 8, "from": "from config (GatherConfig.N=8)"}


def _rewrite(path, edit):
    raw = torch.load(path, weights_only=True)
    edit(raw)
    torch.save(raw, path)


def test_a_config_whose_class_cannot_be_imported_is_replayed_from_its_saved_facts(tmp_path, capsys):
    path = kc.save_call(dump_rmsnorm, tmp_path / "cfg.pt", torch.randn(3, 5), torch.randn(5))
    _rewrite(path, lambda raw: raw["config"].update({"class": "gone_module:NormConfig"}))
    code, out, _ = validate(path, capsys)
    assert code == 1
    assert ("note:    config: config gone_module:NormConfig not rebuilt (ModuleNotFoundError: No module named "
            "'gone_module'); replayed from its saved dims, dtypes and attributes") in out
    assert "D      = 8      from config (NormConfig.D=8)" in out  # the provenance the live call had


def test_tensors_saved_on_other_devices_are_judged_on_those_devices(tmp_path, capsys):
    path = kc.save_call(dump_scale_rows, tmp_path / "dev.pt", *rows())
    _rewrite(path, lambda raw: raw["tensors"]["w"].update(device="cuda:1"))
    code, out, _ = validate(path, capsys)
    assert code == 1
    assert "note:    tensors saved on cpu, cuda:1 were loaded on the CPU here: device checks use the saved devices" \
        in out or "w: DeviceError" in out
    assert "[1] w: DeviceError\n      expected cpu (device of x)\n      got      cuda:1" in out
    assert "w    float32 [8] strides (1,) offset 0 on cuda:1" in out


def test_a_call_saved_on_a_gpu_picks_the_gpu_backend_when_replayed_on_the_cpu(tmp_path, capsys):
    path = kc.save_call(dump_scale_rows, tmp_path / "gpu.pt", *rows())
    _rewrite(path, lambda raw: [r.update(device="cuda:0") for r in raw["tensors"].values()])
    code, out, _ = validate(path, capsys)
    assert code == 0
    assert "note:    tensors saved on cuda:0 were loaded on the CPU here: device checks use the saved devices" in out
    assert "     gpu: chosen (priority 40" in out and "    fast: not chosen: runs on cpu, not cuda" in out


def test_the_packed_decode_op_round_trips_through_save_call(tmp_path, capsys):
    call = make_decode_call(TP2, batch=4, pool=8)
    code, out, _ = validate(kc.save_call(kc.packed_decode, tmp_path / "ok.pt", **call, config=TP2), capsys)
    assert code == 0 and "variant VK" in out and "HV = 16     from config (num_v_heads=32 / tp_size=2)" in out
    assert "   torch: chosen (priority 0, the highest that supports this call)" in out
    bad = dict(call, a=call["a"].view(4, 16, 128))
    code, out, _ = validate(kc.save_call(kc.packed_decode, tmp_path / "bad.pt", **bad, config=TP2), capsys)
    assert code == 1 and "fix: `a` looks unflattened" in out


def test_a_kv_packed_decode_call_replays_its_variant(tmp_path, capsys):
    kv = TP2.model_copy(update={"state_layout": "KV"}).revalidate()
    path = kc.save_call(kc.packed_decode, tmp_path / "kv.pt", **make_decode_call(kv, batch=2, pool=4), config=kv)
    code, report = validate_json(path, capsys)
    assert code == 0 and report["target"]["variant"] == "KV"


def test_save_call_refuses_what_is_not_an_op_or_a_contract(tmp_path):
    with pytest.raises(kc.AnnotationError, match=r"kc.save_call: expected a kc.Op or a function decorated with "
                                                 r"@kc.contract, got function 'verdict_of'"):
        kc.save_call(verdict_of, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_an_argument_that_cannot_be_saved_is_a_placeholder_and_said_so(tmp_path, capsys):
    class Opaque:
        pass

    x, _, out = rows()
    path = kc.save_call(dump_scale_rows, tmp_path / "opaque.pt", x, Opaque(), out)
    code, out_text, _ = validate(path, capsys)
    assert code == 1 and "w: ArgumentTypeError" in out_text
    assert ("note:    w: a test_an_argument_that_cannot_be_saved_is_a_placeholder_and_said_so.<locals>.Opaque could "
            "not be saved (not a tensor, a plain value, or an object with fields); the replay passes a placeholder"
            ) in out_text


# -- saved automatically when a call is rejected -----------------------------------------------------
@pytest.fixture
def dump_dir(tmp_path, monkeypatch):
    d = tmp_path / "dumps"
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_DIR", str(d))
    monkeypatch.delenv("KDA_CONTRACTS_DUMP_MAX", raising=False)
    monkeypatch.delenv("KDA_CONTRACTS_DUMP_MAX_BYTES", raising=False)
    return d


def dumps_in(d):
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.mark.parametrize("mode", ["check", "strict"])
def test_a_call_the_contract_rejects_is_saved_and_replays_the_same_violations(dump_dir, capsys, mode):
    x, w, out = rows()
    with kc.mode(mode), pytest.raises(kc.ShapeError) as info:
        dump_scale_rows(x, w[:5], out)
    assert dumps_in(dump_dir) == ["kda-dump-000-dump_scale_rows.pt"]
    path = dump_dir / "kda-dump-000-dump_scale_rows.pt"
    assert str(info.value).endswith(f"\n  call saved to {path} (replay: kda-contracts validate {path})")
    assert info.value.dump_path == str(path)
    code, report = validate_json(path, capsys)
    assert code == 1 and report["saved"]["by"] == "rejection" and report["saved"]["mode"] == mode
    assert [(v["argument"], v["error"], v["expected"], v["got"]) for v in report["violations"]] == \
        [(v.argument, v.kind.kind_name, v.expected, v.got) for v in info.value.violations]


def test_a_contract_functions_rejected_call_is_saved_too(dump_dir, capsys):
    with kc.mode("check"), pytest.raises(kc.ArgumentTypeError):
        dump_rmsnorm([[1.0] * 8], torch.randn(8))
    (path,) = dump_dir.iterdir()
    code, out, _ = validate(path, capsys)
    assert code == 1 and "x: ArgumentTypeError" in out and "got      list" in out


def test_a_call_strict_value_checks_reject_is_saved_and_replayed_in_strict_mode(dump_dir, capsys):
    cfg = GatherConfig(slots=8, width=16)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError):
        dump_gather(torch.randn(8, 16), torch.tensor([1, 9, 3]), torch.empty(3, 16), config=cfg)
    (path,) = dump_dir.iterdir()
    code, out, _ = validate(path, capsys)
    assert code == 1 and "mode strict" in out
    assert ("saved:   automatically (KDA_CONTRACTS_DUMP_DIR): rejected in mode strict by strict mode's value "
            "checks") in out
    assert "[1] idx: ValueRangeError\n      expected slots in [0, N) = [0, 8)\n      got      1 out of range" in out
    code, out, _ = validate(path, capsys, "--mode", "check")
    assert code == 0  # shapes alone are fine, and the report says why it was rejected all the same
    assert ("note:    rejected when it was saved (its report is below), valid here: replayed in mode check, without "
            "the value checks") in out
    assert "rejected when saved:\n  dump_gather(): 1 contract violation\n    [1] idx: ValueRangeError" in out


def test_a_strict_rejection_saved_without_values_is_not_called_valid_silently(dump_dir, monkeypatch, capsys):
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_MAX_BYTES", "64")
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError):
        dump_gather(torch.randn(8, 16), torch.tensor([1, 9, 3]), torch.empty(3, 16),
                    config=GatherConfig(slots=8, width=16))
    (path,) = dump_dir.iterdir()
    code, out, _ = validate(path, capsys)
    assert code == 0 and "mode strict" in out
    assert "note:    strict mode: the value checks were skipped (the tensors were saved without values)" in out
    assert ("note:    rejected when it was saved (its report is below), valid here: its tensor values were not "
            "saved, so the value checks could not run") in out
    assert "  [1] idx: ValueRangeError" in out.split("rejected when saved:")[1]


def test_a_call_an_ops_after_checks_reject_is_saved_with_what_the_backend_wrote(dump_dir, capsys):
    cfg = GatherConfig(slots=8, width=16)
    out = torch.zeros(2, 16)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match="after backend 'nan'"):
        dump_gather(torch.randn(8, 16), torch.tensor([1, 2]), out, config=cfg, backend="nan")
    assert out.eq(0).all()  # strict mode rolled the call back ...
    (path,) = dump_dir.iterdir()
    assert torch.isnan(read_call_dump(load_file(path)).values["out"]).all()  # ... after saving what the check saw
    code, out, _ = validate(path, capsys)
    assert code == 1
    assert "rejected in mode strict by the op's after checks, once backend 'nan' had run" in out
    assert "got      non-finite values after backend nan" in out


def test_nothing_is_written_for_valid_calls(dump_dir):
    cfg = GatherConfig(slots=8, width=16)
    for mode in ("check", "strict"):
        with kc.mode(mode):
            for b in range(1, 26):
                dump_scale_rows(*rows(b, 4 * (b % 3 + 1)))
                dump_gather(torch.randn(8, 16), torch.randint(0, 8, (b,)), torch.empty(b, 16), config=cfg)
                dump_rmsnorm(torch.randn(b, 8), torch.randn(8))
    assert dumps_in(dump_dir) == []


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("KDA_CONTRACTS_DUMP_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(kc.ShapeError) as info:
        dump_scale_rows(torch.randn(2, 4), torch.randn(3), torch.empty(2, 4))
    assert "call saved" not in str(info.value) and list(tmp_path.iterdir()) == []


def test_the_number_of_dumps_is_bounded_and_the_oldest_are_kept(dump_dir, monkeypatch, capsys):
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_MAX", "5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in range(1, 31):
            with kc.mode("check"), pytest.raises(kc.ShapeError):
                dump_scale_rows(torch.randn(b, 8), torch.randn(7), torch.empty(b, 8))
    assert dumps_in(dump_dir) == [f"kda-dump-{i:03d}-dump_scale_rows.pt" for i in range(5)]
    kept = [read_call_dump(load_file(dump_dir / n)).values["x"].shape[0] for n in dumps_in(dump_dir)]
    assert kept == [1, 2, 3, 4, 5]
    full = [str(w.message) for w in caught if "already holds" in str(w.message)]
    assert full == [f"kda_contracts: {dump_dir} already holds 5 dumps (KDA_CONTRACTS_DUMP_MAX=5); later rejected "
                    "calls are not saved (the oldest are kept: remove them to save more)"]


def test_a_dump_that_cannot_be_written_is_a_warning_and_the_call_raises_its_own_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_DIR", str(blocker))
    with pytest.warns(RuntimeWarning, match=r"kda_contracts: could not save the rejected call of dump_scale_rows to "
                                            r"KDA_CONTRACTS_DUMP_DIR=.*a-file: FileExistsError"), \
            pytest.raises(kc.ShapeError) as info:
        dump_scale_rows(torch.randn(2, 4), torch.randn(3), torch.empty(2, 4))
    assert "call saved" not in str(info.value)


def test_warnings_as_errors_never_replace_the_calls_own_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_MAX", "many")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(kc.ShapeError):
            dump_scale_rows(torch.randn(2, 4), torch.randn(3), torch.empty(2, 4))
    assert list(tmp_path.iterdir()) == []


def test_a_bad_limit_is_a_warning_naming_the_variable(dump_dir, monkeypatch):
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_MAX", "many")
    with pytest.warns(RuntimeWarning, match=r"KDA_CONTRACTS_DUMP_MAX='many' is not an integer"), \
            pytest.raises(kc.ShapeError):
        dump_scale_rows(torch.randn(2, 4), torch.randn(3), torch.empty(2, 4))


def test_a_call_over_the_byte_limit_is_saved_without_values_and_still_judged(dump_dir, monkeypatch, capsys):
    monkeypatch.setenv("KDA_CONTRACTS_DUMP_MAX_BYTES", "1000")
    with kc.mode("check"), pytest.raises(kc.LayoutError):
        dump_scale_rows(torch.randn(64, 32), torch.randn(32), torch.empty(32, 64).t())
    (path,) = dump_dir.iterdir()
    assert path.stat().st_size < 8000
    code, out, _ = validate(path, capsys, "--strict")
    assert code == 1 and "[1] out: LayoutError" in out
    assert ("note:    tensor values not saved: the call's storages take 16512 bytes, over "
            "KDA_CONTRACTS_DUMP_MAX_BYTES=1000") in out
    assert ("note:    tensors saved on cpu were loaded without values (on the meta device) here: device checks use "
            "the saved devices") in out
    assert "note:    strict mode: the value checks were skipped (the tensors were saved without values)" not in out
    assert "out  float32 [64, 32] strides (1, 64) offset 0 on cpu" in out


def test_nothing_is_saved_while_torch_compile_traces(dump_dir):
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: dump_rmsnorm(x, w), fullgraph=True, backend="eager")
    with kc.mode("check"):
        for b in range(2, 6):
            f(torch.randn(b, 8), torch.randn(8))
        with pytest.raises(kc.ShapeError):
            f(torch.randn(3, 4), torch.randn(4))
    torch._dynamo.reset()
    assert dumps_in(dump_dir) == []


def test_a_rejected_packed_decode_call_is_saved_with_its_config(dump_dir, capsys):
    call = make_decode_call(TP2, batch=4, pool=8)
    idx = call["ssm_state_indices"].clone()
    idx[1] = idx[0]
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match="duplicate value"):
        kc.packed_decode(**dict(call, ssm_state_indices=idx), config=TP2, backend="torch")
    assert dumps_in(dump_dir) == ["kda-dump-000-packed_decode.pt"]
    code, report = validate_json(dump_dir / "kda-dump-000-packed_decode.pt", capsys)
    assert code == 1 and report["violations"][0]["got"] == (
        "1 duplicate value(s); the first: ssm_state_indices[1] = 0, also at ssm_state_indices[0]")
    assert report["config"]["class"] == "kda_contracts.ops._packed.config:KDAConfig"
    assert report["config"]["fields"]["tp_size"] == 2 and report["config"]["rebuilt"] is True
    assert NORM_CONFIG.D == 8  # the contract module's static config was not touched by any replay


def test_a_model_layer_method_rejected_call_replays_with_the_layer_as_its_config(dump_dir, capsys):
    from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32, index_dtype="int32")
    layer = KimiDeltaAttention(cfg, tp_rank=0, backend="torch")
    layer.load_weights(**random_weights(cfg, seed=0))
    ssm, conv = layer.new_state_pools(6)
    with kc.mode("check"), pytest.raises(kc.ContractError) as info:
        layer.decode(torch.randn(3, 30), ssm, conv, torch.tensor([-1, 4, -1], dtype=torch.int32))
    (path,) = dump_dir.iterdir()
    assert path.stat().st_size < 64 * 1024  # the layer's weights are not saved: only what the contract reads
    code, report = validate_json(path, capsys)
    assert code == 1 and report["target"]["name"] == "KimiDeltaAttention.decode"
    assert [(v["argument"], v["got"]) for v in report["violations"]] == \
        [(v.argument, v.got) for v in info.value.violations]
    assert report["dims"]["D"] == {"value": 32, "from": "from config (hidden_size=32)"}
    assert report["config"]["rebuilt"] is False


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here loads cuda:0 tensors in place")


@needs_no_gpu
def test_a_dump_written_on_a_gpu_is_loaded_on_the_cpu_and_judged_for_the_gpu(tmp_path, capsys):
    import zipfile

    path = kc.save_call(dump_scale_rows, tmp_path / "gpu.pt", *rows())
    with zipfile.ZipFile(path) as z:  # what torch.save writes for cuda:0 tensors: the location, and our records
        entries = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in entries if n.endswith("data.pkl"))
    entries[pkl] = entries[pkl].replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
    with zipfile.ZipFile(path, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    loaded = load_file(path)
    assert loaded.moved == ("cuda:0",) and read_call_dump(loaded).values["x"].device.type == "cpu"
    code, out, _ = validate(path, capsys)
    assert code == 0
    assert "x    float32 [4, 8] strides (8, 1) offset 0 on cuda:0" in out
    assert "     gpu: chosen (priority 40" in out


def test_a_bound_method_of_a_contracted_class_round_trips(tmp_path, capsys):
    from dump_ops import Projector

    method = Projector(4).project
    code, out, _ = validate(kc.save_call(method, tmp_path / "m.pt", torch.randn(3, 8), torch.randn(8, 4)), capsys)
    assert code == 0 and "call:    Projector.project (contract dump_ops:Projector.project)" in out
    code, out, _ = validate(kc.save_call(method, tmp_path / "bad.pt", torch.randn(3, 8), torch.randn(5, 4)), capsys)
    assert code == 1 and "[1] w: ShapeError" in out
