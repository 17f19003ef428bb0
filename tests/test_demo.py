"""The main job of the README: `kda-contracts demo`."""

import subprocess
import sys

import kda_contracts as kc
from kda_contracts.__main__ import main
from kda_contracts._app.demo import USER_SOURCE, run_demo


def _demo_text() -> str:
    lines: list[str] = []
    assert run_demo(lines.append) == 0
    return "\n".join(lines)


def test_demo_catches_all_seven_mistakes_and_runs_the_reference():
    text = _demo_text()
    assert text.endswith("7/7 mistakes caught (1 in your function, 5 of KDA's, 1 of GDN's); demo OK")
    for kind in ("ShapeError", "DtypeError", "LayoutError"):
        assert f"caught {kind}" in text


def test_demo_opens_with_the_sizes_it_uses():
    assert _demo_text().startswith(
        "kda-contracts demo: a contract on a function of your own, then the packed-decode ops that ship with the "
        "library\n"
        "  1. your function: attention(q, k, v), B=2, T=5, H=4, D=8 (float32, torch seed 0)\n"
        "  2. KDA packed decode, Kimi-Linear-48B-A3B (KDAConfig.preset('kimi-linear-48b-a3b')): H=HV=32, K=V=128, "
        "fp32 state;\n"
        "     a valid call at B=8, pool N=64; the mistakes at B=4, pool N=8\n"
        "  3. GDN packed decode, Qwen3-Next-80B-A3B (GDNConfig.preset('qwen3-next-80b-a3b')): H=16, HV=32, K=V=128\n"
        "  4. the reference kernel on the valid KDA call\n")


def test_demo_shows_a_user_contract_called_right_and_wrong_with_the_real_message():
    text = _demo_text()
    part = text.split("== 1. A contract on your own function: the annotations are the contract\n", 1)[1]
    part = part.split("\n\n== 2.", 1)[0]
    source = "\n".join("   " + line if line else "" for line in USER_SOURCE.splitlines())
    assert "   @kc.contract\n   def attention(q: Float[Tensor, \"B T H D\"]" in source
    torch_says = "   without the contract, torch fails inside the body: RuntimeError: einsum(): "
    head, tail = part.split(torch_says, 1)
    assert head == source + """

-- a correct call: q, k, v of [2, 5, 4, 8] -> out [2, 5, 4, 8]

-- v kept in [B, H, T, D], the layout F.scaled_dot_product_attention takes: attention(q, k, v.transpose(1, 2))
"""
    assert tail.split("\n", 1)[1] == """\
   with it, the call is rejected before the body runs: ShapeError:
   attention(): 1 contract violation
     [1] v: ShapeError
         expected [B, T, H, D] = [2, 5, 4, 8]
         got      [2, 4, 5, 8]
         dim 1 (T): expected 5 (T from q.shape[1]), got 4
         dim 2 (H): expected 4 (H from q.shape[2]), got 5
     dims: B=2 from q.shape[0]; T=5 from q.shape[1]; H=4 from q.shape[2]; D=8 from q.shape[3]"""


def test_the_user_part_runs_in_check_mode_whatever_the_mode(monkeypatch):
    monkeypatch.setenv("KDA_CONTRACTS_MODE", "off")
    with kc.mode("off"):
        text = _demo_text()
    assert "with it, the call is rejected before the body runs: ShapeError:" in text


def test_demo_shows_one_gdn_mistake_with_its_message_and_fix():
    gdn = _demo_text().split("== 3. GDN packed decode, Qwen3-Next-80B-A3B (H=16, HV=32, K=V=128)", 1)[1]
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
