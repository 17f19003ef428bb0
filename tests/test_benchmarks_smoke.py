"""benchmarks/prefill.py on the CPU so it does not rot: ``--smoke`` runs fla's chunk kernels through
the ops and bare, and the token loop, at tiny sizes under the Triton interpreter (nothing here is a
timing; the figures come from a GPU), and without CUDA the plain command says it needs one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "prefill.py"


def _run(*args):
    got = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert got.returncode == 0, got.stderr[-3000:]
    return got.stdout


def test_prefill_smoke_runs_both_ops_direct_and_looped():
    pytest.importorskip("fla.ops.kda")
    out = _run("--smoke", "--host")
    assert "| op | T | seqs | op (ms) | planned (ms) | op ÷ planned (IQR) | bare (ms) |" in out
    assert "command: `python benchmarks/prefill.py --smoke --host`" in out and "card: " in out
    main, host = out.split("Host time per call of the op, in place")
    lines = [ln for ln in main.splitlines() if ln.startswith(("| kda |", "| gdn |"))]
    rows = {ln.split(" | ")[0][2:]: ln.split(" | ") for ln in lines}
    assert sorted(rows) == ["gdn", "kda"]
    for cells in rows.values():
        assert "% (" in cells[5]  # the ratio with its quartiles
        # the op and the direct calls: the same kernel on the same inputs (the op's q/k l2 norm, in its own
        # copy, sums as fla's kernel does under the interpreter)
        assert float(cells[-2]) == 0.0
        assert float(cells[-1].rstrip(" |")) < 1e-5  # against the token loop, in fp32
    assert "| op | T | seqs | call | outside _run | prepare | fla | finish | rest of _run |" in host
    pieces = [[float(x) for x in ln.rstrip(" |").split(" | ")[3:]]
              for ln in host.splitlines() if ln.startswith(("| kda |", "| gdn |"))]
    assert len(pieces) == 2 and all(p[0] > p[3] > 0 and min(p[1:]) > -1.0 for p in pieces)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_prefill_without_cuda_says_so_and_exits_0():
    assert "needs CUDA" in _run()


def test_layer_prefill_smoke_times_both_layers_packed_and_looped():
    """benchmarks/layer_prefill.py at tiny sizes on the CPU: every row of both layers is there."""
    got = subprocess.run([sys.executable, str(SCRIPT.parent / "layer_prefill.py"), "--smoke"], capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert got.returncode == 0, got.stderr[-3000:]
    rows = [ln.split(" | ") for ln in got.stdout.splitlines() if ln.startswith(("| Kimi", "| Qwen"))]
    assert [(r[0][2:], r[1]) for r in rows] == [
        (f"{m} (smoke sizes)", p) for m in ("Kimi-Linear-48B TP1", "Qwen3-Next-80B TP2")
        for p in ("token loop (padded)", "packed", "packed")]
    assert all(float(r[3]) > 0 for r in rows)
