"""The main job of the README: `kda-contracts demo`."""

import subprocess
import sys

import kda_contracts as kc
from kda_contracts.__main__ import main
from kda_contracts._app.demo import run_demo


def test_demo_catches_all_six_mistakes_and_runs_the_reference():
    lines: list[str] = []
    assert run_demo(lines.append) == 0
    text = "\n".join(lines)
    assert "6/6 mistakes caught; demo OK" in text
    for kind in ("ShapeError", "DtypeError", "LayoutError"):
        assert f"caught {kind}" in text


def test_demo_shows_one_gdn_mistake_with_its_message_and_fix():
    lines: list[str] = []
    run_demo(lines.append)
    gdn = "\n".join(lines).split("-- GDN packed decode, Qwen3-Next-80B-A3B (H=16, HV=32, K=V=128)", 1)[1]
    assert ("-- GDN: `a` with KDA's shape [B, HV*K]\n   caught ShapeError:\n"
            "   gdn_packed_decode(): 1 contract violation") in gdn
    assert "fix: `a` has KDA's per-key-channel gate shape [B, HV*K] (HV=32, K=128)" in gdn


def test_cli_demo_exits_zero(capsys):
    assert main(["demo"]) == 0
    assert "demo OK" in capsys.readouterr().out


def test_importing_the_package_loads_no_kernel_framework():
    code = ("import sys, kda_contracts; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('triton', 'helion', 'fla')]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert kc.__version__
