"""The pictures packed linear-attention ops share: the packed ``mixed_qkv`` row and the state
pool in either layout, drawn as SVG for a config (:class:`Svg` is the small drawing helper).

Example::

    svg = state_pool_svg(KDAConfig.preset("kimi-linear-48b-a3b"), "VK")
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from .config import KDAConfig

_FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""


COLORS = {"q": "#cfe2ff", "k": "#d1f0d6", "v": "#ffe3c4", "slot": "#e9e4f7", "head": "#fff1b8", "hot": "#ffd0d0"}


STROKE = {"q": "#2a5db0", "k": "#2e8540", "v": "#b35c00"}


class Svg:
    """A tiny SVG builder (rectangles, lines, text): numbers are rounded to 0.1 px so output is
    stable across platforms."""

    def __init__(self, width: int, height: int, title: str) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = [f"<title>{escape(title)}</title>",
                                 f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']

    def rect(self, x: float, y: float, w: float, h: float, fill: str, stroke: str = "#333333",
             width: float = 1.0, dash: bool = False) -> None:
        extra = ' stroke-dasharray="4 3"' if dash else ""
        self.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="{_n(width)}"{extra}/>')

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#333333", width: float = 1.0,
             dash: bool = False, arrow: bool = False) -> None:
        extra = (' stroke-dasharray="4 3"' if dash else "") + (' marker-end="url(#arrow)"' if arrow else "")
        self.parts.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{stroke}" '
                          f'stroke-width="{_n(width)}"{extra}/>')

    def text(self, x: float, y: float, s: str, size: int = 12, anchor: str = "start", weight: str = "normal",
             fill: str = "#111111", rotate: bool = False) -> None:
        rot = f' transform="rotate(-90 {_n(x)} {_n(y)})"' if rotate else ""
        bold = ' font-weight="bold"' if weight == "bold" else ""
        self.parts.append(f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}" '
                          f'fill="{fill}"{bold}{rot} {_FONT}>{escape(s)}</text>')

    def render(self) -> str:
        defs = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#111111"/></marker></defs>')
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}">')
        return "\n".join([head, defs, *self.parts, "</svg>"]) + "\n"


def _n(x: float) -> str:
    r = round(x, 1)
    return str(int(r)) if r == int(r) else f"{r:.1f}"


def group_heads(n_heads: int, head_px: float, min_px: float) -> int:
    """The smallest power of two g such that g heads of ``head_px`` pixels span at least ``min_px``
    (draw every g-th head boundary when heads are too narrow to draw one by one)."""
    g = 1
    while g * head_px < min_px and g < n_heads:
        g *= 2
    return g


def mixed_qkv_svg(cfg: KDAConfig) -> str:
    """One row of ``mixed_qkv`` for one rank of ``cfg``: ``[q heads | k heads | v heads]``.

    Example::

        >>> "2·H·K + HV·V = 12288" in mixed_qkv_svg(KDAConfig.preset("kimi-linear-48b-a3b"))
        True
    """
    H, HV, K, V = cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v
    width = 2 * H * K + HV * V
    W, left, bar_w = 980, 30, 920
    px = bar_w / width
    svg = Svg(W, 300, f"mixed_qkv row: q | k | v heads (H={H}, HV={HV}, K={K}, V={V})")
    svg.text(left, 24, f"one row of mixed_qkv (one request): 2·H·K + HV·V = {width} columns", 15, weight="bold")
    svg.text(left, 42, f"H={H} q/k heads, HV={HV} value heads, K={K}, V={V} (one rank, tp_size={cfg.tp_size}); "
                       "last dim stride 1", 12)
    segments = (("q", H, K, 0), ("k", H, K, H * K), ("v", HV, V, 2 * H * K))
    y, h = 92, 40
    min_group_px = 0.0
    for name, n, d, start in segments:
        x0 = left + start * px
        seg_w = n * d * px
        svg.rect(x0, y, seg_w, h, COLORS[name], STROKE[name], 1.5)
        head_px = d * px
        # Draw every head boundary when heads are at least 3 px wide; otherwise every g-th one.
        g = group_heads(n, head_px, 3.0)
        min_group_px = max(min_group_px, g)
        for i in range(g, n, g):
            xb = x0 + i * head_px
            svg.line(xb, y, xb, y + h, STROKE[name], 0.6)
        # Head numbers under the bar, every `lab` heads (at least 26 px apart).
        lab = group_heads(n, head_px, 26.0)
        for i in range(0, n, lab):
            svg.text(x0 + (i + 0.5) * head_px, y + h + 13, str(i), 9, "middle", fill=STROKE[name])
        last = n - 1
        if name == "v" and last % lab and (last - last // lab * lab) * head_px >= 14:
            svg.text(x0 + (last + 0.5) * head_px, y + h + 13, str(last), 9, "middle", fill=STROKE[name])
        label = {"q": "q", "k": "k", "v": "v"}[name]
        sym = "H" if name != "v" else "HV"
        dsym = "K" if name != "v" else "V"
        svg.text(x0 + seg_w / 2, y - 22, f"{label}: {n} heads × {dsym}={d}", 13, "middle", "bold", STROKE[name])
        svg.text(x0 + seg_w / 2, y - 8, f"{sym}·{dsym} = {n * d} columns", 11, "middle", fill=STROKE[name])
    for col in (0, H * K, 2 * H * K, width):
        x = left + col * px
        svg.line(x, y + h, x, y + h + 34, "#111111", 1.2)
        svg.text(x, y + h + 46, str(col), 11, "middle")
    note = ("small numbers: head index within q / k / v; every head boundary drawn" if min_group_px <= 1
            else f"small numbers: head index; boundaries drawn every {int(min_group_px)} heads "
                 "(heads too narrow to draw one by one)")
    svg.text(W - 20, y + h + 64, note, 10, "end", fill="#555555")
    # The index rule, as a zoom on the first q head.
    zy = 228
    zx, zw = left, 300
    svg.rect(zx, zy, zw, 26, COLORS["q"], STROKE["q"], 1.2)
    for i in range(1, 16):
        svg.line(zx + i * zw / 16, zy, zx + i * zw / 16, zy + 26, STROKE["q"], 0.4)
    svg.text(zx + 4, zy + 17, "d = 0", 10)
    svg.text(zx + zw - 4, zy + 17, f"d = {K - 1}", 10, "end")
    svg.line(left, y + h, zx, zy, "#777777", 0.8, dash=True)
    svg.line(left + K * px, y + h, zx + zw, zy, "#777777", 0.8, dash=True)
    svg.line(zx, zy + 36, zx + zw, zy + 36, arrow=True)
    svg.text(zx + zw / 2, zy + 50, "stride 1", 10, "middle")
    svg.text(zx + zw + 24, zy + 8, "q head h = columns h·K … h·K+K−1 (column h·K + d);", 12)
    svg.text(zx + zw + 24, zy + 24, f"k head h starts at column H·K + h·K = {H * K} + h·{K};", 12)
    svg.text(zx + zw + 24, zy + 40, f"v head hv starts at 2·H·K + hv·V = {2 * H * K} + hv·{V};", 12)
    group = HV // H
    gva = ("HV = H: value head hv uses q/k head hv" if group == 1
           else f"GVA: value head hv uses q/k head hv // {group} (HV/H = {group})")
    svg.text(zx + zw + 24, zy + 56, gva, 12)
    return svg.render()


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 16) == 0:
            v = n / size
            return f"{v:g} {unit}"
    return f"{n} B"


def _draw_pool(svg: Svg, slot_size: int) -> float:
    """The pool column: N slots, slot s marked; returns the y of slot s."""
    px, py, pw, ph = 40, 86, 110, 26
    svg.text(px + pw / 2, py - 12, "pool: N slots", 12, "middle", "bold")
    labels = ["slot 0", "slot 1", "slot s", "⋮", "slot N−1"]
    for i, lab in enumerate(labels):
        yy = py + i * (ph + 6)
        if lab == "⋮":
            svg.text(px + pw / 2, yy + 18, lab, 16, "middle")
            continue
        svg.rect(px, yy, pw, ph, COLORS["hot"] if lab == "slot s" else COLORS["slot"], width=1.2)
        svg.text(px + pw / 2, yy + 17, lab, 11, "middle")
    svg.text(px + pw / 2, py + 5 * (ph + 6) + 10, "slot stride: free", 11, "middle")
    svg.text(px + pw / 2, py + 5 * (ph + 6) + 25, f"(≥ HV·V·K = {slot_size})", 10, "middle", fill="#555555")
    return py + 2 * (ph + 6)


def _draw_slot(svg: Svg, HV: int, head_size: int, slot_y: float) -> tuple[float, float, float, float, int]:
    """Slot s as HV head boxes, linked to the pool; returns (x, y, height, head width, heads per box)."""
    px, pw, ph = 40, 110, 26
    sx, sy, sw, sh = 210, 136, 330, 34
    svg.line(px + pw, slot_y, sx, sy, "#777777", 0.8, dash=True)
    svg.line(px + pw, slot_y + ph, sx, sy + sh, "#777777", 0.8, dash=True)
    svg.text(sx + sw / 2, sy - 26, f"slot s: HV = {HV} heads, one after another", 12, "middle", "bold")
    svg.text(sx + sw / 2, sy - 11, f"head stride V·K = {head_size}", 11, "middle")
    head_w = sw / HV
    g = group_heads(HV, head_w, 9.0)
    for i in range(0, HV, g):
        w = head_w * min(g, HV - i)
        svg.rect(sx + i * head_w, sy, w, sh, COLORS["hot"] if i == 0 else COLORS["head"], width=0.8)
    every = group_heads(HV, head_w, 26.0)
    for i in range(0, HV, every):
        svg.text(sx + (i + 0.5) * head_w, sy + sh + 13, str(i), 9, "middle")
    if g > 1:
        svg.text(sx + sw / 2, sy + sh + 28, f"(boxes of {g} heads)", 10, "middle", fill="#555555")
    return sx, sy, sh, head_w, g


def _draw_head(svg: Svg, slot: tuple[float, float, float, float, int], rows_sym: str, cols_sym: str, rows: int,
               cols: int) -> None:
    """One head's rows x cols matrix, the stride-1 axis along the rows, linked to its slot box."""
    sx, sy, sh, head_w, g = slot
    scale = 180 / max(rows, cols)
    mw, mh = cols * scale, rows * scale
    mx, my = 740, 120
    svg.line(sx, sy + sh, mx, my + mh, "#777777", 0.8, dash=True)
    svg.line(sx + head_w * g, sy, mx, my, "#777777", 0.8, dash=True)
    svg.rect(mx, my, mw, mh, COLORS["head"], width=1.5)
    n_strips = 8
    for i in range(1, n_strips):
        svg.line(mx, my + i * mh / n_strips, mx + mw, my + i * mh / n_strips, "#b8a25a", 0.6)
    svg.rect(mx, my, mw, mh / n_strips, COLORS["hot"], "#b03030", 1.2)
    svg.text(mx + mw / 2, my - 30, f"state[s, hv]: a {rows_sym}×{cols_sym} = {rows}×{cols} matrix", 12, "middle",
             "bold")
    svg.line(mx, my - 12, mx + mw, my - 12, "#b03030", 1.6, arrow=True)
    svg.text(mx + mw / 2, my - 16, f"contiguous: {cols_sym} (stride 1)", 11, "middle", fill="#b03030")
    svg.line(mx - 10, my, mx - 10, my + mh, "#111111", 1.0, arrow=True)
    svg.text(mx - 16, my + mh / 2 - 4, f"{rows_sym} = {rows} rows", 11, "end")
    svg.text(mx - 16, my + mh / 2 + 10, f"row stride {cols_sym} = {cols}", 11, "end")
    svg.text(mx + mw / 2, my + mh + 16, f"red: one row = {cols_sym} = {cols} elements, adjacent in memory", 10,
             "middle", fill="#b03030")


def state_pool_svg(cfg: KDAConfig, layout: str) -> str:
    """The state pool in ``layout`` ("VK" or "KV"): slot -> HV heads -> one matrix per head.

    Example::

        >>> "contiguous: K" in state_pool_svg(KDAConfig.preset("kimi-linear-48b-a3b"), "VK")
        True
    """
    if layout not in ("VK", "KV"):
        raise ValueError(f"layout must be 'VK' or 'KV', got {layout!r}")
    HV, K, V = cfg.local_num_v_heads, cfg.head_k, cfg.head_v
    rows_sym, cols_sym = ("V", "K") if layout == "VK" else ("K", "V")
    rows, cols = (V, K) if layout == "VK" else (K, V)
    dims = "[N, HV, V, K]" if layout == "VK" else "[N, HV, K, V]"
    who = "sglang's layout, the default" if layout == "VK" else "flash-linear-attention's default"
    state_dtype = cfg.state_dtype or "float32"
    elt = {"float32": 4, "bfloat16": 2, "float16": 2}[state_dtype]
    svg = Svg(980, 400, f"state pool, {layout} layout {dims}")
    svg.text(30, 24, f"initial_state {dims}: {layout} layout ({who})", 15, weight="bold")
    svg.text(30, 42, f"HV={HV}, K={K}, V={V} (one rank, tp_size={cfg.tp_size}); slot s = ssm_state_indices[b]; "
                     f"one slot = HV·V·K = {HV * V * K} elements ({_fmt_bytes(HV * V * K * elt)} in {state_dtype})",
             12)
    slot = _draw_slot(svg, HV, V * K, _draw_pool(svg, HV * V * K))
    _draw_head(svg, slot, rows_sym, cols_sym, rows, cols)
    idx = "s·slot_stride + hv·V·K + v·K + k" if layout == "VK" else "s·slot_stride + hv·K·V + k·V + v"
    elem = "state[s, hv, v, k]" if layout == "VK" else "state[s, hv, k, v]"
    svg.text(30, 346, f"element {elem} is at offset {idx}", 12)
    if layout == "VK":
        use = "the kernel reads S as V×K (S·k and S·q reduce along the contiguous K)"
    else:
        use = "the kernel reads S transposed (S[k, v]); the update u ⊗ k writes rows of length V"
    svg.text(30, 364, use, 12)
    svg.text(30, 382, "inner 3 dims must be dense (Spec(inner_contiguous=3)): a transposed or sliced view is "
                      "rejected with a LayoutError", 12)
    return svg.render()
