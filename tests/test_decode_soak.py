"""The soak test of issue 13 at CPU size: 5,000 decode steps per mode, every 50th call malformed,
every 200th backend call failing (half-written in strict mode): every bad call is rejected with
nothing changed, every output and the final pool match a clean run bit for bit, memory stays
flat. Throughput figures come from the same script at full size on the H200
(docs/reliability.md), never asserted here."""

import importlib.util
import json
import sys
from pathlib import Path

import kda_contracts as kc

ROOT = Path(__file__).resolve().parents[1]


def load_soak():
    spec = importlib.util.spec_from_file_location("decode_soak", ROOT / "examples" / "decode_soak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_five_thousand_steps_under_faults_lose_nothing(tmp_path):
    soak = load_soak()
    out = tmp_path / "soak.json"
    code = soak.main(["--steps", "5000", "--modes", "check,strict", "--throughput-steps", "20", "--repeats", "1",
                      "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"]
    for r in report["reports"]:
        assert r["steps"] == 5000 and r["bad_calls"] == 100 and r["bad_rejected_unchanged"] == 100
        assert r["backend_failures"] >= 25 and r["retries"] == r["backend_failures"]
        assert r["outputs_match"] and r["pool_matches"]
        assert r["rss_mib"][-1] - r["rss_mib"][len(r["rss_mib"]) // 4] < 32  # flat after warm-up
    faults = set(report["reports"][1]["by_fault"])
    assert faults & set(soak.VALUE_FAULTS), "strict mode must also get value faults"
    assert not set(report["reports"][0]["by_fault"]) & set(soak.VALUE_FAULTS)
    assert "soak-flaky" not in kc.packed_decode.table.registry
