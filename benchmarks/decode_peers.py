"""Peer packed-decode kernels for benchmarks/decode.py, each wrapped as ``bind(inputs) -> launch(indices)``.
KDA: sglang's Helion and Triton kernels and flash-linear-attention's in-place Triton kernel. GDN:
sglang's Triton packed-decode kernel and fla's ``fused_recurrent_gated_delta_rule``, which has no
in-place, indexed entry in fla-core 0.6.0 (only ``initial_state`` of one slot per request and a
fresh ``final_state``), so its binder gathers the slots, runs it and scatters the result back.

None of this code is ours to ship: the peers are imported from wherever they are installed. sglang's
kernels are not on the device image; ``benchmarks/fetch_peers.sh DEST`` (see docs/kernels.md) puts
just those two kernels in a git-ignored DEST, which the benchmark finds on ``PYTHONPATH``.
Missing peers are reported and skipped.

Example::

    peers, missing = load_peers("kda")        # or "gdn"
    launch = peers["sglang-helion"](inputs)   # inputs: dict from decode.device_inputs
    launch(indices)                            # one decode step over those slots
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Launch = Callable[[torch.Tensor], None]
Binder = Callable[[dict[str, Any]], Launch]


def _packed(fn: Callable[..., Any], **gate: Any) -> Binder:
    """A peer with sglang's packed signature (no bounds or layout options: VK, valid indices);
    ``gate``: KDA's ``lower_bound=None`` (GDN's has no such argument)."""

    def bind(x: dict[str, Any]) -> Launch:
        def launch(indices: torch.Tensor) -> None:
            fn(x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["scale"], x["state"], x["out"], indices,
               use_qk_l2norm_in_kernel=True, **gate)

        return launch

    return bind


def _fla_in_place(fwd: Callable[..., Any]) -> Binder:
    """fla's in-place kernel on q/k/v split out of mixed_qkv once (kernel time only)."""

    def bind(x: dict[str, Any]) -> Launch:
        mq, st, H = x["mixed_qkv"], x["state"], x["H"]
        B, HV, V, K = mq.shape[0], st.shape[1], st.shape[2], st.shape[3]
        q = mq[:, : H * K].reshape(B, 1, H, K).contiguous()
        k = mq[:, H * K : 2 * H * K].reshape(B, 1, H, K).contiguous()
        v = mq[:, 2 * H * K :].reshape(B, 1, HV, V).contiguous()
        g = x["a"].reshape(B, 1, HV, K).contiguous()
        beta = x["b"].reshape(B, 1, HV).contiguous()

        def launch(indices: torch.Tensor) -> None:
            fwd(q=q, k=k, v=v, g=g, beta=beta, A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=st,
                scale=x["scale"], inplace_final_state=True, state_v_first=True, ssm_state_indices=indices,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                lower_bound=None, out=x["out"].view(B, 1, HV, V))

        return launch

    return bind


def _fla_gather(fn: Callable[..., Any]) -> Binder:
    """fla's GDN kernel, out of place: gather the request's slots, run it (gate and beta inputs in
    its kernel), cast and scatter its fp32 final state back, copy its output into ``out``. q/k/v are
    split out of mixed_qkv once and beta = sigmoid(b) rounded to b's dtype (as sglang and our kernels
    use it) is made once, outside the timed launch; fla would otherwise use the unrounded sigmoid."""

    def bind(x: dict[str, Any]) -> Launch:
        mq, st, H = x["mixed_qkv"], x["state"], x["H"]
        B, HV, V, K = mq.shape[0], st.shape[1], st.shape[2], st.shape[3]
        q = mq[:, : H * K].reshape(B, 1, H, K).contiguous()
        k = mq[:, H * K : 2 * H * K].reshape(B, 1, H, K).contiguous()
        v = mq[:, 2 * H * K :].reshape(B, 1, HV, V).contiguous()
        g = x["a"].reshape(B, 1, HV).contiguous()
        beta = torch.sigmoid(x["b"].float()).to(x["b"].dtype).reshape(B, 1, HV)

        def launch(indices: torch.Tensor) -> None:
            o, final = fn(q=q, k=k, v=v, g=g, beta=beta, scale=x["scale"], initial_state=st.index_select(0, indices),
                          output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                          A_log=x["A_log"], dt_bias=x["dt_bias"], state_v_first=True)
            st.index_copy_(0, indices.long(), final.to(st.dtype))
            x["out"].copy_(o.view_as(x["out"]))

        return launch

    return bind


def _module(name: str) -> Any:
    return __import__(name, fromlist=["x"])


SGL_FLA = "sglang.kernels.ops.attention.fla.fused_recurrent"
ATTEMPTS: dict[str, dict[str, Callable[[], Binder]]] = {
    "kda": {
        "sglang-helion": lambda: _packed(_module("sglang.kernels.ops.attention.helion.kda_decode")
                                         .helion_fused_recurrent_kda_packed_decode, lower_bound=None),
        "sglang-triton": lambda: _packed(_module(SGL_FLA).fused_recurrent_kda_packed_decode, lower_bound=None),
        "fla-kernel": lambda: _fla_in_place(_module("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd),
    },
    "gdn": {
        "sglang-triton": lambda: _packed(_module(SGL_FLA).fused_recurrent_gated_delta_rule_packed_decode),
        "fla-oop": lambda: _fla_gather(
            _module("fla.ops.gated_delta_rule.fused_recurrent").fused_recurrent_gated_delta_rule),
    },
}


def load_peers(op: str = "kda") -> tuple[dict[str, Binder], dict[str, str]]:
    """The peers of ``op`` (``"kda"`` or ``"gdn"``) importable here (name -> binder) and, for the
    others, why not."""
    found: dict[str, Binder] = {}
    missing: dict[str, str] = {}
    attempts = ATTEMPTS[op]
    for name, attempt in attempts.items():
        try:
            found[name] = attempt()
        except Exception as exc:  # any import failure: the peer is skipped, the reason reported
            missing[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return found, missing
