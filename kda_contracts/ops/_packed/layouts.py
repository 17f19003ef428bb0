"""The state layouts of a packed linear-attention pool and how a call declares its own: the
layout cannot be told from shapes when K == V, so it is declared (``state_layout=`` or the
config's), never guessed. And the dims every packed op binds, in the kernels' order.

Example::

    resolve = layout_resolver("packed_decode")
    resolve(None, None), resolve(None, "KV")     # ('VK', 'KV')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ..._engine import LayoutError, Violation, raise_violations

Layout = Literal["VK", "KV"]
LAYOUTS: tuple[Layout, ...] = ("VK", "KV")
SYMBOLS = ("B", "H", "HV", "K", "V", "N")  # the dims both layouts bind, in this order (kda_kernels' DecodeDims)


def layout_resolver(function: str) -> Callable[[Any, str | None], Layout]:
    """The ``variant=`` of a packed-decode op named ``function`` (KDA's, GDN's): the declared state
    layout of a call — ``state_layout=``, else the config's, else "VK"; a value other than VK/KV,
    or a keyword that contradicts the config, is a LayoutError naming ``function``."""

    def resolve_layout(config: Any, state_layout: str | None) -> Layout:
        """The declared state layout: `state_layout=`, else the config's, else "VK" (never guessed from shapes)."""
        cfg_layout = getattr(config, "state_layout", None)
        if state_layout is None:
            return cfg_layout or "VK"
        if state_layout not in LAYOUTS:
            raise_violations(function, [Violation(
                LayoutError, "state_layout", "'VK' or 'KV' (or None: the config's, else 'VK')", repr(state_layout))],
                {}, {})
        if cfg_layout is not None and cfg_layout != state_layout:
            raise_violations(function, [Violation(
                LayoutError, "state_layout", f"{cfg_layout!r} (config state_layout)", repr(state_layout),
                hint="pass one source of truth: drop state_layout= or fix the config")], {}, {})
        return state_layout  # type: ignore[return-value]

    resolve_layout.__qualname__ = "resolve_layout"  # what the docs show, not the factory's <locals>
    return resolve_layout
