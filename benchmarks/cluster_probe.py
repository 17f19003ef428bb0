"""Can the installed Triton split a KV tile's sums over the CTAs of a cluster? (No GPU needed.)

The KV design left untried by issue 15 (docs/lab-notes.md, "KDA, KV layout") splits a head's
``[K, BV]`` tile over a cluster of programs that add up their partial sums through distributed
shared memory. In Gluon that is a tensor whose layout spreads it over the CTAs of a cluster
(``num_ctas`` > 1, the layout's ``cga_layout``), summed over the split axis, or first converted to a
layout every CTA holds whole. This script compiles both forms for sm_90 offline, a 2-CTA cluster, and
says for each whether it compiled, and to what (``mapa``, ``ld/st.shared::cluster``, a cluster
barrier), or the compiler's error. Each compile runs in its own process: a failed compiler assertion
aborts the process.

    python benchmarks/cluster_probe.py          # Triton 3.6 (the device image's): neither compiles
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

FORMS = {
    "reduce": "the sum over the axis split across the 2 CTAs",
    "convert": "a layout conversion from split across the CTAs to held whole by each, then the sum",
}


def compile_form(form: str) -> dict[str, object]:
    """Compile one form (in this process) and describe the PTX."""
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    @gluon.jit
    def partial_sums(x, y, A: gl.constexpr, B: gl.constexpr, CONVERT: gl.constexpr):
        # a [2 * R, 16] tile: rows split over the two CTAs of the cluster (layout A)
        rows = gl.arange(0, A.size_per_thread[0] * A.threads_per_warp[0] * 2, gl.SliceLayout(1, A))
        cols = gl.arange(0, 16, gl.SliceLayout(0, A))
        t = gl.load(x + gl.expand_dims(rows, 1) * 16 + gl.expand_dims(cols, 0))
        if CONVERT:
            t = gl.convert_layout(t, B)  # every CTA holds the whole tile
            gl.store(y + gl.arange(0, 16, gl.SliceLayout(0, B)), gl.sum(t, axis=0))
        else:
            gl.store(y + cols, gl.sum(t, axis=0))

    split = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0], cga_layout=[[1, 0]])  # row 1 on the other CTA
    whole = gl.BlockedLayout([2, 1], [1, 32], [1, 1], [1, 0], cga_layout=[[0, 0]])  # both rows on each CTA
    signature = {"x": "*fp32", "y": "*fp32", "A": "constexpr", "B": "constexpr", "CONVERT": "constexpr"}
    src = GluonASTSource(partial_sums, signature, {(2,): split, (3,): whole, (4,): form == "convert"}, {})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "num_ctas": 2})
    ptx = compiled.asm["ptx"]
    return {"compiled": True, "mapa": "mapa" in ptx, "shared_cluster": "shared::cluster" in ptx,
            "cluster_barrier": "barrier.cluster" in ptx}


def probe(form: str) -> dict[str, object]:
    """Compile ``form`` in a child process; its outcome, or the compiler's error."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, __file__, "--child", form], capture_output=True, text=True, env=env,
                         timeout=600)
    if run.returncode == 0 and run.stdout.strip():
        return json.loads(run.stdout.strip().splitlines()[-1])
    lines = [line for line in run.stderr.splitlines() if re.search(r"Assertion|error:|Error", line)]
    why = lines[0] if lines else f"exit {run.returncode}"
    return {"compiled": False, "error": why.strip()[:300]}


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(compile_form(sys.argv[2])))
        return 0
    import triton

    print(f"Triton {triton.__version__}, sm_90, a cluster of 2 CTAs:")
    for form, what in FORMS.items():
        print(f"  {form} ({what}): {json.dumps(probe(form))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
