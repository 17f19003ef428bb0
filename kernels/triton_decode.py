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
from typing import Any

import torch
from torch import Tensor

from .interface import WATCH_CHECKS, DecodeArgs, DecodeBackend, WatchArgs
from .triton_configs import ConfigUnsupported, DecodeConfig, pick_config, picked_configs

try:
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except ImportError as exc:  # the module stays importable so is_available() can say why
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    _TRITON_IMPORT_ERROR = f"triton is not installed ({exc})"

__all__ = ["ConfigUnsupported", "DecodeConfig", "gdn_packed_decode", "is_available", "packed_decode", "pick_config",
           "picked_configs"]


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

    @triton.jit(do_not_specialize=["serial"])
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
        watch_scratch,  # int64 [WATCH_WORDS] (only touched when WATCH finds something)
        watch_host,  # float64 doorbell in host memory (ditto)
        serial,  # the call's serial (WATCH)
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
        WATCH: tl.constexpr,  # make interface.WATCH_CHECKS on what the program reads (watch mode)
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
        a_log = tl.load(A_log + i_hv, eviction_policy=ev).to(tl.float32)
        b_A = tl.exp(a_log)
        b_b = tl.load(b + i_b * stride_b + i_hv, eviction_policy=ev)
        b_beta = tl.sigmoid(b_b.to(tl.float32))
        if ROUND_BETA:
            b_beta = b_beta.to(b_b.dtype).to(tl.float32)
        # watch mode, the common path: no branch on what is found until the program's work is done.
        # A probe is NaN when anything it sums is NaN or Inf (x * 0): the inputs this program read
        # (a non-finite a or dt_bias makes their sum so); the earlier indices' first block is
        # loaded now, compared at the end (Distinct); what is found is then checked exactly.
        probe = 0.0
        lead = (i_hv == 0) & (i_v0 == 0)
        o_j = tl.arange(0, 64)
        earlier = o_j
        if WATCH:
            probe = tl.sum(b_q * 0.0 + b_k * 0.0 + b_x * 0.0, axis=0) + a_log * 0.0 + b_b.to(tl.float32) * 0.0
            earlier = tl.load(indices + o_j, mask=o_j < tl.where(lead, i_b, 0), other=-1)
        rows_bad = tl.zeros([], tl.int32)
        v_probe = 0.0
        if MASK_GUARD:
            # No branch: the pool is addressed through slot 0 and every pool access is masked off
            # unless the index is valid (a masked-off lane touches no memory).
            rows_bad, v_probe = _decode_tiles(
                state + tl.where(valid, slot, 0) * stride_state + i_hv * (V * K), tl.where(valid, V, 0),
                row + 2 * H * K + i_hv * V, out + (i_b * HV + i_hv) * V, i_v0,
                b_q, b_k, b_x, b_A, b_beta, scale, lower_bound, o_k, mask_k,
                K, V, BV, STATE_KV, USE_L2NORM, BOUNDED_GATE, TILES, STAGES, STATE_EVICTION,
                LOAD_CACHE, STORE_CACHE, ACT_EVICTION, STORE_EVICTION, MASK_ROWS, MASK_K,
                row + i_h * K, row + (H + i_h) * K, x_row, bias_row, KV_CHUNK, V_EVICTION, GATE_STRIDE,
                KV_FIRST_EVICTION, FUSED_OUTPUT, EARLY_LOAD, WATCH,
            )
        else:
            if valid:
                rows_bad, v_probe = _decode_tiles(
                    state + slot * stride_state + i_hv * (V * K), V,
                    row + 2 * H * K + i_hv * V, out + (i_b * HV + i_hv) * V, i_v0,
                    b_q, b_k, b_x, b_A, b_beta, scale, lower_bound, o_k, mask_k,
                    K, V, BV, STATE_KV, USE_L2NORM, BOUNDED_GATE, TILES, STAGES, STATE_EVICTION,
                    LOAD_CACHE, STORE_CACHE, ACT_EVICTION, STORE_EVICTION, MASK_ROWS, MASK_K,
                    row + i_h * K, row + (H + i_h) * K, x_row, bias_row, KV_CHUNK, V_EVICTION, GATE_STRIDE,
                    KV_FIRST_EVICTION, FUSED_OUTPUT, EARLY_LOAD, WATCH,
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
                    if WATCH:  # (this program's v, unread here otherwise)
                        b_v = tl.load(row + 2 * H * K + i_hv * V + o_v, mask=o_v < V, other=0.0)
                        v_probe += tl.sum(b_v.to(tl.float32) * 0.0, axis=0)
        if HAS_COUNTER:
            if (slot >= N) & (i_hv == 0) & (i_v0 == 0):
                tl.atomic_add(oob_counter, 1)
        if WATCH:
            suspect = (probe != probe) | (v_probe != v_probe) | (lead & (slot >= N))
            if lead & (slot >= 0):  # Distinct: an earlier request on this slot (later blocks loaded now)
                hit = tl.max(((earlier == slot) & (o_j < i_b)).to(tl.int32), axis=0)
                for jb in range(1, tl.cdiv(i_b, 64)):
                    oj = jb * 64 + o_j
                    xj = tl.load(indices + oj, mask=oj < i_b, other=-1).to(tl.int64)
                    hit = tl.maximum(hit, tl.max(((xj == slot) & (oj < i_b)).to(tl.int32), axis=0))
                suspect = suspect | (hit > 0)
            if suspect:  # (rare: everything this program checks, exactly, and recorded)
                _watch_inputs(qkv, a, b, A_log, dt_bias, indices, watch_scratch, watch_host, serial, N, slot,
                              i_b, i_hv, i_h, i_v0, H, HV, K, V, BK, BV, TILES, stride_qkv, stride_a, stride_b,
                              GATE_STRIDE)
            if rows_bad > 0:  # (the slot's row: NaN found (2) sorts before Inf only (1))
                _watch_note(watch_scratch, watch_host, serial, 2, 1, i_b * 2 + (rows_bad == 1),
                            tl.where(rows_bad == 2, float("nan"), float("inf")), slot)

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
        WATCH: tl.constexpr,  # (KV_CHUNK == 0) also say whether a loaded tile holds NaN (2) or Inf (1)
    ):
        """The slot's tiles of this program; returns, with WATCH, whether they held NaN (2) or Inf (1)
        and a probe of the v values read (NaN when one is NaN or Inf)."""
        bad = tl.zeros([], tl.int32)
        v_probe = 0.0
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
        elif EARLY_LOAD:
            # the state load goes out as soon as the slot is known, so its latency overlaps the
            # activation loads' and the gate and norm math instead of following them
            b_s, b_v = _load_tile(base, v_limit, v_row, i_v0, o_k, mask_k, K, V, BV, STATE_KV,
                                  STATE_EVICTION, LOAD_CACHE, V_EVICTION, MASK_ROWS, MASK_K)
            if WATCH:
                v_probe = tl.sum(b_v.to(tl.float32) * 0.0, axis=0)
            b_q, b_k, b_decay, kq = _tile_vectors(b_q, b_k, b_x, b_A, scale, lower_bound, USE_L2NORM,
                                                  BOUNDED_GATE, FUSED_OUTPUT)
            bad = _update_tile(b_s, b_v, base, v_limit, o_row, i_v0, b_q, b_k, b_decay, b_beta, o_k,
                               mask_k, K, V, BV, STATE_KV, STORE_CACHE, STORE_EVICTION, MASK_ROWS, MASK_K,
                               FUSED_OUTPUT, kq, WATCH)
        else:
            b_q, b_k, b_decay, kq = _tile_vectors(b_q, b_k, b_x, b_A, scale, lower_bound, USE_L2NORM,
                                                  BOUNDED_GATE, FUSED_OUTPUT)
            for t in tl.range(0, TILES, num_stages=STAGES):
                b_s, b_v = _load_tile(base, v_limit, v_row, i_v0 + t, o_k, mask_k, K, V, BV, STATE_KV,
                                      STATE_EVICTION, LOAD_CACHE, V_EVICTION, MASK_ROWS, MASK_K)
                if WATCH:
                    v_probe += tl.sum(b_v.to(tl.float32) * 0.0, axis=0)
                bad = tl.maximum(bad, _update_tile(b_s, b_v, base, v_limit, o_row, i_v0 + t, b_q, b_k, b_decay,
                                                   b_beta, o_k, mask_k, K, V, BV, STATE_KV, STORE_CACHE,
                                                   STORE_EVICTION, MASK_ROWS, MASK_K, FUSED_OUTPUT, kq, WATCH))
        return bad, v_probe

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
                     MASK_K: tl.constexpr, FUSED_OUTPUT: tl.constexpr, kq, WATCH: tl.constexpr):
        """The delta-rule step on one loaded tile: its output rows and the updated tile are stored.
        FUSED_OUTPUT: the output rows from the decayed tile, ``h q + u (k . q)`` with ``kq = k . q``,
        so both sums read the loaded tile side by side instead of the second waiting for the update.
        Returns, with WATCH, :func:`_tile_bad` of the loaded tile (else 0)."""
        p_s, o_v = _tile_ptrs(base, i_v, o_k, K, V, BV, STATE_KV)
        mask_s = None
        if MASK_ROWS or MASK_K:
            mask_s = _tile_mask(o_v, v_limit, mask_k, MASK_ROWS, MASK_K)
        b_s = b_s.to(tl.float32)
        bad = tl.zeros([], tl.int32)
        if WATCH:  # (on the tile as converted for the step: no second copy of it)
            bad = _tile_bad(b_s)
        b_s = b_s * b_decay[None, :]
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
        return bad

    @triton.jit
    def _store_tile(p_s, b_s, mask_s, base, STORE_CACHE: tl.constexpr, STORE_EVICTION: tl.constexpr):
        if STORE_CACHE == "":
            tl.store(p_s, b_s.to(base.dtype.element_ty), mask=mask_s, eviction_policy=STORE_EVICTION)
        else:  # a cache modifier (".cs": streaming) cannot be combined with an eviction hint
            tl.store(p_s, b_s.to(base.dtype.element_ty), mask=mask_s, cache_modifier=STORE_CACHE)


    # --- watch mode: interface.WATCH_CHECKS on what the program reads ------------------------------
    # Every element is checked by exactly one program (so counts are exact): q and k by the first
    # value head of their group's first V group, a and b by each value head's first V group,
    # A_log and dt_bias by request 0's, v by the program that owns its rows, the pool tiles by the
    # program that loads them. Nothing is written unless something is found (interface.py's scratch).

    @triton.jit
    def _upcast(x):
        if tl.constexpr(x.dtype != tl.float64):  # (16-bit floats as fp32: exact, NaN and Inf kept)
            x = x.to(tl.float32)
        return x

    @triton.jit
    def _first_bad(x, offs, live, count, first, value):
        """Fold the non-finite lanes of ``x`` (element numbers ``offs``, lanes ``live``) into
        (count, first element, its value)."""
        big: tl.constexpr = 1 << 62
        x = _upcast(x)
        offs = offs.to(tl.int64)
        bad = live & ((x != x) | (tl.abs(x) == float("inf")))
        n = tl.sum(bad.to(tl.int64), axis=0)
        at = tl.min(tl.where(bad, offs, big), axis=0)
        here = tl.sum(tl.where(bad & (offs == at), x, 0.0).to(tl.float64), axis=0)
        better = (n > 0) & (at < first)
        return count + n, tl.where(better, at, first), tl.where(better, here, value)

    @triton.jit
    def _max_nan(a, b):
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _tile_bad(b_s):
        """2 when a loaded pool tile holds NaN, 1 when Inf (and no NaN), else 0: its largest
        magnitude, NaN kept (one max per element, the absolute value a free operand modifier; no
        branch, so nothing of the tile is kept for a rare path)."""
        x = tl.abs(b_s)
        # (rows first: within each thread; then one reduction across the lanes along K)
        m = tl.reduce(x, None, _max_nan)
        return tl.where(m != m, 2, tl.where(m == float("inf"), 1, 0))

    @triton.jit
    def _watch_note(WS, WH, serial, C: tl.constexpr, count, key, value, extra):
        """Record ``count`` findings of check C (first: ``key``, ``value``, ``extra``) unless another
        call holds the claim; under a lock (a rare path: nothing is found in a clean call)."""
        if count > 0:
            zero = tl.zeros([], tl.int64)
            me = zero + serial
            old = tl.atomic_cas(WS, zero, me)
            if (old == 0) | (old == me):
                locked = tl.atomic_cas(WS + 1, zero, zero + 1)
                while locked != 0:
                    locked = tl.atomic_cas(WS + 1, zero, zero + 1)
                n = (zero + count).to(tl.int64)
                if C == 2:  # a row counts once, however many programs find it
                    pos = key // 2
                    bit = (zero + 1) << (pos % 64)
                    seen = tl.atomic_or(WS + 42 + pos // 64, bit)
                    n = ((seen & bit) == 0).to(tl.int64)
                key64 = (zero + key).to(tl.int64)
                if key64 < tl.atomic_add(WS + 2 + C, zero):
                    tl.atomic_xchg(WS + 2 + C, key64)
                    f64 = tl.zeros([], tl.float64)
                    tl.atomic_xchg(WS + 26 + C, (f64 + value).to(tl.int64, bitcast=True))
                    tl.atomic_xchg(WS + 34 + C, (f64 + extra).to(tl.int64, bitcast=True))
                tl.atomic_add(WS + 10 + C, n)
                if C == 0:
                    tl.atomic_max(WS + 18, (zero + value).to(tl.int64))
                tl.atomic_xchg(WS + 1, zero)
                tl.store(WH, 1.0)

    @triton.jit
    def _watch_inputs(qkv, a, b, A_log, dt_bias, indices, WS, WH, serial, N, slot, i_b, i_hv, i_h, i_v0,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, TILES: tl.constexpr, stride_qkv: tl.constexpr, stride_a: tl.constexpr,
                      stride_b: tl.constexpr, GATE_STRIDE: tl.constexpr):
        """This program's share of the index checks and the inputs' finite checks."""
        big: tl.constexpr = 1 << 62
        W: tl.constexpr = 2 * H * K + HV * V  # (mixed_qkv's element numbers: its logical, row-major ones)
        lead = i_v0 == 0
        o_k = tl.arange(0, BK)
        mask_k = o_k < K
        row = i_b
        if lead & (i_hv == 0):  # one program per request: the index checks
            if slot >= N:
                _watch_note(WS, WH, serial, 0, 1, row * 2, slot, slot)
            if slot >= 0:
                earliest = tl.full([], big, tl.int64)
                for jb in range(0, tl.cdiv(row, 64)):
                    oj = jb * 64 + tl.arange(0, 64)
                    mj = oj < row
                    xj = tl.load(indices + oj, mask=mj, other=-1).to(tl.int64)
                    earliest = tl.minimum(earliest, tl.min(tl.where(mj & (xj == slot), oj.to(tl.int64), big), axis=0))
                if earliest < big:
                    _watch_note(WS, WH, serial, 1, 1, row * 2, slot, earliest)
        # mixed_qkv: q and k (the group's first value head), v (this program's rows)
        count = tl.zeros([], tl.int64)
        first = tl.full([], big, tl.int64)
        value = tl.zeros([], tl.float64)
        if lead & (i_hv % (HV // H) == 0):
            for part in tl.static_range(2):
                col = (part * H + i_h) * K + o_k
                x1 = tl.load(qkv + row * stride_qkv + col, mask=mask_k, other=0.0)
                count, first, value = _first_bad(x1, row * W + col, mask_k, count, first, value)
        for t in tl.static_range(TILES):
            o_v = (i_v0 + t) * BV + tl.arange(0, BV)
            col = 2 * H * K + i_hv * V + o_v
            x2 = tl.load(qkv + row * stride_qkv + col, mask=o_v < V, other=0.0)
            count, first, value = _first_bad(x2, row * W + col, o_v < V, count, first, value)
        _watch_note(WS, WH, serial, 3, count, first * 2, value, 0.0)
        if lead:  # a, b: each value head's first V group
            count = tl.zeros([], tl.int64)
            first = tl.full([], big, tl.int64)
            value = tl.zeros([], tl.float64)
            if GATE_STRIDE:
                x3 = tl.load(a + row * stride_a + i_hv * K + o_k, mask=mask_k, other=0.0)
                count, first, value = _first_bad(x3, row * (HV * K) + i_hv * K + o_k, mask_k,
                                                 count, first, value)
            else:
                x4 = tl.load(a + row * stride_a + i_hv + o_k * 0, mask=o_k == 0, other=0.0)
                count, first, value = _first_bad(x4, row * HV + i_hv + o_k, o_k == 0,
                                                 count, first, value)
            _watch_note(WS, WH, serial, 4, count, first * 2, value, 0.0)
            count = tl.zeros([], tl.int64)
            first = tl.full([], big, tl.int64)
            value = tl.zeros([], tl.float64)
            x5 = tl.load(b + row * stride_b + i_hv + o_k * 0, mask=o_k == 0, other=0.0)
            count, first, value = _first_bad(x5, row * HV + i_hv + o_k, o_k == 0, count, first, value)
            _watch_note(WS, WH, serial, 5, count, first * 2, value, 0.0)
            if row == 0:  # A_log, dt_bias: request 0's programs
                count = tl.zeros([], tl.int64)
                first = tl.full([], big, tl.int64)
                value = tl.zeros([], tl.float64)
                x6 = tl.load(A_log + i_hv + o_k * 0, mask=o_k == 0, other=0.0)
                count, first, value = _first_bad(x6, i_hv + o_k, o_k == 0, count, first, value)
                _watch_note(WS, WH, serial, 6, count, first * 2, value, 0.0)
                count = tl.zeros([], tl.int64)
                first = tl.full([], big, tl.int64)
                value = tl.zeros([], tl.float64)
                if GATE_STRIDE:
                    x7 = tl.load(dt_bias + i_hv * K + o_k, mask=mask_k, other=0.0)
                    count, first, value = _first_bad(x7, i_hv * K + o_k, mask_k, count, first, value)
                else:
                    x8 = tl.load(dt_bias + i_hv + o_k * 0, mask=o_k == 0, other=0.0)
                    count, first, value = _first_bad(x8, i_hv + o_k, o_k == 0, count, first, value)
                _watch_note(WS, WH, serial, 7, count, first * 2, value, 0.0)


@DecodeBackend
def packed_decode(call: DecodeArgs, *, oob_counter: Tensor | None = None, config: DecodeConfig | None = None,
                  watch: WatchArgs | None = None) -> None:
    """KDA packed decode with Triton; writes ``out`` and the used slots of ``state`` in place.

    Signature and semantics: ``kernels/INTERFACE.md`` (:class:`~kda_kernels.interface.DecodeBackend`
    checks the layout and returns at once when B == 0). Inputs are assumed validated by
    ``kda_contracts`` (shapes agree, dtypes supported); memory safety is not: any index value is
    safe. ``oob_counter`` (int32 ``[1]`` on the device), when given, gets +1 for every index >= N,
    without a host sync, so a strict mode can read it later. ``config`` overrides the launch
    shape :func:`pick_config` would choose (for tuning and tests). ``watch``: make
    :data:`~kda_kernels.interface.WATCH_CHECKS` on what the kernel reads and record what it finds
    there (watch mode; no launch of its own, no sync; the launch shape is auto's without the
    shared-memory or chunked KV tile).

    Example::

        packed_decode(mixed_qkv, a, b, A_log, dt_bias, 128 ** -0.5, state, out, indices,
                      num_heads=32, use_qk_l2norm=True, lower_bound=None)
    """
    _launch(call, gdn=False, oob_counter=oob_counter, config=config, watch=watch)


@DecodeBackend
def gdn_packed_decode(call: DecodeArgs, *, oob_counter: Tensor | None = None,
                      config: DecodeConfig | None = None, watch: WatchArgs | None = None) -> None:
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
    _launch(call, gdn=True, oob_counter=oob_counter, config=config, watch=watch)


#: kernels given ``watch=`` make interface.WATCH_CHECKS themselves (kda_contracts' watch mode reads this)
packed_decode.watch_checks = gdn_packed_decode.watch_checks = WATCH_CHECKS  # type: ignore[attr-defined]


def _launch(call: DecodeArgs, *, gdn: bool, oob_counter: Tensor | None, config: DecodeConfig | None,
            watch: WatchArgs | None = None) -> None:
    if triton is None:
        raise RuntimeError(f"the triton backend is not available: {_TRITON_IMPORT_ERROR}")
    mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices = call[:9]
    _, use_qk_l2norm, lower_bound, state_layout, dims = call[9:]  # (H is dims[1])
    # Everything but the data (grid, constexprs, options) is planned once per distinct call shape:
    # the dims, the row strides the kernel specializes on, the state dtype, the flags, the device
    # (what the shared-memory KV tile can run on is the GPU's) and the config.
    pkey = (dims, mixed_qkv.stride()[0], a.stride()[0], b.stride()[0], state.stride()[0], state.dtype,
            state_layout, gdn, bool(use_qk_l2norm), lower_bound is not None, oob_counter is not None,
            state.get_device(), config, watch is not None)
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
        watch[0] if watch is not None else indices,  # (scratch, host, serial: a WatchArgs or its fields)
        watch[1] if watch is not None else indices,
        watch[2] if watch is not None else 0,
        float(scale),
        float(lower_bound) if lower_bound is not None else 0.0,
        dims[5],  # N
    )
    plan = _plans.get(pkey)
    if plan is None:
        plan = _plan(pkey)
        if watch is not None and config is None and state.is_cuda:
            plan = _register_capped(pkey, plan, args)
    grid, constexprs, options, plan_id, kernel = plan
    if plan_id in _copies_tile and state.data_ptr() % 16:  # the shared-memory KV tile needs an aligned pool
        grid, constexprs, options, plan_id, kernel = _misaligned_plan(pkey, state)
    key = None
    if _fast_launch["enabled"]:
        # (the compiled launcher takes an int as a pointer as is: each tensor passed as its address
        # saves the launcher an attribute call and a driver query; the watch doorbell, pinned host
        # memory, is at the same address on the device: unified addressing)
        ptrs = tuple(map(Tensor.data_ptr, args[:11]))
        key = _launch_key(args, plan_id, ptrs)
    error = None
    if key is not None:
        entry = _fast_launch["cache"].get(key)
        if entry is not None:
            launched, error = _launch_compiled(entry, key[0], grid, ptrs + args[11:], constexprs)
            if launched:
                return
    compiled = (kernel or _packed_decode_kernel)[grid](*args, *constexprs, **options)
    if error is not None:  # the normal launch worked where the compiled kernel's launcher failed
        _disable_fast_launch(f"the compiled kernel's launcher failed ({error!r})")
    elif key is not None:
        _remember(key, compiled, len(constexprs))


def _register_capped(pkey: tuple, plan: tuple, args: tuple) -> tuple:
    """A watched launch's plan, capped at the registers of the same launch without watch (rounded up
    to the allocation unit, 8) when the checks' rare path (run only when something is found) would
    otherwise raise the kernel's count so far that a grid the unwatched kernel runs in one wave of
    resident programs takes more: at B = 8, H = 32, fp32 state on an H100, 4,096 programs, one wave
    at 64 registers, two at 70 (+1.5-2.2 µs a call; capped, +0.7). Many waves either way (B = 256),
    the cap only spills: it measured 10 % slower there. Compiles both kernels once (Triton caches
    them) to read their counts; anything unexpected keeps the plan as it is."""
    plain = _plans.get((*pkey[:-1], False)) or _plan((*pkey[:-1], False))
    grid, constexprs, options, _, kernel = plan
    if kernel is not None or plain[4] is not None or "maxnreg" in options:
        return plan
    try:
        counts = []
        for g, c, o in ((plain[0], plain[1], plain[2]), (grid, constexprs, options)):
            compiled = _packed_decode_kernel.warmup(*args, *c, grid=g, **o)
            compiled._init_handles()
            counts.append(int(compiled.n_regs))
        sms = torch.cuda.get_device_properties(args[5].device).multi_processor_count
    except Exception:
        return plan
    programs, warps = grid[0] * grid[1] * grid[2], options.get("num_warps", 4)
    if not 0 < counts[0] <= 255 or _waves(counts[0], warps, programs, sms) != 1 or _waves(
            counts[1], warps, programs, sms) == 1:
        return plan
    return _keep(pkey, grid, constexprs, {**options, "maxnreg": min(255, -(-counts[0] // 8) * 8)}, kernel)


def _waves(registers: int, warps: int, programs: int, sms: int) -> int:
    """Waves of resident programs a grid takes (a Hopper SM: 64K registers, 64 warps, 32 programs)."""
    per_warp = -(-registers // 8) * 8 * 32
    resident = max(1, min(65536 // (per_warp * warps), 64 // warps, 32))
    return -(-programs // (resident * sms))


def _misaligned_plan(pkey: tuple, state: Tensor) -> tuple:
    """The plan of a call whose pool the shared-memory KV tile cannot copy (its base address):
    auto's shape without that tile; an explicit config asking for it is refused."""
    from . import triton_kv_shared

    config = pkey[-2]
    if config is not None:
        raise ConfigUnsupported(f"{config} cannot run here: {triton_kv_shared.misaligned(state)}")
    dims, state_dtype, state_layout, gdn, gpu = pkey[0], pkey[5], pkey[6], pkey[7], pkey[-3]
    fallback = pick_config(dims[0], dims[2], dims[4], state_dtype, state_layout, gdn=gdn, kv_shared=False,
                           device=_device_name(gpu))
    key = (*pkey[:-2], fallback, pkey[-1])
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
    (dims, s_qkv, s_a, s_b, s_state, state_dtype, state_layout, gdn, use_qk_l2norm, bounded, counted, gpu, config,
     watched) = pkey
    batch, num_heads, num_v_heads, head_k_dim, head_v_dim, _ = dims
    device_name = _device_name(gpu)  # the card's table (pick_config's device)
    cfg = config if config is not None else pick_config(batch, num_v_heads, head_v_dim, state_dtype, state_layout,
                                                        gdn=gdn, device=device_name, kv_shared=not watched)
    if watched and (cfg.kv_shared or cfg.kv_registers):  # (the watch checks are in this kernel only)
        raise ValueError(f"{cfg} cannot run with watch=: only the Triton kernel's own tiles make the checks")
    if watched and state_layout == "KV" and cfg.kv_chunk:  # (whole tiles in registers: a narrower one)
        cfg = cfg._replace(block_v=min(cfg.block_v, 32))
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
            raise ConfigUnsupported(f"{config} cannot run here: {why}")
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
    chunked = state_layout == "KV" and cfg.kv_chunk and not watched  # (watch checks whole tiles)
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
        min(cfg.kv_chunk, bk) if chunked else 0,
        cfg.act_eviction if cfg.v_eviction is None else cfg.v_eviction,  # V_EVICTION
        0 if gdn else 1,  # GATE_STRIDE
        gdn,  # ROUND_BETA
        cfg.kv_first_eviction,  # KV_FIRST_EVICTION
        cfg.fused_output and not chunked,  # FUSED_OUTPUT
        cfg.early_load and not chunked,  # EARLY_LOAD
        watched,  # WATCH
    )
    options = {"num_warps": cfg.num_warps}
    if cfg.max_registers is not None:
        options["maxnreg"] = cfg.max_registers
    return _keep(pkey, grid, constexprs, options, None)  # None: _packed_decode_kernel, read at launch


def _plan_kv_shared(pkey: tuple, cfg: DecodeConfig) -> tuple:
    """The launch of the shared-memory KV tile (``triton_kv_shared``): same runtime arguments."""
    from . import triton_kv_shared

    dims, s_qkv, s_a, s_b, s_state, state_dtype, _, gdn, use_qk_l2norm, bounded, counted, _, _, _ = pkey
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

_N_RUNTIME_ARGS = 15
_N_CONSTEXPRS = 34  # the Triton kernel's (the shared-memory KV kernel has its own count)
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


def _launch_key(args: tuple, plan_id: int, ptrs: tuple | None = None) -> tuple | None:
    """The specialization key of a launch: the device, the plan (constexprs and options, by
    :func:`_plan`'s id), each pointer's dtype and 16-byte alignment, and each int's
    :func:`_int_spec` (floats are never specialized). None when the fast launch cannot be used."""
    env = _fast_launch["env"]
    if env is None:
        env = _bind_launch_env()
        if env is None:
            return None
    q, a, b, A, d, s, o, i, c, ws, wh = args[:11]
    p = ptrs if ptrs is not None else tuple(map(Tensor.data_ptr, args[:11]))
    return (
        env[0](),
        plan_id,
        q.dtype, a.dtype, b.dtype, A.dtype, d.dtype, s.dtype, o.dtype, i.dtype, c.dtype, ws.dtype, wh.dtype,
        (p[0] | p[1] | p[2] | p[3] | p[4] | p[5] | p[6] | p[7] | p[8] | p[9] | p[10]) & 15 == 0
        or tuple([(x & 15) == 0 for x in p]),
        args[11] > 0x7FFFFFFF,  # (the serial: never specialized on its value, but i32 or i64)
        _int_spec(args[14]),
    )


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


def _remember(key: tuple, compiled: Any, n_constexprs: int) -> None:
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
