"""SVG pictures of the packed-decode layouts, drawn from a :class:`~kda_contracts.KDAConfig`.

Plain SVG strings (no plotting dependency), deterministic for a given config, so the generated
docs can be checked for drift byte for byte (another op's pictures reuse :class:`Svg`, the
colours and :func:`group_heads`). Two pictures:

- :func:`mixed_qkv_svg`: one row of ``mixed_qkv``: q heads | k heads | v heads, every head
  boundary (or every g-th one when heads are too narrow to draw), column offsets, and how a
  column index decomposes (``h*K + d``).
- :func:`state_pool_svg`: the state pool, slot -> value heads -> one ``[V, K]`` (VK) or
  ``[K, V]`` (KV) matrix, with the contiguous (stride-1) axis marked and the strides spelled out.

Example::

    >>> from kda_contracts import KDAConfig
    >>> svg = mixed_qkv_svg(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2))
    >>> svg.startswith("<svg") and "16 heads" in svg
    True
"""

from __future__ import annotations



