"""Differential fuzzing of the dim grammar and of tensors inside containers: ``@kc.contract`` against
``@jaxtyped(typechecker=beartype)`` on random contracts and random calls.

A strategy draws a contract: 1 to 4 arguments, each a tensor (``Float``/``Int``/``Shaped``/``Bool``)
whose dim string is drawn from jaxtyping's grammar (named dims from a small pool, integers, ``_``
and ``_name``, ``#name``, ``name=dim`` labels, ``*batch``/``#*batch``/``...``/``*_``, the scalar
``""``, and expressions ``2*D``, ``D+1``, ``D-1``, ``D*C``, ``D//2``, ``D%2`` only over names an
earlier plain dim binds in jaxtyping's left-to-right order), or such a tensor inside ``list``,
``Sequence``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``, ``Mapping[str, X]`` or
``Optional``; sometimes a ``float``/``int`` scalar; sometimes a return annotation. The source is
exec'd twice and decorated once by each engine. Calls then bind every dim to a random size and
build tensors that fit, or mutate them: a dim off by one, an axis dropped or added, a wrong
broadcast, a wrong variadic length, a wrong dtype, None where not allowed, a non-tensor, the
wrong container, a wrong return.

Verdicts (accepted vs raised) are compared wherever jaxtyping decides: a
``jaxtyping.AnnotationError`` at call time (a dim it cannot evaluate yet) is counted, not compared.
beartype checks one random item of a list, a ``tuple[X, ...]`` or a mapping, and we check every
item: the items of one container are given the same shape and dtype, so that either all fit or
none does and both engines decide the same thing.

Every verdict must agree, except where a case is recognised (by the case itself, never by the
verdict alone) as one of:

- a documented, intended difference (docs/reliability.md), confirmed by undoing it and asking
  jaxtyping again: an int or a bool for a ``float`` parameter;
- a known bug, reported, each with a strict-xfail minimal reproduction at the end of this file
  (``test_bug_*``): when one is fixed, its xfail passes, CI fails, and its recogniser goes.

Anything else (a different verdict, or an exception other than a ``kc.ContractError`` on a call or
a ``kc.AnnotationError`` at decoration) fails the test with the contract and the call. Contracts we
refuse at decoration are counted apart: they must be refusals of a dim no required tensor or
container binds (a documented difference), never anything else.

Budget: the loaded Hypothesis profile's ``max_examples`` (tests/conftest.py) per property, seven
calls per contract (two valid, five mutated): the ``ci`` profile compares about 2,700 calls, in
10 to 20 s. ``HYPOTHESIS_PROFILE=long`` for a long local run; ``KDA_DIFF_SURVEY=1`` collects every
unexplained case and prints them at the end instead of failing on the first. Counters print at the
end of the module (``grammar_differential counters: ...``) and go to ``$KDA_FUZZ_STATS`` if set.
"""

# No `from __future__ import annotations`: the generated sources' annotations must be evaluated
# (and compile() below does not inherit this module's future flags either).

import os
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import jaxtyping
import pytest
import torch
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation
from fuzz_stats import report_counters
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Bool, Float, Int, Shaped, jaxtyped
from torch import Tensor

import kda_contracts as kc


def budget(fraction: float) -> settings:
    """The profile's settings with ``fraction`` of its example budget (seed blob always printed)."""
    return settings(max_examples=max(10, int(settings.default.max_examples * fraction)), deadline=None,
                    print_blob=True)


STATS: Counter[str] = Counter(escapes=0, unexplained=0)  # unexplained: must stay 0

NAMES = ("B", "C", "D")
FAMILIES: dict[str, tuple[torch.dtype, ...]] = {  # the dtypes a valid call draws for each category
    "Float": (torch.float32, torch.float16, torch.bfloat16, torch.float64),
    "Int": (torch.int64, torch.int32, torch.int8),
    "Shaped": (torch.float32, torch.int64, torch.bool, torch.uint8),
    "Bool": (torch.bool,),
}
ANY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)
# Expressions jaxtyping can evaluate once their names are bound: (template, arity).
EXPRESSIONS = (("2*{0}", 1), ("{0}+1", 1), ("{0}-1", 1), ("{0}//2", 1), ("{0}%2", 1), ("{0}*{1}", 2),
               ("{0}+{1}", 2))
CONTAINERS = ("list", "Sequence", "tuple...", "tuple2", "dict", "Mapping", "Optional", "|None")


def chance(draw: st.DrawFn, percent: int) -> bool:
    """True ``percent`` times in 100, away from the bounds Hypothesis draws more often than the rest."""
    return 20 <= draw(st.integers(0, 99)) < 20 + percent


# -- contracts ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Axis:
    """One token of a dim string: ``kind`` is name, int, any, bcast, expr, var, bvar or ellipsis."""

    kind: str
    text: str
    names: tuple[str, ...] = ()  # the dim names it reads (a name, a bcast, an expression)
    value: int = 0  # an int's size


@dataclass(frozen=True)
class Leaf:
    family: str
    axes: tuple[Axis, ...]

    @property
    def dim_str(self) -> str:
        return " ".join(a.text for a in self.axes)

    @property
    def source(self) -> str:
        return f'{self.family}[Tensor, "{self.dim_str}"]'


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "tensor", a CONTAINERS entry, or "float"/"int" for a scalar
    leaves: tuple[Leaf, ...] = ()

    @property
    def source(self) -> str:
        if self.kind in ("float", "int"):
            return self.kind
        inner = self.leaves[0].source
        return {
            "tensor": inner, "list": f"list[{inner}]", "Sequence": f"Sequence[{inner}]",
            "tuple...": f"tuple[{inner}, ...]", "dict": f"dict[str, {inner}]", "Mapping": f"Mapping[str, {inner}]",
            "Optional": f"Optional[{inner}]", "|None": f"{inner} | None",
            "tuple2": f"tuple[{inner}, {self.leaves[-1].source}]",
        }[self.kind]


@dataclass(frozen=True)
class Contract:
    params: tuple[Param, ...]
    ret: Leaf | None

    @property
    def source(self) -> str:
        args = ", ".join(f"{p.name}: {p.source}" for p in self.params)
        ret = f" -> {self.ret.source}" if self.ret is not None else ""
        return f"def f({args}){ret}:\n    return _ret()\n"

    def leaves(self) -> list[Leaf]:
        return [leaf for p in self.params for leaf in p.leaves] + ([self.ret] if self.ret is not None else [])


@st.composite
def axes(draw: st.DrawFn, bound: set[str], pool: Sequence[str], variadic: bool) -> tuple[Axis, ...]:
    """A dim string. ``bound``: the names jaxtyping has bound before this argument (it grows with
    this argument's plain names); expressions read only those, or names earlier in this one.
    ``pool``: the names to draw from."""
    out: list[Axis] = []
    for _ in range(draw(st.integers(0, 3))):
        kinds = (["name", "name", "bcast", "label"] if pool else []) + ["int", "any"] + (["expr"] * 2 if bound else [])
        kind = draw(st.sampled_from(kinds))
        name = draw(st.sampled_from(pool)) if pool else ""
        if kind == "name":
            out.append(Axis("name", name, (name,)))
        elif kind == "label":
            k = draw(st.integers(1, 4))
            out.append(Axis("name", f"{name.lower()}s={name}", (name,)) if draw(st.booleans())
                       else Axis("int", f"n={k}", value=k))
        elif kind == "int":
            k = draw(st.integers(1, 4))
            out.append(Axis("int", str(k), value=k))
        elif kind == "any":
            out.append(Axis("any", draw(st.sampled_from(("_", "_h")))))
        elif kind == "bcast":
            out.append(Axis("bcast", f"#{name}", (name,)))
        else:
            template, arity = draw(st.sampled_from(EXPRESSIONS))
            names = tuple(draw(st.sampled_from(sorted(bound))) for _ in range(arity))
            text = template.format(*names)
            out.append(Axis("expr", f"#{text}" if chance(draw, 10) else text, names))
    if variadic and draw(st.booleans()):
        kind, text = draw(st.sampled_from((("var", "*batch"), ("var", "*batch"), ("bvar", "#*batch"),
                                           ("ellipsis", "..."), ("ellipsis", "*_"))))
        out.insert(draw(st.integers(0, len(out))), Axis(kind, text))
    # jaxtyping reads one argument's dims left to right (the prefix before a variadic dim, then the
    # suffix): an expression before its names' first plain occurrence cannot be evaluated.
    seen, fixed = set(bound), []
    for a in out:
        if a.kind == "expr" and not set(a.names) <= seen:
            a = Axis("name", a.names[0], (a.names[0],))
        if a.kind == "name":
            seen.add(a.names[0])
        fixed.append(a)
    bound |= {a.names[0] for a in fixed if a.kind == "name"}
    return tuple(fixed)


@st.composite
def leaves(draw: st.DrawFn, bound: set[str], binds: bool) -> Leaf:
    """A tensor annotation; ``binds``: whether its plain names count as bound for later arguments
    (not inside an Optional, a list or a mapping, which may be None or empty)."""
    trial = set(bound)
    dims = draw(axes(trial, NAMES, variadic=True))
    if binds:
        bound |= trial
    return Leaf(draw(st.sampled_from(sorted(FAMILIES))), dims)


def carried(params: Sequence[Param]) -> set[str]:
    """The names (and ``*batch``) some argument's annotation mentions, in any form."""
    names = {n for p in params for leaf in p.leaves for a in leaf.axes for n in a.names}
    if any(a.kind in ("var", "bvar") for p in params for leaf in p.leaves for a in leaf.axes):
        names.add("*batch")
    return names


@st.composite
def returns(draw: st.DrawFn, params: Sequence[Param], bound: set[str]) -> Leaf:
    """A return annotation over the dims the arguments carry; rarely a dim none carries (which we
    refuse at decoration: a documented difference)."""
    known = sorted(carried(params) - {"*batch"})
    rare = chance(draw, 5)
    pool = NAMES if rare else tuple(known)
    dims = draw(axes(set(bound), pool, variadic="*batch" in carried(params) or rare))
    if "*batch" not in carried(params) and not rare:  # `...` stands in for a variadic dim none binds
        dims = tuple(a if a.kind not in ("var", "bvar") else Axis("ellipsis", "...") for a in dims)
    return Leaf(draw(st.sampled_from(sorted(FAMILIES))), dims)


@st.composite
def contracts(draw: st.DrawFn, containers: bool) -> Contract:
    bound: set[str] = set()
    params = []
    for i in range(draw(st.integers(1, 4))):
        name = "xyzw"[i]
        if containers and chance(draw, 60):
            kind = draw(st.sampled_from(CONTAINERS))
            if kind == "tuple2":
                params.append(Param(name, kind, (draw(leaves(bound, True)), draw(leaves(bound, True)))))
            else:
                params.append(Param(name, kind, (draw(leaves(bound, False)),)))
        elif chance(draw, 10):
            params.append(Param(name, draw(st.sampled_from(("float", "int")))))
        else:
            params.append(Param(name, "tensor", (draw(leaves(bound, True)),)))
    ret = draw(returns(params, bound)) if draw(st.booleans()) else None
    return Contract(tuple(params), ret)


# -- calls -------------------------------------------------------------------------------------------
@dataclass
class Call:
    args: list[Any]
    ret: Any = None
    mutations: list[str] = field(default_factory=list)


def _shape(draw: st.DrawFn, leaf: Leaf, env: Mapping[str, int], batch: tuple[int, ...]) -> list[int]:
    shape: list[int] = []
    for a in leaf.axes:
        if a.kind == "name":
            shape.append(env[a.names[0]])
        elif a.kind == "int":
            shape.append(a.value)
        elif a.kind == "any":
            shape.append(draw(st.integers(1, 4)))
        elif a.kind == "bcast":
            shape.append(draw(st.sampled_from((1, env[a.names[0]]))))
        elif a.kind == "expr":
            value = eval(a.text.lstrip("#"), {}, dict(env))
            shape.append(1 if a.text.startswith("#") and chance(draw, 25) else value)
        elif a.kind == "var":
            shape.extend(batch)
        elif a.kind == "bvar":
            kept = batch[draw(st.integers(0, len(batch))):]
            shape.extend(draw(st.sampled_from((1, s))) for s in kept)
        else:
            shape.extend(draw(st.lists(st.integers(1, 3), max_size=2)))
    return shape


def _variadic_span(leaf: Leaf, rank: int) -> tuple[int, int] | None:
    for i, a in enumerate(leaf.axes):
        if a.kind in ("var", "bvar", "ellipsis"):
            return i, rank - (len(leaf.axes) - 1 - i)
    return None


def _mutate_shape(draw: st.DrawFn, leaf: Leaf, shape: list[int], env: Mapping[str, int]) -> tuple[list[int], str]:
    """One shape mutation of a fitting shape (it may happen to fit still: verdicts are compared,
    not predicted)."""
    span = _variadic_span(leaf, len(shape))
    kinds = ["dim", "drop axis", "add axis"]
    if any(a.kind == "bcast" for a in leaf.axes):
        kinds.append("broadcast")
    if span is not None:
        kinds.append("variadic length")
    how = draw(st.sampled_from(kinds))
    shape = list(shape)
    if how == "dim" and shape:
        i = draw(st.integers(0, len(shape) - 1))
        shape[i] = max(0, shape[i] + draw(st.sampled_from((-1, 1))))
    elif how == "drop axis" and shape:
        del shape[draw(st.integers(0, len(shape) - 1))]
    elif how == "broadcast":
        i = draw(st.sampled_from([i for i, a in enumerate(leaf.axes) if a.kind == "bcast"]))
        axis = i if span is None or i < span[0] else i - len(leaf.axes)
        shape[axis] = env[leaf.axes[i].names[0]] + 1
    elif how == "variadic length":
        assert span is not None
        start, stop = span
        if stop > start and draw(st.booleans()):
            del shape[draw(st.integers(start, stop - 1))]
        else:
            shape.insert(draw(st.integers(start, stop)), draw(st.integers(1, 3)))
    else:
        how = "add axis"
        shape.insert(draw(st.integers(0, len(shape))), draw(st.integers(1, 3)))
    return shape, how


@st.composite
def tensors(draw: st.DrawFn, leaf: Leaf, env: Mapping[str, int], batch: tuple[int, ...], mutate: bool,
            log: list[str], where: str) -> Any:
    """A tensor for ``leaf`` (mutated: wrong shape, dtype or not a tensor at all)."""
    shape = _shape(draw, leaf, env, batch)
    dtype = draw(st.sampled_from(FAMILIES[leaf.family]))
    if mutate:
        how = draw(st.sampled_from(("shape", "shape", "shape", "dtype", "non-tensor")))
        if how == "dtype":
            dtype = draw(st.sampled_from([d for d in ANY_DTYPES if d != dtype]))
            log.append(f"{where}: dtype {dtype}")
        elif how == "non-tensor":
            value = draw(st.sampled_from(([0.0], 3, "t")))
            log.append(f"{where}: non-tensor {value!r}")
            return value
        else:
            shape, how = _mutate_shape(draw, leaf, shape, env)
            log.append(f"{where}: {how} -> {shape}")
    return torch.zeros(shape, dtype=dtype)


@st.composite
def calls(draw: st.DrawFn, contract: Contract, mutations: int) -> Call:
    env = {n: draw(st.integers(1, 4)) for n in NAMES}
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    n_params = len(contract.params) + (contract.ret is not None)
    targets = set(draw(st.lists(st.integers(0, n_params - 1), min_size=mutations, max_size=mutations)))
    call = Call([])
    for i, p in enumerate(contract.params):
        call.args.append(draw(values(p, env, batch, i in targets, call.mutations)))
    if contract.ret is not None:
        call.ret = draw(tensors(contract.ret, env, batch, len(contract.params) in targets, call.mutations, "return"))
    return call


@st.composite
def values(draw: st.DrawFn, p: Param, env: Mapping[str, int], batch: tuple[int, ...], mutate: bool,
           log: list[str]) -> Any:
    if p.kind in ("float", "int"):
        good = {"float": (0.5, -2.0), "int": (2, 0)}[p.kind]
        if not mutate:
            return draw(st.sampled_from(good))
        value = draw(st.sampled_from((True, "1", None, 1.5 if p.kind == "int" else 1)))
        log.append(f"{p.name}: scalar {value!r}")
        return value
    if mutate and p.kind not in ("Optional", "|None") and chance(draw, 15):
        log.append(f"{p.name}: None")
        return None
    if p.kind == "tuple2":
        which = draw(st.integers(0, 2)) if mutate else -1
        if which == 2:
            log.append(f"{p.name}: tuple length 1")
            return (draw(tensors(p.leaves[0], env, batch, False, log, p.name)),)
        return tuple(draw(tensors(leaf, env, batch, which == j, log, f"{p.name}[{j}]"))
                     for j, leaf in enumerate(p.leaves))
    if p.kind in ("Optional", "|None") and not mutate and draw(st.booleans()):
        return None
    mutate_container = mutate and p.kind not in ("tensor", "Optional", "|None") and chance(draw, 25)
    item = draw(tensors(p.leaves[0], env, batch, mutate and not mutate_container, log, p.name))
    if p.kind in ("tensor", "Optional", "|None"):
        return item
    # The items of one container are one shape and dtype (see the module docstring).
    n = draw(st.integers(0 if not mutate else 1, 3))
    items = [item.clone() if isinstance(item, Tensor) else item for _ in range(n)]
    if p.kind in ("dict", "Mapping"):
        if mutate_container:
            log.append(f"{p.name}: container list for a mapping")
            return items
        return {f"k{j}": t for j, t in enumerate(items)}
    if mutate_container:
        log.append(f"{p.name}: container {'list' if p.kind == 'tuple...' else 'dict'} for a {p.kind}")
        return items if p.kind == "tuple..." else {"k": items[0]}
    return tuple(items) if p.kind == "tuple..." else items


MUTATIONS = ("dim", "drop axis", "add axis", "broadcast", "variadic length", "dtype", "non-tensor", "None",
             "tuple length", "container", "scalar")


# -- verdicts ----------------------------------------------------------------------------------------
@dataclass
class Pair:
    """A dataclass holding a tensor (for the fixed examples of differences below)."""

    a: Float[Tensor, "B"]


class Couple(NamedTuple):
    a: Float[Tensor, "B"]


NAMESPACE = dict(Float=Float, Int=Int, Shaped=Shaped, Bool=Bool, Tensor=Tensor, Optional=Optional,
                 Sequence=Sequence, Mapping=Mapping, Pair=Pair, Couple=Couple)


class Engines:
    """The contract's source exec'd twice, decorated once by each engine; the body returns
    ``self.ret``."""

    def __init__(self, contract: Contract, source: str | None = None) -> None:
        self.contract = contract
        self.source = source or contract.source
        self.ret: Any = None
        self.jaxtyping = jaxtyped(typechecker=beartype)(self._define())
        self.refusal: str | None = None
        self.escape: str | None = None
        try:
            self.ours = kc.contract(register=False, mode="check")(self._define())
        except kc.AnnotationError as exc:
            self.refusal = str(exc)
        except Exception as exc:  # an escape at decoration: always a bug
            self.escape = f"{type(exc).__name__} at decoration: {exc}"

    def _define(self) -> Callable[..., Any]:
        ns = dict(NAMESPACE, _ret=lambda: self.ret)
        exec(compile(self.source, "<differential contract>", "exec", dont_inherit=True), ns)
        return ns["f"]

    def jaxtyping_verdict(self, call: Call) -> str:
        """"accept", "reject" or "undecided" (jaxtyping cannot evaluate a dim yet)."""
        self.ret = call.ret
        try:
            self.jaxtyping(*call.args)
        except (jaxtyping.TypeCheckError, BeartypeCallHintViolation):
            return "reject"
        except jaxtyping.AnnotationError:
            return "undecided"
        return "accept"

    def our_verdict(self, call: Call) -> str:
        self.ret = call.ret
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.ours(*call.args)
            except kc.ContractError:
                verdict = "reject"
            except Exception as exc:  # an escape: always a bug
                return f"escape: {type(exc).__name__}: {exc}"
            else:
                verdict = "accept"
        if any("fast checker" in str(w.message) for w in caught):
            return f"escape: the fast checker and the full check disagree ({verdict})"
        return verdict


def describe(contract: Contract, call: Call) -> str:
    def show(v: Any) -> str:
        if isinstance(v, Tensor):
            return f"zeros({tuple(v.shape)}, {v.dtype})"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(show(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {show(x)}" for k, x in v.items()) + "}"
        return repr(v)

    args = ", ".join(show(a) for a in call.args)
    return (textwrap.indent(contract.source, "    ") + f"    f({args})" +
            (f" returning {show(call.ret)}" if contract.ret is not None else "") + f"\n    mutations: {call.mutations}")


# -- the documented differences and the known bugs, recognised by the case ---------------------------
TOP_LEVEL = ("tensor", "Optional", "|None")  # what kda-contracts checks as a top-level tensor argument
SURVEY = bool(os.environ.get("KDA_DIFF_SURVEY"))  # collect unexplained cases instead of failing on the first
UNEXPLAINED: list[str] = []


def documented_difference(engines: Engines, call: Call, jt: str, ours: str) -> str | None:
    """The documented, intended difference (docs/reliability.md) behind a mismatch: found by
    undoing it and asking jaxtyping again."""
    floats = [i for i, p in enumerate(engines.contract.params) if p.kind == "float" and isinstance(call.args[i], int)]
    if (jt, ours) == ("reject", "accept") and floats:
        undone = Call([float(v) if i in floats else v for i, v in enumerate(call.args)], call.ret)
        if engines.jaxtyping_verdict(undone) == "accept":
            return "an int for a float"
    if (jt, ours) == ("accept", "reject") and _widened_by_the_result(engines.contract):
        return "a variadic dim only broadcastable container items carry is not widened by the result"
    return None


def _widened_by_the_result(contract: Contract) -> bool:
    """The return names ``*b`` that no top-level argument carries plainly and some container item
    carries as ``#*b``: jaxtyping lets the result widen it (order-dependent), we keep it fixed."""
    if contract.ret is None:
        return False
    def var(a: Axis) -> str:
        return a.text.lstrip("#*")
    returned = {var(a) for a in contract.ret.axes if a.kind in ("var", "bvar")}
    for name in returned:
        plain_top = any(a.kind == "var" and var(a) == name for p in contract.params if p.kind == "tensor"
                        for leaf in p.leaves for a in leaf.axes)
        bcast_inside = any(a.kind == "bvar" and var(a) == name for p in contract.params if p.kind != "tensor"
                           for leaf in p.leaves for a in leaf.axes)
        if bcast_inside and not plain_top:
            return True
    return False


def known_bug(contract: Contract, call: Call, jt: str, ours: str) -> str | None:
    """The known bug behind a case. The eight the fuzzer found are fixed (their reproductions
    below now pass), so none is known: every mismatch outside the documented differences fails."""
    return None


def _tensors(values: Any) -> list[Any]:
    if isinstance(values, (list, tuple)):
        return [t for v in values for t in _tensors(v)]
    return _tensors(list(values.values())) if isinstance(values, dict) else [values]


def _record(prefix: str, label: str | None, case: str) -> None:
    if label is not None:
        STATS[f"{prefix}: {label}"] += 1
        return
    STATS["unexplained"] += 1
    if SURVEY:
        UNEXPLAINED.append(case)
        return
    raise AssertionError(f"an unexplained difference with jaxtyping, or an escape (a bug):\n{case}")


def compare(engines: Engines, call: Call, prefix: str) -> None:
    """Both verdicts on one call, counted; an unexplained difference or escape fails the test."""
    STATS["calls"] += 1
    jt = engines.jaxtyping_verdict(call)
    case = describe(engines.contract, call)
    if engines.escape is not None:
        STATS["escapes"] += 1
        only_inside = "*batch" not in carried([p for p in engines.contract.params if p.kind == "tensor"])
        bug = engines.escape.startswith("KeyError at decoration: '*batch'") and only_inside
        _record(prefix, "bug 2: KeyError at decoration (a variadic dim only containers and Optionals carry)"
                if bug else None, f"{engines.escape}\n{case}")
        return
    if engines.refusal is not None:
        STATS[f"{prefix}: refused contract: jaxtyping {jt}s the call"] += 1
        return
    ours = engines.our_verdict(call)
    if ours.startswith("escape"):
        STATS["escapes"] += 1
        _record(prefix, known_bug(engines.contract, call, jt, ours), f"{ours}\n{case}")
        return
    if jt == "undecided":
        STATS[f"{prefix}: jaxtyping cannot decide (we {ours})"] += 1
        return
    STATS["compared"] += 1
    for m in call.mutations:
        STATS["mutation: " + next(k for k in MUTATIONS if m.split(": ", 1)[1].startswith(k))] += 1
    if jt == ours:
        STATS[f"{prefix}: both {jt}"] += 1
        return
    why = documented_difference(engines, call, jt, ours)
    label = f"documented difference: {why}" if why else known_bug(engines.contract, call, jt, ours)
    _record(prefix, label, f"jaxtyping {jt}s, kc.contract {ours}s:\n{case}")


def run_cases(contract: Contract, data: st.DataObject, prefix: str) -> None:
    """One contract, decorated once by each engine, and seven calls: two valid, five mutated."""
    engines = Engines(contract)
    STATS[f"{prefix}: contracts"] += 1
    if engines.refusal is not None:
        why = "a dim no required tensor or container binds" if "cannot bind dim" in engines.refusal else None
        STATS[f"{prefix}: contracts we refuse: {why}"] += 1
        assert why is not None or SURVEY, f"we refuse a contract: {engines.refusal}\n{contract.source}"
    for mutations in (0, 0, 1, 1, 1, 1, 2):
        compare(engines, data.draw(calls(contract, mutations)), prefix)


# -- the properties ----------------------------------------------------------------------------------
@budget(1.0)
@given(contract=contracts(containers=False), data=st.data())
def test_random_dim_strings_get_jaxtypings_verdict(contract: Contract, data: st.DataObject) -> None:
    run_cases(contract, data, "grammar")


@budget(1.0)
@given(contract=contracts(containers=True), data=st.data())
def test_tensors_inside_containers_get_jaxtypings_verdict(contract: Contract, data: st.DataObject) -> None:
    run_cases(contract, data, "containers")


def test_the_profile_budget_compares_enough_calls() -> None:
    """At least 1,000 compared calls under the ci profile (5 per example of the loaded profile)."""
    if not (STATS["grammar: contracts"] and STATS["containers: contracts"]):
        pytest.skip("run with both properties")
    assert STATS["compared"] >= 5 * settings.default.max_examples


# -- the bugs this test found (fixed): minimal reproductions ----------------------------------------
def _both(header: str, *args: Any, ret: Any = None) -> tuple[str, str]:
    """jaxtyping's verdict and ours (or our escape) on one call of a one-line contract."""
    engines = Engines(Contract((), None), header + "\n    return _ret()\n")
    assert engines.escape is None and engines.refusal is None, engines.escape or engines.refusal
    call = Call(list(args), ret)
    return engines.jaxtyping_verdict(call), engines.our_verdict(call)


# -- the documented differences, one fixed example each (docs/reliability.md) ------------------------
DIFFERENCES = {  # name: (contract header, call arguments, jaxtyping's verdict, ours)
    "an int for a float": ("def f(s: float):", (1,), "reject", "accept"),
    "a bool for a float (rejected by both since issue 13)": ("def f(s: float):", (True,), "reject", "reject"),
    "list items that disagree with each other (beartype checks one)":
        ('def f(xs: list[Float[Tensor, "B"]]):', ([torch.zeros(3), torch.zeros(4)],), "accept", "reject"),
    "mapping values that disagree with each other (beartype checks one)":
        ('def f(xs: dict[str, Float[Tensor, "B"]]):', ({"a": torch.zeros(3), "b": torch.zeros(4)},), "accept",
         "reject"),
    "variadic-tuple items that disagree with each other (beartype checks one)":
        ('def f(xs: tuple[Float[Tensor, "B"], ...]):', ((torch.zeros(3), torch.zeros(4)),), "accept", "reject"),
    "a dataclass's fields checked with the call's dims (beartype checks the instance's type)":
        ('def f(p: Pair, x: Float[Tensor, "B"]):', (Pair(torch.zeros(3)), torch.zeros(4)), "accept", "reject"),
    "a NamedTuple's fields checked with the call's dims (beartype checks the instance's type)":
        ('def f(p: Couple, x: Float[Tensor, "B"]):', (Couple(torch.zeros(3)), torch.zeros(4)), "accept", "reject"),
    "a dim solved from an expression (jaxtyping cannot evaluate it yet)":
        ('def f(x: Float[Tensor, "2*D"], y: Float[Tensor, "D"]):', (torch.zeros(6), torch.zeros(3)), "undecided",
         "accept"),
}


@pytest.mark.parametrize("difference", sorted(DIFFERENCES))
def test_documented_differences_with_jaxtyping(difference: str) -> None:
    header, args, jt, ours = DIFFERENCES[difference]
    assert _both(header, *args) == (jt, ours)


REFUSED = {  # contracts jaxtyping takes and we refuse at decoration: a dim no required tensor binds
    "a dim only the return carries": 'def f(x: Float[Tensor, "B"]) -> Float[Tensor, "B C"]:',
    "a dim only an Optional tensor carries": 'def f(x: Optional[Float[Tensor, "B"]]):',
}


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_contracts_jaxtyping_takes_and_we_refuse(refused: str) -> None:
    engines = Engines(Contract((), None), REFUSED[refused] + "\n    return _ret()\n")
    assert engines.refusal is not None and "cannot bind dim" in engines.refusal





def test_bug_1_a_return_dim_only_an_empty_list_binds_is_bound_by_the_return() -> None:
    assert _both('def f(x: list[Float[Tensor, "*b"]]) -> Float[Tensor, "*b"]:', [], ret=torch.zeros(2)) == \
        ("accept", "accept")  # we: TypeError escapes ("B" instead of "*b": "expected [B] = [None]")



def test_bug_2_a_variadic_dim_in_a_list_and_an_optional_decorates() -> None:
    engines = Engines(Contract((), None), 'def f(x: list[Float[Tensor, "*b"]], y: Optional[Float[Tensor, "*b"]]):'
                      "\n    return _ret()\n")
    assert engines.escape is None  # we: KeyError: '*b' from the code generator



def test_bug_3_an_optional_tensor_next_to_an_empty_list_is_checked_once() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "the fast checker of f rejected a call the full check accepts"
        assert _both('def f(x: Optional[Float[Tensor, "B"]], y: list[Float[Tensor, "B"]]) -> Float[Tensor, "B"]:',
                     torch.zeros(3), [], ret=torch.zeros(3)) == ("accept", "accept")  # we: TypeError escapes



def test_bug_4_a_list_item_may_widen_a_broadcast_only_dim() -> None:
    assert _both('def f(x: list[Float[Tensor, "N"]], y: Float[Tensor, "#N"]):', [torch.zeros(3)], torch.zeros(1)) \
        == ("accept", "accept")  # as f(x: "N", y: "#N") with sizes 3 and 1, which we accept; so Optional "N"



def test_bug_5_the_return_may_widen_a_broadcast_only_dim() -> None:
    assert _both('def f(x: Float[Tensor, "#N"]) -> Float[Tensor, "N"]:', torch.zeros(1), ret=torch.zeros(5)) \
        == ("accept", "accept")  # as f(x: "#N", y: "N") with sizes 1 and 5, which we accept



def test_bug_6_a_broadcast_only_dim_of_sizes_0_and_1_is_0() -> None:
    assert _both('def f(x: Float[Tensor, "#N"], y: Float[Tensor, "#N"]):', torch.zeros(0), torch.zeros(1)) \
        == ("accept", "accept")  # torch broadcasts them to 0, as we do for "#*b"



def test_bug_7_broadcastable_variadic_dims_inside_containers_broadcast_together() -> None:
    assert _both('def f(x: list[Float[Tensor, "#*b"]], y: list[Float[Tensor, "#*b"]]):', [torch.zeros(1)],
                 [torch.zeros(3)]) == ("accept", "accept")  # as two top-level "#*b" arguments, which we accept



def test_bug_8_an_optional_broadcastable_variadic_tensor_is_checked_once() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "the fast checker of f rejected a call the full check accepts"
        assert _both('def f(x: Float[Tensor, "*b"], y: Optional[Float[Tensor, "#*b"]]) -> Float[Tensor, "*b"]:',
                     torch.zeros(3), torch.zeros(1), ret=torch.zeros(3)) == ("accept", "accept")  # we: TypeError


@pytest.fixture(scope="module", autouse=True)
def _report_counters(request: pytest.FixtureRequest):
    yield
    report_counters(request, STATS, "grammar_differential")
    if UNEXPLAINED:
        print("\n\n".join(UNEXPLAINED))
