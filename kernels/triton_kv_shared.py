"""The KV-layout tile staged whole in shared memory: a Gluon kernel behind the Triton backend.

In the KV layout (``[N, HV, K, V]``, contiguous along V) the delta rule's two sums run over the K
rows, so a program needs a head's whole ``[K, BV]`` tile before it can write any of it. Held in
registers that tile is too large for many programs per SM; read twice (sums, then the update) it
costs a second pass through L2. Here one program per (request, value head, block of ``BV`` V
columns):

1. copies the whole tile global -> shared memory with ``cp.async`` (16-byte vectors), and meanwhile
   reads q, k, v and the gate inputs and puts the per-row vectors (decay, normalized k, and their
   products with k and q) in shared memory;
2. reads the tile from shared memory chunk by chunk (``CK`` rows, the loop unrolled) for the two sums
   ``S·(d*k)`` and ``S·(d*q)``; with several warps, they sit side by side along V and each thread
   sums its products over all chunks before one cross-lane reduction (no cross-warp sums);
3. reads it again from shared memory for the update ``S*d + k u^T`` and stores it to the pool.

The pool is read from DRAM once and written once, like the VK kernel. Measured on the H200 against
the two-pass chunked Triton tile and the VK kernel (docs/lab-notes.md). :func:`DecodeConfig`'s
``kv_shared`` selects it; :func:`unsupported` says when it cannot run (the Triton interpreter has no
Gluon, ``cp.async`` needs sm_80, and the tile must fit the kernel's layout and shared memory).

Gluon (``triton.experimental.gluon``) is imported on first use, never by ``import kda_kernels``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

SHARED_MEMORY_LIMIT = 227 * 1024  # bytes of shared memory a program may use on sm_90 (when no device is named)
# state elements per thread the register tile may hold: 128 compile to 224-242 registers and no spills
# (offline for sm_90, fp32 and bf16, one and two warps), 256 spill (bf16 [128, 64] on one warp: 720 bytes)
REGISTER_TILE_LIMIT = 128


@functools.cache
def _gluon() -> tuple[Any, str | None]:
    """(the Gluon kernel, None), or (None, why it cannot be built)."""
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

        # Triton 3.6 names the cp.async copy async_copy_global_to_shared and the CTA barrier
        # thread_barrier; later releases async_load and barrier
        async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
        barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    except Exception as exc:  # an older Triton, or none
        return None, f"triton.experimental.gluon is not importable as expected ({type(exc).__name__}: {exc})"
    return _build(gluon, gl, cp, async_load, barrier), None


def _build(gluon: Any, gl: Any, cp: Any, async_load: Any, barrier: Any) -> Any:
    @gluon.jit(do_not_specialize=["serial"])
    def kv_shared_kernel(
        qkv, a, b, A_log, dt_bias, state, out, indices, oob_counter, watch_scratch, watch_host, serial, scale,
        lower_bound, N,  # (watch_*, serial: the Triton kernel's watch mode arguments, unused here)
        H: gl.constexpr, HV: gl.constexpr, stride_qkv: gl.constexpr, stride_a: gl.constexpr,
        stride_b: gl.constexpr, stride_state: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
        BV: gl.constexpr, CK: gl.constexpr, USE_L2NORM: gl.constexpr, BOUNDED_GATE: gl.constexpr,
        HAS_COUNTER: gl.constexpr, GATE_STRIDE: gl.constexpr, ROUND_BETA: gl.constexpr,
        LOAD_EVICTION: gl.constexpr, STORE_EVICTION: gl.constexpr, ACT_EVICTION: gl.constexpr,
        WIDE: gl.constexpr, ACC2D: gl.constexpr, L2D: gl.constexpr, L1: gl.constexpr, SMEM: gl.constexpr,
        SMEM1: gl.constexpr, REGS: gl.constexpr,
    ):
        # 1-D grid, request-major, then value head, then V block
        NV: gl.constexpr = V // BV
        pid = gl.program_id(0)
        i_b = pid // (HV * NV)
        i_hv = (pid // NV) % HV
        i_v = pid % NV
        if WIDE:  # activation offsets may pass 2**31 (pool offsets are always int64)
            i_b = i_b.to(gl.int64)
        i_h = i_hv // (HV // H)
        LK: gl.constexpr = gl.SliceLayout(1, L2D)  # along the K rows of a chunk
        LV: gl.constexpr = gl.SliceLayout(0, L2D)  # along the V columns
        o_v = i_v * BV + gl.arange(0, BV, LV)
        slot = gl.load(indices + i_b).to(gl.int64)
        valid = (slot >= 0) & (slot < N)
        o_row = out + (i_b * HV + i_hv) * V
        if valid:
            base = state + slot * stride_state + i_hv * (K * V)
            if REGS:  # the whole tile into registers (L1 is LK here: the K-vectors need no conversion)
                p_t = base + gl.expand_dims(gl.arange(0, K, LK), 1) * V + gl.expand_dims(o_v, 0)
                regs = gl.load(p_t, eviction_policy=LOAD_EVICTION)
            else:
                tile = gl.allocate_shared_memory(state.dtype.element_ty, [K, BV], SMEM)
                for j in gl.static_range(K // CK):
                    o_c = j * CK + gl.arange(0, CK, LK)
                    p_s = base + gl.expand_dims(o_c, 1) * V + gl.expand_dims(o_v, 0)
                    async_load(tile.slice(j * CK, CK), p_s, eviction_policy=LOAD_EVICTION)
                cp.commit_group()
            # while the tile is in flight: the K-vectors of this head
            row = qkv + i_b * stride_qkv
            o_k = gl.arange(0, K, L1)
            b_q = gl.load(row + i_h * K + o_k, eviction_policy=ACT_EVICTION).to(gl.float32)
            b_k = gl.load(row + (H + i_h) * K + o_k, eviction_policy=ACT_EVICTION).to(gl.float32)
            if GATE_STRIDE:  # KDA: a gate per key channel
                b_x = gl.load(a + i_b * stride_a + i_hv * K + o_k, eviction_policy=ACT_EVICTION).to(gl.float32)
                b_x += gl.load(dt_bias + i_hv * K + o_k, eviction_policy=ACT_EVICTION).to(gl.float32)
            else:  # GDN: one per value head
                x0 = gl.load(a + i_b * stride_a + i_hv).to(gl.float32) + gl.load(dt_bias + i_hv).to(gl.float32)
                b_x = gl.zeros([K], gl.float32, L1) + x0
            b_A = gl.exp(gl.load(A_log + i_hv).to(gl.float32))
            b_raw = gl.load(b + i_b * stride_b + i_hv)
            b_beta = 1.0 / (1.0 + gl.exp(-b_raw.to(gl.float32)))
            if ROUND_BETA:
                b_beta = b_beta.to(b_raw.dtype).to(gl.float32)
            if BOUNDED_GATE:
                b_g = lower_bound * (1.0 / (1.0 + gl.exp(-(b_A * b_x))))
            else:  # softplus with torch's threshold: x above 20 is returned as is
                b_g = -b_A * gl.where(b_x > 20.0, b_x, gl.log(1.0 + gl.exp(gl.minimum(b_x, 20.0))))
            r_q = scale
            r_k = 1.0
            if USE_L2NORM:
                r_q = scale / gl.sqrt(gl.sum(b_q * b_q, axis=0) + 1e-6)
                r_k = 1.0 / gl.sqrt(gl.sum(b_k * b_k, axis=0) + 1e-6)
            kq = gl.sum(b_q * b_k, axis=0) * (r_q * r_k)
            b_d = gl.exp(b_g)
            b_kn = b_k * r_k
            if REGS:  # both sums straight from the registers (the K-vectors are in the rows' layout)
                h = regs.to(gl.float32) * gl.expand_dims(b_d, 1)
                acc_k = gl.sum(h * gl.expand_dims(b_kn, 1), axis=0)
                acc_q = gl.sum(h * gl.expand_dims(b_q * r_q, 1), axis=0)
                b_v = gl.load(row + 2 * H * K + i_hv * V + o_v, eviction_policy=ACT_EVICTION).to(gl.float32)
            else:
                v_dk = gl.allocate_shared_memory(gl.float32, [K], SMEM1, b_d * b_kn)
                v_dq = gl.allocate_shared_memory(gl.float32, [K], SMEM1, b_d * (b_q * r_q))
                v_d = gl.allocate_shared_memory(gl.float32, [K], SMEM1, b_d)
                v_k = gl.allocate_shared_memory(gl.float32, [K], SMEM1, b_kn)
                b_v = gl.load(row + 2 * H * K + i_hv * V + o_v, eviction_policy=ACT_EVICTION).to(gl.float32)
                cp.wait_group(0)
                barrier()
                if ACC2D:  # each thread sums its products over every chunk; one cross-lane reduction
                    a2k = gl.zeros([CK, BV], gl.float32, L2D)
                    a2q = gl.zeros([CK, BV], gl.float32, L2D)
                    for j in gl.static_range(K // CK):
                        s = tile.slice(j * CK, CK).load(L2D).to(gl.float32)
                        a2k += s * gl.expand_dims(v_dk.slice(j * CK, CK).load(LK), 1)
                        a2q += s * gl.expand_dims(v_dq.slice(j * CK, CK).load(LK), 1)
                    acc_k = gl.sum(a2k, axis=0)
                    acc_q = gl.sum(a2q, axis=0)
                else:
                    acc_k = gl.zeros([BV], gl.float32, LV)
                    acc_q = gl.zeros([BV], gl.float32, LV)
                    for j in gl.static_range(K // CK):
                        s = tile.slice(j * CK, CK).load(L2D).to(gl.float32)
                        acc_k += gl.sum(s * gl.expand_dims(v_dk.slice(j * CK, CK).load(LK), 1), axis=0)
                        acc_q += gl.sum(s * gl.expand_dims(v_dq.slice(j * CK, CK).load(LK), 1), axis=0)
            b_u = b_beta * (b_v - acc_k)
            if REGS:  # the tile first: its stores need not wait for the output's sum
                h = h + gl.expand_dims(b_kn, 1) * gl.expand_dims(b_u, 0)
                gl.store(p_t, h.to(state.dtype.element_ty), eviction_policy=STORE_EVICTION)
            gl.store(o_row + o_v, (acc_q + b_u * kq).to(out.dtype.element_ty))
            if not REGS:
                for j in gl.static_range(K // CK):
                    o_c = j * CK + gl.arange(0, CK, LK)
                    s = tile.slice(j * CK, CK).load(L2D).to(gl.float32)
                    s = s * gl.expand_dims(v_d.slice(j * CK, CK).load(LK), 1) + \
                        gl.expand_dims(v_k.slice(j * CK, CK).load(LK), 1) * gl.expand_dims(b_u, 0)
                    p_s = base + gl.expand_dims(o_c, 1) * V + gl.expand_dims(o_v, 0)
                    gl.store(p_s, s.to(state.dtype.element_ty), eviction_policy=STORE_EVICTION)
        else:  # padding (< 0) or out of range (>= N): zero output, no pool access
            gl.store(o_row + o_v, gl.zeros([BV], out.dtype.element_ty, LV))
        if HAS_COUNTER:
            if (slot >= N) & (i_hv == 0) & (i_v == 0):
                gl.atomic_add(oob_counter, 1)

    return kv_shared_kernel


def unsupported(head_k_dim: int, head_v_dim: int, state_dtype: torch.dtype, block_v: int, num_warps: int,
                chunk: int, device: torch.device | None = None, slot_stride: int | None = None,
                registers: bool = False) -> str | None:
    """Why the shared-memory KV kernel cannot run this shape here (on ``device``, for a pool whose
    slots are ``slot_stride`` elements apart), or None when it can. The pool's base address must
    also be 16-byte aligned (:func:`misaligned`, per call). ``registers``: the tile held in registers
    (``chunk`` is then K): no shared memory, no ``cp.async``, any alignment."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "the Triton interpreter (TRITON_INTERPRET) does not run Gluon kernels"
    if torch.version.hip is not None:
        return "cp.async and this kernel's layouts are NVIDIA's (a ROCm build of torch)"
    kernel, why = _gluon()
    if kernel is None:
        return why
    vec = 16 // state_dtype.itemsize
    for name, n in (("K", head_k_dim), ("block_v", block_v), ("kv_chunk", chunk), ("num_warps", num_warps)):
        if n < 1 or n & (n - 1):
            return f"{name} = {n} is not a power of two"
    if head_v_dim % block_v:
        return f"V = {head_v_dim} is not a multiple of block_v = {block_v}"
    if head_k_dim % chunk:
        return f"K = {head_k_dim} is not a multiple of kv_chunk = {chunk}"
    if block_v < vec * num_warps:
        return f"block_v = {block_v} is narrower than {num_warps} warps of 16-byte vectors ({vec * num_warps} columns)"
    rows = 32 // _lanes_v(block_v, vec, num_warps)  # K rows one warp's lanes cover in a chunk (see layouts)
    if chunk < rows:
        what = f"K = {chunk}" if registers else f"kv_chunk = {chunk}"
        return f"{what} rows is fewer than a warp's rows of the chunk layout ({rows})"
    if registers:
        held = head_k_dim * block_v // (32 * num_warps)
        if held > REGISTER_TILE_LIMIT:
            return (f"a [{head_k_dim}, {block_v}] tile on {num_warps} warp(s) holds {held} state elements per thread, "
                    f"more than the {REGISTER_TILE_LIMIT} that fit in registers without spilling")
        return None
    if slot_stride is not None and slot_stride * state_dtype.itemsize % 16:
        return (f"the pool's slots are {slot_stride} elements apart, not a multiple of 16 bytes (the tile is "
                "copied in 16-byte vectors)")
    limit = SHARED_MEMORY_LIMIT
    if device is not None and device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 0):
            return "cp.async needs sm_80 or later"
        props = torch.cuda.get_device_properties(device)  # (the opt-in limit is missing from torch's stubs)
        limit = getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block)
    if shared_bytes(head_k_dim, block_v, state_dtype) > limit:
        return f"a [{head_k_dim}, {block_v}] tile needs more than the {limit} bytes of shared memory a program may use"
    return None


def misaligned(state: torch.Tensor) -> str | None:
    """Why this pool cannot go to the kernel (its base address), or None."""
    if state.data_ptr() % 16:
        return "the pool's base address is not 16-byte aligned (the tile is copied in 16-byte vectors)"
    return None


MEASURED_TRITON = ("3.6.",)  # Triton releases the kernel was timed with (the H200 image's)


def auto_unmeasured() -> str | None:
    """Why ``backend="auto"`` should not pick this kernel with the installed Triton, or None.

    Its chunk loops are unrolled (``static_range``): with Triton 3.6 that measured fastest on the
    H200 (the same kernel with plain loops ran 3-12% slower, with the next chunk prefetched in a
    loop 0.3-49% slower). Triton 3.9's compiler holds the unrolled chunks at once (255 registers and 160-384
    bytes of spills per thread, offline for sm_90), and no device here runs 3.9, so with any other
    release ``auto`` keeps the chunked Triton tile and the kernel runs only when a config asks for it.
    """
    import triton

    if triton.__version__.startswith(MEASURED_TRITON):
        return None
    timed = ", ".join(v.rstrip(".") for v in MEASURED_TRITON)
    return f"timed with Triton {timed} only (installed: {triton.__version__})"


def shared_bytes(head_k_dim: int, block_v: int, state_dtype: torch.dtype) -> int:
    """Shared memory of one program: the tile and four fp32 K-vectors."""
    return head_k_dim * block_v * state_dtype.itemsize + 4 * head_k_dim * 4


def layouts(block_v: int, itemsize: int, num_warps: int, head_k_dim: int = 0) -> tuple[Any, Any, Any, Any]:
    """The register layout of a ``[CK, block_v]`` chunk (16-byte vectors along V, warps side by side
    along V), of the K-vectors, and the shared layouts of the tile and of the K-vectors.

    With ``head_k_dim`` (the register tile): the layout of the whole ``[K, block_v]`` tile, each
    lane holding a run of adjacent K rows, and the K-vectors in its row slice, so each lane loads
    the q, k and gate values of its own rows and no value changes lanes before the sums."""
    from triton.experimental.gluon import language as gl

    vec = 16 // itemsize
    lanes_v = _lanes_v(block_v, vec, num_warps)
    rows = max(head_k_dim // (32 // lanes_v), 1)
    chunk = gl.BlockedLayout([rows, vec], [32 // lanes_v, lanes_v], [1, num_warps], [1, 0])
    vectors = gl.SliceLayout(1, chunk) if head_k_dim else gl.BlockedLayout([1], [32], [num_warps], [0])
    return chunk, vectors, gl.SwizzledSharedLayout(1, 1, 1, [1, 0]), gl.SwizzledSharedLayout(1, 1, 1, [0])


def _lanes_v(block_v: int, vec: int, num_warps: int) -> int:
    """A warp's lanes along V in the chunk layout (``vec`` elements each, warps side by side);
    the other ``32 // lanes`` lanes go along K."""
    return min(block_v // (vec * num_warps), 32)


def kernel() -> Any:
    """The Gluon kernel (raises RuntimeError when Gluon is not importable)."""
    k, why = _gluon()
    if k is None:
        raise RuntimeError(why)
    return k
