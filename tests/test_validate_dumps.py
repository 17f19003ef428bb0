"""``kda-contracts validate DUMP`` on a ``kc.save_call`` dump of any op: exit 0 valid, 1 violations,
2 unusable or internal error (with a traceback; an unexpected exception is never 1); the text
report and the ``--json`` schema pinned; the packed-decode format of ``save_dump`` read by the same
command (its own tests: ``tests/test_cli.py``)."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from dump_ops import GatherConfig, dump_fragile, dump_gather, dump_scale_rows

import kda_contracts as kc
from kda_contracts.__main__ import main
from kda_contracts._engine.tools.dumps import FORMAT_KEY
from kda_contracts.ops.packed_decode.dump import save_dump
from kda_contracts.testing import make_decode_call

TESTS = Path(__file__).resolve().parent


def validate(path, capsys, *extra):
    code = main(["validate", str(path), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def bad_call(tmp_path):
    with kc.mode("check"):
        return kc.save_call(dump_scale_rows, tmp_path / "bad.pt", torch.randn(4, 8), torch.randn(6),
                            torch.empty(4, 8))


GOLDEN = """\
kda-contracts validate: {path}
call:    dump_scale_rows (op dump_ops:dump_scale_rows), mode check
saved:   by kc.save_call (mode check)
config:  none (dims come from the tensors)

arguments:
  x    float32 [4, 8] strides (8, 1) offset 0 on cpu
  w    float32 [6] strides (1,) offset 0 on cpu
  out  float32 [4, 8] strides (8, 1) offset 0 on cpu

INVALID: 1 violation
  [1] w: ShapeError
      expected [D] = [8]
      got      [6]
      dim 0 (D): expected 8 (D from x.shape[1]), got 6

dims:
  B = 4      from x.shape[0]
  D = 8      from x.shape[1]

backends: none would run it (dump_scale_rows validates before dispatching)
"""


def test_the_text_report_is_pinned(bad_call, capsys):
    code, out, err = validate(bad_call, capsys)
    assert (code, err) == (1, "")
    assert out == GOLDEN.format(path=bad_call)


def test_the_json_schema_is_pinned(tmp_path, capsys):
    cfg = GatherConfig(slots=8, width=16)
    with kc.mode("check"):
        path = kc.save_call(dump_gather, tmp_path / "g.pt", torch.randn(8, 16), torch.tensor([3, 1]),
                            torch.empty(2, 16), config=cfg)
    code, out, _ = validate(path, capsys, "--json")
    report = json.loads(out)
    assert code == 0
    assert list(report) == ["path", "valid", "exit_code", "mode", "target", "saved", "config", "arguments", "notes",
                            "violations", "dims", "backends", "plugin_errors"]
    assert report["target"] == {"kind": "op", "name": "dump_gather", "ref": "dump_ops:dump_gather", "variant": None}
    assert report["saved"] == {"by": "kc.save_call", "mode": "check", "stage": None, "backend": None,
                               "backend_asked": "auto", "error": None}
    assert report["arguments"]["idx"] == {"tensor": {"dtype": "torch.int64", "shape": [2], "stride": [1],
                                                     "storage_offset": 0, "device": "cpu"}}
    assert report["arguments"]["config"] == {"value": {"slots": 8, "width": 16}}
    assert report["dims"] == {"N": {"value": 8, "from": "from config (GatherConfig.N=8)"},
                              "W": {"value": 16, "from": "from config (GatherConfig.W=16)"},
                              "B": {"value": 2, "from": "from idx.shape[0]"}}
    assert report["backends"] == [
        {"name": "torch", "priority": 0, "accepts": True, "chosen": True, "reasons": []},
        {"name": "nan", "priority": -1, "accepts": True, "chosen": False, "reasons": []}]
    assert (report["valid"], report["exit_code"], report["violations"], report["plugin_errors"]) == (True, 0, [], {})


def test_json_violations_carry_expected_got_details_and_fix(bad_call, capsys):
    code, out, _ = validate(bad_call, capsys, "--json")
    report = json.loads(out)
    assert code == 1 and report["exit_code"] == 1 and report["backends"] is None
    assert report["violations"] == [{"argument": "w", "error": "ShapeError", "expected": "[D] = [8]", "got": "[6]",
                                     "details": ["dim 0 (D): expected 8 (D from x.shape[1]), got 6"], "fix": None}]


def test_strict_flag_runs_the_value_checks_of_a_call_saved_in_check_mode(tmp_path, capsys):
    cfg = GatherConfig(slots=8, width=16)
    with kc.mode("check"):
        path = kc.save_call(dump_gather, tmp_path / "g.pt", torch.randn(8, 16), torch.tensor([3, 8]),
                            torch.empty(2, 16), config=cfg)
    assert validate(path, capsys)[0] == 0  # saved in check mode: replayed in check mode
    code, out, _ = validate(path, capsys, "--strict")
    assert code == 1 and "mode strict" in out and "[1] idx: ValueRangeError" in out


# -- unusable files: exit 2, a clear message on stderr, nothing on stdout ----------------------------
class NotAllowed:
    pass


def _unusable(tmp_path, good: Path) -> dict[str, Path]:
    raw = torch.load(good, weights_only=True)
    files = {}

    def save(name, obj):
        files[name] = tmp_path / name
        torch.save(obj, files[name])

    files["missing.pt"] = tmp_path / "missing.pt"
    files["corrupt.pt"] = tmp_path / "corrupt.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(files["corrupt.pt"], "w") as dst:
        for entry in src.namelist():
            if "/data/" not in entry:  # the tensors' storages are lost
                dst.writestr(entry, src.read(entry))
    files["text.pt"] = tmp_path / "text.pt"
    files["text.pt"].write_text("x,w,out\n")
    save("pickle.pt", {**raw, "arguments": {**raw["arguments"], "w": NotAllowed()}})
    save("newer.pt", {**raw, FORMAT_KEY: 7})
    save("malformed.pt", {k: v for k, v in raw.items() if k != "arguments"})
    save("no_module.pt", {**raw, "target": {**raw["target"], "ref": "vanished_ops:dump_scale_rows",
                                            "name": "vanished_op"}})
    save("local.pt", {**raw, "target": {**raw["target"], "ref": "dump_ops:make.<locals>.op", "name": "local_op"}})
    save("not_an_op.pt", {**raw, "target": {**raw["target"], "ref": "dump_ops:GatherConfig", "name": "other"}})
    save("list.pt", [1, 2, 3])
    save("state_dict.pt", {"layer.weight": torch.zeros(2)})
    return files


@pytest.mark.parametrize(("name", "message"), [
    ("missing.pt", "missing.pt: no such file"),
    ("corrupt.pt", "corrupt.pt: torch.load failed ("),
    ("text.pt", "text.pt: not a torch.save file (neither a zip archive nor a pickle)"),
    ("pickle.pt", "pickle.pt: refused by torch.load(weights_only=True): the file holds objects other than tensors and "
                  "plain Python values (Unsupported global: GLOBAL test_validate_dumps.NotAllowed"),
    ("newer.pt", "newer.pt: call dump format 7 is newer than the one this kda-contracts reads (1)"),
    ("malformed.pt", "malformed.pt: malformed call dump: 'arguments' is missing or not a dict"),
    ("no_module.pt", "no_module.pt: cannot import the op 'vanished_op' from vanished_ops:dump_scale_rows "
                     "(ModuleNotFoundError: No module named 'vanished_ops'). Run kda-contracts validate where that "
                     "module imports (from the project's root, or with PYTHONPATH set)"),
    ("local.pt", "local.pt: cannot import the op 'local_op' from dump_ops:make.<locals>.op (ImportError: "
                 "make.<locals>.op is defined inside a function; only a module-level name can be imported)"),
    ("not_an_op.pt", "not_an_op.pt: dump_ops:GatherConfig is not the op 'other' (kc.ops() has no op of that name)"),
    ("list.pt", "list.pt: not a dump kda-contracts can read: not a kc.save_call dump (no 'kda_contracts_dump' key); "
                "not a packed_decode dump (expected a dict of packed_decode arguments by name, got a list)"),
    ("state_dict.pt", "not a packed_decode dump (none of the packed_decode arguments: is this a dump of another call "
                      "(or a state_dict)? (keys: 'layer.weight'; required: mixed_qkv, a, b, A_log"),
])
def test_a_file_that_is_not_a_usable_dump_exits_2_with_a_clear_message(tmp_path, bad_call, capsys, name, message):
    files = _unusable(tmp_path, bad_call)
    code, out, err = validate(files[name], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("kda-contracts validate: ") and message in err
    assert "Traceback" not in err


def test_a_malicious_dump_is_refused_without_running_its_code(tmp_path, bad_call, capsys):
    marker = tmp_path / "pwned"

    class WritesAFile:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    raw = torch.load(bad_call, weights_only=True)
    torch.save({**raw, "arguments": {**raw["arguments"], "x": WritesAFile()}}, tmp_path / "evil.pt")
    code, _, err = validate(tmp_path / "evil.pt", capsys)
    assert code == 2 and "refused by torch.load(weights_only=True)" in err
    assert not marker.exists()


def test_a_dump_of_an_op_whose_module_is_gone_exits_2(tmp_path, capsys, monkeypatch):
    (tmp_path / "short_lived_ops.py").write_text(
        "import torch, kda_contracts as kc\nfrom kda_contracts import Float, Tensor\n\n"
        "@kc.op\ndef short_lived(x: Float[Tensor, 'B D']) -> Float[Tensor, 'B D']:\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import short_lived_ops

    path = kc.save_call(short_lived_ops.short_lived, tmp_path / "s.pt", torch.randn(2, 3))
    assert validate(path, capsys)[0] == 0
    (tmp_path / "short_lived_ops.py").unlink()
    proc = subprocess.run([sys.executable, "-m", "kda_contracts", "validate", str(path)], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"kda-contracts validate: {path}: cannot import the op 'short_lived' from "
                           "short_lived_ops:short_lived (ModuleNotFoundError: No module named 'short_lived_ops'). Run "
                           "kda-contracts validate where that module imports (from the project's root, or with "
                           "PYTHONPATH set)\n")


def test_an_internal_error_exits_2_with_its_traceback_never_1(tmp_path, capsys):
    with kc.mode("check"):
        path = kc.save_call(dump_fragile, tmp_path / "f.pt", torch.randn(5))
    assert validate(path, capsys)[0] == 0  # check mode: the buggy value check does not run
    code, out, err = validate(path, capsys, "--strict")
    assert (code, out) == (2, "")
    assert "Traceback (most recent call last):" in err and "in _positive_total" in err
    assert err.rstrip().endswith("kda-contracts validate: internal error (RuntimeError: a Tensor with 5 elements "
                                 "cannot be converted to Scalar); the traceback is above")


def test_options_of_the_packed_decode_format_are_refused_for_a_call_dump(bad_call, capsys):
    code, _, err = validate(bad_call, capsys, "--config", "kimi-linear-48b-a3b")
    assert code == 2
    assert "--config: for other dump formats; a kc.save_call dump carries its own arguments and config" in err


def test_the_legacy_packed_decode_format_goes_through_the_same_command(tmp_path, capsys):
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2)
    call = make_decode_call(cfg, batch=4, pool=8)
    save_dump(tmp_path / "legacy.pt", call, config=cfg)
    code, out, _ = validate(tmp_path / "legacy.pt", capsys)
    assert code == 0 and "call:   packed_decode, state layout VK, mode strict" in out
    save_dump(tmp_path / "legacy_bad.pt", dict(call, b=call["b"][:, :4]), config=cfg)
    code, out, _ = validate(tmp_path / "legacy_bad.pt", capsys, "--json")
    assert code == 1 and json.loads(out)["violations"][0]["argument"] == "b"


def test_the_help_documents_exit_codes_and_both_formats(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for line in ("0  the call meets the contract", "1  the call breaks the contract (every violation is listed)",
                 "2  the file is not a usable dump", "an internal error (traceback on stderr)",
                 "A kc.save_call dump (also what KDA_CONTRACTS_DUMP_DIR collects)",
                 "packed_decode dumps (save_dump)"):
        assert line in out


def test_the_installed_command_replays_a_user_op_from_the_current_directory(tmp_path, bad_call):
    ok = kc.save_call(dump_scale_rows, tmp_path / "ok.pt", torch.randn(4, 8), torch.randn(8), torch.empty(4, 8))
    for path, want in ((ok, 0), (bad_call, 1)):
        proc = subprocess.run([sys.executable, "-m", "kda_contracts", "validate", str(path)], cwd=TESTS,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == want, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "kda_contracts", "validate", str(ok)], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "cannot import the op 'dump_scale_rows' from dump_ops:dump_scale_rows" in proc.stderr

