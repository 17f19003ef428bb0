"""The check families of a contract, one object per rule: each emits its fast-path test, decides
the slow path with that same test, and describes itself for the docs.

A rule's ``test`` is Python source that is true when the rule is *broken*, over a few named
values (the tensor's dtype, shape, strides, ...; see :class:`Slots`). The code generator inlines
that source into the straight-line checker; the explainer compiles the very same source into a
small function and calls it on the call it explains. So the fast and the slow path cannot
disagree on a verdict: only the wording of the message lives on the slow path.

Example::

    rule = InnerDense("initial_state", n=3)
    rule.test(Slots(shape="s", strides="st"))        # -> "(s[-1] != 1 and st[-1] != 1) or ..."
    rule.broken(shape=(8, 4, 16, 16), strides=(1024, 256, 16, 1))  # -> False
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..errors import ArgumentTypeError, ContractError, DeviceError, DtypeError, LayoutError, Violation
from ..facts import DeviceMismatch, DtypeMismatch, LayoutBroken
from ..grammar.dims import BinOp, Const, Expr
from ..source import define


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def fmt_ints(xs: Sequence[Any]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def dense_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides of a dense tensor of ``shape`` (a size-0 dim counts as 1)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def concrete(d: Any, env: Mapping[str, int]) -> str:
    """A dim's value when ``env`` binds all its symbols, else its text (``_``, ``#B``, ``*batch``)."""
    if not isinstance(d, Expr):
        return str(d)
    if d.symbols() <= env.keys():
        try:
            return str(d.evaluate(env))
        except ZeroDivisionError:
            pass
    return str(d)


def product(dims: Sequence[Any]) -> Expr | None:
    """The product of ``dims`` as an expression (None when one is not an expression); 1s dropped."""
    out: Expr | None = None
    for d in dims:
        if not isinstance(d, Expr):
            return None
        if isinstance(d, Const) and d.value == 1:
            continue
        out = d if out is None else BinOp("*", out, d)
    return out if out is not None else Const(1)


def _dense_strides_doc(dims: Sequence[Any], inner: int, env: Mapping[str, int]) -> dict[str, str]:
    """Dense row-major strides of the last ``inner`` dims (``*`` for the free outer ones),
    symbolic and for ``env``."""
    sym, conc = [], []
    for axis in range(len(dims)):
        if axis < len(dims) - inner:
            sym.append("*")
            conc.append("*")
            continue
        p = product(dims[axis + 1:])
        sym.append("?" if p is None else str(p))
        conc.append("?" if p is None else concrete(p, env))
    return {"strides": "[" + ", ".join(sym) + "]", "concrete_strides": "[" + ", ".join(conc) + "]"}


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


@dataclass(frozen=True)
class Slots:
    """The names a rule's test may use, as the generated code calls them. The explainer compiles
    each test with the default names below as the parameters of a small function."""

    value: str = "value"  # the argument itself (a tensor or a scalar)
    shape: str = "shape"
    strides: str = "strides"
    dtype: str = "dtype"
    device: str = "device"  # the device of the call's first tensor
    config_value: str = "config_value"  # what the config fixes for this rule (None: nothing)
    other_dtype: str = "other_dtype"  # the dtype of the argument named by same_dtype_as
    bound: str = "bound"  # the dim an argument is named after, as the call bound it (None: unbound)
    constants: Mapping[str, str] = field(default_factory=dict)  # constant object id -> name
    # Names already holding each axis's size (when the generated code has them in locals), from
    # the front; None: index ``shape``.
    sizes: tuple[str, ...] | None = None

    def size(self, axis: int) -> str:
        """Source for the size of ``axis`` (negative: from the back)."""
        return self.sizes[axis] if self.sizes is not None else f"{self.shape}[{axis}]"


_PARAMS = Slots()
CONFIG_ABSENT: Any = object()  # describe(config_value=...) when no config is documented
_COMPILED: dict[tuple[str, str], Callable[..., bool]] = {}


class Rule:
    """One rule of one argument. Subclasses set ``kind``, ``needs``, ``family``, ``order`` and
    ``doc_section`` and define ``test``, ``violation``, ``describe`` and ``doc``. Whatever uses
    rules (the code generator, the explainer, the docs, the dump report) asks the rule these, and
    never names a rule class: a new rule is its class and the ``kc.Spec`` field that declares it.

    ``family`` groups the rules the explainer decides together (at most one violation per
    argument and family, the first broken rule in declaration order), in ``order``;
    ``doc_section`` is the docs' column the rule describes itself in (None: the docs leave it to
    the argument's other columns, as for the device rule)."""

    kind: ClassVar[type[ContractError]] = ContractError
    needs: ClassVar[frozenset[str]] = frozenset()  # which Slots fields the test reads
    family: ClassVar[str] = "other"
    order: ClassVar[int] = 90
    doc_section: ClassVar[str | None] = None
    #: whether the verdict depends on the argument's metadata alone (False: a user predicate that
    #: may read anything: the check cache never answers for a contract with one)
    cacheable: ClassVar[bool] = True
    argument: str

    def config_source(self) -> tuple[str, str] | None:
        """What a config fixes for this rule (its ``config_value`` slot): ``("dtype", role)`` (the
        dtype the config pins for a role), ``("attr", name)`` (a config attribute), or None."""
        return None

    def other_argument(self) -> str | None:
        """The other argument whose dtype the ``other_dtype`` slot holds, or None."""
        return None

    def test(self, n: Slots) -> str:
        """Python source, true when the rule is broken, over the names in ``n``."""
        raise NotImplementedError

    def constants(self) -> dict[str, Any]:
        """Objects the test refers to by name (``n.constants[key]``), by key."""
        return {}

    def broken(self, **values: Any) -> bool:
        """The slow path's verdict: the same source as the fast path, compiled once."""
        args = {getattr(_PARAMS, f): values[getattr(_PARAMS, f)] for f in self.needs}
        return self.compiled_test()(**args)

    def compiled_test(self) -> Callable[..., bool]:
        """:meth:`broken` as a function of the values the test needs, by keyword (``dtype=``,
        ``config_value=``...), made once for a caller that keeps it: the same source compiled
        once, with this rule's constants bound (torch.compile traces it: nothing to compile)."""
        consts = self.constants()
        names = Slots(constants={k: f"_c_{k}" for k in consts})
        src = self.test(names)
        key = (type(self).__name__, src)
        fn = _COMPILED.get(key)
        if fn is None:
            params = ", ".join(getattr(_PARAMS, f) for f in sorted(self.needs))
            cparams = "".join(f", _c_{k}" for k in consts)
            code = f"def broken({params}{cparams}):\n    return bool({src})\n"
            fn = _COMPILED[key] = define(code, f"<kda_contracts rule {type(self).__name__}>", "broken")
        return functools.partial(fn, **{f"_c_{k}": v for k, v in consts.items()}) if consts else fn

    def violation(self, **values: Any) -> Violation:
        """The message for a call that broke this rule (slow path only)."""
        raise NotImplementedError

    def words(self, path: str, **values: Any) -> str:
        """The rule broken by the tensor at ``path`` inside a container or a result, in one line
        (the walk's problem; the slot values by name, as :meth:`broken` takes them)."""
        v = self.violation(**{k: values[k] for k in self.needs})
        return f"{path}: expected {v.expected}, got {v.got}"

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        """What the docs show of this rule as data: ``dims`` are the argument's, concrete where
        ``env`` binds them; ``config_value`` is what the documented config fixes for it."""
        raise NotImplementedError

    def doc(self, data: Mapping[str, Any]) -> str:
        """The rule in one phrase of Markdown, from :meth:`describe`'s data."""
        raise NotImplementedError


# -- dtype and device ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DtypeIn(Rule):
    """The dtype is one the annotation (narrowed by ``Spec(dtypes=...)``) allows, and the one the
    config pins for the argument's role, if any."""

    argument: str
    allowed: frozenset[torch.dtype]
    role: str | None = None
    kind: ClassVar[type[ContractError]] = DtypeError
    needs: ClassVar[frozenset[str]] = frozenset({"dtype", "config_value"})
    family: ClassVar[str] = "dtype"
    order: ClassVar[int] = 10
    doc_section: ClassVar[str | None] = "dtype"

    def config_source(self) -> tuple[str, str] | None:
        return None if self.role is None else ("dtype", self.role)

    def test(self, n: Slots) -> str:
        base = f"{n.dtype} not in {n.constants['allowed']}"
        if self.role is None:
            return base
        return f"{base} or ({n.config_value} is not None and {n.dtype} != {n.config_value})"

    def constants(self) -> dict[str, Any]:
        return {"allowed": self.allowed}

    def violation(self, **values: Any) -> Violation:
        dt, pinned = values["dtype"], values["config_value"]
        allowed, why = self.allowed, ""
        if self.role is not None and pinned is not None:
            allowed, why = frozenset((pinned,)), f" (config {self.role} dtype)"
        names = " or ".join(sorted(dtype_name(d) for d in allowed))
        return Violation(DtypeError, self.argument, names + why, dtype_name(dt),
                         facts=(DtypeMismatch(allowed, dt, self.role if why else None),))

    def words(self, path: str, **values: Any) -> str:
        allowed = " or ".join(sorted(dtype_name(d) for d in self.allowed))
        return f"{path}: dtype {dtype_name(values['dtype'])}, expected {allowed}"

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"dtypes": sorted(dtype_name(d) for d in self.allowed), "config_dtype": self.role,
                "config_pins": dtype_name(config_value) if config_value is not None else None}

    def doc(self, data: Mapping[str, Any]) -> str:
        text = ", ".join(_grouped_dtype_names(data["dtypes"]))
        if data["config_pins"]:
            return f"**{data['config_pins']}** (config `{self.role}_dtype`; allowed without it: {text})"
        return text + (f" (config `{self.role}_dtype` may pin one)" if self.role else "")


def _grouped_dtype_names(names: Sequence[str]) -> list[str]:
    """Several float8 kinds shown as one "any float8" (jaxtyping's ``Float`` allows four)."""
    f8 = [n for n in names if n.startswith("float8_")]
    return list(names) if len(f8) < 2 else [*(n for n in names if n not in f8), "any float8"]


@dataclass(frozen=True)
class SameDtype(Rule):
    """The dtype equals that of another tensor argument (skipped when that one is None)."""

    argument: str
    other: str
    kind: ClassVar[type[ContractError]] = DtypeError
    needs: ClassVar[frozenset[str]] = frozenset({"dtype", "other_dtype"})
    family: ClassVar[str] = "dtype"
    order: ClassVar[int] = 10
    doc_section: ClassVar[str | None] = "dtype"

    def other_argument(self) -> str | None:
        return self.other

    def test(self, n: Slots) -> str:
        return f"{n.other_dtype} is not None and {n.dtype} != {n.other_dtype}"

    def violation(self, **values: Any) -> Violation:
        dt, od = values["dtype"], values["other_dtype"]
        return Violation(DtypeError, self.argument, f"{dtype_name(od)} (same as {self.other})", dtype_name(dt),
                         facts=(DtypeMismatch(frozenset((od,)), dt, same_as=self.other),))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"same_dtype_as": self.other}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"same dtype as `{self.other}`"


@dataclass(frozen=True)
class SameDevice(Rule):
    """On the device of the call's first tensor."""

    argument: str
    first: str
    kind: ClassVar[type[ContractError]] = DeviceError
    needs: ClassVar[frozenset[str]] = frozenset({"value", "device"})
    family: ClassVar[str] = "device"
    order: ClassVar[int] = 20
    doc_section: ClassVar[str | None] = None

    def test(self, n: Slots) -> str:
        return f"{n.value}.device != {n.device}"

    def violation(self, **values: Any) -> Violation:
        dev, got = values["device"], values["value"].device
        return Violation(DeviceError, self.argument, f"{dev} (device of {self.first})", str(got),
                         facts=(DeviceMismatch(dev, got),))

    def words(self, path: str, **values: Any) -> str:
        return f"{path}: device {values['value'].device}, expected {values['device']} (device of {self.first})"

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"same_device": True}

    def doc(self, data: Mapping[str, Any]) -> str:
        return f"on the device of `{self.first}`"


# -- written in place ----------------------------------------------------------------------------
def _inference_outside_mode(t: torch.Tensor) -> bool:
    """An inference tensor, outside ``torch.inference_mode()`` (torch refuses to write it)."""
    return t.is_inference() and not torch.is_inference_mode_enabled()


def _never(t: torch.Tensor) -> bool:
    return False


# dynamo cannot trace is_inference() (a graph break): compiled code asks nothing, as compiled
# code cannot be handed an inference tensor outside inference mode anyway
_inference_outside_mode._torchdynamo_inline = _never  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Writable(Rule):
    """A tensor the op writes in place (``kc.Spec(mutated=True)``): it does not require grad (a
    kernel's writes bypass autograd) unless the contract declares ``autograd=True``, and it is
    not an inference tensor outside ``torch.inference_mode()`` (torch refuses the write). Decided
    before any write, in check mode."""

    argument: str
    autograd: bool = False
    kind: ClassVar[type[ContractError]] = ArgumentTypeError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "written"
    order: ClassVar[int] = 40
    doc_section: ClassVar[str | None] = None

    def test(self, n: Slots) -> str:
        inference = f"{n.constants['inference']}({n.value})"
        return inference if self.autograd else f"{n.value}.requires_grad or {inference}"

    def constants(self) -> dict[str, Any]:
        return {"inference": _inference_outside_mode}

    def violation(self, **values: Any) -> Violation:
        t = values["value"]
        if not self.autograd and t.requires_grad:
            return Violation(ArgumentTypeError, self.argument,
                             "a tensor the op may write in place (requires_grad=False)",
                             "requires_grad=True",
                             hint="the kernel writes it outside autograd; pass a detached tensor (or one made under "
                                  "torch.no_grad()), e.g. a state pool that is a buffer, not an nn.Parameter")
        return Violation(ArgumentTypeError, self.argument, "a tensor the op may write in place",
                         "an inference tensor, outside torch.inference_mode()",
                         hint="call the op inside torch.inference_mode(), or allocate this tensor outside it")

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"written": True, "autograd": self.autograd}

    def doc(self, data: Mapping[str, Any]) -> str:
        return "written in place" + ("" if data.get("autograd") else " (must not require grad)")


# -- strides -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contiguous(Rule):
    """The whole tensor is contiguous."""

    argument: str
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"value"})
    family: ClassVar[str] = "layout"
    order: ClassVar[int] = 30
    doc_section: ClassVar[str | None] = "layout"

    def test(self, n: Slots) -> str:
        return f"not {n.value}.is_contiguous()"

    def violation(self, **values: Any) -> Violation:
        t = values["value"]
        shape, strides = tuple(t.shape), tuple(t.stride())
        return Violation(LayoutError, self.argument, f"contiguous (strides {fmt_ints(dense_strides(shape))})",
                         f"strides {fmt_ints(strides)}", facts=(LayoutBroken("contiguous", len(shape), strides),))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"rule": "contiguous", "dense_inner_dims": len(dims), **_dense_strides_doc(dims, len(dims), env)}

    def doc(self, data: Mapping[str, Any]) -> str:
        same = data["concrete_strides"] == data["strides"]  # (no config gave the dims a value)
        return f"contiguous: strides `{data['strides']}`" + ("" if same else f" = `{data['concrete_strides']}`")


@dataclass(frozen=True)
class InnerDense(Rule):
    """The last ``n`` dims form one dense row-major block (size-1 dims may have any stride; a
    size-0 dim counts as 1). Axes are counted from the back, so any rank works."""

    argument: str
    n: int
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"shape", "strides"})
    family: ClassVar[str] = "layout"
    order: ClassVar[int] = 30
    doc_section: ClassVar[str | None] = "layout"

    def test(self, n: Slots) -> str:
        st = n.strides
        terms = [f"({n.size(-1)} != 1 and {st}[-1] != 1)"]
        expected = ""
        for axis in range(-2, -1 - self.n, -1):
            expected = f"{expected}*" if expected else ""
            expected += f"({n.size(axis + 1)} or 1)"
            terms.append(f"({n.size(axis)} != 1 and {st}[{axis}] != {expected})")
        return " or ".join(terms)

    def violation(self, **values: Any) -> Violation:
        shape, strides = values["shape"], values["strides"]
        dense = dense_strides(shape)
        want = ["*"] * (len(shape) - self.n) + [str(s) for s in dense[len(shape) - self.n:]]
        what = "last dim stride 1" if self.n == 1 else f"last {self.n} dims dense"
        return Violation(LayoutError, self.argument, f"{what} (strides [{', '.join(want)}])",
                         f"strides {fmt_ints(strides)}", facts=(LayoutBroken("inner", self.n, tuple(strides)),))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        return {"rule": "inner", "dense_inner_dims": self.n, **_dense_strides_doc(dims, self.n, env)}

    def doc(self, data: Mapping[str, Any]) -> str:
        if self.n == 1:
            return "last dim stride 1"
        return (f"last {self.n} dims dense (`inner_contiguous={self.n}`): strides `{data['strides']}` = "
                f"`{data['concrete_strides']}`")


@dataclass(frozen=True)
class Disjoint(Rule):
    """A tensor written in place: no two blocks of its last ``n`` dims share memory. ``rank`` is
    None when the rank varies (a variadic dim): then the general test runs."""

    argument: str
    rank: int | None
    n: int
    kind: ClassVar[type[ContractError]] = LayoutError
    needs: ClassVar[frozenset[str]] = frozenset({"shape", "strides"})
    family: ClassVar[str] = "layout"
    order: ClassVar[int] = 30
    doc_section: ClassVar[str | None] = "layout"

    def test(self, n: Slots) -> str:
        s, st, r = n.shape, n.strides, self.rank
        if r is None:
            return f"not {n.constants['disjoint']}({s}, {st}, {self.n})"
        if r - self.n == 1:  # one outer axis (a pool of slots): its stride steps over a whole block
            block = "*".join(f"({n.size(axis)} or 1)" for axis in range(1, r)) or "1"
            return f"{n.size(0)} > 1 and {st}[0] < {block}"
        if r - self.n > 1:
            return f"not {n.constants['disjoint']}({s}, {st}, {self.n})"
        return "False"

    def constants(self) -> dict[str, Any]:
        return {"disjoint": blocks_disjoint} if self.rank is None or self.rank - self.n > 1 else {}

    def violation(self, **values: Any) -> Violation:
        shape, strides = values["shape"], values["strides"]
        block = math.prod(max(s, 1) for s in shape[len(shape) - self.n:])
        expected = (f"blocks of the last {self.n} dims that do not overlap (stride[0] >= {block})"
                    if len(shape) - self.n == 1 else f"blocks of the last {self.n} dims that do not overlap")
        return Violation(LayoutError, self.argument, expected, f"strides {fmt_ints(strides)}",
                         facts=(LayoutBroken("disjoint", self.n, tuple(strides)),))

    def describe(self, dims: Sequence[Any], env: Mapping[str, int], config_value: Any = None) -> dict[str, Any]:
        block = product(dims[len(dims) - self.n:]) if self.n else None
        if block is None:
            return {"disjoint": {"block": "?", "concrete_block": "?"}}
        return {"disjoint": {"block": str(block), "concrete_block": concrete(block, env)}}

    def doc(self, data: Mapping[str, Any]) -> str:
        dis = data["disjoint"]
        return (f"written in place, so blocks must not overlap (`disjoint`: outer stride ≥ `{dis['block']}` = "
                f"`{dis['concrete_block']}`; an `.expand()`ed pool is rejected)")
