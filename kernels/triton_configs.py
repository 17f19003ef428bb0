"""Launch shapes of the Triton packed-decode kernel: :class:`DecodeConfig` (the knobs) and
:func:`pick_config` (the regime table measured on an H200 against sglang's Helion kernel, with the
rows another card measured differently on in that card's table, :data:`DEVICE_TABLES`; the figures
are in docs/benchmarks.md and docs/lab-notes.md). Pure Python: importable without triton.

Example::

    from kda_kernels.triton_configs import pick_config
    pick_config(1024, 32, 128, torch.bfloat16).guard   # 'mask'
    pick_config(8, 32, 128, torch.bfloat16, device="NVIDIA H100 80GB HBM3")   # the H100's table
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["DEVICE_TABLES", "ConfigUnsupported", "DecodeConfig", "TableRule", "pick_config", "picked_configs",
           "table_for"]


class ConfigUnsupported(ValueError):
    """An explicit ``config=`` this machine cannot run (its GPU, its pool's alignment, or the Triton
    interpreter); the message says why. A ``ValueError``, as every refused argument of the kernels."""


class DecodeConfig(NamedTuple):
    """Launch shape: each program does ``tiles`` tiles of ``block_v`` state rows, one after the
    other (software-pipelined ``num_stages`` deep when ``tiles`` > 1), with ``num_warps`` warps."""

    block_v: int
    num_warps: int
    tiles: int = 1
    num_stages: int = 1
    state_eviction: str = "evict_first"
    #: "branch": an out-of-range program skips the pool in an ``if``; "mask": every program runs
    #: the same code and the pool load/store are masked off (the address uses slot 0), so the
    #: state load can issue as soon as the index arrives. Both touch no pool byte for a bad index.
    guard: str = "branch"
    #: cache modifiers of the state load (``""`` or ``".cg"``) and store (``""`` or ``".cs"``)
    load_cache: str = ""
    store_cache: str = ""
    #: program order. "flat": a 1-D grid, request-major, then value head, then V tile (ids split
    #: by integer division); "v_fastest": a 3-D grid (V tile, head, request); "head_fastest": a
    #: 3-D grid (head, V tile, request); "grouped": 1-D, within a request heads in groups of 16
    #: fastest, then V tile, then head group (HV % 16 == 0, else "flat"). 3-D grids need
    #: B <= 65535 (else "flat" is used).
    grid: str = "flat"
    #: eviction hint of the state store (None: the same as ``state_eviction``)
    store_eviction: str | None = None
    #: register cap per thread (ptxas maxrregcount), or None. Fewer registers let more programs
    #: reside per SM, but the spills cost more: on the H200 a 16-row bf16 tile (128 registers)
    #: capped at 96 ran 13% slower at B=1024, at 80 20% slower. Kept for tuning; the table uses none.
    max_registers: int | None = None
    #: eviction hint for the activation loads (q, k, v, gate inputs): "" or "evict_last" (each is
    #: read by every V tile of its head, while the state streams past once)
    act_eviction: str = ""
    #: eviction hint for the v loads (None: ``act_eviction``). Unlike q, k and the gate inputs, each v
    #: element is read by one program only.
    v_eviction: str | None = None
    #: KV layout only, when > 0: the ``[K, block_v]`` tile is worked in two passes over chunks of this
    #: many K rows (sums first, then the update, reading each chunk again from L2), so a tile as wide
    #: as V (whole cache lines) needs few registers. ``tiles`` and the load cache
    #: modifier do not apply.
    kv_chunk: int = 0
    #: chunked KV tile only: eviction hint of the first pass's loads (the second pass reads each
    #: chunk again, from L2 while it is still there)
    kv_first_eviction: str = "evict_last"
    #: KV layout only: the whole ``[K, block_v]`` tile is copied to shared memory (``cp.async``) and
    #: read from there twice, sums then update, in chunks of ``kv_chunk`` rows (a Gluon kernel,
    #: ``triton_kv_shared.py``; CUDA sm_80+, not under the Triton interpreter). Several warps sit
    #: side by side along V. The state hints are ``state_eviction`` (the copy) and ``store_eviction``,
    #: the activations' ``act_eviction``; ``tiles``, ``num_stages``, ``guard``, ``grid``, the cache
    #: modifiers, ``v_eviction``, ``kv_first_eviction`` and ``max_registers`` do not apply.
    kv_shared: bool = False
    #: each tile's output rows from the decayed tile, ``h q + u (k . q)``, so the two sums over K read
    #: the loaded tile side by side (otherwise the output is summed from the updated tile, after the
    #: first sum and the update). Same result to rounding. The updated tile is then stored before the
    #: output rows, so its stores go out while the output's sum is still reduced across lanes. Not for
    #: the chunked or shared-memory KV tiles, which already work that way.
    fused_output: bool = False
    #: the state tile's load issued right after the slot index, before the gate and norm math (which
    #: wait on the q, k and gate loads), so the two memory latencies overlap instead of adding up.
    #: One tile per program only (``tiles`` 1); not for the chunked or shared-memory KV tiles.
    early_load: bool = False
    #: KV layout only: the whole ``[K, block_v]`` tile held in registers by the Gluon kernel of
    #: ``kv_shared`` (no shared memory): each lane holds a run of adjacent K rows and loads the q, k and
    #: gate values of those rows itself, so the two sums over K need no layout conversion (a Triton
    #: kernel moves those K-vectors between lanes through shared memory, with barriers). Sums side by
    #: side, as ``fused_output``. CUDA only, not under the Triton interpreter, and at most 128 state
    #: elements per thread (``K * block_v / (32 * num_warps)``; more would spill); the hints are as for
    #: ``kv_shared`` (``state_eviction``, ``store_eviction``, ``act_eviction``), the rest do not apply.
    #: Not with ``kv_shared``. Measured and not picked: on the H200 at B <= 64, the best of seven shapes
    #: per row against the Triton KV pick, 2.4 % faster in 1 of 36 rows, level to 26 % slower in the
    #: rest (docs/lab-notes.md).
    kv_registers: bool = False


class TableRule(NamedTuple):
    """One row of a device's table (:data:`DEVICE_TABLES`): a call whose state width, value heads and
    batch fall in these inclusive ranges (and whose op and layout match) takes ``config`` instead of
    the H200 regime table's shape."""

    wide_state: bool  #: fp32 state (True) or 16-bit state (False)
    num_v_heads: tuple[int, int]
    batch: tuple[int, int]
    config: DecodeConfig
    layout: str = "VK"
    gdn: bool = False

    def matches(self, batch: int, num_v_heads: int, wide_state: bool, layout: str, gdn: bool) -> bool:
        return (self.wide_state == wide_state and self.layout == layout and self.gdn == gdn
                and self.num_v_heads[0] <= num_v_heads <= self.num_v_heads[1]
                and self.batch[0] <= batch <= self.batch[1])


#: Per-device tables: the rows where a card's measurements chose another launch shape than the H200
#: regime table of :func:`pick_config` (the first matching rule wins; no rule: the regime table).
#: A GPU takes the table whose name, upper case, is in its name (``torch.cuda.get_device_name()``
#: upper case, letters and digits only; the longest such name wins): "h100" for every H100 (SXM,
#: PCIe, NVL), "h200" for the H200 and GH200. "h200" and "default" (any other card) are the regime
#: table itself. A card's rows come from ``python benchmarks/device_table.py --write`` run on it
#: (docs/kernels.md), which rewrites the block between the two marker lines below.
DEVICE_TABLES: dict[str, tuple[TableRule, ...]] = {
    "h200": (),
    "default": (),
    # BEGIN GENERATED TABLES (benchmarks/device_table.py --write)
    # (a --write for this card replaces the whole entry: the rules after "added" below, and the upper bound
    # of the H=4 float32 B=64 rule, cut to B=255 by hand, would have to be put back)
    "h100": (  # benchmarks/device_table.py on NVIDIA H100 80GB HBM3, 2026-12-06: 11 rules, then 4 added by hand
        # H=32 bfloat16 B=1: triton:m 1.076 / 1.345
        TableRule(False, (23, 65536), (1, 2), DecodeConfig(block_v=4, num_warps=1, guard='mask')),
        # H=32 bfloat16 B=8: triton:el 1.004 / 1.082
        TableRule(False, (23, 65536), (3, 22),
                  DecodeConfig(block_v=16, num_warps=1, guard='mask', act_eviction='evict_last', early_load=True)),
        # H=16 bfloat16 B=1: triton:m 1.192 / 1.436
        TableRule(False, (9, 22), (1, 2), DecodeConfig(block_v=4, num_warps=1, guard='mask')),
        # H=4 bfloat16 B=1: triton:m 1.150 / 1.225
        TableRule(False, (1, 8), (1, 2), DecodeConfig(block_v=4, num_warps=1, guard='mask')),
        # H=4 bfloat16 B=8: triton:m 1.070 / 1.178
        TableRule(False, (1, 8), (3, 22), DecodeConfig(block_v=4, num_warps=1, guard='mask')),
        # H=32 float32 B=1: triton:flat 1.123 / 1.218
        TableRule(True, (23, 65536), (1, 2), DecodeConfig(block_v=4, num_warps=1, guard='mask', fused_output=True)),
        # H=32 float32 B=8: triton:el 1.205 / 0.995
        TableRule(True, (23, 65536), (3, 22),
                  DecodeConfig(block_v=8, num_warps=1, fused_output=True, early_load=True)),
        # H=16 float32 B=1: triton:flat 1.182 / 1.280
        TableRule(True, (9, 22), (1, 2), DecodeConfig(block_v=4, num_warps=1, guard='mask', fused_output=True)),
        # H=4 float32 B=1: triton:r2 1.201 / 1.347
        TableRule(True, (1, 8), (1, 2),
                  DecodeConfig(block_v=2, num_warps=1, guard='mask', grid='v_fastest', fused_output=True)),
        # H=4 float32 B=8: triton:flat 1.111 / 1.233
        TableRule(True, (1, 8), (3, 22), DecodeConfig(block_v=4, num_warps=1, guard='mask', fused_output=True)),
        # H=4 float32 B=64: triton:el 1.163 / 1.001 (up to B=255 by hand; --write gave it every larger B)
        TableRule(True, (1, 8), (23, 255),
                  DecodeConfig(block_v=8, num_warps=1, fused_output=True, early_load=True)),
        # added 2026-12-06 from one-row sweeps on the same card (not --write: they keep the rules above)
        # H=16 bfloat16 B=64: triton:m-cg 0.985 / 1.002 (the pick: 0.979 / 1.018);
        # device_table.py --warm 14 --heads 16 --batches 64 --states bfloat16
        TableRule(False, (9, 22), (23, 128), DecodeConfig(block_v=16, num_warps=1, guard='mask', load_cache='.cg')),
        # H=4 float32 B=256: triton:m 0.998 / 0.998 (the pick, el from B=64 up: 0.993 / 0.990); B=1024:
        # triton:base, the regime table's shape at H=4, 0.997 / 0.999 (el: 0.983 / 0.983), taken for every
        # HV <= 8 (the regime table's own pick varies with B*HV; only H=4 was measured); session 4,
        # decode.py --candidates --warm 14 --heads 4 --batches 256,1024 --states float32 --no-kv --no-eager
        TableRule(True, (1, 8), (256, 1023),
                  DecodeConfig(block_v=8, num_warps=1, guard='mask', fused_output=True, early_load=True)),
        TableRule(True, (1, 8), (1024, 1073741824),
                  DecodeConfig(block_v=8, num_warps=1, state_eviction='', guard='mask', act_eviction='evict_last',
                               fused_output=True)),
        # GDN, float32, B >= 256 (H=16 and 8, HV=2H): triton:r32 1.000-1.005 / sglang-triton on all 8 rows
        # (the pick: 0.991-1.001); decode.py --op gdn --candidates --heads 16,8 --batches 256,1024 --states float32
        TableRule(True, (1, 1073741824), (129, 1073741824),
                  DecodeConfig(block_v=32, num_warps=1, state_eviction='', guard='mask', grid='flat',
                               act_eviction='evict_last'), gdn=True),
    ),
    # END GENERATED TABLES
}


def table_for(device: str | None) -> str:
    """The table a device takes: ``device`` is a table name (``"h100"``), a GPU's name as
    ``torch.cuda.get_device_name()`` gives it, or None (``"default"``).

    Example::

        table_for("NVIDIA H100 80GB HBM3")   # 'h100'
        table_for("NVIDIA A100-SXM4-80GB")   # 'default'
    """
    if device is None:
        return "default"
    if device in DEVICE_TABLES:
        return device
    name = _alnum(device)
    named = sorted((t for t in DEVICE_TABLES if t != "default"), key=len, reverse=True)
    return next((table for table in named if _alnum(table) in name), "default")


def _alnum(name: str) -> str:
    return "".join(c for c in name.upper() if c.isascii() and c.isalnum())


def pick_config(
    batch: int, num_v_heads: int, head_v_dim: int, state_dtype: torch.dtype, state_layout: str = "VK",
    *, gdn: bool = False, kv_shared: bool = True, device: str | None = None,
) -> DecodeConfig:
    """The launch shape for a call (measured on an H200 with K = V = 128; no runtime autotuning).
    ``device`` (a GPU's name or a table name, see :func:`table_for`) selects the card's table: its
    rules (:data:`DEVICE_TABLES`) first, then the regime table below, which every card shares.

    VK: one-warp programs won at every batch size: a single warp keeps every reduction in shuffles
    (no shared-memory round trips or barriers), and many small programs keep enough loads in
    flight. fp32 state: 4 rows (2 KB) while B * HV < 4096, then 8 rows with no hint on the state and
    evict_last on the activations; KDA from B * HV = 128 to 1024 8 rows, request-major, branch guard,
    fused output (its tile stored before the output rows, so the stores need not wait for the
    output's sum): side by side on the H200 against sglang's Helion kernel, hot / cold, H=4 B=64
    0.966 / 0.991 -> 1.147 / 1.018, H=32 B=8 0.985 / 1.000 -> 1.184 / 1.009, H=16 B=8 1.027 / 1.043
    -> 1.172 / 1.061, H=4 B=256 1.016 / 1.008 -> 1.022 / 1.016; at 2048 and at 32 it lost.
    16-bit state: 16 rows (4 KB); when that leaves fewer than ~1024
    programs (B * HV < 128 at V = 128) the tile shrinks to 8 or 4 rows so that small batches still
    spread over all 132 SMs; from B * HV = 4096 the masked guard, no hint on the state, q, k and the
    gate inputs kept in L2 (evict_last; not v, each v element is read once), request-major order
    (side by side on the H200, 2-6% faster than groups of 16 heads first with the branch guard at
    B * HV >= 16384, 0.5-1.3% at 8192, level at 4096); below 4096 the activations are kept in L2
    (evict_last), or at B * HV < 1024 with HV < 16 the state is read through L2 only (.cg).
    Measured per regime against sglang's Helion kernel: see docs/kernels.md and docs/lab-notes.md.
    KDA with fp32 state sums each tile's output from the decayed tile (``fused_output``): side by
    side on the H200 over the 30 fp32 VK rows (H 32/16/4, B 1-1024, hot and cold) against sglang's
    Helion kernel, 0.977-1.254x -> 0.980-1.281x: +0-0.7 % at B >= 256 (H=16 B=256 0.989 -> 0.994),
    +0-2.3 % at B = 1, -1.4 to +2.8 % at B = 8 and 64; with 16-bit state it lost up to 2.4 % at
    B >= 256, and with the tile stored first it is level with the unfused shape (side by side, 18
    rows at B <= 64: +0-2.6 % hot, -0.5 to -2.5 % cold), so it is not taken there. GDN keeps the
    shapes it was measured with (no fused output).
    KV (contiguous along V): tiles of 16 to 64 V columns (whole lines per row), wider as the batch
    grows (KDA with fp32 state up to B * HV = 256 with ``fused_output``: KV / the same VK pick
    0.83-1.00 -> 0.85-1.02 at B = 1, -0.7 to +2.8 % at B * HV 128-256; with 16-bit state it lost
    10-15 %); 16-bit state from B * HV = 1024 in two passes over 32-row chunks of a full-width
    (V = 128: 256-byte) tile with no hint on the first pass's loads. Side by side on the H200 (bf16,
    three runs): from B * HV = 8192, 2-3.3% faster cold (0.7-2.7% hot) than the same tile with
    evict_last on the first pass (H=32 B=1024: 652-656 -> 639-640 µs; H=16 B=1024: 331-332 -> 322 µs);
    at 1024-4096, -0.4 to +5% cold (hot -3% to +28%) against 64 columns on two warps; at 512 level
    to 3.5% slower, so 64 columns on two warps stay below 1024. GDN, wherever the shared-memory tile
    below is not taken, keeps the earlier KV shapes (the chunked tile with evict_last from 8192):
    there, at B * HV = 4096, 64 columns on two warps measured 5% faster than the chunked tile.

    KV, where the shared-memory tile can run (``kv_shared``; the Triton backend falls back to
    ``kv_shared=False`` under the interpreter, before sm_80, with a Triton release other than the
    one it was timed with, or for a shape it cannot take): 16-bit state from
    B * HV = 2048, full-width (V = 128) tiles on two warps in 16-row chunks; fp32 state from 4096,
    64 columns (256-byte rows) on one warp. Side by side on the H200 (cold, KV / VK): bf16 H=32
    B=1024 0.867 -> 0.981, H=16 B=256 0.862 -> 0.944, H=32 B=64 0.850 -> 0.910; fp32 H=32 B=1024
    0.984 -> 0.996, H=4 B=1024 0.971 -> 0.978. Below those sizes it lost (fewer, longer programs).
    GDN (``gdn=True``) takes the same two shapes from half those sizes: 16-bit state from B * HV = 1024,
    fp32 from 2048 (H=16/HV=32 and H=8/HV=16, B = 64, 256, 1024, KV / VK against GDN's other KV
    shapes: bf16 0.79-0.85 -> 0.88-1.00, e.g. HV=32 B=1024 651 -> 558 µs, HV=16 B=64 cold 23.9 ->
    22.6 µs; fp32 0.6-1.2 % faster, level at B * HV = 1024).

    GDN (``gdn=True``, one gate per value head) with 16-bit state in VK: the same tiles with the
    masked guard (the branch guard measured 15-20% slower there from B * HV = 2048; for KDA, in
    the shape above, 0.6-4.5% from 4096): groups of 16 heads first with q, k and the gate kept in
    L2 from B * HV = 4096, else V tiles fastest. Measured on an H200 against sglang's Triton GDN
    kernel (docs/benchmarks.md).

    Example::

        pick_config(256, 32, 128, torch.float32)   # DecodeConfig(block_v=8, num_warps=1, ...)
    """
    limit = 1 << max(head_v_dim - 1, 0).bit_length()  # the V tile never exceeds next_pow2(V)
    work = batch * num_v_heads
    wide_state = state_dtype.itemsize >= 4
    for rule in DEVICE_TABLES.get(table_for(device), ()):
        if rule.matches(batch, num_v_heads, wide_state, state_layout, gdn) and (kv_shared or not rule.config.kv_shared):
            return rule.config._replace(block_v=min(rule.config.block_v, limit))
    if gdn and state_layout == "VK" and not wide_state:
        rows = 16
        while rows > 4 and work * -(-head_v_dim // rows) < 1024:
            rows //= 2
        if work >= 4096 and num_v_heads % 16 == 0:
            cfg = DecodeConfig(block_v=rows, num_warps=1, guard="mask", grid="grouped", state_eviction="",
                               act_eviction="evict_last", v_eviction="")
        else:
            cfg = DecodeConfig(block_v=rows, num_warps=1, guard="mask", grid="v_fastest")
        return cfg._replace(block_v=min(cfg.block_v, limit))
    if state_layout == "KV":
        # from where the shared-memory tile was measured faster: KDA from 4096 (fp32) / 2048 request-heads;
        # GDN, whose other KV shapes trail further, from 2048 / 1024
        if kv_shared and work >= (4096 if wide_state else 2048) // (2 if gdn else 1):
            if wide_state:
                cfg = DecodeConfig(block_v=64, num_warps=1, kv_chunk=16, kv_shared=True, state_eviction="")
            else:
                cfg = DecodeConfig(block_v=128, num_warps=2, kv_chunk=16, kv_shared=True, state_eviction="")
        elif work <= 32:
            cfg = DecodeConfig(block_v=16, num_warps=1, fused_output=wide_state and not gdn)
        elif work <= 256:
            cfg = DecodeConfig(block_v=32, num_warps=1, fused_output=wide_state and not gdn)
        elif wide_state:  # from 4096 request-heads the state load without a hint was 1-3% faster
            cfg = DecodeConfig(block_v=64, num_warps=4, state_eviction="" if work >= 4096 else "evict_first")
        elif work >= 1024 and not gdn:  # whole 256-byte rows in two passes of 32-row chunks, the first unhinted
            cfg = DecodeConfig(block_v=128, num_warps=1, kv_chunk=32, kv_first_eviction="")
        elif work >= 8192:  # GDN: the same tile, the first pass kept in L2 (evict_last)
            cfg = DecodeConfig(block_v=128, num_warps=1, kv_chunk=32)
        else:
            cfg = DecodeConfig(block_v=64, num_warps=2)
    elif wide_state:
        if not gdn and 128 <= work <= 1024:  # 8 rows, request-major, branch guard, tile stored first
            cfg = DecodeConfig(block_v=8, num_warps=1, fused_output=True)
        elif work < 4096:
            cfg = DecodeConfig(block_v=4, num_warps=1, guard="mask", grid="v_fastest", fused_output=not gdn)
        else:
            cfg = DecodeConfig(8, 1, state_eviction="", act_eviction="evict_last", guard="mask", fused_output=not gdn)
    else:
        rows = 16
        while rows > 4 and work * -(-head_v_dim // rows) < 1024:
            rows //= 2
        keep_acts: dict[str, Any] = dict(act_eviction="evict_last")
        if rows < 16:  # a few hundred programs: plain
            cfg = DecodeConfig(block_v=rows, num_warps=1)
        elif work >= 4096:
            # masked guard, no hint on the state, q, k and the gate inputs kept in L2 (not v: each v
            # element is read by one program only), request-major order
            cfg = DecodeConfig(block_v=rows, num_warps=1, guard="mask", state_eviction="",
                               act_eviction="evict_last", v_eviction="")
        elif work < 1024 and num_v_heads < 16:  # the state read through L2 only (.cg), masked guard
            cfg = DecodeConfig(block_v=rows, num_warps=1, guard="mask", load_cache=".cg")
        elif work < 1024:
            cfg = DecodeConfig(block_v=rows, num_warps=1, guard="mask", **keep_acts)
        else:
            cfg = DecodeConfig(block_v=rows, num_warps=1, **keep_acts)
    return cfg._replace(block_v=min(cfg.block_v, limit))


def picked_configs(head_v_dim: int = 128, device: str | None = None) -> list[DecodeConfig]:
    """Every launch shape :func:`pick_config` can choose at this V on ``device`` (a GPU's or a table's
    name), or with None on any card: every table's (for tests and device checks).

    Example::

        DecodeConfig(block_v=4, num_warps=1) in picked_configs()   # True
    """
    tables = list(DEVICE_TABLES) if device is None else [table_for(device)]
    found = {
        pick_config(batch, hv, head_v_dim, dtype, layout, gdn=gdn, kv_shared=kv_shared, device=table)
        for table in tables
        for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
        for hv in (1, 2, 4, 8, 12, 16, 32, 64, 96)
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for layout in ("VK", "KV")
        for gdn in (False, True)
        for kv_shared in (True, False)
    }
    # every rule's shape, also where no batch or head count above falls in its ranges
    found.update(rule.config._replace(block_v=min(rule.config.block_v, 1 << max(head_v_dim - 1, 0).bit_length()))
                 for table in tables for rule in DEVICE_TABLES.get(table, ()))
    return sorted(found, key=repr)
