"""Several rules' tests as one compiled function: what a walk asks of each tensor inside a
container or a result (the same test source each rule gives the generated checker, inlined once,
so a walk pays one call per tensor instead of one per rule).

Example::

    broken = first_broken((DtypeIn("x", frozenset({torch.float32})), SameDevice("x", "w")))
    broken(torch.zeros(2), torch.device("cpu"))   # -1: none broken; else the index of the first
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..source import define
from .tensor import Rule, Slots


def first_broken(rules: Sequence[Rule]) -> Callable[[Any, Any], int]:
    """``f(value, device) -> int``: the index of the first of ``rules`` that the tensor ``value``
    breaks, the call's device being ``device``, or -1. No config value and no other argument's
    dtype (what a tensor inside a container or a result has): the tests see None for both."""
    consts: dict[str, Any] = {}
    lines = ["def first_broken(value, device, config_value=None, other_dtype=None):", "    dtype = value.dtype"]
    if any("shape" in r.needs or "strides" in r.needs for r in rules):
        lines += ["    shape = tuple(value.shape)", "    strides = value.stride()"]
    for i, rule in enumerate(rules):
        own = rule.constants()
        consts.update({f"_c{i}_{k}": v for k, v in own.items()})
        lines += [f"    if {rule.test(Slots(constants={k: f'_c{i}_{k}' for k in own}))}:", f"        return {i}"]
    lines.append("    return -1")
    return define("\n".join(lines) + "\n", "<kda_contracts walk tests>", "first_broken", consts)  # type: ignore[no-any-return]
