"""Differential fuzzing where a checker may leak (issue 29): tensors in containers, as dataclass and
NamedTuple fields and as results, on CPU and ``meta`` devices (and both in one call), with broadcast
variadics (``#*b``, ``*b``, ``#B``, ``...``), eagerly and under ``torch.compile``: ``@kc.contract``
against ``@jaxtyped(typechecker=beartype)`` on the same function (tests/edges_fuzz.py builds both).

Templates: an anchor (none, ``B D``, ``*b D``, ``#*b D``, ``#B D``, ``... D``) × 16 placements of an
inner annotation (a second argument; list, fixed and variadic tuple, dict, list of tuples, dict of
lists, ``*args``, ``**kwargs``; dataclass field, NamedTuple field, list of dataclasses, dataclass in
a dataclass; the result, the first item of a returned tuple, a result whose dims a list binds) ×
the inner dim string: 470, of which we refuse 76 at decoration (counted, each for a known reason).
Each is called 7 times (valid on cpu, on meta, on both; four with one or two groups of tensors
mutated: a dim, a broadcast axis, a variadic length, a rank, a dtype; on a drawn device) and, for
the containers, 3 times more with items that differ from each other. Nine templates are compiled
(``fullgraph=True``, ``backend="eager"``) and called 15 times each, valid calls replayed with every
size >= 2 grown (one static class, one verdict): each compiled verdict must be the eager one (the
same ``ContractError`` kinds), and an accepted call may trace at most 2 graphs per static class
(device, dtype, rank, sizes 0/1/many, container lengths).

Ours must accept, or reject with a ``kc.ContractError`` and nothing else. Every verdict must agree
with jaxtyping's or be recognised, from the case and confirmed by asking again without the
difference, as one of ``EXPLAINED`` (devices, fields, items, widened by the result) or of
``KNOWN_BUGS`` (each with a strict-xfail reproduction at the end of the file, with the other
defects this fuzz found); anything else fails with the contract and the call (``KDA_DIFF_SURVEY=1``
collects them all and prints them instead). "leafwise" is jaxtyping's own verdict on every tensor
of the call checked one by one in one memo: the reference where its call sees only some of them
(fields, one sampled item).

Deterministic: a fixed enumeration, calls drawn from ``random.Random(index)``, ``random.seed(0)``
before each jaxtyping call (beartype draws the item it checks with ``random.getrandbits``). Counters
print at the end of the module (``edges_differential counters: ...``; per category
``mode | where | device | variadic``) and go to ``$KDA_FUZZ_STATS`` if set.
"""

# No `from __future__ import annotations`: the reproductions below exec annotations that must be evaluated.
import dataclasses
import os
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo
from edges_fuzz import (
    FIELDS,
    KINDS,
    PLACEMENTS,
    Call,
    Engines,
    Template,
    describe,
    make_call,
    our_verdict,
    shifted,
    templates,
)
from fuzz_stats import report_counters
from jaxtyping import Float
from torch import Tensor

import kda_contracts as kc

STATS: Counter[str] = Counter(unexplained=0, escapes=0)
CATEGORIES: Counter[str] = Counter()  # "mode | where | device | variadic": compared calls
SURVEY = bool(os.environ.get("KDA_DIFF_SURVEY"))
UNEXPLAINED: list[str] = []

TEMPLATES = templates()
# Per eager call: (mutations, device, uniform items); the device "drawn" is cpu, meta or mixed.
EAGER_PLAN = ((0, "cpu", True), (0, "meta", True), (0, "mixed", True), (1, "drawn", True), (1, "drawn", True),
              (1, "drawn", True), (2, "drawn", True))
# Containers whose items may differ: (mutations, device).
ITEMS_PLAN = ((0, "drawn"), (1, "drawn"), (1, "drawn"))
ITEMS = ("list", "tuple...", "dict", "list[tuple]", "dict[list]", "list[dataclass]", "list+return", "*args", "**kwargs")
# The compiled calls: (mutations, device, size shifts); each drawn call is replayed with every size
# >= 2 grown by each shift (one static class for dynamo, one verdict).
COMPILE_PLAN = ((0, "cpu", (0, 1, 2, 3)), (0, "cpu", (0, 1, 2, 3)), (0, "meta", (0, 1, 2, 3)), (0, "mixed", (0,)),
                (1, "cpu", (0,)), (2, "meta", (0,)))

# The explained differences: a label of explain() names one or more of them (", devices" added
# where the call is also on two devices).
EXPLAINED = {
    "devices": "kda-contracts refuses tensors of one call on different devices (DeviceError); jaxtyping does "
               "not check devices. Confirmed: the same call on one device gets jaxtyping's verdict.",
    "fields": "kda-contracts checks a dataclass's or NamedTuple's tensor fields with the call's dims; beartype "
              "checks only the instance's type. Confirmed: jaxtyping's leafwise verdict is ours.",
    "items": "kda-contracts checks every item of a list, tuple[X, ...] or mapping; beartype checks one. "
             "Confirmed: jaxtyping's leafwise verdict is ours.",
    "widened by the result": "a #*b only container items carry broadcastably is not widened by the result "
                             "(docs/reliability.md; recognised by tests/test_fuzz_grammar_differential.py); "
                             "jaxtyping's memo lets the result broadcast it. Confirmed: returning the items' "
                             "broadcast #*b instead, both accept.",
}
KNOWN_BUGS: dict[str, str] = {}  # label: a strict-xfail reproduction at the end of this file (none open)


def _device(rng: random.Random, device: str) -> str:
    return rng.choice(("cpu", "cpu", "meta", "mixed")) if device == "drawn" else device


# -- judging one call ------------------------------------------------------------------------------
def explain(engines: Engines, call: Call, jt: str, leafwise: str, ours: str, kinds: frozenset[str]) -> str | None:
    """The label of a verdict: an agreement or an explained difference; None if unexplained."""
    if ours.startswith("escape"):
        return None
    if call.device == "mixed":
        return _explain_mixed(engines, call, jt, ours, kinds)
    fields = call.template.placement in FIELDS
    by_leaf = fields or not call.uniform  # jaxtyping's call does not see every tensor: its leafwise check does
    if not by_leaf and jt != leafwise:
        return None  # jaxtyping's call and its leaf-by-leaf check disagree: look at the case
    if jt == ours and (ours == leafwise or not by_leaf):
        return f"both {ours}"
    if by_leaf and (jt, leafwise, ours) == ("accept", "reject", "reject"):
        return f"explained: {'fields' if fields else 'items'}"
    if (leafwise, ours, kinds) == ("accept", "reject", {"ShapeError"}) and _widened(engines, call):
        return "explained: widened by the result"
    return None


def _widened(engines: Engines, call: Call) -> bool:
    """The result widens a ``#*b`` that only container items carry broadcastably (the documented
    difference tests/test_fuzz_grammar_differential.py recognises): confirmed when both engines
    accept the same call returning the items' broadcast ``#*b`` instead."""
    t = call.template
    if (t.placement, t.inner) != ("list+return", "#*b") or t.anchor == "*b":
        return False
    parts = [s.tensor.shape[:-1] for s in call.slots if s.group == "inner" or (s.group == "anchor" and
                                                                               t.anchor == "#*b")]
    ret = next(s.tensor for s in call.slots if s.group == "ret")
    try:
        shape = (*np.broadcast_shapes(*parts), *ret.shape[-1:])
    except ValueError:
        return False
    narrow = call.replaced({id(ret): torch.zeros(shape, dtype=ret.dtype, device=ret.device)})
    return (engines.jaxtyping_verdict(narrow), our_verdict(engines.ours, narrow)[0]) == ("accept", "accept")


def _explain_mixed(engines: Engines, call: Call, jt: str, ours: str, kinds: frozenset[str]) -> str | None:
    """A call on two devices: we must reject it; jaxtyping's verdict must be the one it gives the same
    call on one device, and so must ours there (up to the explained differences)."""
    one = call.on_one_device()
    jt_one, leafwise_one = engines.jaxtyping_verdict(one), engines.leafwise_verdict(one)
    ours_one, kinds_one = our_verdict(engines.ours, one)
    inner = explain(engines, one, jt_one, leafwise_one, ours_one, kinds_one)
    if inner is None or jt != jt_one:
        return None
    if ours != "reject":
        return None
    if jt == "reject":
        if "DeviceError" not in kinds:  # (a container reports its first bad item, with all that item breaks)
            STATS["mixed, both reject: the device violation of another item not reported"] += 1
        return "both reject"
    if ours_one == "accept":  # the device rule alone
        return "explained: devices" if "DeviceError" in kinds else None
    return f"{inner}, devices"


def record(call: Call, mode: str, label: str | None, case: str) -> None:
    STATS["compared"] += 1
    STATS[f"{mode}: compared"] += 1
    if label is None:
        STATS["unexplained"] += 1
        if SURVEY:
            UNEXPLAINED.append(case)
            return
        raise AssertionError(f"an unexplained difference with jaxtyping, or an escape (a bug):\n{case}")
    if label.startswith("explained: "):
        assert all(part in EXPLAINED for part in label.removeprefix("explained: ").split(", ")), label
    assert label in KNOWN_BUGS or not label.startswith("known bug"), label
    STATS[f"{mode}: {label}"] += 1
    where = PLACEMENTS[call.template.placement][1]
    CATEGORIES[f"{mode} | {where} | {call.device} | {call.variadic}"] += 1
    for axis, value in (("mode", mode), ("where", where), ("device", call.device), ("variadic", call.variadic)):
        STATS[f"{axis}={value}"] += 1


def judge(engines: Engines, call: Call) -> tuple[str | None, str, frozenset[str], str]:
    """(label, our verdict, our kinds, the case's description) of one eager call."""
    jt, leafwise = engines.jaxtyping_verdict(call), engines.leafwise_verdict(call)
    ours, kinds = our_verdict(engines.ours, call)
    if ours.startswith("escape"):
        STATS["escapes"] += 1
    label = explain(engines, call, jt, leafwise, ours, kinds)
    case = f"jaxtyping {jt}, leafwise {leafwise}, kc.contract {ours} {sorted(kinds)}:\n{describe(call)}"
    return label, ours, kinds, case


def decorate(t: Template) -> Engines | None:
    """Both engines on ``t``; None (counted) where we refuse it at decoration, which must be for a
    dim nothing we accept as a binder carries."""
    engines = Engines(t)
    STATS["templates"] += 1
    if engines.refusal is None:
        return engines
    why = refusal(t, engines.refusal)
    assert why is not None, f"we refuse:\n{engines.refusal}\n{t.source}"
    STATS[f"templates we refuse: {why}"] += 1
    return None


def refusal(t: Template, message: str) -> str | None:
    """Why we refuse ``t`` at decoration (jaxtyping takes every template), or None if unforeseen."""
    if "cannot bind dim" in message and t.placement in ("return", "return tuple"):
        return "a dim only the result carries (documented)"
    return None


# -- eager -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("anchor", [None, *KINDS], ids=lambda a: f"anchor={a}")
def test_every_placement_gets_jaxtypings_verdict_eagerly(anchor: str | None) -> None:
    for index, t in enumerate(TEMPLATES):
        if t.anchor != anchor or (engines := decorate(t)) is None:
            continue
        rng = random.Random(index)
        plan = EAGER_PLAN + (tuple((m, d, False) for m, d in ITEMS_PLAN) if t.placement in ITEMS else ())
        for mutations, device, uniform in plan:
            call = make_call(t, rng, mutations, _device(rng, device), uniform=uniform)
            label, _, _, case = judge(engines, call)
            record(call, "eager", label, case)


# -- compiled --------------------------------------------------------------------------------------
# The compiled subset: (anchor, placement, inner), every category, device and variadic kind.
COMPILED = (("*b", "arg", "#*b"), ("plain", "list", "#B"), ("#B", "dict", "plain"), ("...", "dict[list]", "#*b"),
            ("#*b", "NamedTuple", "#*b"), ("plain", "list[dataclass]", "..."), ("#B", "return tuple", "#B"),
            (None, "list+return", "*b"), ("#B", "*args", "#*b"))


def compiled_templates() -> list[int]:
    return [next(j for j, t in enumerate(TEMPLATES) if (t.anchor, t.placement, t.inner) == want) for want in COMPILED]


def static_class(call: Call) -> tuple[Any, ...]:
    """What dynamo may specialise on: each tensor's place, device, dtype, rank and sizes 0/1/many."""
    return tuple((s.path, s.tensor.device.type, s.tensor.dtype, tuple(min(n, 2) for n in s.tensor.shape))
                 for s in call.slots)


@pytest.mark.parametrize("index", compiled_templates(), ids=lambda i: TEMPLATES[i].placement)
def test_compiled_verdicts_are_the_eager_ones_and_jaxtypings(index: int) -> None:
    t = TEMPLATES[index]
    engines = decorate(t)
    assert engines is not None, t.source
    torch._dynamo.reset()
    contract = engines.ours.__kda_contract__
    compiled = torch.compile(engines.ours, fullgraph=True, backend="eager")
    rng = random.Random(10_000 + index)
    traces, classes = 0, set()
    with torch._dynamo.config.patch(recompile_limit=64):
        for mutations, device, shifts in COMPILE_PLAN:
            drawn = make_call(t, rng, mutations, device, first_dtype=True)
            for call in (shifted(drawn, k) for k in shifts):
                label, ours, kinds, case = judge(engines, call)  # eagerly first
                calls = contract.calls  # under compile: one per trace (runs of a graph count none)
                got = our_verdict(compiled, call)
                if got[0] == "accept":  # a rejected trace leaves no graph
                    traces += contract.calls - calls
                    classes.add(static_class(call))
                same = got == (ours, kinds)
                record(call, "compile", label if same else None,
                       case if same else f"compiled: {got[0]} {sorted(got[1])}, eager: {ours} {sorted(kinds)}\n{case}")
    torch._dynamo.reset()
    STATS["compile: accepted traces"] += traces
    STATS["compile: static classes"] += len(classes)
    assert traces <= 2 * len(classes), f"{traces} graphs for {len(classes)} static classes:\n{t.source}"


# -- totals ----------------------------------------------------------------------------------------
def test_the_fuzz_compares_enough_calls_and_explains_every_difference() -> None:
    if STATS["eager: compared"] < len(TEMPLATES) or not STATS["compile: compared"]:
        pytest.skip("run with the eager and compiled properties")
    assert STATS["compared"] >= 2000
    assert STATS["unexplained"] == 0 or SURVEY
    for axis, values in (("where", ("top-level", "container", "field", "return")), ("device", ("cpu", "meta", "mixed")),
                         ("variadic", tuple(KINDS)), ("mode", ("eager", "compile"))):
        for value in values:
            assert STATS[f"{axis}={value}"] >= 20, f"{axis}={value}: {STATS[f'{axis}={value}']} calls"


# -- what this fuzz found (E1-E5), fixed: minimal reproductions -------------------------------------
# (E1 and E5 are verdicts the fuzz now compares; E2-E4 are the report's: counted, worded, complete.)
@dataclasses.dataclass
class Held:
    a: Float[Tensor, "D"]


def _contract(header: str, body: str = "return None") -> Any:
    ns: dict[str, Any] = dict(Float=Float, Tensor=Tensor, Any=Any, Held=Held)
    exec(f"{header}:\n    {body}\n", ns)
    return kc.contract(register=False, mode="check")(ns["f"])


def _raised(fn: Any, *args: Any) -> kc.ContractError:
    with pytest.raises(kc.ContractError) as caught:
        fn(*args)
    return caught.value


META = torch.zeros(3, device="meta")
E1_CASES = {  # header, arguments: a result on meta, every tensor argument on the CPU
    "list": ('def f(ys: list[Float[Tensor, "D"]], r: Any) -> Float[Tensor, "D"]', ([torch.zeros(3)], META)),
    "dataclass": ('def f(p: Held, r: Any) -> Float[Tensor, "D"]', (Held(torch.zeros(3)), META)),
    "tuple result": ('def f(ys: list[Float[Tensor, "D"]], r: Any) -> tuple[Float[Tensor, "D"], Float[Tensor, "D"]]',
                     ([torch.zeros(3)], (torch.zeros(3), META))),
}


@pytest.mark.parametrize("case", sorted(E1_CASES))
def test_e1_the_result_is_checked_against_the_device_of_tensors_in_containers(case: str) -> None:
    header, args = E1_CASES[case]
    top = _contract('def f(x: Float[Tensor, "D"], r: Any) -> Float[Tensor, "D"]', "return r")
    assert isinstance(_raised(top, torch.zeros(3), META), kc.DeviceError)  # a top-level x: refused
    assert isinstance(_raised(_contract(header, "return r"), *args), kc.DeviceError)  # (E1: accepted)


def test_e2_a_rejected_result_counts_as_a_rejection() -> None:
    f = _contract('def f(x: Float[Tensor, "D"], r: Any) -> Float[Tensor, "D"]', "return r")
    c = f.__kda_contract__
    _raised(f, torch.zeros(3), torch.zeros(4))  # ShapeError on the result (the pytest plugin's violations)
    assert (c.calls, c.rejections) == (1, 1)  # (E2: (1, 0))
    _raised(torch.compile(f, backend="eager"), torch.zeros(3), torch.zeros(4))
    assert (c.calls, c.rejections) == (2, 2)


def test_e3_the_device_fix_names_the_item_and_the_device() -> None:
    f = _contract('def f(x: Float[Tensor, "D"], ys: list[Float[Tensor, "D"]])')
    hint = _raised(f, torch.zeros(3), [META]).violations[0].hint
    assert hint == "move it: ys[0].to('cpu')"  # (E3: "move it: ys.to('')"; a top-level y: "y.to('cpu')")


def test_e4_every_violation_of_a_container_item_is_reported() -> None:
    top = _contract('def f(x: Float[Tensor, "D"], y: Float[Tensor, "D"])')
    both = _raised(top, torch.zeros(3), torch.zeros(4, device="meta"))
    assert isinstance(both, kc.ShapeError) and isinstance(both, kc.DeviceError)  # a top-level y: both
    inside = _contract('def f(x: Float[Tensor, "D"], ys: list[Float[Tensor, "D"]])')
    err = _raised(inside, torch.zeros(3), [torch.zeros(4, device="meta")])
    assert isinstance(err, kc.ShapeError) and isinstance(err, kc.DeviceError)  # (E4: DeviceError alone)
    assert str(err) == (
        "f(): 2 contract violations\n"
        "  [1] ys: DeviceError\n"
        "      expected list[Tensor[D]]\n"
        "      got      ys[0]: device meta, expected cpu (device of the call's other tensors)\n"
        "      fix: move it: ys[0].to('cpu')\n"
        "  [2] ys: ShapeError\n"
        "      expected list[Tensor[D]]\n"
        "      got      ys[0]: shape [4]: dim 0 (D): expected 3, got 4\n"
        "  dims: D=3 from x.shape[0]")


E5_HEADERS = {  # jaxtyping takes each; we refused them ("cannot bind dim 'B'"), not a top-level #B alone
    "fixed tuple": 'def f(p: tuple[Float[Tensor, "#B D"], Float[Tensor, "D"]])',
    "list": 'def f(x: Float[Tensor, "D"], ys: list[Float[Tensor, "#B D"]])',
}


@pytest.mark.parametrize("case", sorted(E5_HEADERS))
def test_e5_a_broadcast_only_dim_inside_a_container_decorates(case: str) -> None:
    _contract('def f(x: Float[Tensor, "#B D"], w: Float[Tensor, "D"])')  # decorates
    f = _contract(E5_HEADERS[case])  # (E5: AnnotationError "cannot bind dim 'B'")
    two, one, four = torch.zeros(2, 3), torch.zeros(1, 3), torch.zeros(4, 3)
    args = {"fixed tuple": lambda b: ((b, torch.zeros(3)),), "list": lambda b: (torch.zeros(3), [b, one])}[case]
    f(*args(two)), f(*args(one))  # B = 2, or bound to nothing (every size 1)
    assert isinstance(_raised(f, *args(torch.zeros(2, 4))), kc.ShapeError)
    if case == "list":  # one B for every item (jaxtyping samples one item: it takes this)
        assert isinstance(_raised(f, torch.zeros(3), [two, four]), kc.ShapeError)


@pytest.fixture(scope="module", autouse=True)
def _report_counters(request: pytest.FixtureRequest):
    yield
    report_counters(request, STATS, "edges_differential")
    report_counters(request, CATEGORIES, "edges_differential_categories")
    if UNEXPLAINED:
        print("\n\n".join(UNEXPLAINED))
