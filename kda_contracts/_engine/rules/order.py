"""A tensor dense in a given order of its dims (``kc.Spec(dim_order=...)``): the rule
(:class:`DenseOrder`), the strides such a tensor has (:func:`order_strides`, also what
``op.torch_op``'s fake implementation builds a result with) and the order a tensor is dense in,
if any (:func:`dense_order_of`, for the fix a refusal suggests).

The order lists the dims outermost first, as ``torch.Tensor.dim_order()`` does: ``(1, 0)`` on a
``[B, D]`` tensor is its transpose laid out densely (column-major), strides ``[1, B]``. As
``is_contiguous()`` and torch's own stride comparisons (opcheck, fake tensors) have it, a dim of
size 1 may have any stride and an empty tensor meets every order.

Example::

    >>> order_strides((4, 6), (1, 0))
    [1, 4]
    >>> DenseOrder("out", (1, 0)).broken(shape=(4, 6), strides=(1, 4)), dense_order_of((4, 6), (6, 1))
    (False, (0, 1))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ContractError, LayoutError, Violation
from ..facts import LayoutBroken
from .tensor import Rule, Slots, concrete, fmt_ints, product


def order_strides(shape: Sequence[Any], order: Sequence[int]) -> list[Any]:
    """The strides of a tensor of ``shape`` dense in ``order`` (outermost dim first); sizes may
    be symbolic (``torch.SymInt``), so a fake implementation can build the tensor."""
    strides: list[Any] = [1] * len(shape)
    acc: Any = 1
    for axis in reversed(order):
        strides[axis] = acc
        acc = acc * shape[axis]
    return strides


def dense_in_order(shape: Sequence[int], strides: Sequence[int], order: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` is dense in ``order`` (size-1 dims aside; an
    empty tensor always is)."""
    if 0 in shape:
        return True
    want = order_strides(shape, order)
    return all(s == 1 or st == w for s, st, w in zip(shape, strides, want, strict=True))


def dense_order_of(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The order of dims (outermost first) a tensor is dense in, or None when it is dense in none
    (a slice, a padded row, an ``expand()``)."""
    order = tuple(sorted(range(len(shape)), key=lambda a: (-strides[a] if shape[a] != 1 else 0, a)))
    return order if dense_in_order(shape, strides, order) else None


@dataclass(frozen=True)
class DenseOrder(Rule):
    """The tensor is dense with its dims laid out in ``dim_order``, outermost first (every stride
    follows from the shape; size-1 dims may have any stride; an empty tensor passes)."""

    argument: str
    dim_order: tuple[int, ...]
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"shape", "strides"})
    family: ClassVar[str] = "layout"
    order: ClassVar[int] = 30
    doc_section: ClassVar[str | None] = "layout"

    def test(self, n: Slots) -> str:
        st = n.strides
        nonempty = " and ".join(f"{n.size(a)} != 0" for a in self.dim_order) or "True"
        terms, expected = [], "1"
        for k in range(len(self.dim_order) - 1, -1, -1):
            axis = self.dim_order[k]
            terms.append(f"({n.size(axis)} != 1 and {st}[{axis}] != {expected})")
            expected = f"{expected}*{n.size(axis)}" if expected != "1" else n.size(axis)
        return f"({nonempty}) and ({' or '.join(terms) or 'False'})"

    def violation(self, **values: Any) -> Violation:
        shape, strides = tuple(values["shape"]), tuple(values["strides"])
        return Violation(LayoutError, self.argument, f"{self.words_of_order()} (strides "
                         f"{fmt_ints(order_strides(shape, self.dim_order))})", f"strides {fmt_ints(strides)}",
                         facts=(LayoutBroken("dim_order", len(shape), strides),))

    def words_of_order(self) -> str:
        """The rule as reports say it: ``dense in dim order (1, 0)``, ``contiguous`` for the identity."""
        if self.dim_order == tuple(range(len(self.dim_order))):
            return "contiguous"
        return f"dense in dim order {_order_text(self.dim_order)}"

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        sym, conc = [], []
        for axis in range(len(dims)):
            inner = self.dim_order[self.dim_order.index(axis) + 1:]
            p = product([dims[a] for a in inner])
            sym.append("?" if p is None else str(p))
            conc.append("?" if p is None else concrete(p, env))
        return {"rule": "dim_order", "dim_order": list(self.dim_order), "dense_inner_dims": len(dims),
                "strides": "[" + ", ".join(sym) + "]", "concrete_strides": "[" + ", ".join(conc) + "]"}

    def doc(self, data: Mapping[str, Any]) -> str:
        same = data["concrete_strides"] == data["strides"]
        return (f"dense, dim order `{_order_text(self.dim_order)}`: strides `{data['strides']}`"
                + ("" if same else f" = `{data['concrete_strides']}`"))


def _order_text(order: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, order)) + ("," if len(order) == 1 else "") + ")"
