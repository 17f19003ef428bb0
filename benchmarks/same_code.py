"""Whether a measured table still describes the Triton decode kernel, without a GPU: compile the
kernel that ``auto`` launches for every row of a card's sweep (H, state dtype, B; VK layout, K = V =
128, bf16 activations, l2norm on) for that card's architecture, here and at an earlier commit, and
compare the launches (grid, warps, shared memory) and the compiled code (PTX, debug sections and
labels, comments and kernel parameters left out). Nothing is launched: a stand-in Triton driver
names the target, so this runs on a CPU-only machine with the CUDA backend of Triton installed
(``pip install triton``; it ships ptxas).

Identical code in the same launch runs the same instructions on the same card: a table measured
at the earlier commit holds for this one, whatever changed around the kernel (the host path aside:
benchmarks/eager_path.py measures that).

    python benchmarks/same_code.py --against 8d12e1b                # KDA, the H200's table (sm_90)
    python benchmarks/same_code.py --against 57c1638 --op gdn
    python benchmarks/same_code.py --against HEAD~3 --device "NVIDIA H100 80GB HBM3"

Exit status 0 when every row's launch and code are identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATES = ("float32", "bfloat16")
BATCHES = (1, 8, 64, 256, 1024)
HEADS = {"kda": (32, 16, 4), "gdn": (16, 8)}


def dump(op: str, device: str | None, arch: int) -> dict[str, Any]:
    """Compile (never launch) the kernel of each row with the ``kda_kernels`` on ``sys.path``."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class StandIn:  # what JITFunction.run asks of a driver before it compiles
        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", arch, 32)

        def get_device_interface(self) -> Any:
            return torch.cuda

    driver.set_active(StandIn())  # type: ignore[arg-type]
    compiled: list[Any] = []
    run = jit.JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((tuple(grid), kernel))
        return kernel

    jit.JITFunction.run = compile_only  # type: ignore[method-assign]
    import kda_kernels.triton_decode as td

    if device is not None:  # the card's table (pick_config's device), as on that card
        td._device_name = lambda gpu: device  # type: ignore[attr-defined]
    if "_fast_launch" in vars(td):
        td._fast_launch["enabled"] = False
    gdn, rows = op == "gdn", {}
    for H in HEADS[op]:
        HV, K = (2 * H if gdn else H), 128
        for state in STATES:
            for B in BATCHES:
                bf16 = torch.bfloat16
                qkv = torch.zeros(B, 2 * H * K + HV * K, dtype=bf16)
                a = torch.zeros(B, HV if gdn else HV * K, dtype=bf16)
                b = torch.zeros(B, HV, dtype=bf16)
                A_log, dt_bias = torch.zeros(HV), torch.zeros(HV if gdn else HV * K)
                pool = torch.zeros(B + 1, HV, K, K, dtype=getattr(torch, state))
                out, idx = torch.zeros(B, 1, HV, K, dtype=bf16), torch.arange(B, dtype=torch.int32)
                compiled.clear()
                (td.gdn_packed_decode if gdn else td.packed_decode)(
                    qkv, a, b, A_log, dt_bias, K ** -0.5, pool, out, idx, num_heads=H, use_qk_l2norm=True,
                    lower_bound=None)
                grid, kernel = compiled[-1]
                rows[f"H={H} {state} B={B}"] = dict(grid=grid, warps=kernel.metadata.num_warps,
                                                    shared=kernel.metadata.shared, code=_code(kernel.asm["ptx"]))
    return rows


def _code(ptx: str) -> list[str]:
    """The instructions: no debug sections, line records, debug labels, comments or parameters."""
    keep = []
    for line in ptx.split(".section")[0].splitlines():
        line = line.split("//")[0].strip()
        if line and not line.startswith((".loc", ".file")) and ".param" not in line \
                and not re.fullmatch(r"\$L__tmp\d+:", line):
            keep.append(line)
    return keep


def _rows_at(checkout: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """:func:`dump` in a fresh process importing ``kda_kernels`` from ``checkout``."""
    pkgs = scratch / f"pkgs-{checkout.name}"
    pkgs.mkdir()
    (pkgs / "kda_kernels").symlink_to(checkout / "kernels")
    out = scratch / f"{checkout.name}.json"
    cmd = [sys.executable, __file__, "--dump", str(out), "--op", args.op, "--arch", str(args.arch)]
    if args.device:
        cmd += ["--device", args.device]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkgs), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, env=env, cwd=scratch)
    rows: dict[str, Any] = json.loads(out.read_text())
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", help="the commit whose kernel was measured (git rev)")
    p.add_argument("--op", choices=sorted(HEADS), default="kda")
    p.add_argument("--device", help="the card whose table auto reads (its name, as torch gives it); default: "
                                    "the H200's regime table")
    p.add_argument("--arch", type=int, default=90, help="the compute capability compiled for (default: 90, Hopper)")
    p.add_argument("--dump", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump(args.op, args.device, args.arch)))
        return 0
    if not args.against:
        p.error("--against is required")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        then = scratch / "then"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(then), args.against],
                       check=True)
        try:
            old, new = _rows_at(then, args, scratch), _rows_at(ROOT, args, scratch)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(then)], check=False)
    same = 0
    print(f"{args.op}, sm_{args.arch}, {args.device or 'the H200 regime table'}: {args.against} against this checkout")
    for key, was in old.items():
        now = new[key]
        launch = [k for k in ("grid", "warps", "shared") if was[k] != now[k]]
        code = was["code"] == now["code"]
        same += not launch and code
        print(f"  {key:24} launch {'same' if not launch else 'differs in ' + ', '.join(launch):22} "
              f"code {'identical' if code else 'differs'} ({len(now['code'])} lines)")
    print(f"{same} of {len(old)} rows identical")
    return 0 if same == len(old) else 1


if __name__ == "__main__":
    raise SystemExit(main())
