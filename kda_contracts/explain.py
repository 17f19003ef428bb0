"""The slow path: interpret a contract on one call that the generated checker rejected, and
collect every violation with where each dim came from and a fix for known mistakes.

This is the specification the generated fast checker (``codegen``) must agree with.

Example::

    dims, provenance, violations = Explainer(spec, values, config).run()
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .dims import ANY, Expr, Sym
from .errors import DeviceError, DtypeError, LayoutError, ShapeError, ValueRangeError, Violation
from .facts import (
    AxisMismatch,
    ConfigMismatch,
    ConstraintFailed,
    DeviceMismatch,
    DtypeMismatch,
    Fact,
    LayoutBroken,
    RankMismatch,
    Unsolvable,
)
from .markers import config_dim_source, config_dims, config_dtypes
from .spec import CallContext, ContractSpec, TensorParam, dtype_name

__all__ = ["Explainer", "blocks_disjoint", "dense_strides", "inner_block_ok"]


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def dense_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def inner_block_ok(shape: Sequence[int], strides: Sequence[int], n: int) -> bool:
    """True when the last ``n`` dims form one dense row-major block (size-1 dims are free)."""
    expected = dense_strides(shape)
    return all(shape[a] == 1 or strides[a] == expected[a] for a in range(len(shape) - n, len(shape)))


def blocks_disjoint(shape: Sequence[int], strides: Sequence[int], n: int) -> bool:
    """True when no two blocks of the last ``n`` dims share memory: taken by increasing stride,
    each outer axis of size > 1 steps over everything the axes below it span (so an expanded
    axis, stride 0, fails). Sufficient for no overlap; exact for a single outer axis."""
    span = 1
    for a in range(len(shape) - n, len(shape)):
        span *= max(shape[a], 1)
    for a in sorted((a for a in range(len(shape) - n) if shape[a] > 1), key=lambda a: strides[a]):
        if strides[a] < span:
            return False
        span += strides[a] * (shape[a] - 1)
    return True


class Explainer:
    def __init__(self, spec: ContractSpec, values: Mapping[str, Any], config: Any) -> None:
        self.spec = spec
        self.values = values
        self.config = config
        self.dims: dict[str, int] = {}
        self.prov: dict[str, str] = {}
        self.violations: list[Violation] = []
        self.usable: dict[str, tuple[int, ...]] = {}
        # Per tensor: mismatching axes and notes, merged into one violation per argument.
        self.bad_axes: dict[str, dict[int, tuple[str, Fact | None]]] = {}

    def run(self) -> tuple[dict[str, int], dict[str, str], list[Violation]]:
        spec = self.spec
        self._ranks()
        self._bind()
        self._check_dims()
        self._shape_violations()
        self._where()
        self._dtypes()
        self._devices()
        self._layouts()
        self._scalars()
        dims = {s: self.dims[s] for s in spec.symbols if s in self.dims}
        ctx = CallContext(spec, self.values, self.config, dims, self.prov, self.violations)
        self.violations = [self._hinted(v, ctx) for v in self.violations]
        return dims, {s: self.prov[s] for s in dims}, self.violations

    def _hinted(self, v: Violation, ctx: CallContext) -> Violation:
        for h in self.spec.hints:
            text = h(v, ctx)
            if text:
                return v.with_hint(text)
        return v.with_hint(_generic_hint(v, ctx))

    def _ranks(self) -> None:
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            shape = tuple(int(s) for s in t.shape)
            if len(shape) != tp.rank:
                self.violations.append(Violation(
                    ShapeError, name,
                    f"{tp.symbolic()} (rank {tp.rank})",
                    f"{_fmt_shape(shape)} (rank {len(shape)})",
                    facts=(RankMismatch(shape, tp.rank),),
                ))
                continue
            self.usable[name] = shape

    def _bind(self) -> None:
        spec = self.spec
        cfg_dims = config_dims(self.config)
        for sym in spec.symbols:
            if sym in cfg_dims:
                self.dims[sym] = int(cfg_dims[sym])
                self.prov[sym] = f"from config ({config_dim_source(self.config, sym)})"
        for sym, pname in spec.scalar_sources.items():
            value = self.values.get(pname)
            if sym in self.dims:
                if value != self.dims[sym]:
                    self.violations.append(Violation(
                        ShapeError, pname, f"{sym}={self.dims[sym]} ({self.prov[sym]})", f"{value}"))
                continue
            self.dims[sym] = int(value)  # type: ignore[arg-type]  # beartype checked it is an int
            self.prov[sym] = f"from {pname}"
        for sym, srcs in spec.sources.items():
            if sym in self.dims:
                continue
            # When the binders disagree, bind the value most of them carry (ties: priority order),
            # so the odd one out is the argument blamed.
            usable = [src for src in srcs if src.param in self.usable]
            if not usable:
                continue
            sizes = [self.usable[src.param][src.axis] for src in usable]
            best = max(sizes, key=sizes.count)
            src = usable[sizes.index(best)]
            self.dims[sym] = best
            self.prov[sym] = f"from {src.param}.shape[{src.axis}]"
        for s in spec.solvers:
            if s.symbol in self.dims or s.param not in self.usable:
                continue
            if not (s.coef.symbols() | s.const.symbols()) <= self.dims.keys():
                continue
            size = self.usable[s.param][s.axis]
            try:
                coef, const = s.coef.evaluate(self.dims), s.const.evaluate(self.dims)
            except ZeroDivisionError:
                continue
            rest = size - const
            if coef > 0 and rest % coef == 0 and rest // coef >= 1:
                self.dims[s.symbol] = rest // coef
                self.prov[s.symbol] = f"solved from {s.param}.shape[{s.axis}] = {s.dim}"
                continue
            known = ", ".join(f"{k}={self.dims[k]}" for k in sorted(s.dim.symbols() - {s.symbol}))
            frac = f"({size} - {const}) / {coef} = {rest / coef:g}" if coef else f"coefficient {s.coef} is 0"
            self.bad_axes.setdefault(s.param, {})[s.axis] = (
                f"dim {s.axis} ({s.dim}) = {size} gives no positive integer {s.symbol} "
                f"with {known}: {s.symbol} = {frac}", Unsolvable(s.symbol, s.axis, str(s.dim), size, coef, const))

    def _check_dims(self) -> None:
        for name, shape in self.usable.items():
            tp = self.spec.tensors[name]
            for axis, d in enumerate(tp.dims):
                if d is ANY or axis in self.bad_axes.get(name, {}):
                    continue
                assert isinstance(d, Expr)
                if not d.symbols() <= self.dims.keys():
                    continue
                try:
                    want = d.evaluate(self.dims)
                except ZeroDivisionError:
                    why = f"dim {axis} ({d}) divides by zero with the bound dims"
                    self.bad_axes.setdefault(name, {})[axis] = (why, None)
                    continue
                if shape[axis] != want:
                    why = ""
                    if isinstance(d, Sym):
                        why = f" ({d.name} {self.prov.get(d.name, '')})"
                    self.bad_axes.setdefault(name, {})[axis] = (
                        f"dim {axis} ({d}): expected {want}{why}, got {shape[axis]}",
                        AxisMismatch(axis, str(d), want, shape[axis], shape))

    def _concrete(self, tp: TensorParam) -> str:
        parts = []
        for d in tp.dims:
            if d is ANY:
                parts.append("_")
                continue
            assert isinstance(d, Expr)
            try:
                parts.append(str(d.evaluate(self.dims)) if d.symbols() <= self.dims.keys() else "?")
            except ZeroDivisionError:
                parts.append("?")
        return "[" + ", ".join(parts) + "]"

    def _shape_violations(self) -> None:
        for name, axes in self.bad_axes.items():
            tp = self.spec.tensors[name]
            self.violations.append(Violation(
                ShapeError, name,
                f"{tp.symbolic()} = {self._concrete(tp)}",
                _fmt_shape(self.usable[name]),
                tuple(axes[a][0] for a in sorted(axes)),
                facts=tuple(f for a in sorted(axes) if (f := axes[a][1]) is not None),
            ))

    def _where(self) -> None:
        for c, w in self.spec.where:
            if not c.symbols() <= self.dims.keys():
                continue
            try:
                ok = c.holds(self.dims)
            except ZeroDivisionError:
                ok = False
            if not ok:
                got = ", ".join(f"{s}={self.dims[s]}" for s in sorted(c.symbols()))
                self.violations.append(Violation(
                    w.kind, "dims", c.text, got,
                    tuple(f"{s} {self.prov[s]}" for s in sorted(c.symbols()) if s in self.prov),
                    hint=w.hint,
                    facts=(ConstraintFailed(c.text, tuple((s, self.dims[s]) for s in sorted(c.symbols()))),),
                ))

    def _dtypes(self) -> None:
        cfg_dt = config_dtypes(self.config)
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None:
                continue
            allowed: frozenset[torch.dtype] = tp.dtypes
            why = ""
            if tp.spec.config_dtype is not None and tp.spec.config_dtype in cfg_dt:
                allowed = frozenset((cfg_dt[tp.spec.config_dtype],))
                why = f" (config {tp.spec.config_dtype} dtype)"
            if t.dtype not in allowed:
                names = " or ".join(sorted(dtype_name(d) for d in allowed))
                self.violations.append(Violation(DtypeError, name, names + why, dtype_name(t.dtype),
                                                 facts=(DtypeMismatch(allowed, t.dtype,
                                                                      tp.spec.config_dtype if why else None),)))
                continue
            other = tp.spec.same_dtype_as
            if other is not None and self.values.get(other) is not None:
                od = self.values[other].dtype
                if t.dtype != od:
                    self.violations.append(Violation(
                        DtypeError, name, f"{dtype_name(od)} (same as {other})", dtype_name(t.dtype),
                        facts=(DtypeMismatch(frozenset((od,)), t.dtype, same_as=other),)))

    def _devices(self) -> None:
        first = self.spec.first_tensor
        if first is None or self.values.get(first) is None:
            return
        dev = self.values[first].device
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None or name == first or not tp.spec.same_device:
                continue
            if t.device != dev:
                self.violations.append(Violation(DeviceError, name, f"{dev} (device of {first})", str(t.device),
                                                 facts=(DeviceMismatch(dev, t.device),)))

    def _layouts(self) -> None:
        for name, tp in self.spec.tensors.items():
            t = self.values.get(name)
            if t is None or name not in self.usable:
                continue
            shape, strides = self.usable[name], tuple(t.stride())
            if tp.spec.contiguous and not t.is_contiguous():
                self.violations.append(Violation(
                    LayoutError, name, f"contiguous (strides {_fmt_shape(dense_strides(shape))})",
                    f"strides {_fmt_shape(strides)}", facts=(LayoutBroken("contiguous", len(shape), strides),)))
            elif tp.spec.inner_contiguous and not inner_block_ok(shape, strides, tp.spec.inner_contiguous):
                n = tp.spec.inner_contiguous
                dense = dense_strides(shape)
                want = ["*"] * (len(shape) - n) + [str(s) for s in dense[len(shape) - n:]]
                what = "last dim stride 1" if n == 1 else f"last {n} dims dense"
                self.violations.append(Violation(
                    LayoutError, name, f"{what} (strides [{', '.join(want)}])", f"strides {_fmt_shape(strides)}",
                    facts=(LayoutBroken("inner", n, strides),)))
            elif tp.spec.disjoint and not tp.spec.contiguous and not blocks_disjoint(
                    shape, strides, tp.spec.inner_contiguous):
                n = tp.spec.inner_contiguous
                block = math.prod(max(s, 1) for s in shape[len(shape) - n:])
                self.violations.append(Violation(
                    LayoutError, name, f"blocks of the last {n} dims that do not overlap (stride[0] >= {block})"
                    if len(shape) - n == 1 else f"blocks of the last {n} dims that do not overlap",
                    f"strides {_fmt_shape(strides)}", facts=(LayoutBroken("disjoint", n, strides),)))

    def _scalars(self) -> None:
        for name, sp in self.spec.scalars.items():
            v = self.values.get(name)
            if sp.range is not None and v is not None and not sp.range.holds(v):
                self.violations.append(Violation(ValueRangeError, name, sp.range.describe(), repr(v)))
            elif sp.match is not None and self.config is not None and not sp.match.agrees(v, self.config):
                self.violations.append(Violation(
                    ValueRangeError, name, f"{getattr(self.config, sp.match.attr)!r} (config {sp.match.attr})",
                    repr(v), facts=(ConfigMismatch(sp.match.attr, getattr(self.config, sp.match.attr)),)))


def _generic_hint(v: Violation, ctx: CallContext) -> str | None:
    if v.kind is DtypeError:
        fact = v.fact(DtypeMismatch)
        if fact is not None and len(fact.allowed) == 1:
            (dt,) = fact.allowed
            return f"cast it: {v.argument}.to({dt})"
        return None
    if v.kind is LayoutError:
        layout = v.fact(LayoutBroken)
        if layout is not None and layout.rule == "contiguous":
            return f"pass {v.argument}.contiguous()"
        if layout is not None and layout.rule == "disjoint":
            return (f"{v.argument} is written in place, so its blocks must not share memory (an .expand()ed or "
                    f"as_strided view makes them): allocate it densely")
        return (f"pass {v.argument}.contiguous(), or allocate it with a dense inner block; a transposed or "
                "sliced view has the wrong strides")
    if v.kind is DeviceError:
        dev = v.fact(DeviceMismatch)
        return f"move it: {v.argument}.to({str(dev.want if dev else '')!r})"
    return None
