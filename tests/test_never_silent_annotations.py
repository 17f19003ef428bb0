"""Never silent, the cases an adversarial probe found: annotations that decorated fine and then
checked nothing (tensor annotations on ``*args``/``**kwargs``, a TypedDict of tensors, a dataclass
one of whose field annotations does not resolve, a TypeVar bound to a tensor type, kc.MatchConfig
with no config), and decorations that escaped as other exceptions (a dataclass that holds itself:
RecursionError; a builtin: ValueError; ``@kc.contract`` above ``@staticmethod``/``@classmethod``:
TypeError). Each is now either checked or an AnnotationError at decoration, with the message pinned.
Also checked: what these fixes read correctly (a parameterised generic dataclass, type aliases)."""

# No `from __future__ import annotations`: each annotation is evaluated where its function is defined.
import dataclasses
import re
import typing
import warnings
from typing import Annotated, Any, Generic, Optional, TypedDict, TypeVar

import numpy as np
import pytest
import torch
import typing_extensions

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor

if typing.TYPE_CHECKING:
    from collections import OrderedDict as TypeOnly  # imported for type checkers only: unknown at runtime


def _decorate(fn: Any) -> Any:
    return kc.contract(register=False)(fn)


def test_annotated_args_and_kwargs_are_checked_item_by_item_unannotated_ones_pass_through() -> None:
    # (refused at decoration before: never checked)
    @kc.contract(register=False)
    def mix(w: Float[Tensor, "D E"], *xs: Float[Tensor, "B D"]) -> Float[Tensor, "B E"]:
        return sum(x @ w for x in xs)

    @kc.contract(register=False)
    def count(**named: Int[Tensor, "B"]) -> int:
        return len(named)

    @kc.contract(register=False)
    def sizes(x: Float[Tensor, "B D"], *dims: int) -> int:
        return len(dims)

    w, ok = torch.ones(3, 4), torch.ones(2, 3)
    assert mix(w, ok, ok).shape == (2, 4)
    cases = [
        (lambda: mix(w, ok, torch.ones(5, 3)), kc.ShapeError,
         r"(?s)\[1\] xs: ShapeError\n +expected tuple\[Tensor\[B D\], \.\.\.\]\n +got +xs\[1\]: shape \[5, 3\]: "
         r"dim 0 \(B\): expected 2, got 5"),
        (lambda: mix(w, ok, torch.ones(2, 7)), kc.ShapeError, r"xs\[1\]: shape \[2, 7\]: dim 1 \(D\): expected 3"),
        (lambda: mix(w, ok, "x"), kc.ArgumentTypeError, r"xs\[1\]: expected a torch.Tensor, got str"),
        (lambda: count(a=torch.ones(2, dtype=torch.int64), b=torch.ones(3, dtype=torch.int64)), kc.ShapeError,
         r"named\['b'\]: shape \[3\]: dim 0 \(B\): expected 2, got 3"),
        (lambda: count(a=torch.ones(2)), kc.DtypeError, r"named\['a'\]"),
        (lambda: sizes(ok, 1, "2"), kc.ArgumentTypeError,
         r"(?s)dims: ArgumentTypeError\n +expected tuple\[int, \.\.\.\]\n +got +tuple "
         r"\(dims\[1\]: expected int, got str\)"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert count(a=torch.ones(2, dtype=torch.int64), b=torch.ones(2, dtype=torch.int64)) == 2
    assert count() == 0 and sizes(ok) == 0 and sizes(ok, 1, 2) == 2

    @kc.contract(register=False)
    def loose(w: Float[Tensor, "D E"], *xs: Any, **named) -> int:
        return len(xs) + len(named)

    assert loose(torch.zeros(2, 3), "anything", k=1) == 2
    with pytest.raises(kc.ShapeError):
        loose(torch.zeros(2))


class StrDims:
    def contract_dims(self) -> dict[str, Any]:
        return {"D": "3"}


@pytest.mark.parametrize("value", ["3", True, np.int64(3), [3]], ids=["str", "bool", "numpy", "list"])
def test_a_config_giving_a_dim_as_anything_but_an_int_is_refused_and_none_leaves_it_free(value: Any) -> None:
    # before: a str, bool, numpy integer or list was skipped, so the dim went unchecked (and
    # contract_dims() returning "3" split the fast checker, which rejected, from the full check)
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], cfg: Any) -> None: ...

    def g(x: Float[Tensor, "B D"]) -> None: ...

    kind = type(value).__name__
    got = re.escape(f"D={value!r}, a {kind}, which binds no dim")
    message = (r"(?s)f\(\): 1 contract violation\n  \[1\] cfg: ArgumentTypeError\n +expected D as an int \(a dim "
               rf"of the contract\)\n +got +{got}\n +fix: make dict's D an int: int\(\.\.\.\) it\n")
    for width in (3, 5):
        with pytest.raises(kc.ArgumentTypeError, match=message):
            f(torch.zeros(2, width), {"D": value})
    with pytest.raises(kc.AnnotationError, match=re.escape(
            f"g: the config's D is {value!r}, a {kind}, so it binds no dim; dims are ints (int(...) it)")):
        kc.contract(config={"D": value}, register=False)(g)
    f(torch.zeros(2, 5), {"D": None})  # None: the config does not fix D
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fast/slow disagreement)
        with pytest.raises(kc.ArgumentTypeError, match=r"got +D='3', a str, which binds no dim"):
            f(torch.zeros(2, 3), StrDims())


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks-allowed", "fullgraph"])
def test_star_args_of_tensors_compile_once(fullgraph: bool) -> None:
    import torch._dynamo.testing

    @kc.contract(register=False)
    def mix(w: Float[Tensor, "D E"], *xs: Float[Tensor, "B D"]) -> Float[Tensor, "B E"]:
        return xs[0] @ w + xs[1] @ w

    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(mix, backend=counts, fullgraph=fullgraph, dynamic=True)
    w = torch.ones(3, 4)
    for b in range(2, 26):
        assert compiled(w, torch.ones(b, 3), torch.ones(b, 3)).eq(6).all()
    assert counts.frame_count <= 2, counts.frame_count
    with pytest.raises(kc.ShapeError, match=r"xs\[1\]"):
        compiled(w, torch.ones(4, 3), torch.ones(5, 3))


def test_an_op_with_annotated_star_args_is_refused() -> None:
    with pytest.raises(kc.AnnotationError, match=r"star_op: \*xs: an op takes named parameters \(its backends and "
                                                 r"torch.library see them by name\); take a list or tuple of them"):
        @kc.op(name="star_op")
        def star_op(w: Float[Tensor, "D E"], *xs: Float[Tensor, "B D"]) -> None: ...


def test_every_item_of_a_container_argument_is_checked_not_a_sample() -> None:
    # beartype checks one random item per container per call: a bad item passed ~97 % of the time
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B"], ks: list[int], by_name: dict[str, float], modes: list[typing.Literal["a", "b"]],
          nested: list[tuple[int, str]] | None = None) -> None: ...

    x = torch.ones(2)
    for i in range(40):
        ks: list[Any] = [1] * 40
        ks[i] = "3"
        with pytest.raises(kc.ArgumentTypeError, match=rf"ks: ArgumentTypeError\n +expected list\[int\]\n +got +list "
                                                       rf"\(ks\[{i}\]: expected int, got str\)"):
            f(x, ks, {}, [])
        modes: list[Any] = ["a"] * 40
        modes[i] = "c"
        with pytest.raises(kc.ArgumentTypeError, match=rf"modes\[{i}\]: expected Literal\['a', 'b'\], got str"):
            f(x, [1], {}, modes)
    with pytest.raises(kc.ArgumentTypeError, match=r"by_name\['z'\]: expected float, got str"):
        f(x, [1], {f"k{i}": 1.0 for i in range(30)} | {"z": "no"}, [])
    with pytest.raises(kc.ArgumentTypeError, match=r"nested\[7\]\[1\]: expected str, got int"):
        f(x, [1], {}, [], [(1, "a")] * 7 + [(1, 2)] + [(1, "a")] * 7)
    f(x, [1] * 40, {"a": 1, "b": 2.5}, ["a", "b"] * 20, [(1, "a")] * 10)  # (an int stands for a float)


def test_a_bad_item_of_a_union_container_is_named_on_every_call() -> None:
    # beartype's verdict on a container rests on one sampled item: the explanation (and, for a hint
    # without a type tree, the item check itself) must not depend on which item that was. A 1-in-15
    # draw named the list instead of the item, and with a validator inside the union the explanation
    # came out empty and a raw TypeError escaped
    from beartype.vale import Is

    positive = Annotated[int, Is[lambda v: v > 0]]

    @kc.contract(register=False)
    def f(x: Float[Tensor, "B"], pairs: list[tuple[int, str]] | None = None,
          ks: list[positive] | None = None) -> None: ...  # type: ignore[valid-type]

    x = torch.ones(2)
    for _ in range(150):
        with pytest.raises(kc.ArgumentTypeError, match=r"got +list \(pairs\[7\]\[1\]: expected str, got int\)"):
            f(x, [(1, "a")] * 7 + [(1, 2)] + [(1, "a")] * 7)
        with pytest.raises(kc.ArgumentTypeError, match=r"got +list \(ks\[7\]: expected Annotated\[int, "):
            f(x, None, [1] * 7 + [-1] + [1] * 7)
    f(x, [(1, "a")] * 15, [1] * 15)


def test_a_type_rejection_the_explanation_cannot_name_is_still_an_argument_type_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kda_contracts._engine.contract.compiled import Contract

    @kc.contract(register=False)
    def f(x: Float[Tensor, "B"], ks: list[int]) -> None: ...

    monkeypatch.setattr(Contract, "type_violations", lambda self, values: [])
    with pytest.raises(kc.ArgumentTypeError, match=r"\(arguments\): ArgumentTypeError\n +expected types that fit "
                                                   r"the annotations\n +got +rejected by the type check"):
        f(torch.ones(2), ["no"])


def test_every_item_of_a_plain_part_of_a_tensor_container_is_checked() -> None:
    @dataclasses.dataclass
    class Batch:
        x: Float[Tensor, "B D"]
        lengths: list[int]

    @kc.contract(register=False)
    def f(batch: Batch) -> None: ...

    lengths: list[Any] = [1] * 30
    lengths[17] = 1.5
    with pytest.raises(kc.ArgumentTypeError, match=r"batch.lengths\[17\]: expected int, got float"):
        f(Batch(torch.ones(2, 3), lengths))
    f(Batch(torch.ones(2, 3), [1] * 30))

def test_a_typeddict_of_tensors_is_refused() -> None:
    class Params(TypedDict):
        w: Float[Tensor, "D D"]

    def f(x: Float[Tensor, "B D"], p: Params) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: argument 'p': the TypedDict Params holds tensors, and "
                                                 r"kda-contracts does not walk TypedDicts; use a dataclass"):
        _decorate(f)


@dataclasses.dataclass
class HalfResolvable:
    w: Float[Tensor, "D D"]
    tok: "TypeOnly | None" = None  # a type-only import: does not resolve at decoration


@dataclasses.dataclass
class NoTensors:
    n: int
    tok: "TypeOnly | None" = None


@typing.no_type_check
@dataclasses.dataclass
class OptedOut:
    n: int
    tok: "TypeOnly | None" = None


def test_a_dataclass_whose_other_fields_hold_tensors_must_resolve_every_annotation() -> None:
    def f(x: Float[Tensor, "B D"], p: HalfResolvable) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: argument 'p': cannot read the annotation of "
                                                 r"HalfResolvable.tok \(TypeOnly \| None\) at decoration: name "
                                                 r"'TypeOnly' is not defined, so what HalfResolvable holds would go "
                                                 r"unchecked"):
        _decorate(f)

    def g(x: Float[Tensor, "B D"], p: NoTensors) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"NoTensors.tok .* or mark NoTensors @typing.no_type_check"):
        _decorate(g)

    @kc.contract(register=False)  # marked @typing.no_type_check: an opaque type, checked with isinstance
    def h(x: Float[Tensor, "B D"], p: OptedOut) -> None: ...

    h(torch.zeros(2, 3), OptedOut(1))
    with pytest.raises(kc.ArgumentTypeError):
        h(torch.zeros(2, 3), "not OptedOut")


@dataclasses.dataclass
class Chain:  # e.g. a linked list of per-layer caches
    v: Float[Tensor, "D"]
    nxt: Optional["Chain"] = None


def test_a_dataclass_that_holds_itself_is_refused_at_any_stack_depth() -> None:
    def f(x: Float[Tensor, "B D"], n: Chain) -> None: ...

    def deeper(k: int) -> Any:
        return deeper(k - 1) if k else _decorate(f)

    for k in range(6):  # (it used to escape as RecursionError at some depths)
        with pytest.raises(kc.AnnotationError, match=r"f: argument 'n'.nxt: Chain holds itself \(a recursive "
                                                     r"structure\), which kda-contracts does not walk"):
            deeper(k)


T = TypeVar("T")
TV = TypeVar("TV", bound=Float[Tensor, "D"])


@dataclasses.dataclass
class Box(Generic[T]):
    w: Float[Tensor, "D D"]
    meta: T


def test_a_parameterised_generic_dataclass_is_walked_like_its_class() -> None:
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], p: Box[int]) -> None: ...

    f(torch.zeros(2, 3), Box(torch.zeros(3, 3), 1))
    with pytest.raises(kc.ArgumentTypeError, match=r"p.w"):
        f(torch.zeros(2, 3), Box("not a tensor", 1))
    with pytest.raises(kc.ShapeError, match=r"p.w"):
        f(torch.zeros(2, 3), Box(torch.zeros(4, 4), 1))


def test_a_typevar_bound_to_a_tensor_type_is_refused() -> None:
    def f(x: Float[Tensor, "B D"], y: TV) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: argument 'y': the TypeVar TV is bound to or constrained by "
                                                 r"tensor annotations, which kda-contracts does not check through a "
                                                 r"TypeVar; annotate the tensor itself"):
        _decorate(f)


Vector = typing_extensions.TypeAliasType("Vector", Float[Tensor, "D"])
Vectors = typing_extensions.TypeAliasType("Vectors", list[Float[Tensor, "D"]])


def test_type_aliases_are_read_as_what_they_stand_for() -> None:
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], ys: Vectors, v: Annotated[Vector, kc.Spec(contiguous=True)]) -> None: ...

    assert set(f.__kda_contract__.spec.tensors) == {"x", "v"}  # the alias of a tensor is a tensor argument
    f(torch.zeros(2, 3), [torch.zeros(3)], torch.zeros(3))
    with pytest.raises(kc.ArgumentTypeError):
        f(torch.zeros(2, 3), [torch.zeros(3), "not a tensor"], torch.zeros(3))
    with pytest.raises(kc.ShapeError, match=r"ys\[0\]"):
        f(torch.zeros(2, 3), [torch.zeros(4)], torch.zeros(3))
    with pytest.raises(kc.ShapeError, match=r"\bv\b"):
        f(torch.zeros(2, 3), [torch.zeros(3)], torch.zeros(4))


def test_match_config_without_a_config_is_refused() -> None:
    def f(x: Float[Tensor, "B D"], eps: Annotated[float, kc.MatchConfig("epsilon")]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: argument 'eps': kc.MatchConfig\('epsilon'\) compares the "
                                                 r"value with a config, and this contract has none: give "
                                                 r"kc.contract\(config=...\) or config_arg="):
        _decorate(f)


def test_a_builtin_without_a_signature_is_an_annotation_error() -> None:
    with pytest.raises(kc.AnnotationError, match=r"kc.contract takes a function, a method or a class, got a "
                                                 r"builtin_function_or_method instance"):
        kc.contract(torch.add)


def test_contract_above_staticmethod_and_classmethod_decorates_and_checks() -> None:
    class M:
        scale = 2.0

        @kc.contract(register=False)
        @staticmethod
        def s(x: Float[Tensor, "B D"], y: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
            return x + y

        @kc.contract(register=False)
        @classmethod
        def c(cls, x: Float[Tensor, "B D"], y: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
            return cls.scale * x + y

    x, y = torch.ones(2, 3), torch.ones(3)
    for call in (M.s, M().s):
        assert call(x, y).eq(2).all()
        with pytest.raises(kc.ShapeError):
            call(x, torch.ones(4))
    for call in (M.c, M().c):
        assert call(x, y).eq(3).all()
        with pytest.raises(kc.ShapeError):
            call(x, torch.ones(4))


# --- return annotations --------------------------------------------------------------------------


def test_a_return_annotation_without_tensors_is_checked() -> None:
    @kc.contract(register=False)
    def count(x: Float[Tensor, "B D"], as_text: bool = False) -> int:
        return "two" if as_text else x.shape[0]  # type: ignore[return-value]

    @kc.contract(register=False)
    def in_place(x: Float[Tensor, "B D"], give_back: bool = False) -> None:
        x.add_(1)
        return x if give_back else None  # type: ignore[return-value]

    @kc.contract(register=False)
    def sizes(x: Float[Tensor, "B D"]) -> tuple[int, ...]:
        return tuple(x.shape)

    assert count(torch.zeros(2, 3)) == 2 and sizes(torch.zeros(2, 3)) == (2, 3)
    assert in_place(torch.zeros(2, 3)) is None
    with pytest.raises(kc.ArgumentTypeError, match=r"(?s)\[1\] return: ArgumentTypeError\n +expected int\n +got +str"):
        count(torch.zeros(2, 3), True)
    with pytest.raises(kc.ArgumentTypeError, match=r"(?s)return: ArgumentTypeError\n +expected None\n +got +Tensor"):
        in_place(torch.zeros(2, 3), True)


def test_what_a_return_annotation_cannot_have_checked_is_refused() -> None:
    def written(x: Float[Tensor, "B D"]) -> Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]: ...

    def bounded(x: Float[Tensor, "B D"]) -> Annotated[float, kc.Range(gt=0)]: ...

    def nested(x: Float[Tensor, "B D"]) -> list[Annotated[int, kc.Range(gt=0)]]: ...

    with pytest.raises(kc.AnnotationError, match=r"written: return: kc.Spec\(mutated=...\) does not apply to a "
                                                 r"return \(a call writes its arguments in place, not its result\)"):
        _decorate(written)
    with pytest.raises(kc.AnnotationError, match=r"bounded: return: Range\(gt=0.*on a return annotation is not "
                                                 r"checked"):
        _decorate(bounded)
    with pytest.raises(kc.AnnotationError, match=r"nested: return: metadata inside list\[Annotated\[int, Range"):
        _decorate(nested)


def test_same_dtype_as_on_a_return_is_checked() -> None:
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], widen: bool = False) -> Annotated[Float[Tensor, "B D"], kc.Spec(same_dtype_as="x")]:
        return x.double() if widen else 2 * x

    assert f(torch.zeros(2, 3)).dtype == torch.float32
    with pytest.raises(kc.DtypeError, match=r"(?s)return: DtypeError\n +expected float32 \(same as x\)\n "
                                            r"+got +float64"):
        f(torch.zeros(2, 3), True)


def test_bounds_inside_a_container_or_union_of_numbers_are_refused() -> None:
    import annotated_types as at

    def lrs(x: Float[Tensor, "B D"], lrs: list[Annotated[float, at.Gt(0)]]) -> None: ...

    def either(x: Float[Tensor, "B D"], p: Annotated[float, at.Ge(0), at.Le(1)] | str) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"lrs: argument 'lrs': metadata inside list\[Annotated\[float, "
                                                 r"Gt\(gt=0\)\]\] is not checked \(bounds apply to a top-level "
                                                 r"number\)"):
        _decorate(lrs)
    with pytest.raises(kc.AnnotationError, match=r"either: argument 'p': metadata inside"):
        _decorate(either)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_checked_plain_return_compiles_once_per_shape_class(fullgraph: bool) -> None:
    import torch._dynamo.testing

    @kc.contract(register=False)
    def rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> int:
        return (x @ w).shape[0]

    @kc.contract(register=False)
    def scaled(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"], out: Float[Tensor, "B E"]) -> None:
        torch.matmul(x, w, out=out)

    w = torch.randn(4, 5)
    for fn, check in ((rows, lambda b, r, out: r == b), (scaled, lambda b, r, out: r is None and out.abs().sum() > 0)):
        torch._dynamo.reset()
        counts = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(fn, backend=counts, fullgraph=fullgraph, dynamic=True)
        for b in range(2, 26):
            out = torch.zeros(b, 5)
            args = (torch.randn(b, 4), w) + ((out,) if fn is scaled else ())
            assert check(b, compiled(*args), out)
        assert counts.frame_count <= 2, (fn.__name__, counts.frame_count)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_bad_plain_return_is_rejected_in_compiled_code(fullgraph: bool) -> None:
    @kc.contract(register=False)
    def leaks(x: Float[Tensor, "B D"]) -> None:
        return x + 1  # type: ignore[return-value]

    @kc.contract(register=False)
    def labels(x: Float[Tensor, "B D"]) -> list[int]:
        return [x.shape[0], "D"]  # type: ignore[list-item]

    for fn, pattern in ((leaks, r"expected None\n +got +Tensor"), (labels, r"expected list\[int\]\n +got +list")):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="eager", fullgraph=fullgraph)
        with pytest.raises(kc.ArgumentTypeError, match=r"(?s)return: ArgumentTypeError\n +" + pattern):
            compiled(torch.zeros(2, 3))


def test_in_strict_mode_a_call_whose_result_is_rejected_leaves_what_it_wrote_as_it_was() -> None:
    @kc.contract(register=False)
    def scale_(x: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], w: Float[Tensor, "D"],
               good: bool = True) -> Float[Tensor, "B D"]:
        x.mul_(w)
        return x if good else x[:, :1]

    x, w = torch.ones(2, 3), torch.full((3,), 2.0)
    for _ in range(3):  # (the check cache in front of the checker, too)
        with kc.mode("strict"), pytest.raises(kc.ShapeError, match=r"return"):
            scale_(x, w, False)
        assert x.eq(1).all()  # put back before the report
    with kc.mode("strict"):
        assert scale_(x, w).eq(2).all() and x.eq(2).all()
    with kc.mode("check"), pytest.raises(kc.ShapeError):  # check mode copies nothing: the write stays
        scale_(x, w, False)
    assert x.eq(4).all()


def test_a_fixed_config_whose_dim_is_a_float_is_refused() -> None:
    hidden, heads = 12, 4

    def f(x: Float[Tensor, "B D"]) -> None: ...

    for cfg in ({"D": hidden / heads}, dataclasses.make_dataclass("Dims", [("D", float)])(3.0)):
        with pytest.raises(kc.AnnotationError, match=r"f: the config's D is 3.0, a float, so it binds no dim; dims "
                                                     r"are ints"):
            kc.contract(config=cfg, register=False)(f)
    checked = kc.contract(config={"D": hidden // heads, "eps": 1e-5}, register=False)(f)  # other floats: fine
    with pytest.raises(kc.ShapeError):
        checked(torch.zeros(2, 7))


# --- found by a review of the above --------------------------------------------------------------


@dataclasses.dataclass
class Holder(Generic[T]):
    v: T


def test_a_generic_class_whose_type_parameter_is_a_tensor_type_is_refused() -> None:
    def f(b: Holder[Float[Tensor, "n"]], y: Float[Tensor, "n"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: argument 'b': .*Holder\[.*\] gives a type parameter of Holder "
                                                 r"a tensor type, and kda-contracts does not substitute type "
                                                 r"parameters"):
        _decorate(f)


def test_self_typeguard_and_noreturn_returns_decorate_and_run() -> None:
    class Layer:
        @kc.contract(register=False)
        def load(self, w: Float[Tensor, "n"]) -> typing_extensions.Self:
            return self

    @kc.contract(register=False)
    def all_finite(x: Float[Tensor, "n"]) -> typing_extensions.TypeGuard[Tensor]:
        return bool(x.isfinite().all())

    @kc.contract(register=False)
    def fail(x: Float[Tensor, "n"]) -> typing.NoReturn:
        raise ValueError("always")

    layer = Layer()
    assert layer.load(torch.zeros(3)) is layer and all_finite(torch.zeros(3)) is True
    with pytest.raises(ValueError, match="always"):
        fail(torch.zeros(3))
    with pytest.raises(kc.ShapeError):
        layer.load(torch.zeros(3, 3))


def test_a_contextmanager_is_checked_on_its_arguments_not_on_its_generator_annotation() -> None:
    import contextlib

    @kc.contract(register=False)
    @contextlib.contextmanager
    def scaled(x: Float[Tensor, "n"]) -> typing.Iterator[Tensor]:
        yield 2 * x

    with scaled(torch.ones(3)) as y:
        assert y.eq(2).all()
    with pytest.raises(kc.ShapeError):
        scaled(torch.ones(3, 3))


def test_beartype_validators_inside_a_container_are_beartypes_to_check() -> None:
    from beartype.vale import Is

    @kc.contract(register=False)
    def f(x: Float[Tensor, "n"], ks: list[Annotated[int, Is[lambda k: k > 0]]]) -> None: ...

    f(torch.zeros(3), [1, 2])
    with pytest.raises(kc.ArgumentTypeError):
        f(torch.zeros(3), [0])


def test_a_return_beartype_decides_compiles_once_under_dynamic_shapes() -> None:
    import torch._dynamo.testing

    @kc.contract(register=False)
    def sign(x: Float[Tensor, "B D"]) -> typing.Literal[0, 1]:
        return 1

    torch._dynamo.reset()
    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(sign, backend=counts, fullgraph=True, dynamic=True)
    for b in range(2, 26):
        assert compiled(torch.randn(b, 4)) == 1
    assert counts.frame_count <= 2, counts.frame_count


# --- a config passed per call whose dim is a float ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntDims:
    D: int


@dataclasses.dataclass(frozen=True)
class FloatDims:
    D: float
    eps: float = 1e-5


def test_a_per_call_config_whose_dim_is_a_float_is_refused_at_the_call() -> None:
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], cfg: Any) -> None: ...

    message = (r"(?s)f\(\): 1 contract violation\n  \[1\] cfg: ArgumentTypeError\n +expected D as an int \(a dim of "
               r"the contract\)\n +got +D=3\.0, a float, which binds no dim\n +fix: make {}'s D an int: int\(\.\.\.\) "
               r"it, or compute it with //")
    # before: a float D bound nothing, so any width passed (the shape matched the float or not)
    for cfg, kind in ((FloatDims(3.0), "FloatDims"), ({"D": 12 / 4}, "dict")):
        for width in (3, 5):
            with pytest.raises(kc.ArgumentTypeError, match=message.format(kind)):
                f(torch.zeros(2, width), cfg)
    _, violations = f.__kda_contract__.explain(torch.zeros(2, 5), FloatDims(3.0))  # the slow path says it too
    assert [(v.argument, v.got) for v in violations] == [("cfg", "D=3.0, a float, which binds no dim")]
    f(torch.zeros(2, 3), {"D": 12 // 4, "eps": 1e-5})  # an int dim binds; other floats are fine
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(2, 5), {"D": 3, "eps": 1e-5})


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks-allowed", "fullgraph"])
def test_a_per_call_float_dim_is_refused_in_compiled_code_and_an_int_one_compiles_once(fullgraph: bool) -> None:
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], cfg: Any) -> Float[Tensor, "B D"]:
        return x * 2

    import torch._dynamo.testing

    good, bad = IntDims(3), FloatDims(3.0)  # (a dict config per call: torch 2.11 cannot trace id() of it)
    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda x, c: f(x, c), backend=counts, fullgraph=fullgraph, dynamic=True)
    for b in range(2, 26):
        assert compiled(torch.ones(b, 3), good).eq(2).all()
    assert counts.frame_count <= 2, counts.frame_count
    with pytest.raises(kc.ArgumentTypeError, match=r"cfg: ArgumentTypeError\n +expected D as an int"):
        compiled(torch.ones(4, 3), bad)


def test_an_op_with_a_per_call_config_whose_dim_is_a_float_is_refused() -> None:
    @kc.op(name="never_silent_float_cfg_op", returns="out", config_arg="cfg")
    def double(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], cfg: Any) -> None:
        out.copy_(x * 2)

    x, out = torch.ones(2, 5), torch.zeros(2, 5)
    with pytest.raises(kc.ArgumentTypeError, match=r"cfg: ArgumentTypeError\n +expected D as an int"):
        double(x, out, FloatDims(3.0))
    assert out.eq(0).all()


# --- strict mode: a kc.check in the body that rejects the call rolls back what the body wrote -----


def _scale_then_check() -> Any:
    @kc.contract(register=False)
    def scale_(x: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], w: Float[Tensor, "D E"]) -> None:
        x.mul_(2)
        kc.check(x @ w, "B D", name="y")  # rejects when E != D, after x was written

    return scale_


def test_strict_mode_rolls_back_a_body_that_a_check_inside_it_rejects() -> None:
    scale_ = _scale_then_check()
    x, wrong = torch.ones(2, 3), torch.ones(3, 4)
    with kc.mode("strict"), pytest.raises(kc.ShapeError, match=r"y: ShapeError"):
        scale_(x, wrong)
    assert x.eq(1).all()  # before: 2, the write kept although the call was rejected
    with kc.mode("strict"):
        scale_(x, torch.ones(3, 3))
    assert x.eq(2).all()
    with kc.mode("check"), pytest.raises(kc.ShapeError):  # check mode copies nothing: the write stays
        scale_(x, wrong)
    assert x.eq(4).all()


def test_strict_mode_rolls_back_a_body_rejected_by_a_contract_or_check_it_calls() -> None:
    # what rejects the call may sit outside the function's own code: another contracted function, or
    # a helper running kc.check. Strict mode copies what the function writes before every call (the
    # function's code cannot tell), so the outer call still changes nothing
    @kc.contract(register=False)
    def inner(y: Float[Tensor, "B 3"]) -> None: ...

    def helper(t: torch.Tensor) -> None:
        kc.check(t, "N 3", name="t")

    @kc.contract(register=False)
    def outer(pool: Annotated[Float[Tensor, "N D"], kc.Spec(mutated=True)], i: int) -> None:
        pool[i] += 1
        inner(pool)

    @kc.contract(register=False)
    def outer_helper(pool: Annotated[Float[Tensor, "N D"], kc.Spec(mutated=True)], i: int) -> None:
        pool[i] += 1
        helper(pool)

    for fn, match in ((outer, r"inner\(\)"), (outer_helper, r"t: ShapeError")):
        pool = torch.zeros(4, 5)
        with kc.mode("strict"), pytest.raises(kc.ShapeError, match=match):
            fn(pool, 0)
        assert pool.eq(0).all(), fn  # before: row 0 kept the +1
        with kc.mode("check"), pytest.raises(kc.ShapeError, match=match):  # check mode copies nothing
            fn(pool, 0)
        assert pool[0].eq(1).all() and pool[1:].eq(0).all()


@pytest.mark.parametrize("raised", [RuntimeError("bug in the body"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_strict_mode_rolls_back_a_contracted_function_that_does_not_return(raised: BaseException) -> None:
    # strict mode is transactional: the function's own error or an interrupt leaves its written
    # arguments as they were (and propagates unchanged)
    @kc.contract(register=False)
    def fill_(out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], x: Float[Tensor, "B D"]) -> None:
        out[0] = x[0]
        raise raised

    out, x = torch.zeros(3, 4), torch.ones(3, 4)
    with kc.mode("strict"), pytest.raises(type(raised)):
        fill_(out, x)
    assert out.eq(0).all()
    with kc.mode("check"), pytest.raises(type(raised)):  # check mode copies nothing
        fill_(out, x)
    assert out[0].eq(1).all()


def test_strict_mode_rolls_back_an_op_whose_backend_is_interrupted() -> None:
    @kc.op(name="test_interrupted_fill")
    def fill_op(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x)

    @fill_op.backend("slow", devices=("cpu",), priority=50)
    def _(x: torch.Tensor, out: torch.Tensor) -> None:
        out[0].fill_(1.0)
        raise KeyboardInterrupt

    x, out = torch.randn(3, 4), torch.zeros(3, 4)
    with kc.mode("strict"), pytest.raises(KeyboardInterrupt):
        fill_op(x, out)
    assert out.eq(0).all()  # before: row 0 kept the backend's write

def test_an_async_body_rejected_by_its_check_rolls_back_in_strict_mode() -> None:
    import asyncio

    @kc.contract(register=False)
    async def scale_(x: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], w: Float[Tensor, "D E"]) -> None:
        x.mul_(2)
        kc.check(x @ w, "B D", name="y")

    x = torch.ones(2, 3)
    with kc.mode("strict"), pytest.raises(kc.ShapeError):
        asyncio.run(scale_(x, torch.ones(3, 4)))
    assert x.eq(1).all()


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks-allowed", "fullgraph"])
def test_a_body_check_with_written_tensors_compiles_once_in_strict_mode(fullgraph: bool) -> None:
    import torch._dynamo.testing

    scale_ = _scale_then_check()
    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(scale_, backend=counts, fullgraph=fullgraph, dynamic=True)
    with kc.mode("strict"):  # (no snapshot while tracing: the copy would join the graph)
        for b in range(2, 26):
            x = torch.ones(b, 3)
            compiled(x, torch.ones(3, 3))
            assert x.eq(2).all()
    assert counts.frame_count <= 2, counts.frame_count


# --- an op's return annotation without tensors is checked against what its backend returns -------


def test_an_ops_plain_return_annotation_is_checked_against_its_backends_result() -> None:
    import torch._dynamo.testing

    @kc.op(name="never_silent_row_count")
    def row_count(x: Float[Tensor, "B D"]) -> int:
        return x.shape[0]

    @row_count.backend("as-text", devices=("cpu",), priority=-1)
    def as_text(x: Any) -> Any:
        return str(x.shape[0])

    assert row_count(torch.zeros(3, 2)) == 3
    for mode in ("check", "strict"):
        with kc.mode(mode), pytest.raises(kc.ArgumentTypeError, match=r"(?s)return: ArgumentTypeError\n +expected "
                                                                         r"int\n +got +str"):
            row_count(torch.zeros(3, 2), backend="as-text")  # before: '3' returned unchecked
    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda x: row_count(x) + 1, backend=counts, dynamic=True)
    for b in range(2, 26):
        assert compiled(torch.zeros(b, 2)) == b + 1
    assert counts.frame_count <= 2, counts.frame_count
    with pytest.raises(kc.ArgumentTypeError, match=r"return: ArgumentTypeError"):
        torch.compile(lambda x: row_count(x, backend="as-text"), backend="eager")(torch.zeros(3, 2))


def test_a_none_returning_op_returns_none_whatever_its_backend_returns() -> None:
    # an in-place kernel that returns its output (fla's style) is not wrong for a `-> None` op
    @kc.op(name="never_silent_fill_op")
    def fill_(out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.fill_(1)

    @fill_.backend("returns-out", devices=("cpu",), priority=-1)
    def returns_out(out: Any) -> Any:
        return out.fill_(2)

    out = torch.zeros(2, 2)
    assert fill_(out) is None and out.eq(1).all()
    for mode in ("check", "strict"):
        with kc.mode(mode):
            assert fill_(out, backend="returns-out") is None and out.eq(2).all()
    assert torch.compile(lambda t: fill_(t, backend="returns-out"), backend="eager")(out) is None



@pytest.mark.parametrize("mode", ["check", "strict"])
def test_an_ops_result_is_checked_in_compiled_code_in_strict_mode_too(mode: str) -> None:
    # strict mode's transaction runs the backend alone in compiled code: its result went unchecked
    @kc.op(name=f"never_silent_scale_{mode}")
    def scale(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x * 2

    @scale.backend("one-column", devices=("cpu",), priority=-1)
    def one_column(x: Any) -> Any:
        return x[:, :1] * 2

    with kc.mode(mode):
        assert torch.compile(scale, backend="eager")(torch.ones(3, 2)).eq(2).all()
        with pytest.raises(kc.ShapeError, match=r"return: ShapeError"):
            torch.compile(lambda x: scale(x, backend="one-column"), backend="eager")(torch.ones(3, 2))


# --- check hooks that return something other than a list of violations --------------------------


def test_an_after_hook_returning_strings_is_an_annotation_error_and_the_call_is_rolled_back() -> None:
    def after(ctx: Any, backend: str) -> Any:
        return [] if bool(torch.isfinite(ctx.values["out"]).all()) else ["out is not finite"]

    @kc.op(name="never_silent_log_after", returns="out", after=after)
    def lg(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        torch.log(x, out=out)

    out = torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(kc.AnnotationError, match=r"never_silent_log_after: after returned a list "
                                                                     r"holding str; it must return a list of "
                                                                     r"kc.Violation \(\[\] when the call is fine\)"):
        lg(-torch.ones(2, 3), out)  # before: a raw AttributeError, and out left NaN
    assert out.eq(0).all()


@pytest.mark.parametrize("returned,words", [("violation", "Violation"), ("strings", "a list holding str"),
                                            ("none", "NoneType"), ("number", "int")])
def test_value_checks_must_return_a_list_of_violations(returned: str, words: str) -> None:
    v = kc.Violation(kc.ValueRangeError, "x", "> 0", "<= 0")
    result = {"violation": v, "strings": ["bad"], "none": None, "number": 3}[returned]

    @kc.contract(value_checks=lambda ctx: result, register=False)
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x

    with kc.mode("strict"), pytest.raises(kc.AnnotationError, match=rf"value_checks returned {words}; it must "):
        f(torch.ones(2, 3))

    @kc.contract(value_checks=lambda ctx: iter([v]), register=False)  # any iterable of violations is fine
    def g(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x

    with kc.mode("strict"), pytest.raises(kc.ValueRangeError):
        g(torch.ones(2, 3))


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr boom")

    def __hash__(self) -> int:
        return 1


def test_an_item_whose_repr_raises_neither_escapes_nor_breaks_a_valid_call() -> None:
    # the every-item check worded each item's path (its repr) before checking it
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], s: set[_BadRepr], d: dict[_BadRepr, int]) -> None: ...

    f(torch.zeros(2, 3), {_BadRepr()}, {_BadRepr(): 1})
    with pytest.raises(kc.ArgumentTypeError, match=r"d\[<_BadRepr>\]: expected int, got str"):
        f(torch.zeros(2, 3), {_BadRepr()}, {_BadRepr(): "x"})


def test_strict_mode_gives_a_resized_argument_its_shape_back() -> None:
    @kc.contract(register=False)
    def fill(out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], x: Float[Tensor, "B D"]) -> None:
        out.resize_(x.shape[0] * 2, x.shape[1])
        out.fill_(7.0)
        kc.check(out, "B D", name="out")

    out = torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(kc.ShapeError, match=r"out: ShapeError"):
        fill(out, torch.ones(2, 3))
    assert out.shape == (2, 3) and out.eq(0).all()


# --- found by an independent review (2026-12-02) ----------------------------------------------------


def _classvar_initvar_cases() -> dict[str, type]:
    import pydantic

    @dataclasses.dataclass
    class WithClassVar:
        w: Float[Tensor, "D"]
        table: typing.ClassVar[Float[Tensor, "D D"]] = torch.zeros(7)

    @dataclasses.dataclass
    class WithInitVar:
        w: Float[Tensor, "D"]
        bias: dataclasses.InitVar[Float[Tensor, "D"] | None] = None

    class ModelWithClassVar(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        w: Float[Tensor, "D"]
        table: typing.ClassVar[Float[Tensor, "D D"]] = torch.zeros(7)

    return {"dataclass-ClassVar": WithClassVar, "dataclass-InitVar": WithInitVar,
            "pydantic-ClassVar": ModelWithClassVar}


@pytest.mark.parametrize("case", list(_classvar_initvar_cases()))
def test_a_class_or_init_only_variable_with_a_tensor_type_is_refused(case: str) -> None:
    # not a field, so never checked: refused at decoration (before: decorated, the tensor unchecked)
    cls = _classvar_initvar_cases()[case]
    name = "bias" if "InitVar" in case else "table"

    def f(layer: cls, x: Float[Tensor, "D"]) -> None: ...  # type: ignore[valid-type]

    message = (re.escape(f"f: argument 'layer': {cls.__name__}.{name} is annotated ") + r".*: a class variable or "
               r"init-only variable is not a field, so its tensor would go unchecked; make it a field, or annotate it "
               r"without a tensor type")
    with pytest.raises(kc.AnnotationError, match=message):
        kc.contract(register=False)(f)


def test_a_class_variable_without_a_tensor_type_is_fine() -> None:
    @dataclasses.dataclass
    class Layer:
        w: Float[Tensor, "D"]
        name: typing.ClassVar[str] = "layer"

    @kc.contract(register=False)
    def f(layer: Layer, x: Float[Tensor, "D"]) -> None: ...

    f(Layer(torch.zeros(3)), torch.zeros(3))
    with pytest.raises(kc.ShapeError):
        f(Layer(torch.zeros(4)), torch.zeros(3))


def test_a_pydantic_field_constraint_given_with_field_is_refused_inside_a_container_like_annotated() -> None:
    # `n: int = Field(gt=0)` puts Gt(0) in the field's metadata, not in its annotation: it was
    # skipped, so n = 0 passed; now it is read as Annotated[int, Gt(0)] (refused inside a container)
    import annotated_types
    import pydantic

    class WithField(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        a: Float[Tensor, "B"]
        n: int = pydantic.Field(gt=0, default=1)

    class WithAnnotated(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        a: Float[Tensor, "B"]
        n: Annotated[int, annotated_types.Gt(0)] = 1

    for cls in (WithField, WithAnnotated):
        def f(p: cls, x: Float[Tensor, "B"]) -> None: ...  # type: ignore[valid-type]

        with pytest.raises(kc.AnnotationError, match=re.escape(
                "f: argument 'p'.n: metadata (Gt(gt=0),) inside a container cannot be checked")):
            kc.contract(register=False)(f)
