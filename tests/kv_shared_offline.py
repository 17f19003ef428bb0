"""Compile the shared-memory KV kernel for sm_90 offline (no GPU) and report what ptxas made of it.

Run as a script in a process where the Triton interpreter is off (``TRITON_INTERPRET=0`` before
Triton is imported: under the interpreter Triton's own ``@jit`` helpers, such as the sum a reduction
calls, are interpreted functions a compiled kernel cannot call). Reads a JSON list of cases from
argv[1] (``{"config": DecodeConfig fields, "dtype": "bfloat16", "gdn": bool, "bounded": bool,
"counted": bool}``), compiles each as ``triton_decode._plan_kv_shared`` would launch it (K = V = 128,
H = HV = 32) and prints one JSON object per case: registers, stack and local bytes per thread (from
``cuobjdump -res-usage``), shared memory, the number of ``cp.async`` copies and of barriers in the
PTX, the layout conversions in the Triton GPU IR and its global stores in program order (``"tile"``:
the pool, ``"row"``: the output). ``"triton": true`` compiles the Triton kernel instead, planned as
``triton_decode._plan`` plans the call (``"layout"``: ``"VK"`` or ``"KV"``, default KV).

    TRITON_INTERPRET=0 python tests/kv_shared_offline.py '[{"config": {"block_v": 128, "num_warps": 2,
        "kv_chunk": 16, "kv_shared": true}, "dtype": "bfloat16"}]'
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from kda_kernels import triton_decode, triton_kv_shared
from kda_kernels.triton_configs import DecodeConfig
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

ELEMENT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def compile_case(case: dict) -> dict:
    cfg = DecodeConfig(**case["config"])
    dtype = getattr(torch, case["dtype"])
    gdn, bounded, counted = (bool(case.get(k, False)) for k in ("gdn", "bounded", "counted"))
    h, k, v = 32, 128, 128
    pkey = ((1024, h, h, k, v, 4096), 2 * h * k + h * v, h if gdn else h * k, h, h * k * v, dtype, "KV", gdn, True,
            bounded, counted, 0, cfg, False)
    if case.get("triton"):  # the Triton kernel, planned for this shape as _launch plans it (batch 1024)
        layout = case.get("layout", "KV")
        pkey = (pkey[0], *pkey[1:6], layout, *pkey[7:])
        constexprs, fn = triton_decode._plan(pkey)[1], triton_decode._packed_decode_kernel
        source: type = ASTSource
    else:
        constexprs, fn, source = triton_decode._plan_kv_shared(pkey, cfg)[1], triton_kv_shared.kernel(), GluonASTSource
    names = fn.arg_names
    runtime = ["*bf16", "*bf16", "*bf16", "*fp32", "*fp32", f"*{ELEMENT[case['dtype']]}", "*bf16", "*i32", "*i32",
               "*i64", "*fp64", "i32", "fp32", "fp32", "i32"]  # (... oob counter, watch scratch, host, serial, ...)
    signature = dict(zip(names, runtime, strict=False))  # the runtime arguments come first
    values = {}
    for name, value in zip(names[len(runtime):], constexprs, strict=True):
        signature[name] = "constexpr"
        values[(names.index(name),)] = value
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(9)}
    compiled = triton.compile(source(fn, signature, values, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.num_warps})
    tools = os.path.dirname(triton.knobs.nvidia.ptxas.path)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage!r}")
    registers, stack, local = map(int, found.groups())
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    # the global stores in program order: "tile" (a 2-D store, the pool) or "row" (1-D: the output)
    stores = ["tile" if re.search(r"tensor<\d+x\d+x!tt\.ptr", line) else "row"
              for line in ttgir.splitlines() if re.match(r"\s*tt\.store ", line)]
    return dict(registers=registers, stack=stack, local=local, shared=compiled.metadata.shared,
                cp_async=len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
                barriers=len(re.findall(r"\bbar\.sync\b", ptx)), conversions=ttgir.count("ttg.convert_layout"),
                stores=stores)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("run with TRITON_INTERPRET=0")
    for case in json.loads(sys.argv[1]):
        print(json.dumps(compile_case(case)), flush=True)
