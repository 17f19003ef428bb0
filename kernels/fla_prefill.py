"""flash-linear-attention's chunk kernels behind the packed-prefill call (peers): ``chunk_kda`` for
KDA, ``chunk_gated_delta_rule`` for GDN (fla-core 0.6.0, ``fla.ops.kda`` / ``fla.ops.gated_delta_rule``).

fla takes q/k/v as dense ``[1, T, H, K]`` tensors with ``cu_seqlens`` (int64, ``[B+1]``) for varlen
input, a dense initial state of one row per sequence (``[B, HV, K, V]``, or ``[B, HV, V, K]`` with
``state_v_first=True``) and returns the final states out of place (``output_final_state=True``).
This wrapper computes the gate and beta itself (in fp32, as the references do, so the semantics are
ours whatever fla fuses), gathers each sequence's slot (zero where ``has_initial_state`` is False or
the slot is padding), runs the kernel and scatters the final states back to the valid slots, with
no host sync of its own (:class:`~kda_kernels.interface.RowSlots`). fla itself reads ``cu_seqlens``
on the host to plan its chunks.

Checked against fla-core 0.6.0's source: both kernels take ``g`` in natural-log space, already
activated (``use_gate_in_kernel=False``, the default: per channel ``[1, T, HV, K]`` for KDA, per head
``[1, T, HV]`` for GDN; fla multiplies by 1/ln 2 itself), ``beta`` after the sigmoid
(``use_beta_sigmoid_in_kernel=False``), an fp32 initial state (``chunk_kda`` asserts it), GVA with
``HV % H == 0``, and return ``(o [1, T, HV, V] in q's dtype, final_state fp32)``. Zero-length
sequences in ``cu_seqlens`` get no chunk, their final state is their initial one. With
``flash_qla`` installed, fla hands bf16 GDN calls with K = V = 128 on SM90+ to FlashQLA instead of
its Triton kernels (``FLA_FLASH_QLA=0`` turns that off).

CUDA; also the CPU under the Triton interpreter (``TRITON_INTERPRET=1``, for tests), with two
shims while the kernel runs (:func:`_interpreted`): Triton's autotuner benchmarks its configs
through the active GPU driver, of which the interpreter has none ("0 active drivers"), so each
autotuned kernel keeps its first config; and fla's ``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``
calls ``.to(tl.int64)`` on the index of a ``for i_t in range(NT)`` loop, a tensor when compiled but
a Python int under the interpreter, which therefore makes it one (``tl.tensor``) first.

Example::

    from kda_kernels.fla_prefill import is_available, packed_prefill
"""

from __future__ import annotations

import ast
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from .fla_decode import is_available as _fla_available
from .gdn_reference import gdn_gate
from .interface import row_slots, split_qkv
from .prefill_reference import token_sequences
from .reference import kda_gate

__all__ = ["gdn_is_available", "gdn_packed_prefill", "is_available", "launch_context", "packed_prefill"]


def is_available() -> tuple[bool, str]:
    """Whether fla's ``chunk_kda`` can run here, and why not."""
    return _fla_available("fla.ops.kda.chunk")


def gdn_is_available() -> tuple[bool, str]:
    """Whether fla's ``chunk_gated_delta_rule`` can run here, and why not."""
    return _fla_available("fla.ops.gated_delta_rule.chunk")


_SHIMS = threading.Lock()
_LOOP_INDEX: list[Any] = []  # the interpreter's AST transformer with loop indices made tensors, built once


def _loop_index_transformer() -> Any:
    if not _LOOP_INDEX:
        from triton.runtime.interpreter import ASTTransformer

        class LoopIndexAsTensor(ASTTransformer):  # type: ignore[misc]
            """``for i in range(...)``: ``i = interpreter_semantic.to_tensor(i, False)`` first, as compiled."""

            def visit_For(self, node: ast.For) -> ast.For:
                node = self.generic_visit(node)  # type: ignore[assignment]
                it, target = node.iter, node.target
                if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                        and isinstance(target, ast.Name)):
                    sem = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                        ctx=ast.Load())
                    call = ast.Call(func=sem, args=[ast.Name(id=target.id, ctx=ast.Load()), ast.Constant(False)],
                                    keywords=[])
                    node.body.insert(0, ast.copy_location(
                        ast.Assign(targets=[ast.Name(id=target.id, ctx=ast.Store())], value=call), node))
                return node

        _LOOP_INDEX.append(LoopIndexAsTensor())
    return _LOOP_INDEX[0]


@contextlib.contextmanager
def launch_context(device: torch.device) -> Iterator[None]:
    """On CUDA, ``device`` current (fla launches on the current one); on the CPU (the Triton
    interpreter) the module's two shims, undone afterwards."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
        return
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Autotuner

    with _SHIMS:
        prune, rewriter = Autotuner.prune_configs, interpreter.FunctionRewriter.ast_transformer
        Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]  # type: ignore[method-assign]
        interpreter.FunctionRewriter.ast_transformer = _loop_index_transformer()
        try:
            yield
        finally:
            Autotuner.prune_configs = prune  # type: ignore[method-assign]
            interpreter.FunctionRewriter.ast_transformer = rewriter


def _run(kernel: Callable[..., Any], mixed_qkv: Tensor, g: Tensor, beta: Tensor, scale: float,
         initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
         has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str) -> None:
    T = mixed_qkv.shape[0]
    N, HV = initial_state.shape[:2]
    V = out.shape[-1]
    K = (mixed_qkv.shape[1] - HV * V) // (2 * num_heads)
    B = ssm_state_indices.shape[0]
    if B == 0 or T == 0:
        out.zero_()
        if B:  # sequences without tokens: their final state is their initial one
            rows = row_slots(ssm_state_indices, N)
            old = rows.gather(initial_state)
            keep = has_initial_state.view(B, 1, 1, 1)
            rows.scatter(initial_state, torch.where(keep, old, torch.zeros_like(old)), old)
        return
    rows = row_slots(ssm_state_indices, N)
    old = rows.gather(initial_state)  # [B, HV, *, *] in the pool's layout
    start = (rows.valid & has_initial_state).view(B, 1, 1, 1)
    h0 = torch.where(start, old.float(), torch.zeros((), device=old.device)).contiguous()
    q, k, v = (x.unsqueeze(0).contiguous() for x in split_qkv(mixed_qkv, num_heads, HV, K, V))
    with launch_context(mixed_qkv.device):
        o, ht = kernel(q=q, k=k, v=v, g=g.unsqueeze(0).contiguous(), beta=beta.unsqueeze(0).contiguous(),
                       scale=scale, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm,
                       state_v_first=state_layout == "VK", cu_seqlens=cu_seqlens.long())
    live = rows.valid.index_select(0, token_sequences(cu_seqlens, T)).view(T, 1, 1)
    out.copy_(o[0].masked_fill(~live, 0.0))
    rows.scatter(initial_state, ht, old)


def packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                   initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                   has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
                   state_layout: str) -> None:
    """KDA packed prefill on fla's ``chunk_kda`` (the reference's arguments; see the module)."""
    from fla.ops.kda import chunk_kda

    HV = A_log.shape[0]
    g = kda_gate(a, dt_bias, A_log, lower_bound)  # [T, HV, K] fp32, log space
    beta = torch.sigmoid(b.float()).view(-1, HV)
    _run(chunk_kda, mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state,
         num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)


def gdn_packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                       initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                       has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str) -> None:
    """GDN packed prefill on fla's ``chunk_gated_delta_rule``; beta rounded to ``b``'s dtype (GDN's rule)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    g = gdn_gate(a, dt_bias, A_log)  # [T, HV] fp32
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    _run(chunk_gated_delta_rule, mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices,
         has_initial_state, num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)
