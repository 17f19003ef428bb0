"""The ops benchmarks/decode.py measures, and what differs between them: head ratio, gate width,
our kernels, the oracle, the peers, the report's heading, main peer and summary, the eager call.
KDA's parts are here; GDN's come from decode_gdn.py.

Example::

    op = OPS["gdn"]()
    kernels, missing = op.ours()      # our kernels that load here; why the others do not
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from decode_report import SECTION, summary

import kda_contracts as kc
from kda_contracts.testing import make_decode_call

Kernel = Callable[..., None]  # our kernel interface (kernels/INTERFACE.md)


@dataclass(frozen=True)
class OpBench:
    """What differs between the ops this script measures (KDA here, GDN from decode_gdn.py)."""

    name: str  # --op
    section: str  # its "## " heading in docs/benchmarks.md
    hv_per_h: int  # HV = hv_per_h * H
    gate_per_channel: bool  # a [B, HV*K] and dt_bias [HV*K] (KDA), or a [B, HV] and dt_bias [HV] (GDN)
    heads: str  # default --heads (H)
    ours: Callable[[], tuple[dict[str, Kernel], dict[str, str]]]  # our kernels here; why the others are not
    reference: Callable[[], Kernel]  # the oracle of the check step
    triton_kernel: str  # the kda_kernels.triton_decode function --candidates launches
    peers: tuple[str, ...]  # its peers' names (decode_peers.ATTEMPTS[name])
    main_peer: str  # the peer of the summary and of the "vs" column
    method: str  # op-specific sentence(s) of the method paragraph
    summary: Callable[[list[dict[str, Any]]], list[str]]
    eager: Callable[[torch.device, str], tuple[dict[str, Any], Kernel, Callable[..., Any]]]
    eager_shape: str  # the eager call's shape, in words
    untimed: dict[str, str] = field(default_factory=dict)  # backends checked only, and why


def kda_ours() -> tuple[dict[str, Kernel], dict[str, str]]:
    """Every registered KDA backend that can be graph-captured (not the reference; fla's adapter
    compacts on the host, and fla's kernel is timed as a peer)."""
    found: dict[str, Kernel] = {}
    missing: dict[str, str] = {}
    for name, (ok, why) in kc.adapters.available().items():
        if name in ("torch", "fla"):
            continue
        if ok:
            found[name] = kc.adapters.get(name).load()
        else:
            missing[name] = why
    return found, missing


def kda_reference() -> Kernel:
    from kda_kernels import reference

    return reference.packed_decode


def kda_eager(device: torch.device, ours: str) -> tuple[dict[str, Any], Kernel, Callable[..., Any]]:
    """A Kimi-Linear-48B-A3B TP1 call at B = 1 (H = 32, fp32 state): (call, our kernel, the op)."""
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b")
    return make_decode_call(cfg, 1, 64, device=device), kc.adapters.get(ours).load(), kc.packed_decode


def gdn_bench() -> OpBench:
    import decode_gdn as g

    return OpBench(name="gdn", section=g.SECTION, hv_per_h=g.HV_PER_H, gate_per_channel=False, heads="16,8",
                   ours=g.load_ours, reference=g.reference, triton_kernel="gdn_packed_decode", peers=g.PEERS,
                   main_peer=g.MAIN_PEER, method=g.METHOD, summary=g.summary, eager=g.eager_setup,
                   eager_shape="H = 16, HV = 32", untimed=dict(g.UNTIMED))


KDA = OpBench(name="kda", section=SECTION, hv_per_h=1, gate_per_channel=True, heads="32,16,4", ours=kda_ours,
              reference=kda_reference, triton_kernel="packed_decode",
              peers=("sglang-helion", "sglang-triton", "fla-kernel"), main_peer="sglang-helion", method="HV = H,",
              summary=summary, eager=kda_eager, eager_shape="H = 32")
OPS: dict[str, Callable[[], OpBench]] = {"kda": lambda: KDA, "gdn": gdn_bench}
