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

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
KDA_SECTION = "## Packed decode kernels (GPU)\n\nthe KDA table, untouched\n"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"kda_benchmarks_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gdn_dry_run_checks_every_backend_and_writes_its_own_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n" + KDA_SECTION)
    env = dict(os.environ, TRITON_INTERPRET="1")
    got = subprocess.run([sys.executable, str(BENCH / "decode.py"), "--dry", "--op", "gdn", "--out", str(doc)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert " 0 incorrect" in got.stderr.splitlines()[-1]
    text = doc.read_text()
    assert KDA_SECTION in text  # the KDA section is left as it was
    gdn = text[text.index("## GDN packed decode kernels (GPU)"):]
    assert "| variant | layout | backend | H/HV | state | B |" in gdn and "vs sgl-triton" in gdn
    rows = [ln for ln in gdn.splitlines() if ln.startswith(("| hot |", "| cold |"))]
    # the reference stands in for our kernels until they load; every row checked, none wrong
    assert any("| VK | torch | 2/4 | float32 | 1 |" in r for r in rows)
    assert any("| KV | torch | 2/4 | bfloat16 | 2 |" in r for r in rows)
    assert rows and not [r for r in rows if "✗" in r]
    for name in ("triton", "fla"):  # each of ours ran or is reported (helion is left out of dry runs)
        assert any(f"| {name} |" in r for r in rows) or f"gdn backend {name}: unavailable" in got.stderr


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


def test_plot_draws_a_gdn_json(tmp_path):
    pytest.importorskip("matplotlib")
    report = _load("decode_report")
    rows = [dict(_row(n, B, us, pct=None, variant=v), tbps=tb) for v in ("hot", "cold")
            for n, us, tb in (("triton", 1.0, 4.0), ("sglang-triton", 1.1, 3.8)) for B in (1, 256)]
    src = tmp_path / "gdn.json"
    src.write_text(json.dumps(dict(op="gdn", device="H200", copy_tbps=4.2, rows=rows)))
    report.plot(src, tmp_path / "gdn.png")
    assert (tmp_path / "gdn.png").read_bytes()[:4] == b"\x89PNG"
