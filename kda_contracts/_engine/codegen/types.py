"""TODO docstring."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from beartype.roar import BeartypeCallHintParamViolation

from ..model.nodes import Plain
from ..model.type_verdict import _has_items, _items_problem
from ..reading.type_trees import read_types
from ..source import define, precompiled


class ItemTypeViolation(BeartypeCallHintParamViolation):
    """An item of a container argument that beartype's sample did not look at breaks its hint
    (caught wherever beartype's own violation is: the call then takes the slow path)."""


def every_item_checker(check_types: Callable[..., None], params: Sequence[str],
                       hints: Mapping[str, Any]) -> Callable[..., None]:
    """``check_types`` (beartype's shim over ``params``), then every item of each container argument
    against its hint (a type tree where types alone decide, else beartype item by item); raises
    :class:`ItemTypeViolation`. ``check_types`` itself when no hint has a container."""
    deep = [(i, name, hints[name], read_types(hints[name])) for i, name in enumerate(params)
            if name in hints and _has_items(hints[name])]
    if not deep:
        return check_types

    def check_every_item(*vals: Any) -> None:
        try:
            check_types(*vals)
        except BeartypeCallHintParamViolation:
            raise
        except Exception as exc:  # beartype wording its report (an item's repr that raises): the slow path words it
            raise ItemTypeViolation(f"{type(exc).__name__} while checking the types", culprits=(exc,)) from None
        for i, name, hint, tree in deep:
            value = vals[i]
            problem = tree.match(value, {}, name) if tree is not None else _items_problem(value, hint, name)
            if problem is not None:
                raise ItemTypeViolation(problem[1], culprits=(value,))

    return check_every_item


_TRACED_TYPES = precompiled('''
def traced(*vals):
    for node, name, value in zip(_kc_nodes, _kc_names, vals):
        if node is not None and node.match(value, {}, name) is not None:
            return _kc_reject(*vals)
''', "<kda_contracts traced type check>")


def traced_type_check(check_types: Callable[..., None], params: Sequence[str], nodes: Mapping[str, Plain],
                      reject: Callable[..., None]) -> None:
    """Make torch.compile trace ``check_types`` (beartype's shim, over ``params`` in order) as the
    parameters' ``nodes`` (a :class:`Plain` per hint: its type tree, else beartype at trace time);
    ``reject``, a constant-result function taking every argument, raises the report of a call
    they reject. Eager calls are untouched: this only sets the attribute dynamo reads.

    Example::

        traced_type_check(contract.check_types, ["x", "tags"], {"tags": Plain(list[Tag], ...)}, reject)
    """
    ns: dict[str, Any] = {"_kc_nodes": tuple(nodes.get(p) for p in params), "_kc_names": tuple(params),
                          "_kc_reject": reject}
    # closure-free (dynamo guards a stand-in's closure via the shim's)
    check_types._torchdynamo_inline = define(_TRACED_TYPES, "", "traced", ns)  # type: ignore[attr-defined]
