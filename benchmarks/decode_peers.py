"""Peer KDA packed-decode kernels for benchmarks/decode.py: sglang's Helion and Triton kernels and
flash-linear-attention's in-place Triton kernel, each wrapped as ``bind(inputs) -> launch(indices)``.

None of this code is ours to ship: the peers are imported from wherever they are installed. sglang's
kernels are not on the device image; ``benchmarks/fetch_peers.sh DEST`` (see docs/kernels.md) puts
just those two kernels in a git-ignored DEST, which the benchmark finds on ``PYTHONPATH``.
Missing peers are reported and skipped.

Example::

    peers, missing = load_peers()
    launch = peers["sglang-helion"](inputs)   # inputs: dict from decode.device_inputs
    launch(indices)                            # one decode step over those slots
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Launch = Callable[[torch.Tensor], None]
Binder = Callable[[dict[str, Any]], Launch]


def _packed(fn: Callable[..., Any]) -> Binder:
    """A peer with sglang's packed signature (no bounds or layout options: VK, valid indices)."""

    def bind(x: dict[str, Any]) -> Launch:
        def launch(indices: torch.Tensor) -> None:
            fn(x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["scale"], x["state"], x["out"], indices,
               use_qk_l2norm_in_kernel=True, lower_bound=None)

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


def load_peers() -> tuple[dict[str, Binder], dict[str, str]]:
    """The peers importable here (name -> binder) and, for the others, why not."""
    found: dict[str, Binder] = {}
    missing: dict[str, str] = {}
    attempts: dict[str, Callable[[], Binder]] = {
        "sglang-helion": lambda: _packed(
            __import__("sglang.kernels.ops.attention.helion.kda_decode", fromlist=["x"])
            .helion_fused_recurrent_kda_packed_decode),
        "sglang-triton": lambda: _packed(
            __import__("sglang.kernels.ops.attention.fla.fused_recurrent", fromlist=["x"])
            .fused_recurrent_kda_packed_decode),
        "fla-kernel": lambda: _fla_in_place(
            __import__("fla.ops.kda.fused_recurrent", fromlist=["x"]).fused_recurrent_kda_fwd),
    }
    for name, attempt in attempts.items():
        try:
            found[name] = attempt()
        except Exception as exc:  # any import failure: the peer is skipped, the reason reported
            missing[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return found, missing
