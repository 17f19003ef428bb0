"""benchmarks/decode.py --op gdn and benchmarks/gpu_abuse.py --op gdn on the CPU: the dry run checks
every GDN backend against the reference and writes its own section, the summary states issue 14's
targets with verdicts, the abuse run catches a kernel that writes outside its slots (nothing is
timed here; the figures come from the H200)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
KDA_SECTION = "## Packed decode kernels (GPU)\n\nthe KDA table, untouched\n"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"kda_benchmarks_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _decode(*args):
    got = subprocess.run([sys.executable, str(BENCH / "decode.py"), *args], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    return got


def test_gdn_dry_run_checks_every_backend_and_writes_its_own_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n" + KDA_SECTION)
    # (tuning candidates: four of them, one per kind of row, keep their code path exercised; all ~40
    # took 70-90 s of CI under the interpreter, and benchmarks/gpu_abuse.py --all-configs checks each
    # on a GPU)
    got = _decode("--dry", "--op", "gdn", "--out", str(doc), "--json", str(tmp_path / "gdn.json"),
                  "--only", "br,m,fe0,bv64-w2")
    assert " 0 incorrect" in got.stderr.splitlines()[-1]
    text = doc.read_text()
    assert KDA_SECTION in text  # the KDA section is left as it was
    gdn = text[text.index("## GDN packed decode kernels (GPU)"):]
    assert "| variant | layout | backend | H/HV | state | B |" in gdn and "vs sgl-triton" in gdn
    rows = [ln for ln in gdn.splitlines() if ln.startswith(("| hot |", "| cold |"))]
    assert any("| triton:fe0 |" in r for r in rows) and any("| triton:br |" in r for r in rows)
    # the reference stands in for our kernels until they load; every row checked, none wrong
    assert any("| VK | torch | 2/4 | float32 | 1 |" in r for r in rows)
    assert any("| KV | torch | 2/4 | bfloat16 | 2 |" in r for r in rows)
    assert rows and not [r for r in rows if "✗" in r]
    for name in ("triton", "fla"):  # each of ours ran or is reported (helion is left out of dry runs)
        assert any(f"| {name} |" in r for r in rows) or f"gdn backend {name}: unavailable" in got.stderr
    # the same section again from the saved rows (how a sweep split over several commands is reported)
    doc.write_text("# Benchmarks\n\n" + KDA_SECTION)
    _decode("--report", str(tmp_path / "gdn.json"), "--out", str(doc))
    assert doc.read_text() == text
    if importlib.util.find_spec("matplotlib"):
        _decode("--plot", f"{tmp_path / 'gdn.json'},{tmp_path / 'gdn.json'}", str(tmp_path / "gdn.png"))
        assert (tmp_path / "gdn.png").read_bytes()[:4] == b"\x89PNG"


def test_kda_dry_run_reports_candidates_this_machine_cannot_run_as_not_run_not_as_wrong(tmp_path):
    # the shared-memory and register KV tiles are Gluon kernels, which the Triton interpreter does not
    # run: their rows say why, they are not timed, and they do not count as incorrect
    got = _decode("--dry", "--json", str(tmp_path / "kda.json"), "--only", "sh128-w2,rg16,r4")
    assert got.stderr.splitlines()[-1].endswith(" 0 incorrect")
    rows = json.loads((tmp_path / "kda.json").read_text())["rows"]
    not_here = [r for r in rows if r["backend"] in ("triton:sh128-w2", "triton:rg16")]
    assert not_here and all(r["layout"] == "KV" and r["correct"] is None and r["us"] is None
                            and r["note"] == "not here: the Triton interpreter (TRITON_INTERPRET) does not run "
                                             "Gluon kernels" for r in not_here)
    ran = [r for r in rows if r["backend"] in ("triton", "triton:r4")]
    assert {r["layout"] for r in ran} == {"VK", "KV"} and all(r["correct"] is True for r in ran)


def _row(backend, B, us, state="float32", variant="cold", pct=None, H=16):
    return dict(variant=variant, layout="VK", backend=backend, H=H, HV=2 * H, state=state, B=B, us=us,
                tbps=None, pct_copy=pct, correct=True, same_size_copy_tbps=3.9 if B >= 256 else None)


def test_gdn_summary_states_each_target_with_its_verdict():
    gdn = _load("decode_gdn")
    data = []
    for state, pct in (("float32", 96.0), ("bfloat16", 90.5)):
        for B, ours, sgl in ((1, 2, 2), (8, 4, 4.08), (64, 10, 10.5), (256, 30, 31.5), (1024, 100, 99)):
            data += [_row("triton", B, ours, state, pct=pct), _row("helion", B, ours * 2, state, pct=pct / 2),
                     _row("sglang-triton", B, sgl, state, pct=pct * ours / sgl),
                     _row("fla-oop", B, 3 * sgl, state, pct=30.0)]
    text = "\n".join(gdn.summary(data))
    assert ("| ≥ 1.03× sglang-triton at B ∈ {8, 64, 256} | worst 1.020× (cold, H=16, float32, B=8, triton); "
            "geometric mean 1.040× over 6 rows | **miss** (2 of 6 rows) |") in text
    assert ("| never slower than sglang-triton at B = 1 and 1024 | worst 0.990× (cold, H=16, float32, B=1024, "
            "triton); geometric mean 0.995× over 4 rows | **miss** (2 of 4 rows) |") in text
    assert "| ≥ 95 % of copy at B ≥ 256, float32 state | ours 96.0–96.0 %" in text and "| pass |" in text
    assert "| ≥ 92 % of copy at B ≥ 256, bfloat16 state | ours 90.5–90.5 %" in text
    assert "| 16 | 32 | float32 | 256 | triton | 96.0 | 91.4 | 30.0 | 3.90 |" in text


def test_gdn_summary_without_sglang_says_so():
    gdn = _load("decode_gdn")
    assert gdn.summary([_row("triton", 8, 1.0)]) == [
        "No row has both one of our GDN kernels and sglang-triton timed: no targets to check."]


@pytest.fixture
def abuse():
    mod = _load("gpu_abuse")
    mod.DEVICE, mod.ACTIVATIONS = "cpu", torch.float32
    return mod


def test_gpu_abuse_help_runs_without_a_gpu(abuse, capsys):
    with pytest.raises(SystemExit) as stop:
        abuse.main(["--help"])
    assert stop.value.code == 0 and "--op {kda,gdn}" in capsys.readouterr().out


def test_gdn_abuse_passes_the_reference_and_catches_stray_writes(abuse, capsys):
    from decode_gdn import reference

    ref = reference()

    def writes_before_the_pool(*args, **kwargs):  # into the canary slot in front of slot 0
        ref(*args, **kwargs)
        state = args[6]
        torch.as_strided(state, (1,), (1,), state.storage_offset() - 1).fill_(1.0)

    trials = 12
    failures = abuse.abuse({"torch": ref, "good": ref, "stray": writes_before_the_pool}, ref, True,
                           torch.Generator().manual_seed(0), trials)
    out = capsys.readouterr().out
    assert failures == trials and out.count("FAIL stray trial") == trials and "FAIL good" not in out
    assert "cases per backend: {'torch': 12, 'good': 12, 'stray': 12}" in out


def test_gdn_abuse_trials_cover_layouts_dtypes_index_widths_and_bad_indices(abuse):
    g = torch.Generator().manual_seed(0)
    trials = [abuse.gdn_trial(t, g) for t in range(60)]
    assert {t[4] for t in trials} == {"VK", "KV"}
    assert {t[5] for t in trials} == {torch.float32, torch.bfloat16, torch.float16}
    assert {t[6] for t in trials} == {torch.int32, torch.int64}
    assert {t[0].num_v_heads // t[0].num_heads for t in trials} == {1, 2, 4}
    for _cfg, B, N, idx, *_ in trials:
        valid = [i for i in idx if 0 <= i < N]
        assert len(valid) == len(set(valid)) and len(idx) == B  # no duplicate slots
    bad = {i for t in trials for i in t[3] if not 0 <= i < t[2]}
    assert {-1, 8, 2**31 - 1, 2**63 - 1} <= bad


def test_plot_draws_a_gdn_json(tmp_path):
    pytest.importorskip("matplotlib")
    report = _load("decode_report")
    rows = [dict(_row(n, B, us, pct=None, variant=v), tbps=tb) for v in ("hot", "cold")
            for n, us, tb in (("triton", 1.0, 4.0), ("sglang-triton", 1.1, 3.8)) for B in (1, 256)]
    src = tmp_path / "gdn.json"
    src.write_text(json.dumps(dict(op="gdn", device="H200", copy_tbps=4.2, rows=rows)))
    report.plot(src, tmp_path / "gdn.png")
    assert (tmp_path / "gdn.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_the_eager_path_benchmark_says_it_needs_cuda(capsys):
    eager_path = _load("eager_path")
    assert eager_path.main(["--rounds", "1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_the_cluster_probe_says_what_the_installed_triton_makes_of_sums_split_over_a_cluster():
    # docs/lab-notes.md rests on it: Triton 3.6 (the H200 image's) compiles neither form, 3.9 both
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.experimental.gluon.language")
    probe = _load("cluster_probe")
    got = {form: probe.probe(form) for form in probe.FORMS}
    if triton.__version__.startswith("3.6."):
        assert "isReduceWithinCTA" in got["reduce"]["error"]
        assert "'nvvm.mapa' op result #0 must be LLVM pointer" in got["convert"]["error"]
    elif triton.__version__.startswith("3.9."):
        for form in probe.FORMS:
            assert got[form] == {"compiled": True, "mapa": True, "shared_cluster": True, "cluster_barrier": True}
    for form in probe.FORMS:  # any release: an outcome, never nothing
        assert got[form]["compiled"] or got[form]["error"]
