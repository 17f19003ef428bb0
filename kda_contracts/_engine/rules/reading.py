"""Reading a call's value rules (:mod:`kda_contracts._engine.rules.values`): their probes
(:func:`probes`, no sync), strict mode's one read of them all (:func:`read_rules`) and the
wording of what a probe found (:func:`describe`). A rule of one's own (a subclass of
kc.ValueRule) is guarded: a ``_probe`` or ``words`` that raises or gives back the wrong kind is a
BackendError naming it (:mod:`kda_contracts._engine.rules.declared`).

Example::

    violations, host = read_rules(contract.spec.value_rules, values, dims, host_copies=True, name="f")
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import Violation
from .declared import guarded_probe, guarded_violation
from .values import (
    HOST_COPY_MAX,
    Distinct,
    EndsAt,
    Finite,
    FiniteRows,
    Found,
    HostCopy,
    InRange,
    NonDecreasing,
    StartsAt,
    ValueRule,
)

BUILT_IN = frozenset({InRange, Distinct, Finite, FiniteRows, StartsAt, EndsAt, NonDecreasing})


def probes(rules: Sequence[ValueRule], values: Mapping[str, Any], dims: Mapping[str, Any],
           name: str = "") -> list[tuple[int, Tensor]]:
    """``(position in rules, probe)`` of each rule with something to check (no sync); a rule of
    one's own is guarded (:func:`~kda_contracts._engine.rules.declared.guarded_probe`: a
    BackendError naming it and the contract ``name``)."""
    out = []
    for i, r in enumerate(rules):
        p = r.probe(values, dims) if type(r) in BUILT_IN else guarded_probe(r, values, dims, name)
        if p is not None:
            out.append((i, p))
    return out


def describe(rule: ValueRule, found: Found, shapes: Mapping[str, Sequence[int]] | None, dims: Mapping[str, Any],
             host: Mapping[str, HostCopy] | None = None, name: str = "") -> Violation:
    """``rule``'s violation for what its probe ``found`` (a rule of one's own guarded)."""
    if type(rule) in BUILT_IN:
        return rule.violation(found, shapes, dims, host)
    return guarded_violation(rule, found, shapes, dims, host, name)


def read_rules(rules: Sequence[ValueRule], values: Mapping[str, Any], dims: Mapping[str, Any], *,
               host_copies: bool = False, name: str = "") -> tuple[list[Violation], dict[str, HostCopy]]:
    """Strict mode: every rule's probe, stacked and read back at once per device (one read), as
    violations; the rules' integer index arguments come back in the same read (exact values for
    the report), and with ``host_copies`` are returned by name: lists of ints, or CPU int64 tensors
    past :data:`HOST_COPY_MAX` values in all. ``name``: the contract's (a failing rule of one's own names it)."""
    found = probes(rules, values, dims, name)
    if not found:
        return [], {}
    wanted = [a for r in rules for a in r.index_args]  # (exact values for the report, host copies for the call)
    copies = {a: values[a] for a in dict.fromkeys(wanted) if isinstance(values.get(a), Tensor)
              and not (values[a].dtype.is_floating_point or values[a].dtype.is_complex)}
    as_lists = sum(t.numel() for t in copies.values()) <= HOST_COPY_MAX
    by_device: dict[torch.device, list[tuple[int, Tensor]]] = {}
    for i, p in found:
        by_device.setdefault(p.device, []).append((i, p))
    read: dict[int, list[float]] = {}
    host: dict[str, HostCopy] = {}
    for device, items in by_device.items():
        mine = {a: t for a, t in copies.items() if t.device == device and a not in host}
        packed = torch.cat([torch.stack([p for _, p in items]).reshape(-1).view(torch.int64),
                            *(t.reshape(-1).to(torch.int64) for t in mine.values())])
        ints: HostCopy = packed.tolist() if as_lists else packed.cpu()  # the one read
        at = 4 * len(items)
        head = ints[:at] if isinstance(ints, list) else ints[:at].tolist()
        floats = struct.unpack(f"={at}d", struct.pack(f"={at}q", *head))  # the float64 bits back
        read.update({i: list(floats[4 * k:4 * k + 4]) for k, (i, _) in enumerate(items)})
        for a, t in mine.items():
            host[a] = ints[at:at + t.numel()]
            at += t.numel()
    shapes = {a: tuple(v.shape) for a, v in values.items() if isinstance(v, Tensor)}
    violations = [describe(rules[i], row, shapes, dims, host, name) for i, row in sorted(read.items()) if row[0] >= 0]
    return violations, host if host_copies else {}
