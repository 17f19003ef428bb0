"""How a constant-result function's arguments cross from dynamo's trace into plain Python.

Dynamo hands a constant-result function (see :func:`.marks.mark_constant_result`)
only values it can turn into constants one by one: a tensor, a plain constant, an object (torch
2.13). A list, tuple or dict is a constant only when everything in it is one, so a list of
tensors, a tuple of symbolic sizes (``tuple(x.shape)`` under ``dynamic=True``), a dict of
objects or a NamedTuple holding a tensor would stop the trace. The stand-in dynamo traces
therefore takes containers apart (:func:`flatten`, traced): each leaf crosses on its own, the
layout crosses as a constant of nested tuples, and :func:`rebuild` puts the same containers
together again on the other side, holding the real leaves.

Flattened: lists, tuples (NamedTuples and ``torch.Size`` rebuilt as their own class), dicts and
OrderedDicts (keys are leaves too), and those inside them. Anything else is a leaf.

Example::

    leaves = []
    layout = flatten([x, (3, y)], leaves)       # ("seq", list, (0, ("seq", tuple, (1, 2))))
    rebuild(layout, leaves)                     # [x, (3, y)]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

#: a layout: a leaf's index, ("seq", class, items) or ("map", class, keys, values)
Layout = Any

_SEQUENCE, _MAPPING = "seq", "map"


def flatten(value: Any, leaves: list[Any]) -> Layout:
    """``value``'s layout, appending its leaves to ``leaves`` (traced by dynamo: only builtins it
    models, and no guard on anything but the containers' lengths and the leaves' types)."""
    if isinstance(value, (list, tuple)) and (type(value) in (list, tuple) or _rebuildable(type(value))):
        return _SEQUENCE, type(value), tuple(flatten(v, leaves) for v in value)
    if type(value) in (dict, OrderedDict):
        keys = tuple(flatten(k, leaves) for k in value)
        return _MAPPING, type(value), keys, tuple(flatten(v, leaves) for v in value.values())
    leaves.append(value)
    return len(leaves) - 1


def _rebuildable(cls: type) -> bool:
    """A tuple class that :func:`rebuild` makes from its items: a NamedTuple, ``torch.Size``."""
    return cls is torch.Size or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


def rebuild(layout: Layout, leaves: list[Any] | tuple[Any, ...]) -> Any:
    """The value :func:`flatten` took apart, holding ``leaves`` (plain Python, at trace time)."""
    if isinstance(layout, int):
        return leaves[layout]
    if layout[0] == _SEQUENCE:
        _, cls, items = layout
        values = [rebuild(i, leaves) for i in items]
        if cls is list:
            return values
        return cls(*values) if hasattr(cls, "_fields") else cls(values)
    _, cls, keys, items = layout
    return cls(zip([rebuild(k, leaves) for k in keys], [rebuild(v, leaves) for v in items], strict=True))
