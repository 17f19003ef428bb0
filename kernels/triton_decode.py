"""Triton backend for the KDA packed decode (one token per request, state updated in place).

The state read and write is ~99% of the traffic (``2*HV*V*K*state_bytes`` per request), so the
kernel is shaped for bandwidth: one program per (request, value head, tile of ``BV`` state rows),
each loading a ``[BV, K]`` tile of the slot (contiguous along K in the VK layout: coalesced), the
q/k/v/gate vectors of its head, doing the whole delta-rule step in registers and writing the tile
back. Gates and the q/k l2 norms are recomputed by every V tile of a head: they are K-long vectors,
which is cheap next to a ``BV*K`` tile. Programs are one warp (every reduction stays in
shuffles) over a few KB of state; :func:`pick_config` (``triton_configs.py``) holds the shapes
measured on an H200, and per card (the pool's GPU, by name) the rows measured differently on it.
On the H200, at B=256, H=HV=32, K=V=128 (cold L2), a call took 264.8 µs with fp32 state and 136.2 µs
with bf16 state (4.10 and 4.02 TB/s against 4.27 TB/s for a device-to-device copy), level with or
ahead of sglang's Helion kernel in the same run (docs/benchmarks.md).

Memory safety does not depend on validation: an index < 0 (padding) or >= N (out of range) zeroes
the output row and touches no pool byte; pool addresses are computed in int64.

Eager calls after the first of each specialization skip Triton's Python-side dispatch and launch
the cached compiled kernel directly (see "eager launch" below; ``KDA_TRITON_FAST_LAUNCH=0`` turns
that off).

Example::

    from kda_kernels.triton_decode import is_available, packed_decode
    ok, why = is_available()
    if ok:
        packed_decode(mixed_qkv, a, b, A_log, dt_bias, K ** -0.5, state, out, indices,
                      num_heads=H, use_qk_l2norm=True, lower_bound=None)
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

from .interface import DecodeArgs, DecodeBackend
from .triton_configs import DecodeConfig, pick_config, picked_configs

try:
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except ImportError as exc:  # the module stays importable so is_available() can say why
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    _TRITON_IMPORT_ERROR = f"triton is not installed ({exc})"

__all__ = ["DecodeConfig", "gdn_packed_decode", "is_available", "packed_decode", "pick_config", "picked_configs"]


def is_available() -> tuple[bool, str]:
    """Whether this backend can run here, and why not.

    Example::

        ok, why = is_available()   # (False, "no CUDA device and TRITON_INTERPRET is not set")
    """
    if _TRITON_IMPORT_ERROR is not None:
        return False, _TRITON_IMPORT_ERROR
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True, "triton interpreter (TRITON_INTERPRET is set)"
    if not torch.cuda.is_available():
        return False, "no CUDA device and TRITON_INTERPRET is not set"
    return True, f"triton {triton.__version__} on {torch.cuda.get_device_name()}"


if triton is not None:

    @triton.jit
    def _packed_decode_kernel(
        qkv,  # [B, 2*H*K + HV*V]
        a,  # [B, HV*K]
        b,  # [B, HV]
        A_log,  # [HV]
        dt_bias,  # [HV*K]
        state,  # [N, HV, V, K] (VK) or [N, HV, K, V] (KV); inner dims contiguous
        out,  # [B, 1, HV, V] contiguous
        indices,  # [B]
        oob_counter,  # int32 [1] (only touched when HAS_COUNTER)
        scale,
        lower_bound,
        N,
        # Head counts and strides are compile-time constants (a model has one set of each): index
        # arithmetic folds into immediates, divisions by HV or H become multiplies.
        H: tl.constexpr,
        HV: tl.constexpr,
        stride_qkv: tl.constexpr,
        stride_a: tl.constexpr,
        stride_b: tl.constexpr,
        stride_state: tl.constexpr,
        K: tl.constexpr,
        V: tl.constexpr,
        BK: tl.constexpr,
        BV: tl.constexpr,
        STATE_KV: tl.constexpr,
        USE_L2NORM: tl.constexpr,
        BOUNDED_GATE: tl.constexpr,
        HAS_COUNTER: tl.constexpr,
        TILES: tl.constexpr,
        STAGES: tl.constexpr,
        STATE_EVICTION: tl.constexpr,
        MASK_GUARD: tl.constexpr,
        LOAD_CACHE: tl.constexpr,
        STORE_CACHE: tl.constexpr,
        GRID: tl.constexpr,
        WIDE: tl.constexpr,
        ACT_EVICTION: tl.constexpr,
        STORE_EVICTION: tl.constexpr,
        MASK_ROWS: tl.constexpr,
        MASK_K: tl.constexpr,
        KV_CHUNK: tl.constexpr,
        V_EVICTION: tl.constexpr,
        GATE_STRIDE: tl.constexpr,  # 1: KDA, a gate per key channel; 0: GDN, one per value head
        ROUND_BETA: tl.constexpr,  # round sigmoid(b) to b's dtype before use (GDN, as sglang does)
        KV_FIRST_EVICTION: tl.constexpr,  # chunked KV tile: hint of the first pass's loads
        FUSED_OUTPUT: tl.constexpr,  # the output from the decayed tile: sum(h q) + u (k . q)
        EARLY_LOAD: tl.constexpr,  # one tile, its state load issued before the gate and norm math
    ):
        # GRID 0: 1-D, request-major, then value head, then group of V tiles (a request's programs
        # are adjacent, and the grid has no 65535 limit on B). 1: 3-D (V group, head, request).
        # 2: 3-D (head, V group, request).
        NG: tl.constexpr = (V + BV * TILES - 1) // (BV * TILES)
        if GRID == 0:
            pid = tl.program_id(0)
            i_b = pid // (HV * NG)
            i_hv = (pid // NG) % HV
            i_v0 = (pid % NG) * TILES
        elif GRID == 3:  # groups of 16 heads fastest, then V group, then head group
            pid = tl.program_id(0)
            i_b = pid // (HV * NG)
            r = pid % (HV * NG)
            i_hv = (r // (16 * NG)) * 16 + r % 16
            i_v0 = ((r % (16 * NG)) // 16) * TILES
        elif GRID == 1:
            i_v0 = tl.program_id(0) * TILES
            i_hv = tl.program_id(1)
            i_b = tl.program_id(2)
        else:
            i_hv = tl.program_id(0)
            i_v0 = tl.program_id(1) * TILES
            i_b = tl.program_id(2)
        if WIDE:  # activation offsets may pass 2**31 (the host decides; pool offsets are always int64)
            i_b = i_b.to(tl.int64)
        i_h = i_hv // (HV // H)

        o_k = tl.arange(0, BK)
        mask_k = o_k < K

        # The activation loads do not depend on the slot: issue them before the branch so their
        # latency overlaps the index load (they stay inside the activation tensors for any index).
        slot = tl.load(indices + i_b).to(tl.int64)
        valid = (slot >= 0) & (slot < N)
        row = qkv + i_b * stride_qkv
        ev: tl.constexpr = ACT_EVICTION
        b_q = tl.load(row + i_h * K + o_k, mask=mask_k, other=0.0, eviction_policy=ev).to(tl.float32)
        b_k = tl.load(row + (H + i_h) * K + o_k, mask=mask_k, other=0.0, eviction_policy=ev).to(tl.float32)
        # KDA's gate is a K-vector per value head; GDN's one scalar, read by every lane (GATE_STRIDE
        # 0), so the rest of the kernel sees a K-vector of equal decays either way.
        x_row = a + i_b * stride_a + i_hv * (K if GATE_STRIDE else 1)
        bias_row = dt_bias + i_hv * (K if GATE_STRIDE else 1)
        if GATE_STRIDE:
            b_x = tl.load(x_row + o_k, mask=mask_k, other=0.0, eviction_policy=ev).to(tl.float32)
            b_x += tl.load(bias_row + o_k, mask=mask_k, other=0.0, eviction_policy=ev).to(tl.float32)
        else:  # two scalar loads, broadcast (a K-wide load of one address was ~20% slower with bf16 state)
            x0 = tl.load(x_row, eviction_policy=ev).to(tl.float32) + tl.load(bias_row, eviction_policy=ev)
            b_x = tl.zeros([BK], dtype=tl.float32) + x0
        b_A = tl.exp(tl.load(A_log + i_hv, eviction_policy=ev).to(tl.float32))
        b_b = tl.load(b + i_b * stride_b + i_hv, eviction_policy=ev)
        b_beta = tl.sigmoid(b_b.to(tl.float32))
        if ROUND_BETA:
            b_beta = b_beta.to(b_b.dtype).to(tl.float32)
        if MASK_GUARD:
            # No branch: the pool is addressed through slot 0 and every pool access is masked off
            # unless the index is valid (a masked-off lane touches no memory).
            _decode_tiles(
                state + tl.where(valid, slot, 0) * stride_state + i_hv * (V * K), tl.where(valid, V, 0),
                row + 2 * H * K + i_hv * V, out + (i_b * HV + i_hv) * V, i_v0,
                b_q, b_k, b_x, b_A, b_beta, scale, lower_bound, o_k, mask_k,
                K, V, BV, STATE_KV, USE_L2NORM, BOUNDED_GATE, TILES, STAGES, STATE_EVICTION,
                LOAD_CACHE, STORE_CACHE, ACT_EVICTION, STORE_EVICTION, MASK_ROWS, MASK_K,
                row + i_h * K, row + (H + i_h) * K, x_row, bias_row, KV_CHUNK, V_EVICTION, GATE_STRIDE,
                KV_FIRST_EVICTION, FUSED_OUTPUT, EARLY_LOAD,
            )
        else:
            if valid:
                _decode_tiles(
                    state + slot * stride_state + i_hv * (V * K), V,
                    row + 2 * H * K + i_hv * V, out + (i_b * HV + i_hv) * V, i_v0,
                    b_q, b_k, b_x, b_A, b_beta, scale, lower_bound, o_k, mask_k,
                    K, V, BV, STATE_KV, USE_L2NORM, BOUNDED_GATE, TILES, STAGES, STATE_EVICTION,
                    LOAD_CACHE, STORE_CACHE, ACT_EVICTION, STORE_EVICTION, MASK_ROWS, MASK_K,
                    row + i_h * K, row + (H + i_h) * K, x_row, bias_row, KV_CHUNK, V_EVICTION, GATE_STRIDE,
                    KV_FIRST_EVICTION, FUSED_OUTPUT, EARLY_LOAD,
                )
            else:
                # padding (< 0) or out of range (>= N): zero output, no pool access
                for t in tl.range(0, TILES):
                    o_v = (i_v0 + t) * BV + tl.arange(0, BV)
                    tl.store(
                        out + (i_b * HV + i_hv) * V + o_v,
                        tl.zeros([BV], dtype=out.dtype.element_ty),
                        mask=o_v < V,
                    )
        if HAS_COUNTER:
            if (slot >= N) & (i_hv == 0) & (i_v0 == 0):
                tl.atomic_add(oob_counter, 1)

    @triton.jit
    def _decode_tiles(
        base,  # the slot's head: state + slot * stride_state + i_hv * V * K
        v_limit,  # V when the index is in range, else 0: pool rows at or past it are masked off
        v_row,  # this head's v in mixed_qkv
        o_row,  # this head's output row
        i_v0,
        b_q,
        b_k,
        b_x,
        b_A,
        b_beta,
        scale,
        lower_bound,
        o_k,
        mask_k,
        K: tl.constexpr,
        V: tl.constexpr,
        BV: tl.constexpr,
        STATE_KV: tl.constexpr,
        USE_L2NORM: tl.constexpr,
        BOUNDED_GATE: tl.constexpr,
        TILES: tl.constexpr,
        STAGES: tl.constexpr,
        STATE_EVICTION: tl.constexpr,
        LOAD_CACHE: tl.constexpr,
        STORE_CACHE: tl.constexpr,
        ACT_EVICTION: tl.constexpr,
        STORE_EVICTION: tl.constexpr,
        MASK_ROWS: tl.constexpr,
        MASK_K: tl.constexpr,
        q_row,  # this head's q, k, gate input and gate bias (read again per chunk when KV_CHUNK > 0)
        k_row,
        x_row,
        bias_row,
        KV_CHUNK: tl.constexpr,
        V_EVICTION: tl.constexpr,  # hint of the v loads (each v element is read by one program)
        GATE_STRIDE: tl.constexpr,
        KV_FIRST_EVICTION: tl.constexpr,  # hint of the chunked KV tile's first-pass loads
        FUSED_OUTPUT: tl.constexpr,
        EARLY_LOAD: tl.constexpr,  # (TILES == 1)
    ):
        if KV_CHUNK > 0:
            # KV in two passes over chunks of KV_CHUNK state rows (K): the full-width V tile gives
            # whole-line reads, and no [K, BV] tile is ever held in registers.
            r_q = scale
            r_k = 1.0
            if USE_L2NORM:
                r_q = scale / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
                r_k = 1.0 / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            _kv_chunks(
                base, v_limit, q_row, k_row, x_row, bias_row, v_row, o_row, i_v0, r_q, r_k,
                tl.sum(b_q * b_k) * (r_q * r_k), b_A, b_beta, lower_bound, K, V, BV, KV_CHUNK, BOUNDED_GATE,
                STATE_EVICTION, STORE_EVICTION, ACT_EVICTION, V_EVICTION, MASK_ROWS, MASK_K, GATE_STRIDE,
                KV_FIRST_EVICTION,
            )
            return
        if EARLY_LOAD:
            # the state load goes out as soon as the slot is known, so its latency overlaps the
            # activation loads' and the gate and norm math instead of following them
            b_s, b_v = _load_tile(base, v_limit, v_row, i_v0, o_k, mask_k, K, V, BV, STATE_KV,
                                  STATE_EVICTION, LOAD_CACHE, V_EVICTION, MASK_ROWS, MASK_K)
            b_q, b_k, b_decay, kq = _tile_vectors(b_q, b_k, b_x, b_A, scale, lower_bound, USE_L2NORM,
                                                  BOUNDED_GATE, FUSED_OUTPUT)
            _update_tile(b_s, b_v, base, v_limit, o_row, i_v0, b_q, b_k, b_decay, b_beta, o_k,
                         mask_k, K, V, BV, STATE_KV, STORE_CACHE, STORE_EVICTION, MASK_ROWS, MASK_K,
                         FUSED_OUTPUT, kq)
        else:
            b_q, b_k, b_decay, kq = _tile_vectors(b_q, b_k, b_x, b_A, scale, lower_bound, USE_L2NORM,
                                                  BOUNDED_GATE, FUSED_OUTPUT)
            for t in tl.range(0, TILES, num_stages=STAGES):
                b_s, b_v = _load_tile(base, v_limit, v_row, i_v0 + t, o_k, mask_k, K, V, BV, STATE_KV,
                                      STATE_EVICTION, LOAD_CACHE, V_EVICTION, MASK_ROWS, MASK_K)
                _update_tile(b_s, b_v, base, v_limit, o_row, i_v0 + t, b_q, b_k, b_decay, b_beta, o_k,
                             mask_k, K, V, BV, STATE_KV, STORE_CACHE, STORE_EVICTION, MASK_ROWS, MASK_K,
                             FUSED_OUTPUT, kq)

    @triton.jit
    def _tile_vectors(b_q, b_k, b_x, b_A, scale, lower_bound, USE_L2NORM: tl.constexpr,
                      BOUNDED_GATE: tl.constexpr, FUSED_OUTPUT: tl.constexpr):
        """Normalized, scaled q; normalized k; the decay; and k . q when FUSED_OUTPUT (else 0)."""
        if BOUNDED_GATE:
            b_g = lower_bound * tl.sigmoid(b_A * b_x)
        else:
            # softplus with torch's threshold: x above 20 is returned as is
            b_g = -b_A * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
        if USE_L2NORM:  # one scalar reciprocal per vector, then multiplies
            b_q = b_q * (1.0 / tl.sqrt(tl.sum(b_q * b_q) + 1e-6))
            b_k = b_k * (1.0 / tl.sqrt(tl.sum(b_k * b_k) + 1e-6))
        b_q = b_q * scale
        kq = 0.0
        if FUSED_OUTPUT:
            kq = tl.sum(b_q * b_k)
        return b_q, b_k, tl.exp(b_g), kq

    @triton.jit
    def _chunk_vectors(q_row, k_row, x_row, bias_row, o_c, mask_c, r_q, r_k, b_A, lower_bound,
                       BOUNDED_GATE: tl.constexpr, ACT_EVICTION: tl.constexpr, GATE_STRIDE: tl.constexpr):
        """Decay, normalized k and normalized, scaled q on the K rows ``o_c`` of a chunk."""
        ev: tl.constexpr = ACT_EVICTION
        if GATE_STRIDE:
            b_x = tl.load(x_row + o_c, mask=mask_c, other=0.0, eviction_policy=ev).to(tl.float32)
            b_x += tl.load(bias_row + o_c, mask=mask_c, other=0.0, eviction_policy=ev).to(tl.float32)
        else:  # GDN: one gate per value head
            x0 = tl.load(x_row, eviction_policy=ev).to(tl.float32) + tl.load(bias_row, eviction_policy=ev)
            b_x = tl.zeros(o_c.shape, dtype=tl.float32) + x0
        if BOUNDED_GATE:
            b_g = lower_bound * tl.sigmoid(b_A * b_x)
        else:
            b_g = -b_A * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
        b_k = tl.load(k_row + o_c, mask=mask_c, other=0.0, eviction_policy=ev).to(tl.float32) * r_k
        b_q = tl.load(q_row + o_c, mask=mask_c, other=0.0, eviction_policy=ev).to(tl.float32) * r_q
        return tl.exp(b_g), b_k, b_q

    @triton.jit
    def _kv_chunks(base, v_limit, q_row, k_row, x_row, bias_row, v_row, o_row, i_v, r_q, r_k, kq, b_A, b_beta,
                   lower_bound, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, CK: tl.constexpr,
                   BOUNDED_GATE: tl.constexpr, STATE_EVICTION: tl.constexpr, STORE_EVICTION: tl.constexpr,
                   ACT_EVICTION: tl.constexpr, V_EVICTION: tl.constexpr, MASK_ROWS: tl.constexpr,
                   MASK_K: tl.constexpr, GATE_STRIDE: tl.constexpr, FIRST_EVICTION: tl.constexpr):
        """One KV tile ``[K, BV]`` in chunks of CK rows. With the stored tile S and the decay d:
        S·(d*k) and S·(d*q) in a first pass, then u = beta (v - S·(d*k)) and o = S·(d*q) + u (k·q);
        a second pass reads each chunk again (from L2) and writes S*d + k u^T."""
        o_v = i_v * BV + tl.arange(0, BV)
        mask_v = o_v < v_limit
        acc_k = tl.zeros([BV], dtype=tl.float32)
        acc_q = tl.zeros([BV], dtype=tl.float32)
        for j in tl.static_range((K + CK - 1) // CK):
            o_c = j * CK + tl.arange(0, CK)
            mask_c = o_c < K
            p_s = base + o_c[:, None] * V + o_v[None, :]
            if MASK_ROWS or MASK_K:
                b_s = tl.load(p_s, mask=mask_c[:, None] & mask_v[None, :], other=0.0, eviction_policy=FIRST_EVICTION)
            else:
                b_s = tl.load(p_s, eviction_policy=FIRST_EVICTION)
            b_s = b_s.to(tl.float32)
            b_d, b_k, b_q = _chunk_vectors(q_row, k_row, x_row, bias_row, o_c, mask_c, r_q, r_k, b_A, lower_bound,
                                           BOUNDED_GATE, ACT_EVICTION, GATE_STRIDE)
            acc_k += tl.sum(b_s * (b_d * b_k)[:, None], axis=0)
            acc_q += tl.sum(b_s * (b_d * b_q)[:, None], axis=0)
        b_v = tl.load(v_row + o_v, mask=o_v < V, other=0.0, eviction_policy=V_EVICTION).to(tl.float32)
        b_u = b_beta * (b_v - acc_k)
        b_o = tl.where(mask_v, acc_q + b_u * kq, 0.0)
        tl.store(o_row + o_v, b_o.to(o_row.dtype.element_ty), mask=o_v < V)
        for j in tl.static_range((K + CK - 1) // CK):
            o_c = j * CK + tl.arange(0, CK)
            mask_c = o_c < K
            p_s = base + o_c[:, None] * V + o_v[None, :]
            mask_s = mask_c[:, None] & mask_v[None, :]
            if MASK_ROWS or MASK_K:
                b_s = tl.load(p_s, mask=mask_s, other=0.0, eviction_policy=STATE_EVICTION).to(tl.float32)
            else:
                b_s = tl.load(p_s, eviction_policy=STATE_EVICTION).to(tl.float32)
            b_d, b_k, b_q = _chunk_vectors(q_row, k_row, x_row, bias_row, o_c, mask_c, r_q, r_k, b_A, lower_bound,
                                           BOUNDED_GATE, ACT_EVICTION, GATE_STRIDE)
            b_s = b_s * b_d[:, None] + b_k[:, None] * b_u[None, :]
            if MASK_ROWS or MASK_K:
                tl.store(p_s, b_s.to(base.dtype.element_ty), mask=mask_s, eviction_policy=STORE_EVICTION)
            else:
                tl.store(p_s, b_s.to(base.dtype.element_ty), eviction_policy=STORE_EVICTION)

    @triton.jit
    def _tile_ptrs(base, i_v, o_k, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, STATE_KV: tl.constexpr):
        """Pointers of state tile ``i_v`` (``[BV, K]``: rows along V) and its row offsets."""
        o_v = i_v * BV + tl.arange(0, BV)
        if STATE_KV:
            p_s = base + o_k[None, :] * V + o_v[:, None]
        else:
            p_s = base + o_v[:, None] * K + o_k[None, :]
        return p_s, o_v

    @triton.jit
    def _tile_mask(o_v, v_limit, mask_k, MASK_ROWS: tl.constexpr, MASK_K: tl.constexpr):
        """Which lanes of a tile may touch the pool (only built when MASK_ROWS or MASK_K)."""
        if MASK_ROWS and MASK_K:
            mask_s = (o_v < v_limit)[:, None] & mask_k[None, :]
        elif MASK_ROWS:
            mask_s = (o_v < v_limit)[:, None] & (mask_k | True)[None, :]
        else:
            mask_s = (o_v >= 0)[:, None] & mask_k[None, :]
        return mask_s

    @triton.jit
    def _load_tile(base, v_limit, v_row, i_v, o_k, mask_k, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   STATE_KV: tl.constexpr, STATE_EVICTION: tl.constexpr, LOAD_CACHE: tl.constexpr,
                   V_EVICTION: tl.constexpr, MASK_ROWS: tl.constexpr, MASK_K: tl.constexpr):
        """State tile ``i_v`` in its stored dtype (converted where it is used) and its v values."""
        p_s, o_v = _tile_ptrs(base, i_v, o_k, K, V, BV, STATE_KV)
        mask_s = None
        other = None
        if MASK_ROWS or MASK_K:
            mask_s = _tile_mask(o_v, v_limit, mask_k, MASK_ROWS, MASK_K)
            other = 0.0
        # The state is streamed once: do not let it push the activations out of L2.
        if LOAD_CACHE == "":
            b_s = tl.load(p_s, mask=mask_s, other=other, eviction_policy=STATE_EVICTION)
        else:  # a cache modifier (".cg": L2 only) cannot be combined with an eviction hint
            b_s = tl.load(p_s, mask=mask_s, other=other, cache_modifier=LOAD_CACHE)
        if MASK_ROWS or MASK_K:
            b_v = tl.load(v_row + o_v, mask=o_v < V, other=0.0, eviction_policy=V_EVICTION)
        else:
            b_v = tl.load(v_row + o_v, eviction_policy=V_EVICTION)
        return b_s, b_v

    @triton.jit
    def _update_tile(b_s, b_v, base, v_limit, o_row, i_v, b_q, b_k, b_decay, b_beta, o_k, mask_k,
                     K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, STATE_KV: tl.constexpr,
                     STORE_CACHE: tl.constexpr, STORE_EVICTION: tl.constexpr, MASK_ROWS: tl.constexpr,
                     MASK_K: tl.constexpr, FUSED_OUTPUT: tl.constexpr, kq):
        """The delta-rule step on one loaded tile: its output rows and the updated tile are stored.
        FUSED_OUTPUT: the output rows from the decayed tile, ``h q + u (k . q)`` with ``kq = k . q``,
        so both sums read the loaded tile side by side instead of the second waiting for the update."""
        p_s, o_v = _tile_ptrs(base, i_v, o_k, K, V, BV, STATE_KV)
        mask_s = None
        if MASK_ROWS or MASK_K:
            mask_s = _tile_mask(o_v, v_limit, mask_k, MASK_ROWS, MASK_K)
        b_s = b_s.to(tl.float32) * b_decay[None, :]
        if FUSED_OUTPUT:
            b_o = tl.sum(b_s * b_q[None, :], axis=1)
            b_u = b_beta * (b_v.to(tl.float32) - tl.sum(b_s * b_k[None, :], axis=1))
            b_o = b_o + b_u * kq
            b_s = b_s + b_u[:, None] * b_k[None, :]
        else:
            b_u = b_beta * (b_v.to(tl.float32) - tl.sum(b_s * b_k[None, :], axis=1))
            b_s = b_s + b_u[:, None] * b_k[None, :]
            b_o = tl.sum(b_s * b_q[None, :], axis=1)
        # FUSED_OUTPUT: the tile is stored before the output rows. Stores leave in program order (the
        # compiler cannot tell that the two do not overlap), so the tile's stores go out while the
        # output's sum over K is still being reduced across lanes, instead of after it: on the H200,
        # 8-row fp32 tiles 15-18% faster with L2-resident state (B*HV = 256). Without the fused output
        # the updated tile feeds the output's sum, and the output goes first (the other order measured
        # up to 5% slower with 16-bit state at B = 1024).
        if FUSED_OUTPUT:
            _store_tile(p_s, b_s, mask_s, base, STORE_CACHE, STORE_EVICTION)
        if MASK_ROWS:
            b_o = tl.where(o_v < v_limit, b_o, 0.0)
        if MASK_ROWS or MASK_K:
            tl.store(o_row + o_v, b_o.to(o_row.dtype.element_ty), mask=o_v < V)
        else:
            tl.store(o_row + o_v, b_o.to(o_row.dtype.element_ty))
        if not FUSED_OUTPUT:
            _store_tile(p_s, b_s, mask_s, base, STORE_CACHE, STORE_EVICTION)

    @triton.jit
    def _store_tile(p_s, b_s, mask_s, base, STORE_CACHE: tl.constexpr, STORE_EVICTION: tl.constexpr):
        if STORE_CACHE == "":
            tl.store(p_s, b_s.to(base.dtype.element_ty), mask=mask_s, eviction_policy=STORE_EVICTION)
        else:  # a cache modifier (".cs": streaming) cannot be combined with an eviction hint
            tl.store(p_s, b_s.to(base.dtype.element_ty), mask=mask_s, cache_modifier=STORE_CACHE)


@DecodeBackend
def packed_decode(call: DecodeArgs, *, oob_counter: Tensor | None = None, config: DecodeConfig | None = None) -> None:
    """KDA packed decode with Triton; writes ``out`` and the used slots of ``state`` in place.

    Signature and semantics: ``kernels/INTERFACE.md`` (:class:`~kda_kernels.interface.DecodeBackend`
    checks the layout and returns at once when B == 0). Inputs are assumed validated by
    ``kda_contracts`` (shapes agree, dtypes supported); memory safety is not: any index value is
    safe. ``oob_counter`` (int32 ``[1]`` on the device), when given, gets +1 for every index >= N,
    without a host sync, so a strict mode can read it later. ``config`` overrides the launch
    shape :func:`pick_config` would choose (for tuning and tests).

    Example::

        packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5, state, out, indices,
                      num_heads=32, use_qk_l2norm=True, lower_bound=None)
    """
    _launch(call, gdn=False, oob_counter=oob_counter, config=config)


@DecodeBackend
def gdn_packed_decode(call: DecodeArgs, *, oob_counter: Tensor | None = None,
                      config: DecodeConfig | None = None) -> None:
    """GDN (Gated DeltaNet, Qwen3-Next) packed decode with Triton; writes ``out`` and the used slots.

    The KDA kernel with GDN's gate: ``a`` is ``[B, HV]`` and ``dt_bias`` ``[HV]`` (one decay per
    value head, ``docs/semantics.md``), and ``sigmoid(b)`` is rounded to ``b``'s dtype
    before use, as sglang does. Same interface (``lower_bound`` must be None), launch shapes,
    memory safety and options as :func:`packed_decode`.

    Example::

        gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5, state, out, indices,
                          num_heads=16, use_qk_l2norm=True, lower_bound=None)
    """
    if call.lower_bound is not None:
        raise ValueError("GDN has no bounded gate: lower_bound must be None")
    _launch(call, gdn=True, oob_counter=oob_counter, config=config)


def _launch(call: DecodeArgs, *, gdn: bool, oob_counter: Tensor | None, config: DecodeConfig | None) -> None:
    if triton is None:
        raise RuntimeError(f"the triton backend is not available: {_TRITON_IMPORT_ERROR}")
    mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices = call[:9]
    _, use_qk_l2norm, lower_bound, state_layout, dims = call[9:]  # (H is dims[1])
    # Everything but the data (grid, constexprs, options) is planned once per distinct call shape:
    # the dims, the row strides the kernel specializes on, the state dtype, the flags, the device
    # (what the shared-memory KV tile can run on is the GPU's) and the config.
    pkey = (dims, mixed_qkv.stride()[0], a.stride()[0], b.stride()[0], state.stride()[0], state.dtype,
            state_layout, gdn, bool(use_qk_l2norm), lower_bound is not None, oob_counter is not None,
            state.get_device(), config)
    plan = _plans.get(pkey)
    if plan is None:
        plan = _plan(pkey)
    grid, constexprs, options, plan_id, kernel = plan
    if plan_id in _copies_tile and state.data_ptr() % 16:  # the shared-memory KV tile needs an aligned pool
        grid, constexprs, options, plan_id, kernel = _misaligned_plan(pkey, state)
    args = (
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        state,
        out,
        indices,
        oob_counter if oob_counter is not None else indices,
        float(scale),
        float(lower_bound) if lower_bound is not None else 0.0,
        dims[5],  # N
    )
    key = _launch_key(args, plan_id) if _fast_launch["enabled"] else None
    error = None
    if key is not None:
        entry = _fast_launch["cache"].get(key)
        if entry is not None:
            launched, error = _launch_compiled(entry, key[0], grid, args, constexprs)
            if launched:
                return
    compiled = (kernel or _packed_decode_kernel)[grid](*args, *constexprs, **options)
    if error is not None:  # the normal launch worked where the compiled kernel's launcher failed
        _disable_fast_launch(f"the compiled kernel's launcher failed ({error!r})")
    elif key is not None:
        _remember(key, compiled, len(constexprs))


def _misaligned_plan(pkey: tuple, state: Tensor) -> tuple:
    """The plan of a call whose pool the shared-memory KV tile cannot copy (its base address):
    auto's shape without that tile; an explicit config asking for it is refused."""
    from . import triton_kv_shared

    config = pkey[-1]
    if config is not None:
        raise ValueError(f"{config} cannot run here: {triton_kv_shared.misaligned(state)}")
    dims, state_dtype, state_layout, gdn, gpu = pkey[0], pkey[5], pkey[6], pkey[7], pkey[-2]
    fallback = pick_config(dims[0], dims[2], dims[4], state_dtype, state_layout, gdn=gdn, kv_shared=False,
                           device=_device_name(gpu))
    key = (*pkey[:-1], fallback)
    return _plans.get(key) or _plan(key)


@functools.cache
def _device_name(gpu: int) -> str | None:
    """The name of CUDA device ``gpu`` (the pool's), which selects :func:`pick_config`'s per-device
    table; None for a CPU pool (the Triton interpreter): the default table."""
    if gpu < 0 or not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.get_device_name(gpu)
    except (RuntimeError, AssertionError):  # no such device after all: the default table
        return None


def _pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1); plain Python (triton.next_power_of_2 is a
    ConstexprFunction in recent Triton: ~2 µs a call on the host)."""
    return 1 << max(n - 1, 0).bit_length()


# plan key -> (grid, constexprs, options, plan id, kernel: None for _packed_decode_kernel)
_plans: dict[tuple, tuple] = {}


def _plan(pkey: tuple) -> tuple:
    """The launch of one call shape: grid, the kernel's constexprs in order, the compile options,
    a small id standing for all three in the fast launch's key, and the kernel."""
    dims, s_qkv, s_a, s_b, s_state, state_dtype, state_layout, gdn, use_qk_l2norm, bounded, counted, gpu, config = pkey
    batch, num_heads, num_v_heads, head_k_dim, head_v_dim, _ = dims
    device_name = _device_name(gpu)  # the card's table (pick_config's device)
    cfg = config if config is not None else pick_config(batch, num_v_heads, head_v_dim, state_dtype, state_layout,
                                                        gdn=gdn, device=device_name)
    if cfg.kv_shared and cfg.kv_registers:
        raise ValueError(f"{cfg}: kv_shared and kv_registers exclude each other (the tile is in shared memory "
                         "or in registers)")
    if (cfg.kv_shared or cfg.kv_registers) and state_layout == "KV":
        from . import triton_kv_shared

        # the pool's GPU (DecodeBackend makes it the current device, which Triton launches on)
        device = torch.device("cuda", gpu) if gpu >= 0 and torch.cuda.is_available() else None
        untimed = triton_kv_shared.auto_unmeasured() if config is None else None
        chunk = head_k_dim if cfg.kv_registers else cfg.kv_chunk
        why = untimed or triton_kv_shared.unsupported(head_k_dim, head_v_dim, state_dtype, cfg.block_v,
                                                      cfg.num_warps, chunk, device, s_state,
                                                      registers=cfg.kv_registers)
        if why is None:
            return _plan_kv_shared(pkey, cfg)
        if config is not None:
            raise ValueError(f"{config} cannot run here: {why}")
        # auto: the shape picked where the shared-memory tile cannot run (or was not timed)
        cfg = pick_config(batch, num_v_heads, head_v_dim, state_dtype, state_layout, gdn=gdn, kv_shared=False,
                          device=device_name)
    if cfg.early_load and cfg.tiles != 1:
        raise ValueError(f"{cfg}: early_load needs one tile per program (tiles=1)")
    span = cfg.block_v * cfg.tiles
    groups = -(-head_v_dim // span)
    grid_kind = {"flat": 0, "v_fastest": 1, "head_fastest": 2, "grouped": 3}[cfg.grid]
    if (grid_kind in (1, 2) and batch > 65535) or (grid_kind == 3 and num_v_heads % 16):
        grid_kind = 0
    flat = (batch * num_v_heads * groups, 1, 1)
    grid = (flat, (groups, num_v_heads, batch), (num_v_heads, groups, batch), flat)[grid_kind]
    wide = _wide(pkey)
    bk = _pow2(head_k_dim)
    # The kernel's constexprs in order, after its runtime arguments (the fast launch passes both
    # tuples positionally, as Triton's own launch does).
    constexprs = (
        num_heads,  # H
        num_v_heads,  # HV
        s_qkv,
        s_a,
        s_b,
        s_state,
        head_k_dim,  # K
        head_v_dim,  # V
        bk,  # BK
        cfg.block_v,  # BV
        state_layout == "KV",  # STATE_KV
        use_qk_l2norm,  # USE_L2NORM
        bounded,  # BOUNDED_GATE
        counted,  # HAS_COUNTER
        cfg.tiles,  # TILES
        cfg.num_stages,  # STAGES
        cfg.state_eviction,  # STATE_EVICTION
        cfg.guard == "mask",  # MASK_GUARD
        cfg.load_cache,  # LOAD_CACHE
        cfg.store_cache,  # STORE_CACHE
        grid_kind,  # GRID
        wide,  # WIDE
        cfg.act_eviction,  # ACT_EVICTION
        cfg.state_eviction if cfg.store_eviction is None else cfg.store_eviction,  # STORE_EVICTION
        cfg.guard == "mask" or head_v_dim % span != 0,  # MASK_ROWS
        head_k_dim != bk,  # MASK_K
        # KV_CHUNK: at most BK rows (a chunk past a power-of-two K would run unmasked into the next head)
        min(cfg.kv_chunk, bk) if state_layout == "KV" else 0,
        cfg.act_eviction if cfg.v_eviction is None else cfg.v_eviction,  # V_EVICTION
        0 if gdn else 1,  # GATE_STRIDE
        gdn,  # ROUND_BETA
        cfg.kv_first_eviction,  # KV_FIRST_EVICTION
        cfg.fused_output and not (state_layout == "KV" and cfg.kv_chunk),  # FUSED_OUTPUT
        cfg.early_load and not (state_layout == "KV" and cfg.kv_chunk),  # EARLY_LOAD
    )
    options = {"num_warps": cfg.num_warps}
    if cfg.max_registers is not None:
        options["maxnreg"] = cfg.max_registers
    return _keep(pkey, grid, constexprs, options, None)  # None: _packed_decode_kernel, read at launch


def _plan_kv_shared(pkey: tuple, cfg: DecodeConfig) -> tuple:
    """The launch of the shared-memory KV tile (``triton_kv_shared``): same runtime arguments."""
    from . import triton_kv_shared

    dims, s_qkv, s_a, s_b, s_state, state_dtype, _, gdn, use_qk_l2norm, bounded, counted, _, _ = pkey
    batch, num_heads, num_v_heads, head_k_dim, head_v_dim, _ = dims
    grid = (batch * num_v_heads * (head_v_dim // cfg.block_v), 1, 1)
    wide = _wide(pkey)
    store_eviction = cfg.state_eviction if cfg.store_eviction is None else cfg.store_eviction
    regs = cfg.kv_registers  # the tile in registers: one chunk of K rows, no shared memory
    constexprs = (
        num_heads, num_v_heads, s_qkv, s_a, s_b, s_state, head_k_dim, head_v_dim, cfg.block_v,
        head_k_dim if regs else cfg.kv_chunk,  # CK
        use_qk_l2norm, bounded, counted, 0 if gdn else 1, gdn,  # ... GATE_STRIDE, ROUND_BETA
        cfg.state_eviction, store_eviction, cfg.act_eviction, wide,
        cfg.num_warps > 1 and not regs,  # ACC2D: warps side by side along V sum per thread over the chunks
        *triton_kv_shared.layouts(cfg.block_v, state_dtype.itemsize, cfg.num_warps, head_k_dim if regs else 0),
        regs,  # REGS
    )
    return _keep(pkey, grid, constexprs, {"num_warps": cfg.num_warps}, triton_kv_shared.kernel(), copies_tile=not regs)


def _wide(pkey: tuple) -> bool:
    """Whether the largest activation/output element offset a program forms may pass 2**31."""
    dims, s_qkv, s_a, s_b = pkey[:4]
    return dims[0] * max(s_qkv, s_a, s_b, dims[2] * dims[4]) >= 2**31 - 1


def _keep(pkey: tuple, grid: tuple, constexprs: tuple, options: dict, kernel: object,
          copies_tile: bool = False) -> tuple:
    """Store and return a plan; plans that compile alike share an id (the fast launch's key holds
    the id, not the tuples). ``copies_tile``: the kernel copies the pool in 16-byte vectors (its id
    goes into ``_copies_tile`` before the plan is published, so no launch sees the plan without it)."""
    same = (kernel, constexprs, options.get("num_warps"), options.get("maxnreg"))
    plan_id = _plan_ids.setdefault(same, len(_plan_ids))
    if copies_tile:
        _copies_tile.add(plan_id)
    if len(_plans) >= _MAX_PLANS:  # a bounded cache: shapes churn (e.g. every batch size once)
        _plans.clear()
    plan = _plans[pkey] = (grid, constexprs, options, plan_id, kernel)
    return plan


_MAX_PLANS = 4096
_plan_ids: dict[tuple, int] = {}
_copies_tile: set[int] = set()  # ids of the plans that copy the KV tile to shared memory in 16-byte vectors


# --- eager launch ---------------------------------------------------------------------------------
# ``kernel[grid](...)`` spends ~25 µs of host time per call in Triton's JITFunction.run (binding the
# arguments, computing the specialization key, looking up the cache), ten times the kernel itself at
# small batches. So after a normal launch, the CompiledKernel it returns is kept under a key holding
# everything Triton specializes this kernel on, and later calls with the same key go straight to the
# compiled kernel's launcher: the call JITFunction.run itself ends with, on the current stream, with
# no sync (safe under CUDA-graph capture). Anything unexpected about those internals switches this
# off for the process, with a warning, and every call takes the normal path. Under TRITON_INTERPRET
# there is no compiled kernel and the normal path is the only one. Not in the key: Triton settings
# read from the environment at launch (TRITON_DEBUG, instrumentation modes): set them before the
# first call, or set KDA_TRITON_FAST_LAUNCH=0 (read at import) to always launch with kernel[grid].

_N_RUNTIME_ARGS = 12
_N_CONSTEXPRS = 33  # the Triton kernel's (the shared-memory KV kernel has its own count)
_fast_launch: dict = {
    "enabled": os.environ.get("KDA_TRITON_FAST_LAUNCH", "1") not in ("", "0") and triton is not None,
    "cache": {},  # key -> (compiled kernel, launcher, function handle, packed metadata)
    "env": None,  # (get_current_device, get_current_stream, triton.knobs.runtime), bound on first use
}


def _disable_fast_launch(why: str) -> None:
    if _fast_launch["enabled"]:
        _fast_launch["enabled"] = False
        _fast_launch["cache"].clear()
        warnings.warn(
            f"kda_kernels.triton_decode: fast launch disabled, using kernel[grid]: {why}", RuntimeWarning, stacklevel=3
        )


def _int_spec(x: int) -> int:
    """What Triton specializes an int argument on: == 1 (it becomes a constexpr), divisibility by
    16, and its type (i32, i64 or u64), as one small int."""
    if x == 1:
        return 1
    spec = 2 if x % 16 == 0 else 0
    if x < -0x80000000 or x > 0x7FFFFFFF:
        spec += 8 if x > 0x7FFFFFFFFFFFFFFF else 4
    return spec


def _launch_key(args: tuple, plan_id: int) -> tuple | None:
    """The specialization key of a launch: the device, the plan (constexprs and options, by
    :func:`_plan`'s id), each pointer's dtype and 16-byte alignment, and each int's
    :func:`_int_spec` (floats are never specialized). None when the fast launch cannot be used."""
    env = _fast_launch["env"]
    if env is None:
        env = _bind_launch_env()
        if env is None:
            return None
    q, a, b, A, d, s, o, i, c = args[:9]
    return (
        env[0](),
        plan_id,
        q.dtype, a.dtype, b.dtype, A.dtype, d.dtype, s.dtype, o.dtype, i.dtype, c.dtype,
        (q.data_ptr() | a.data_ptr() | b.data_ptr() | A.data_ptr() | d.data_ptr() | s.data_ptr() | o.data_ptr()
         | i.data_ptr() | c.data_ptr()) & 15 == 0 or _alignment(args[:9]),
        _int_spec(args[11]),
    )


def _alignment(tensors: tuple) -> tuple[bool, ...]:
    """Which of the pointers are 16-byte aligned (when not all are)."""
    return tuple([(t.data_ptr() & 15) == 0 for t in tensors])


def _bind_launch_env() -> tuple | None:
    try:
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction

        if not isinstance(_packed_decode_kernel, JITFunction):  # the interpreter, or a wrapper
            _fast_launch["enabled"] = False
            return None
        active = driver.active
        env = (active.get_current_device, active.get_current_stream, triton.knobs.runtime)
    except Exception as exc:
        _disable_fast_launch(f"triton's driver API is not as expected ({exc!r})")
        return None
    _fast_launch["env"] = env
    return env


def _hook_set(hook: object) -> bool:
    # None (triton <= 3.6) or an empty HookChain (later versions) means no hook
    return hook is not None and bool(getattr(hook, "calls", True))


def _remember(key: tuple, compiled: object, n_constexprs: int) -> None:
    """Keep the CompiledKernel a normal launch returned, if it looks like what the fast launch
    expects: a signature listing every parameter (constexprs included) and a launcher."""
    if compiled is None or hasattr(compiled, "result"):  # not launched (a compile hook), or a future
        return
    try:
        signature = list(compiled.src.signature.values())
        ok = len(signature) == _N_RUNTIME_ARGS + n_constexprs and all(
            v == "constexpr" for v in signature[_N_RUNTIME_ARGS:]
        )
        entry = (compiled, compiled.run, compiled.function, compiled.packed_metadata)
        ok = ok and callable(entry[1]) and entry[2] is not None
    except Exception as exc:
        _disable_fast_launch(f"the compiled kernel is not as expected ({exc!r})")
        return
    if not ok:
        _disable_fast_launch("the compiled kernel's signature or launcher is not as expected")
        return
    _fast_launch["cache"][key] = entry


def _launch_compiled(
    entry: tuple, device: int, grid: tuple[int, int, int], args: tuple, constexprs: tuple
) -> tuple[bool, Exception | None]:
    """Launch through the compiled kernel's launcher. Returns (launched, the launcher's error): when
    not launched the normal path runs, and disables this one if it succeeds where this failed (a
    failure of both is the caller's, e.g. a CPU tensor, and Triton's error is the one raised)."""
    get_stream, runtime = _fast_launch["env"][1:]
    if _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook):
        return False, None  # a profiler is listening: let Triton build the launch metadata
    _, run, function, packed_metadata = entry
    try:
        run(*grid, get_stream(device), function, packed_metadata, None, None, None, *args, *constexprs)
    except Exception as exc:
        return False, exc
    return True, None
