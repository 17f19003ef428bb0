"""Contracts and calls for tests/test_fuzz_edges_differential.py: tensors where a checker may leak
(inside containers, as dataclass and NamedTuple fields, as results) on CPU and ``meta`` devices, with
broadcast variadics, judged by ``@kc.contract`` and by ``@jaxtyped(typechecker=beartype)``.

A *template* is a fixed function: an optional anchor argument ``x: Float[Tensor, "<anchor>"]`` and
one *placement* (``PLACEMENTS``) of an inner tensor annotation (``Float``/``Int``/``Shaped`` over
``B D``, ``*b D``, ``#*b D``, ``#B D`` or ``... D``; ``Float`` in fields), with
``Float[Tensor, "D"]`` companions in fixed tuples and dataclasses. A result is handed in as an
``r: Any`` argument (which neither engine checks) and cloned by the body, so that the same function
runs eagerly and under ``torch.compile``.

A *call* binds ``B, D`` to 0..3 (rarely 0) and ``*b`` to 0..2 axes, draws a fitting shape and dtype
for each group of tensors (the anchor; the inner items; the companions; a result), then mutates
the shape or dtype of some groups, and places every tensor on ``cpu``, or every one on ``meta``, or
all but one. A container's items share one shape and dtype (beartype checks one item where we check
all) unless asked otherwise. Everything is drawn from the ``random.Random`` given: the same cases
every run, in any order.
"""

# No `from __future__ import annotations`: the exec'd annotations must be evaluated.

import functools
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jaxtyping
import torch
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation
from jaxtyping import Float, Int, Shaped, jaxtyped
from torch import Tensor

import kda_contracts as kc

KINDS = {"plain": "B D", "*b": "*b D", "#*b": "#*b D", "#B": "#B D", "...": "... D"}
IDENT = {"plain": "Plain", "*b": "Star", "#*b": "BStar", "#B": "HashB", "...": "Ell"}
FAMILIES = {"Float": (torch.float32, torch.float16, torch.bfloat16, torch.float64),
            "Int": (torch.int64, torch.int32, torch.int8, torch.uint8),
            "Shaped": (torch.float32, torch.int64, torch.bool)}
WRONG = {"Float": (torch.int32, torch.int64, torch.bool, torch.complex64),
         "Int": (torch.float32, torch.bool, torch.float16), "Shaped": ()}
AUX = 'Float[Tensor, "D"]'  # the companion of a fixed tuple's or a dataclass's inner tensor
# Where the inner annotation sits: (parameter source, category).
PLACEMENTS = {
    "arg": ("y: {leaf}", "top-level"),
    "list": ("ys: list[{leaf}]", "container"),
    "tuple": (f"ys: tuple[{{leaf}}, {AUX}]", "container"),
    "tuple...": ("ys: tuple[{leaf}, ...]", "container"),
    "dict": ("ys: dict[str, {leaf}]", "container"),
    "list[tuple]": ("ys: list[tuple[{leaf}, {leaf}]]", "container"),
    "dict[list]": ("ys: dict[str, list[{leaf}]]", "container"),
    "dataclass": ("p: Box{ident}", "field"),
    "NamedTuple": ("p: Pair{ident}", "field"),
    "list[dataclass]": ("ps: list[Box{ident}]", "field"),
    "nested dataclass": ("h: Holder{ident}", "field"),
    "*args": ("*ys: {leaf}", "container"),
    "**kwargs": ("**ys: {leaf}", "container"),
    "return": ("r: Any", "return"),
    "return tuple": ("r: Any", "return"),
    "list+return": ("ys: list[{leaf}], r: Any", "return"),  # a return whose dims a list binds
}
RETURNS = {"return": "{leaf}", "return tuple": f"tuple[{{leaf}}, {AUX}]", "list+return": "{leaf}"}
FIELDS = ("dataclass", "NamedTuple", "list[dataclass]", "nested dataclass")


def _out(r: Any) -> Any:
    """The body of a template with a return: the value it was handed, cloned (a traceable op)."""
    return tuple(t.clone() for t in r) if isinstance(r, tuple) else r.clone()


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = dict(Float=Float, Int=Int, Shaped=Shaped, Tensor=Tensor, Any=Any, _out=_out)
    for kind, ident in IDENT.items():  # one dataclass and one NamedTuple per inner dim string
        leaf = f'Float[Tensor, "{KINDS[kind]}"]'
        source = (f"@dataclass\nclass Box{ident}:\n    a: {leaf}\n    w: {AUX}\n\n"
                  f"class Pair{ident}(NamedTuple):\n    a: {leaf}\n    w: {AUX}\n\n"
                  f"@dataclass\nclass Holder{ident}:\n    box: Box{ident}\n    w: {AUX}\n")
        scope = dict(ns, dataclass=dataclass, NamedTuple=NamedTuple)
        exec(compile(source, "<edges classes>", "exec", dont_inherit=True), scope)
        ns.update({name + ident: scope[name + ident] for name in ("Box", "Pair", "Holder")})
    return ns


NAMESPACE = _namespace()


@dataclass(frozen=True)
class Template:
    anchor: str | None  # a KINDS key, or None: no top-level tensor argument
    placement: str
    inner: str  # a KINDS key
    family: str  # the inner annotation's: Float, Int or Shaped (fields are always Float)

    @property
    def where(self) -> str:
        return PLACEMENTS[self.placement][1]

    @property
    def inner_hint_source(self) -> str:
        family = "Float" if self.where == "field" else self.family
        return f'{family}[Tensor, "{KINDS[self.inner]}"]'

    @property
    def source(self) -> str:
        params = [f'x: Float[Tensor, "{KINDS[self.anchor]}"]'] if self.anchor else []
        params.append(PLACEMENTS[self.placement][0].format(leaf=self.inner_hint_source, ident=IDENT[self.inner]))
        ret = RETURNS.get(self.placement)
        head = f"def f({', '.join(params)})" + (f" -> {ret.format(leaf=self.inner_hint_source)}" if ret else "")
        return head + ":\n    return " + ("_out(r)" if ret else "None") + "\n"

    def hint(self, group: str) -> Any:
        """The annotation a tensor of ``group`` (anchor, inner or aux) is checked against."""
        src = {"anchor": f'Float[Tensor, "{KINDS[self.anchor or "plain"]}"]', "inner": self.inner_hint_source,
               "ret": self.inner_hint_source, "aux": AUX}[group]
        return _hint(src)


@functools.cache
def _hint(source: str) -> Any:
    return eval(source, NAMESPACE)


def templates() -> list[Template]:
    """Every anchor × placement × inner dim string; the inner family cycles Float, Float, Int, Shaped.
    A return needs an anchor (a dim only the return carries is refused at decoration)."""
    out = []
    for anchor in (None, *KINDS):
        for placement in PLACEMENTS:
            if anchor is None and placement in ("return", "return tuple"):
                continue
            for inner in KINDS:
                family = ("Float", "Float", "Int", "Shaped")[len(out) % 4]
                out.append(Template(anchor, placement, inner, family))
    return out


# -- calls -------------------------------------------------------------------------------------------
@dataclass
class Slot:
    """One tensor of a call: its group, where it sits (for messages) and its value."""

    group: str
    path: str
    tensor: Tensor


class Kwargs(dict):
    """The keyword arguments of a call (its last element of ``Call.args``)."""


@dataclass
class Call:
    template: Template
    args: list[Any]
    slots: list[Slot]  # every tensor, in the order jaxtyping meets them (arguments, then the return)
    device: str  # "cpu", "meta" or "mixed"
    mutations: list[str] = field(default_factory=list)
    uniform: bool = True  # a container's items share one shape and dtype

    @property
    def variadic(self) -> str:
        return self.template.inner

    def invoke(self, fn: Callable[..., Any]) -> Any:
        if self.args and isinstance(self.args[-1], Kwargs):
            return fn(*self.args[:-1], **self.args[-1])
        return fn(*self.args)

    def replaced(self, tensors: dict[int, Tensor]) -> "Call":
        """The same call with the tensors ``tensors`` maps (by ``id``) replaced."""
        new = {id(s.tensor): tensors.get(id(s.tensor), s.tensor) for s in self.slots}
        return Call(self.template, [_replace(a, new) for a in self.args],
                    [Slot(s.group, s.path, new[id(s.tensor)]) for s in self.slots], self.device, self.mutations,
                    self.uniform)

    def on_one_device(self) -> "Call":
        """The same call with every tensor on the first tensor's device."""
        home = self.slots[0].tensor.device
        one = self.replaced({id(s.tensor): torch.empty_like(s.tensor, device=home) for s in self.slots
                             if s.tensor.device != home})
        one.device = home.type
        return one


def _replace(value: Any, moved: dict[int, Tensor]) -> Any:
    if isinstance(value, Tensor):
        return moved[id(value)]
    if isinstance(value, dict):
        return type(value)({k: _replace(v, moved) for k, v in value.items()})
    if isinstance(value, list):
        return [_replace(v, moved) for v in value]
    if isinstance(value, tuple):  # a NamedTuple's type kept
        items = [_replace(v, moved) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if hasattr(value, "__dataclass_fields__"):
        return type(value)(**{k: _replace(getattr(value, k), moved) for k in value.__dataclass_fields__})
    return value


def _size(rng: random.Random) -> int:
    return rng.choices((0, 1, 2, 3), weights=(1, 6, 7, 7))[0]


def fitting_shape(rng: random.Random, kind: str | None, env: dict[str, Any]) -> list[int]:
    b, B, D = env["b"], env["B"], env["D"]
    if kind is None:  # a companion
        return [D]
    if kind == "plain":
        return [B, D]
    if kind == "*b":
        return [*b, D]
    if kind == "#*b":
        kept = b[rng.randint(0, len(b)):]
        return [rng.choice((1, s)) for s in kept] + [D]
    if kind == "#B":
        return [rng.choice((1, B)), D]
    return [rng.randint(1, 3) for _ in range(rng.randint(0, 2))] + [D]


def mutate_shape(rng: random.Random, kind: str | None, shape: list[int], env: dict[str, Any]) -> tuple[list[int], str]:
    """One shape mutation (the result may still fit: verdicts are compared, not predicted)."""
    shape = list(shape)
    lead = len(shape) - 1  # the axes before D
    hows = ["D", "rank", *{"plain": ["B"], "#B": ["broadcast"], "*b": ["variadic"],
                           "#*b": ["variadic", "broadcast"]}.get(kind or "aux", [])]
    how = rng.choice(hows)
    if how == "D" and shape:
        shape[-1] = env["D"] + (1 if env["D"] == 0 else rng.choice((-1, 1)))
    elif how == "B":
        shape[0] = env["B"] + 1
    elif how == "broadcast" and lead:
        i = rng.randrange(lead)
        shape[i] = (env["B"] if kind == "#B" else env["b"][i - lead + len(env["b"])]) + 1
    elif how == "variadic" and lead and rng.random() < 0.5:
        del shape[rng.randrange(lead)]
    elif how in ("variadic", "broadcast"):
        shape.insert(rng.randint(0, lead), rng.randint(2, 3))
    elif shape and rng.random() < 0.5:
        how = "rank: dropped"
        del shape[rng.randrange(len(shape))]
    else:
        how = "rank: added"
        shape.insert(rng.randint(0, len(shape)), rng.randint(1, 3))
    return shape, how


GROUPS_WITH_AUX = ("tuple", "dataclass", "NamedTuple", "list[dataclass]", "nested dataclass", "return tuple")


class Draw:
    """One call's sizes, and each group's shape and dtype (mutated where drawn)."""

    def __init__(self, rng: random.Random, t: Template, first_dtype: bool) -> None:
        self.rng, self.first_dtype = rng, first_dtype
        self.env = {"B": _size(rng), "D": _size(rng), "b": [_size(rng) for _ in range(rng.randint(0, 2))]}
        family = "Float" if t.where == "field" else t.family
        self.kinds = {"anchor": (t.anchor, "Float"), "inner": (t.inner, family), "aux": (None, "Float"),
                      "ret": (t.inner, family)}
        self.groups = {g: self.fresh(g) for g in self.kinds}
        self.present = [g for g in self.kinds if (g != "anchor" or t.anchor) and (g != "aux" or t.placement in
                        GROUPS_WITH_AUX) and (g != "ret" or t.placement == "list+return")]

    def fresh(self, group: str) -> tuple[list[int], torch.dtype]:
        kind, family = self.kinds[group]
        dtypes = FAMILIES[family]
        return fitting_shape(self.rng, kind, self.env), dtypes[0] if self.first_dtype else self.rng.choice(dtypes)

    def mutated(self, group: str, shape: list[int], dtype: torch.dtype, log: list[str],
                where: str) -> tuple[list[int], torch.dtype]:
        kind, family = self.kinds[group]
        if WRONG[family] and self.rng.random() < 0.3:
            dtype = self.rng.choice(WRONG[family])
            log.append(f"{where}: dtype {dtype}")
        else:
            shape, how = mutate_shape(self.rng, kind, shape, self.env)
            log.append(f"{where}: {how} -> {shape}")
        return shape, dtype


def _structure(t: Template, n: int, make: Callable[[str, str], Tensor]) -> list[Any]:
    """The arguments after the anchor, their tensors made (in jaxtyping's order) by ``make(group, path)``."""
    p, inner = t.placement, lambda path: make("inner", path)
    box, pair = NAMESPACE[f"Box{IDENT[t.inner]}"], NAMESPACE[f"Pair{IDENT[t.inner]}"]
    if p in ("arg", "return"):
        return [inner(p)]
    if p in ("tuple", "return tuple"):
        return [(inner(f"{p}[0]"), make("aux", f"{p}[1]"))]
    if p == "dataclass":
        return [box(inner("p.a"), make("aux", "p.w"))]
    if p == "NamedTuple":
        return [pair(inner("p.a"), make("aux", "p.w"))]
    if p == "nested dataclass":
        holder = NAMESPACE[f"Holder{IDENT[t.inner]}"]
        return [holder(box(inner("h.box.a"), make("aux", "h.box.w")), make("aux", "h.w"))]
    if p == "**kwargs":
        return [Kwargs({f"k{i}": inner(f"ys['k{i}']") for i in range(n)})]
    if p == "list[dataclass]":
        return [[box(inner(f"ps[{i}].a"), make("aux", f"ps[{i}].w")) for i in range(n)]]
    if p == "dict":
        return [{f"k{i}": inner(f"ys['k{i}']") for i in range(n)}]
    if p == "list[tuple]":
        return [[(inner(f"ys[{i}][0]"), inner(f"ys[{i}][1]")) for i in range(n)]]
    if p == "dict[list]":
        return [{f"k{i}": [inner(f"ys['k{i}'][{j}]") for j in range(n - i)] for i in range(n)}]
    items = [inner(f"ys[{i}]") for i in range(n)]
    if p == "list+return":
        return [items, make("ret", "return")]
    if p == "*args":
        return items
    return [tuple(items) if p == "tuple..." else items]


def make_call(t: Template, rng: random.Random, mutations: int, device: str, first_dtype: bool = False,
              uniform: bool = True) -> Call:
    """A call of ``t``: ``device`` is cpu, meta or mixed (one tensor, drawn, on the other one);
    ``uniform``: a container's items share one shape and dtype (else each item is drawn, and a
    mutation of the items mutates one of them)."""
    draw, log = Draw(rng, t, first_dtype), []
    mutated = rng.sample(draw.present, min(mutations, len(draw.present)))
    for g in mutated if uniform else [g for g in mutated if g != "inner"]:
        draw.groups[g] = draw.mutated(g, *draw.groups[g], log, g)
    slots: list[Slot] = []
    base = rng.choice(("cpu", "meta")) if device == "mixed" else device

    def make(group: str, path: str) -> Tensor:
        shape, dtype = draw.fresh(group) if group == "inner" and not uniform else draw.groups[group]
        slots.append(Slot(group, path, torch.zeros(shape, dtype=dtype, device=base)))
        return slots[-1].tensor

    args = ([make("anchor", "x")] if t.anchor else []) + _structure(t, rng.randint(int(mutations > 0), 2), make)
    call, changed = Call(t, args, slots, device, log, uniform), {}
    if not uniform and "inner" in mutated:
        victim = rng.choice([s for s in slots if s.group == "inner"])
        shape, dtype = draw.mutated("inner", list(victim.tensor.shape), victim.tensor.dtype, log, victim.path)
        changed[id(victim.tensor)] = torch.zeros(shape, dtype=dtype, device=base)
    if device == "mixed" and len(slots) > 1:
        victim = rng.choice(slots)
        other = "meta" if base == "cpu" else "cpu"
        changed[id(victim.tensor)] = torch.empty_like(changed.get(id(victim.tensor), victim.tensor), device=other)
        log.append(f"{victim.path}: {other}")
    elif device == "mixed":
        call.device = base  # one tensor: nothing to mix
    return call.replaced(changed) if changed else call


def shifted(call: Call, k: int) -> Call:
    """The same call with every size >= 2 grown by ``k``: the same equalities, 0s and 1s, so the
    same verdicts, and the same static class for dynamo."""
    return call.replaced({id(s.tensor): torch.zeros([n + k if n >= 2 else n for n in s.tensor.shape],
                                                    dtype=s.tensor.dtype, device=s.tensor.device) for s in call.slots})


# -- the engines -------------------------------------------------------------------------------------
def verdict_of(fn: Callable[[], Any]) -> str:
    """"accept", "reject", "undecided" (a jaxtyping AnnotationError) or "escape: ..."."""
    try:
        fn()
    except (jaxtyping.TypeCheckError, BeartypeCallHintViolation):
        return "reject"
    except jaxtyping.AnnotationError:
        return "undecided"
    except Exception as exc:
        return f"escape: {type(exc).__name__}: {exc}"
    return "accept"


ERROR_KINDS = (kc.ShapeError, kc.DtypeError, kc.DeviceError, kc.LayoutError, kc.ValueRangeError, kc.ArgumentTypeError)


def our_verdict(fn: Callable[..., Any], call: Call) -> tuple[str, frozenset[str]]:
    """("accept" | "reject" | "escape: ...", the ContractError kinds raised)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call.invoke(fn)
        except kc.ContractError as exc:
            kinds = frozenset(k.__name__ for k in ERROR_KINDS if isinstance(exc, k))
            result = ("reject", kinds)
        except Exception as exc:
            return f"escape: {type(exc).__name__}: {str(exc)[:400]}", frozenset()
        else:
            result = ("accept", frozenset())
    if any("fast checker" in str(w.message) for w in caught):
        return f"escape: the fast checker and the full check disagree ({result[0]})", frozenset()
    return result


class Engines:
    """One template decorated by each engine (the source exec'd once for each)."""

    def __init__(self, t: Template) -> None:
        self.template = t
        self.jaxtyping = jaxtyped(typechecker=beartype)(self._define())
        self.refusal: str | None = None
        try:
            self.ours = kc.contract(register=False, mode="check")(self._define())
        except kc.AnnotationError as exc:
            self.refusal = str(exc)

    def _define(self) -> Callable[..., Any]:
        ns = dict(NAMESPACE)
        exec(compile(self.template.source, "<edges contract>", "exec", dont_inherit=True), ns)
        return ns["f"]

    def jaxtyping_verdict(self, call: Call) -> str:
        random.seed(0)  # beartype checks one item of a container, drawn with random.getrandbits
        return verdict_of(lambda: call.invoke(self.jaxtyping))

    def leafwise_verdict(self, call: Call) -> str:
        """jaxtyping's verdict on every tensor of the call, one by one in one memo (as it checks the
        arguments of one call): what "checked with the call's dims" means in its own terms."""
        def check() -> None:
            with jaxtyped("context"):
                for slot in call.slots:
                    if not isinstance(slot.tensor, self.template.hint(slot.group)):
                        raise jaxtyping.TypeCheckError(slot.path)
        return verdict_of(check)


def describe(call: Call) -> str:
    def show(v: Any) -> str:
        if isinstance(v, Tensor):
            dev = "" if v.device.type == "cpu" else f", device={v.device.type!r}"
            return f"zeros({tuple(v.shape)}, {str(v.dtype).removeprefix('torch.')}{dev})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {show(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(show(x) for x in v)
            name = type(v).__name__ if hasattr(v, "_fields") else ""
            return f"[{inner}]" if isinstance(v, list) else f"{name}({inner}{',' if len(v) == 1 and not name else ''})"
        if hasattr(v, "__dataclass_fields__"):
            return f"{type(v).__name__}(" + ", ".join(show(getattr(v, k)) for k in v.__dataclass_fields__) + ")"
        return repr(v)

    return (call.template.source.replace("\n", "\n    ").rstrip() + "\n    f("
            + ", ".join(("**" if isinstance(a, Kwargs) else "") + show(a) for a in call.args)
            + f")\n    mutations: {call.mutations}")
