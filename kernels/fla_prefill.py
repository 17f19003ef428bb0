"""flash-linear-attention's chunk kernels behind the packed-prefill call (peers): ``chunk_kda`` for
KDA, ``chunk_gated_delta_rule`` for GDN (fla-core 0.6.0, ``fla.ops.kda`` / ``fla.ops.gated_delta_rule``).

fla takes q/k/v as ``[1, T, H, K]`` tensors with ``cu_seqlens`` (int64, ``[B+1]``) for varlen input, a dense
initial state of one row per sequence (``[B, HV, K, V]``, or ``[B, HV, V, K]`` with ``state_v_first=True``) and
returns the output and the final states out of place (``output_final_state=True``). This wrapper hands fla the raw
gate logits, as a direct caller of fla would, gathers each sequence's slot (zero where ``has_initial_state`` is
False or the slot is padding), runs the kernel, writes ``out`` in one pass (the padding sequences' rows zero) and
scatters the final states back to the valid slots: one Triton launch before fla's call (q/k/v copied out of
``mixed_qkv``, with the q/k l2 norm and KDA's beta sigmoid on the way) and one after it, every byte moved once
(:mod:`kda_kernels.prefill_slots`). Nothing reads ``cu_seqlens`` on the host (on fla's Triton kernels, see below):
fla's default chunk plan (which 64-token chunk of which sequence each program takes) does, a sync that drains the
device queue on every call; here the plan is built on the device instead, with a row count that follows from the
shapes alone (``ceil(T / 64) + B - 1``, the most chunks ``B`` sequences of ``T`` tokens can have), the rows past the
real chunks left to do nothing. KDA takes it through fla's own fixed-shape plan (``use_graph=True``,
``max_num_seqs=B``: every KDA chunk kernel returns at once on a row whose sequence is ``-1``); GDN through
``chunk_indices`` (:func:`chunk_plan`, whose spare rows name a chunk past the end of sequence 0, which every GDN
chunk kernel masks or returns on, as it does for the tail of a short sequence), on fla's Triton kernels only: where
FlashQLA may take a GDN call, or with fla's intra-card context parallelism on (``FLA_INTRACARD_CP``), fla plans for
itself and reads ``cu_seqlens`` on the host (:func:`gdn_plan_taken`).

What fla-core 0.6.0 computes for us, checked against its source and, under the interpreter, against
the token loop (``tests/test_prefill.py``):

- the gate, fused with the chunk cumsum (``use_gate_in_kernel=True`` with ``A_log``, ``dt_bias``,
  ``lower_bound``): KDA's ``-exp(A_log) * softplus(a + dt_bias)``, softplus ``x`` above 20, or with
  ``lower_bound`` ``lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``; GDN's per-head
  ``-exp(A_log) * softplus(a + dt_bias)``; in fp32 from ``a`` in any dtype, as
  :func:`~kda_kernels.reference.kda_gate` / :func:`~kda_kernels.gdn_reference.gdn_gate`. fla's
  softplus is ``log(1 + exp(x))``, not ``log1p`` (on NVIDIA with the approximate ``ex2``/``lg2``):
  per token ``g`` is within 2 ulp plus ``6e-8 * exp(A_log)`` of ours (measured under the
  interpreter for ``x`` in [-120, 40]), below the fp32 rounding of the cumsum it feeds.
  ``safe_gate`` (another intra-chunk algorithm for bounded gates) stays off.
What the launch before fla's call computes in place of fla (each of these is a launch of its own inside
fla's call, and at T = 4,096 fla's call is host-bound: a launch is host time):

- the copies: fla's forward makes every input contiguous (``input_guard``), so q/k/v, views of
  ``mixed_qkv``, are copied inside any call of it, one launch each;
- the q/k l2norm (fla's ``use_qk_l2norm_in_kernel``, two launches): ``x / sqrt(sum(x^2) + 1e-6)`` per
  head in fp32, rounded once, made in the copy where a head of ``K`` channels fits its tiles (``K`` a
  power of two up to 512, :func:`~kda_kernels.prefill_slots.fuses_l2norm`; else fla's). The same
  formula; the sum's order may differ from fla's kernel, so q and k may differ from a direct call's by
  one rounding step of their dtype;
- KDA's beta (fla's ``use_beta_sigmoid_in_kernel``, one launch): ``sigmoid(b)`` in fp32 with Triton's
  sigmoid, as fla's kernel computes it, bit for bit. GDN's beta is ``sigmoid(b)`` rounded to ``b``'s
  dtype (sglang's rule), which fla's fp32 sigmoid is not: it is ``torch.sigmoid(b)`` here (fp32 inside,
  one rounding), handed over in ``b``'s dtype as a direct caller passes it.

With ``flash_qla`` installed (CUDA), fla hands bf16 GDN calls with K = V = 128 on SM90+ to FlashQLA, which takes
only a precomputed gate: GDN then keeps our torch gate (one fp32 value per token and head) so that FlashQLA still
gets the call (:func:`gdn_gate_in_kernel`; ``FLA_FLASH_QLA=0`` keeps fla's Triton kernels and the fused gate).
Zero-length sequences in ``cu_seqlens`` get no chunk, their final state is their initial one. fla caches what it
derives from ``cu_seqlens`` by the tensor's identity; the int64 copy made here is new each call, so a caller's int32
buffer updated in place never meets a stale plan.

CUDA; also the CPU under the Triton interpreter (``TRITON_INTERPRET=1``, for tests), with two
shims while the kernel runs (:func:`launch_context`): Triton's autotuner benchmarks its configs
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
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from .fla_decode import is_available as _fla_available
from .gdn_reference import gdn_gate

__all__ = ["chunk_plan", "gdn_gate_in_kernel", "gdn_is_available", "gdn_packed_prefill", "gdn_plan",
           "gdn_plan_taken", "is_available", "kda_plan", "launch_context", "packed_prefill"]

def chunk_plan(cu_seqlens: Tensor, T: int) -> Tensor:
    """fla's ``chunk_indices`` for ``cu_seqlens`` made on the device in one launch, without a sync
    (:func:`kda_kernels.prefill_slots.chunk_plan`)."""
    from .prefill_slots import chunk_plan as plan

    return plan(cu_seqlens, T)


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


_NOTHING = contextlib.nullcontext()


def launch_context(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """On CUDA, ``device`` current (fla launches on the current one; nothing to do where it already
    is, the usual case, which costs no context switch); on the CPU (the Triton interpreter) the
    module's two shims, undone afterwards."""
    if device.type == "cuda":
        if device.index is None or device.index == torch.cuda.current_device():
            return _NOTHING
        return torch.cuda.device(device)
    return _interpreter_shims()


@contextlib.contextmanager
def _interpreter_shims() -> Iterator[None]:
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


def gdn_gate_in_kernel(device: torch.device) -> bool:
    """Whether a GDN call on ``device`` hands fla the raw gate (``use_gate_in_kernel=True``): yes, unless
    fla may hand it to FlashQLA (CUDA, ``flash_qla`` installed, ``FLA_FLASH_QLA`` not ``0``, backend
    dispatch on), whose verifier refuses ``use_gate_in_kernel``. Asked once per device and setting."""
    if device.type != "cuda" or os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1":
        return True
    return _flash_qla_absent(device.index, os.environ.get("FLA_FLASH_QLA"))


@functools.lru_cache(maxsize=64)
def _flash_qla_absent(index: int | None, setting: str | None) -> bool:
    try:
        from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend
    except ImportError:
        return True
    return not (FlashQLABackend.is_available() and FlashQLABackend().is_enabled())


def _run(kernel: Callable[..., Any], mixed_qkv: Tensor, g: Tensor, beta: Tensor, scale: float,
         initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
         has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str, gdn: bool,
         beta_logits: bool = False, **fused: Any) -> None:
    """``kernel`` on the call: ``g [T, HV(, K)]`` as fla takes it with the ``fused`` flags (the raw logits
    with ``use_gate_in_kernel``), ``beta [T, HV]`` (the logits with ``beta_logits``: their sigmoid made
    in the launch before fla's call), with a chunk plan made on the device (:func:`kda_plan`, or GDN's
    :func:`chunk_plan` where it is taken)."""
    from .prefill_slots import finish, fuses_l2norm, prepare

    T = mixed_qkv.shape[0]
    HV = initial_state.shape[1]
    V = out.shape[-1]
    K = (mixed_qkv.shape[1] - HV * V) // (2 * num_heads)
    B = ssm_state_indices.shape[0]
    if B == 0:
        out.zero_()
        return
    with launch_context(mixed_qkv.device):
        # one launch: q/k/v copied out of mixed_qkv (fla's input guard would copy each view in a launch of
        # its own), the q/k l2 norm and KDA's beta sigmoid on the way (two and one launches in fla's call),
        # each sequence's slot gathered (zero where it starts fresh or is padding), cu_seqlens as int64 (new
        # each call: what fla caches by identity is never stale) and GDN's chunk plan
        planned = gdn and T > 0 and gdn_plan_taken(mixed_qkv.device)
        norm = use_qk_l2norm and fuses_l2norm(K)
        q, k, v, h0, cu, chunk_indices, sig = prepare(mixed_qkv, num_heads, HV, K, V, initial_state,
                                                      ssm_state_indices, has_initial_state, cu_seqlens, plan=planned,
                                                      l2norm=norm, beta_logits=beta if beta_logits else None)
        if T == 0:  # sequences without tokens: their final state is their initial one (or zero)
            finish(out, None, h0, cu, initial_state, ssm_state_indices)
            return
        if gdn:
            plan = {"chunk_indices": chunk_indices} if planned else {}  # (else fla's own plan, see gdn_plan_taken)
        else:
            plan = kda_plan(cu, T, B)
        o, ht = kernel(q=q, k=k, v=v, g=g.unsqueeze(0), beta=beta.unsqueeze(0) if sig is None else sig, scale=scale,
                       initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm and not norm,
                       state_v_first=state_layout == "VK", cu_seqlens=cu, **plan, **fused)
        # one launch: out (zero for the padding sequences' tokens) and the final states into the valid slots
        finish(out, o, ht, cu, initial_state, ssm_state_indices)


def kda_plan(cu_seqlens: Tensor, T: int, B: int) -> dict[str, Any]:
    """``chunk_kda``'s keywords for its own fixed-shape plan, made on the device (``B`` sequences)."""
    return {"use_graph": True, "max_num_seqs": B}


def gdn_plan(cu_seqlens: Tensor, T: int, B: int) -> dict[str, Any]:
    """``chunk_gated_delta_rule``'s keywords for :func:`chunk_plan` (it has no fixed-shape plan of its own),
    where fla's Triton kernels run the call (:func:`gdn_plan_taken`); none elsewhere (fla's own plan). (The
    backend makes the plan in the launch that prepares the call; this is the plan on its own, one launch.)"""
    return {"chunk_indices": chunk_plan(cu_seqlens, T)} if gdn_plan_taken(cu_seqlens.device) else {}


def gdn_plan_taken(device: torch.device) -> bool:
    """Whether a GDN call on ``device`` runs on fla's Triton chunk kernels, which take :func:`chunk_plan`:
    not where FlashQLA may take it (:func:`gdn_gate_in_kernel`; it plans for itself) nor with fla's
    intra-card context parallelism on (``FLA_INTRACARD_CP``, off by default), which splits long
    sequences with a plan of its own sized from the real chunks, so a spare row would read past the
    states it made. Both read ``cu_seqlens`` on the host."""
    if os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1":
        return True
    return os.environ.get("FLA_INTRACARD_CP", "0") in ("", "0") and gdn_gate_in_kernel(device)


def packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                   initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                   has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, lower_bound: float | None,
                   state_layout: str) -> None:
    """KDA packed prefill on fla's ``chunk_kda`` with its fused gate, beta's sigmoid made before (see the module)."""
    from fla.ops.kda import chunk_kda

    HV = A_log.shape[0]
    g = a.unflatten(-1, (HV, a.shape[-1] // HV))  # [T, HV, K] raw logits, a view
    _run(chunk_kda, mixed_qkv, g, b, scale, initial_state, out, cu_seqlens, ssm_state_indices, has_initial_state,
         num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout, gdn=False,
         beta_logits=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)


def gdn_packed_prefill(mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
                       initial_state: Tensor, out: Tensor, cu_seqlens: Tensor, ssm_state_indices: Tensor,
                       has_initial_state: Tensor, *, num_heads: int, use_qk_l2norm: bool, state_layout: str) -> None:
    """GDN packed prefill on fla's ``chunk_gated_delta_rule``, its fused gate unless FlashQLA may take the
    call (:func:`gdn_gate_in_kernel`); beta rounded to ``b``'s dtype (GDN's rule)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # torch.sigmoid on a half tensor computes in fp32 and rounds once: sigmoid(b.float()).to(b.dtype)
    beta = torch.sigmoid(b)
    fused: dict[str, Any]
    if gdn_gate_in_kernel(mixed_qkv.device):
        g, fused = a, {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias}
    else:
        g, fused = gdn_gate(a, dt_bias, A_log), {}  # [T, HV] fp32, log space
    _run(chunk_gated_delta_rule, mixed_qkv, g, beta, scale, initial_state, out, cu_seqlens, ssm_state_indices,
         has_initial_state, num_heads=num_heads, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
         gdn=True, **fused)
