"""SVG pictures of GDN packed decode, drawn from a :class:`~kda_contracts.GDNConfig`.

GDN's packed ``mixed_qkv`` row and its state pool are KDA's, so those pictures are KDA's own
(:func:`~kda_contracts.ops.packed_decode.diagrams.mixed_qkv_svg` and ``state_pool_svg`` take any
config of the family and draw GVA, ``HV = 2H``, as it is). What GDN draws itself is where it
differs: :func:`gate_svg`, one request's gate — GDN's ``a`` ``[B, HV]`` (one logit per value
head, one scalar decay for the whole ``V×K`` slot matrix) against KDA's ``[B, HV*K]`` (one per
key channel, a decay per column) — on one column scale, with ``dt_bias`` beside it.

Example::

    >>> from kda_contracts import GDNConfig
    >>> "a[b]: HV = 32 logits" in gate_svg(GDNConfig.preset("qwen3-next-80b-a3b"))
    True
"""

from __future__ import annotations

from .._packed.config import KDAConfig
from .._packed.svg import COLORS, STROKE, Svg, group_heads

_LEFT, _BAR_W = 30, 920
_GDN, _KDA = "#b03030", "#2a5db0"


def _gate_rows(svg: Svg, HV: int, K: int) -> None:
    """KDA's row of HV*K logits and GDN's row of HV on one column scale, then GDN's zoomed K times."""
    head_w = _BAR_W / HV
    g, every = group_heads(HV, head_w, 3.0), group_heads(HV, head_w, 26.0)
    svg.text(_LEFT, 70, f"KDA (Kimi-Linear) a[b]: HV·K = {HV * K} logits, one per key channel (head hv: columns "
                        f"hv·K … hv·K+{K - 1})", 12, weight="bold", fill=_KDA)
    svg.rect(_LEFT, 78, _BAR_W, 30, COLORS["q"], _KDA, 1.5)
    svg.text(_LEFT, 140, f"GDN (Qwen3-Next) a[b] on the same scale: HV = {HV} logits, one per value head", 12,
             weight="bold", fill=_GDN)
    svg.rect(_LEFT, 148, max(head_w / K * HV, 1.5), 30, COLORS["hot"], _GDN, 1.5)
    svg.text(_LEFT + max(head_w / K * HV, 1.5) + 8, 167, f"← {HV} columns, {K}× narrower than KDA's row", 11,
             fill=_GDN)
    svg.text(_LEFT, 210, f"GDN's row zoomed {K}×: column hv is value head hv's gate logit", 12, fill=_GDN)
    svg.line(_LEFT, 178, _LEFT, 218, "#777777", 0.8, dash=True)
    svg.line(_LEFT + max(head_w / K * HV, 1.5), 178, _LEFT + _BAR_W, 218, "#777777", 0.8, dash=True)
    svg.rect(_LEFT, 218, _BAR_W, 30, COLORS["hot"], _GDN, 1.5)
    for y, stroke in ((78, _KDA), (218, _GDN)):
        for i in range(g, HV, g):
            svg.line(_LEFT + i * head_w, y, _LEFT + i * head_w, y + 30, stroke, 0.6)
        for i in range(0, HV, every):
            svg.text(_LEFT + (i + 0.5) * head_w, y + 43, str(i), 9, "middle", fill=stroke)
    svg.text(_LEFT + _BAR_W, 278, f"a KDA row read as GDN's yields its first {HV} columns (key channels of KDA "
                                  "head 0): wrong gates, and no error from a kernel without a contract", 10, "end",
             fill="#555555")


def _decay_matrices(svg: Svg, K: int, V: int) -> None:
    """What one gate value scales: GDN's whole V×K slot matrix, KDA's one column of it."""
    y, size = 318, 90
    for x, stroke, title, lines in (
            (_LEFT, _GDN, "GDN: g[b, hv] = −exp(A_log[hv]) · softplus(a[b, hv] + dt_bias[hv])",
             ["one scalar per value head:", f"S[hv] ← exp(g) · S[hv] (the whole {V}×{K} matrix)",
              "A_log [HV], dt_bias [HV], float32"]),
            (_LEFT + 470, _KDA, "KDA: g[b, hv, k] = gate(a[b, hv·K + k] + dt_bias[hv·K + k])",
             ["one value per key channel:", "S[hv][:, k] ← exp(g[k]) · S[hv][:, k] (column k)",
              "A_log [HV], dt_bias [HV·K], float32"])):
        svg.text(x, y - 14, title, 12, weight="bold", fill=stroke)
        if stroke == _GDN:
            svg.rect(x, y, size, size, COLORS["hot"], stroke, 1.5)
        else:
            for i in range(8):  # columns shaded one by one: a decay per key channel
                shade = ("#cfe2ff", "#b8d4fb", "#a3c6f7", "#8fb8f2")[i % 4]
                svg.rect(x + i * size / 8, y, size / 8, size, shade, stroke, 0.6)
        svg.text(x + size / 2, y + size + 14, f"V×K = {V}×{K}", 10, "middle")
        for j, text in enumerate(lines):
            svg.text(x + size + 16, y + 18 + 18 * j, text, 12)


def gate_svg(cfg: KDAConfig) -> str:
    """One request's gate for one rank of ``cfg``: GDN's ``a`` ``[B, HV]`` against KDA's
    ``[B, HV*K]``, and the state each gate value decays.

    Example::

        >>> "128× narrower" in gate_svg(GDNConfig.preset("qwen3-next-80b-a3b", tp_size=2))
        True
    """
    HV, K, V = cfg.local_num_v_heads, cfg.head_k, cfg.head_v
    svg = Svg(980, 470, f"GDN gate a [B, HV] vs KDA gate a [B, HV*K] (HV={HV}, K={K})")
    svg.text(_LEFT, 24, f"the gate: GDN's a is [B, HV] = [B, {HV}], KDA's is [B, HV·K] = [B, {HV * K}]", 15,
             weight="bold")
    svg.text(_LEFT, 42, f"HV={HV} value heads, K={K}, V={V} (one rank, tp_size={cfg.tp_size}); b (beta) is [B, HV] "
                        "in both ops; every other input has the same shape in both", 12)
    _gate_rows(svg, HV, K)
    _decay_matrices(svg, K, V)
    svg.text(_LEFT, 455, "KDA's [B, HV·K] given to GDN, or GDN's [B, HV] given to KDA, is a ShapeError whose fix "
                         "names the other op (errors.md: gdn-kda-shaped-a)", 12, fill=STROKE["v"])
    return svg.render()
