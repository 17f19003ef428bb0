"""The vocabulary of generated code: one naming scheme (:class:`Names`), the named snippets the
checker is assembled from, and the line accumulator (:class:`Gen`).

Example::

    n = Names(["x", "w"]); n("a", 0)           # -> "_kc_a0"
    READ_SHAPE.format(shape=n("s", 0), arg=n("a", 0))   # -> "_kc_s0 = _kc_a0.shape"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..rules.tensor import Rule, Slots


# -- naming and snippets -------------------------------------------------------------------------
class Names:
    """The one naming scheme of generated code. Every name it makes starts with a prefix that no
    parameter name of the contracted function starts with, so user names (parameters, dims, the
    function's own name) can never collide with generated ones. Arguments are referred to by
    position (``<p>a0``), dims by index (``<p>d0``): user text never becomes a generated name."""

    def __init__(self, taken: Iterable[str]) -> None:
        taken = tuple(taken)
        prefix = "_kc_"
        while any(t.startswith(prefix) for t in taken):
            prefix += "_"
        self.prefix = prefix

    def __call__(self, role: str, index: int | str = "") -> str:
        return f"{self.prefix}{role}{index}"


# The snippets generated code is assembled from ({...} fields filled by the generator).
REJECT = "return None"
READ_SHAPE = "{shape} = {arg}.shape"
RANK_TEST = "len({shape}) != {rank}"
MIN_RANK_TEST = "len({shape}) < {rank}"
VARIADIC_AXES = "{shape}[{start}:len({shape}) - {after}]"
BIND_AXIS = "{dim} = {shape}[{axis}]"
UNPACK = "{dims} = {shape}"
SOLVE = ("{coef} = {coef_expr}", "{rest} = {shape}[{axis}] - ({const_expr})",
         "if {coef} == 0 or {rest} % {coef} or {rest} // {coef} < 0:", "    return None", "{dim} = {rest} // {coef}")
CONFIG_VIEW = ("{view} = {views}.get(id({cfg}))", "if {view} is None or {view}[0]() is not {cfg}:",
               "    {view} = {views}.make({cfg})", "{cdims}, {cdtypes}, {cmatch} = {view}[1], {view}[2], {view}[3]")
NO_CONFIG = "{cdtypes}, {cmatch} = {nones}, None"
CONFIG_DIM_TEST = "{cdims}[{i}] is not None and {cdims}[{i}] != {dim}"
BIND_EQUAL = "{dim} = {expr}"
ITEMSIZE = "{var} = {arg}.dtype.itemsize"
IS_NONE = "{var} = {arg} is None"
READ_DTYPE = "{dtype} = {arg}.dtype"
READ_STRIDES = "{strides} = {arg}.stride()"
READ_DEVICE = "{device} = {arg}.device"
TYPE_TEST = "not isinstance({arg}, {types})"
OPTIONAL_TYPE_TEST = "({arg} is not None and not isinstance({arg}, {types}))"


class Gen:
    """Accumulates the lines of a generated function and the constants it refers to.

    Consecutive rejections are merged into one ``if a or b or ...: return None`` (same verdict:
    ``or`` keeps their order and short-circuits, and fewer branches run on the happy path)."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self._lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self._indent = 1
        self._pending: list[str] = []

    @property
    def indent(self) -> int:
        return self._indent

    @indent.setter
    def indent(self, value: int) -> None:
        self._flush()
        self._indent = value

    @property
    def lines(self) -> list[str]:
        self._flush()
        return self._lines

    def _flush(self) -> None:
        if self._pending:
            conds = self._pending if len(self._pending) == 1 else [f"({c})" for c in self._pending]
            self._pending = []
            self.emit("if " + " or ".join(conds) + ":", "    " + REJECT)

    def emit(self, *lines: str, **fields: Any) -> None:
        self._flush()
        for line in lines:
            self._lines.append("    " * self._indent + (line.format(**fields) if fields else line))

    def reject_if(self, conds: Sequence[str]) -> None:
        self._pending += conds

    def const(self, value: Any) -> str:
        for k, v in self.consts.items():
            if v is value:
                return k
        name = self.names("k", len(self.consts))
        self.consts[name] = value
        return name

    def slots(self, rule: Rule, **names: Any) -> Slots:
        return Slots(**names, constants={k: self.const(v) for k, v in rule.constants().items()})
