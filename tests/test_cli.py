"""The `kda-contracts` command line: `validate DUMP.pt` (exit 0 valid, 1 invalid, 2 not a usable
dump) and the wiring of the subcommands."""

import json
import subprocess
import sys
import zipfile

import pytest
import torch

import kda_contracts as kc
from kda_contracts.__main__ import main
from kda_contracts.ops.packed_decode.cli import config_from_arg
from kda_contracts.ops.packed_decode.dump import check_dump, load_dump, save_dump
from kda_contracts.testing import make_decode_call

TP2 = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2)


@pytest.fixture(scope="module")
def call():
    return make_decode_call(TP2, batch=4, pool=8)


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- valid and invalid calls ---------------------------------------------------------------------
def test_a_valid_dump_exits_0_with_dims_provenance_and_backends(tmp_path, call, capsys):
    save_dump(tmp_path / "ok.pt", call, config=TP2)
    code, out, _ = run(["validate", str(tmp_path / "ok.pt")], capsys)
    assert code == 0
    assert "VALID: the call meets the contract" in out
    assert "HV = 16     from config (num_v_heads=32 / tp_size=2)" in out
    assert "N  = 8      from initial_state.shape[0]" in out
    assert "torch: accepts (backend='auto' picks it)" in out  # a CPU call
    assert "triton: rejects: runs on cuda, not cpu" in out


def test_an_invalid_dump_exits_1_and_lists_every_violation(tmp_path, call, capsys):
    pinned = TP2.model_copy(update={"index_dtype": "int32"}).revalidate()
    bad = dict(call, a=call["a"].view(4, 16, 128), ssm_state_indices=call["ssm_state_indices"].long())
    save_dump(tmp_path / "bad.pt", bad, config=pinned)
    code, out, _ = run(["validate", str(tmp_path / "bad.pt")], capsys)
    assert code == 1
    assert "INVALID: 2 violations" in out
    assert "[1] a: ShapeError" in out and "[2] ssm_state_indices: DtypeError" in out
    assert "fix: `a` looks unflattened" in out
    assert "backends: none would accept it" in out


def test_without_a_config_dims_come_from_the_tensors(tmp_path, call, capsys):
    save_dump(tmp_path / "noconf.pt", call)
    code, out, _ = run(["validate", str(tmp_path / "noconf.pt")], capsys)
    assert code == 0
    assert "config: none (dims come from the tensors)" in out
    assert "H  = 16     solved from mixed_qkv.shape[1] = 2*H*K+HV*V" in out


def test_strict_mode_is_the_default_and_check_mode_skips_value_checks(tmp_path, call, capsys):
    idx = call["ssm_state_indices"].clone()
    idx[1] = idx[0]
    save_dump(tmp_path / "dup.pt", dict(call, ssm_state_indices=idx), config=TP2)
    code, out, _ = run(["validate", str(tmp_path / "dup.pt")], capsys)
    assert code == 1 and "duplicate value" in out
    code, out, _ = run(["validate", str(tmp_path / "dup.pt"), "--mode", "check"], capsys)
    assert code == 0 and "mode check" in out


def test_the_command_line_config_replaces_the_dumps(tmp_path, call, capsys):
    save_dump(tmp_path / "tp2.pt", call, config=TP2)
    code, out, _ = run(["validate", str(tmp_path / "tp2.pt"), "--config", "kimi-linear-48b-a3b"], capsys)
    assert code == 1
    assert "the tensors look sharded for tp_size=2, the config for tp_size=1" in out
    assert "the dump's config was replaced by --config" in out
    code, _, _ = run(["validate", str(tmp_path / "tp2.pt"), "--config", "kimi-linear-48b-a3b", "--tp", "2"], capsys)
    assert code == 0


@pytest.mark.parametrize("config", ["kimi-linear-48b-a3b", {"preset": "kimi-linear-48b-a3b", "tp_size": 2}])
def test_the_dump_config_may_be_a_preset_name_or_a_preset_with_overrides(tmp_path, call, capsys, config):
    torch.save({**call, "config": config}, tmp_path / "preset.pt")
    code, out, _ = run(["validate", str(tmp_path / "preset.pt")], capsys)
    assert code == (1 if isinstance(config, str) else 0), out  # the tensors are TP2


def test_a_layout_that_contradicts_the_config_is_a_violation(tmp_path, call, capsys):
    save_dump(tmp_path / "layout.pt", call, config=TP2, state_layout="KV")
    code, out, _ = run(["validate", str(tmp_path / "layout.pt")], capsys)
    assert code == 1 and "state_layout: LayoutError" in out


def test_a_kv_dump_is_checked_against_the_kv_contract(tmp_path, capsys):
    kv = TP2.model_copy(update={"state_layout": "KV"}).revalidate()
    save_dump(tmp_path / "kv.pt", make_decode_call(kv, batch=2, pool=4), config=kv)
    code, out, _ = run(["validate", str(tmp_path / "kv.pt")], capsys)
    assert code == 0 and "state layout KV" in out


def test_json_output_carries_the_same_verdict(tmp_path, call, capsys):
    save_dump(tmp_path / "bad.pt", dict(call, scale=-1.0), config=TP2)
    code, out, _ = run(["validate", str(tmp_path / "bad.pt"), "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["valid"] is False and report["exit_code"] == 1
    assert [v["argument"] for v in report["violations"]] == ["scale"]
    assert report["dims"]["HV"] == {"value": 16, "from": "from config (num_v_heads=32 / tp_size=2)"}


def test_a_wrong_python_type_is_a_violation_not_a_broken_dump(tmp_path, call, capsys):
    torch.save({**call, "use_qk_l2norm_in_kernel": "yes"}, tmp_path / "types.pt")
    code, out, _ = run(["validate", str(tmp_path / "types.pt")], capsys)
    assert code == 1 and "use_qk_l2norm_in_kernel: ArgumentTypeError" in out


def test_unknown_keys_are_reported_and_ignored(tmp_path, call, capsys):
    torch.save({**call, "layer_id": 7}, tmp_path / "extra.pt")
    code, out, _ = run(["validate", str(tmp_path / "extra.pt")], capsys)
    assert code == 0 and "ignored keys: 'layer_id'" in out


# -- dumps from a GPU, read on a machine without one ------------------------------------------------
def _as_if_saved_on_cuda(path):
    """Rewrite a CPU dump's storage locations to cuda:0 (what torch.save writes for GPU tensors)."""
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in entries if n.endswith("data.pkl"))
    assert b"X\x03\x00\x00\x00cpu" in entries[pkl]
    entries[pkl] = entries[pkl].replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
    with zipfile.ZipFile(path, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here loads cuda:0 tensors in place")


@needs_no_gpu
def test_a_gpu_dump_is_loaded_on_the_cpu_and_says_so(tmp_path, call, capsys):
    save_dump(tmp_path / "gpu.pt", call, config=TP2)
    _as_if_saved_on_cuda(tmp_path / "gpu.pt")
    code, out, _ = run(["validate", str(tmp_path / "gpu.pt")], capsys)
    assert code == 0
    assert "tensors saved on cuda:0 were loaded on the CPU (no such device here)" in out


@needs_no_gpu
def test_the_saved_devices_are_recorded_when_tensors_are_relocated(tmp_path, call):
    save_dump(tmp_path / "gpu.pt", call, config=TP2)
    _as_if_saved_on_cuda(tmp_path / "gpu.pt")
    dump = load_dump(tmp_path / "gpu.pt")
    assert dump.saved_devices == ("cuda:0",) and dump.relocated
    assert dump.values["mixed_qkv"].device.type == "cpu"


def test_a_dump_that_mixed_devices_stays_invalid_when_loaded_on_the_cpu(tmp_path, call):
    save_dump(tmp_path / "ok.pt", call, config=TP2)
    dump = load_dump(tmp_path / "ok.pt")
    assert dump.saved_devices == ("cpu",) and not dump.relocated
    dump.saved_devices, dump.relocated = ("cpu", "cuda:0"), True  # as a cpu+cuda dump reads on a CPU machine
    report = check_dump(dump)
    assert report.exit_code == 1
    v = report.violations[0]
    assert (v.argument, v.kind.kind_name, v.got) == ("(dump)", "DeviceError", "tensors saved on cpu, cuda:0")


# -- files that are not usable dumps: exit 2, a clear message -------------------------------------
class NotAllowed:
    pass


def _unusable(tmp_path, call):
    cases = {
        "missing.pt": None,
        "text.pt": b"not a checkpoint\n",
        "list.pt": [1, 2, 3],
        "state_dict.pt": {"layer.weight": torch.zeros(2)},
        "partial.pt": {k: v for k, v in call.items() if k != "initial_state"},
        "pickle.pt": {**call, "extra": NotAllowed()},
        "bad_config.pt": {**call, "config": {"num_heads": -1}},
        "bad_preset.pt": {**call, "config": "no-such-model"},
        "bad_layout.pt": {**call, "state_layout": "XY"},
    }
    for name, content in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            torch.save(content, path)
    return cases


@pytest.mark.parametrize(("name", "message"), [
    ("missing.pt", "no such file"),
    ("text.pt", "not a torch.save file"),
    ("list.pt", "expected a dict of packed_decode arguments by name, got a list"),
    ("state_dict.pt", "none of the packed_decode arguments: is this a dump of another call (or a state_dict)?"),
    ("partial.pt", "missing initial_state"),
    ("pickle.pt", "refused by torch.load(weights_only=True)"),
    ("bad_config.pt", "its 'config' is not a valid KDAConfig"),
    ("bad_preset.pt", "unknown preset 'no-such-model'"),
    ("bad_layout.pt", "'state_layout' must be 'VK' or 'KV'"),
])
def test_a_file_that_is_not_a_usable_dump_exits_2_with_a_clear_message(tmp_path, call, capsys, name, message):
    _unusable(tmp_path, call)
    code, out, err = run(["validate", str(tmp_path / name)], capsys)
    assert code == 2
    assert message in err and out == ""


def test_the_pickle_refusal_names_the_offending_object(tmp_path, call, capsys):
    _unusable(tmp_path, call)
    code, _, err = run(["validate", str(tmp_path / "pickle.pt")], capsys)
    assert code == 2 and "NotAllowed" in err and "\x1b[" not in err


class WritesAFile:
    """Unpickling this would call open(path, "w"): weights_only must refuse before that."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_malicious_dump_is_refused_without_running_its_code(tmp_path, call, capsys):
    marker = tmp_path / "pwned"
    torch.save({**call, "payload": WritesAFile(marker)}, tmp_path / "evil.pt")
    code, _, err = run(["validate", str(tmp_path / "evil.pt")], capsys)
    assert code == 2 and "refused by torch.load(weights_only=True)" in err
    assert not marker.exists()


def test_tp_without_config_is_a_bad_command_line(tmp_path, call, capsys):
    save_dump(tmp_path / "ok.pt", call, config=TP2)
    code, _, err = run(["validate", str(tmp_path / "ok.pt"), "--tp", "2"], capsys)
    assert code == 2 and "--tp needs --config" in err


def test_the_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for line in ("0  the call meets the contract", "1  the call breaks the contract", "2  the file is not a usable"):
        assert line in out


# -- the Python side and the installed command -------------------------------------------------------
def test_load_and_check_dump_from_python(tmp_path, call):
    save_dump(tmp_path / "ok.pt", call, config=TP2)
    report = check_dump(load_dump(tmp_path / "ok.pt"))
    assert report.ok and report.exit_code == 0 and dict(report.dims)["B"] == 4


def test_config_from_arg_reads_presets_and_config_json(tmp_path):
    assert config_from_arg(None, None)[1] == "kimi-linear-48b-a3b, tp_size=1"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"linear_attn_config": {"num_heads": 16, "head_dim": 64}}), encoding="utf-8")
    cfg, label = config_from_arg(str(path), 4)
    assert (cfg.local_num_heads, label) == (4, "config.json, tp_size=4")


def test_the_module_runs_as_a_command_with_the_same_exit_codes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kda_contracts", "validate", str(tmp_path / "none.pt")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "no such file" in proc.stderr
