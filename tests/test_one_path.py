"""One engine, one path (issue 28): every tensor the contract can see meets the same rules, and
strict mode's transaction is one object for plain functions, generators, async functions and ops.
Each test here failed before the change that made it pass."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Annotated, NamedTuple

import pydantic
import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor

Written = Annotated[Float[Tensor, "N"], kc.Spec(mutated=True)]


# -- strict mode: aliasing sees the tensors inside containers ---------------------------------------
@kc.contract
def accumulate(xs: list[Float[Tensor, "N"]], out: Written) -> None:
    for x in xs:
        out += x


def test_strict_aliasing_sees_a_written_tensor_inside_a_list():
    buf = torch.ones(3)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=r"out: ValueRangeError[\s\S]*overlaps xs\[0\]"):
        accumulate([buf], buf)
    assert torch.equal(buf, torch.ones(3))


def test_strict_aliasing_accepts_apart_tensors_inside_a_list():
    out = torch.zeros(3)
    with kc.mode("strict"):
        accumulate([torch.ones(3), torch.ones(3)], out)
    assert torch.equal(out, torch.full((3,), 2.0))


# -- strict mode: one transaction for every kind of function ------------------------------------------
@kc.contract
def steps(out: Written) -> Iterator[int]:
    out += 1
    yield 1
    out += 1
    raise RuntimeError("boom")


def test_strict_rolls_back_a_generator_that_writes_then_raises():
    out = torch.zeros(3)
    with kc.mode("strict"):
        gen = steps(out)
        assert next(gen) == 1 and torch.equal(out, torch.ones(3))
        with pytest.raises(RuntimeError, match="boom"):
            next(gen)
    assert torch.equal(out, torch.zeros(3))


def test_closing_a_generator_early_rolls_nothing_back():
    out = torch.zeros(3)
    with kc.mode("strict"):
        gen = steps(out)
        next(gen)
        gen.close()
    assert torch.equal(out, torch.ones(3))


@kc.contract
async def async_steps(out: Written) -> AsyncIterator[int]:
    out += 1
    yield 1
    raise RuntimeError("boom")


def test_strict_rolls_back_an_async_generator_that_writes_then_raises():
    out = torch.zeros(3)

    async def drive() -> None:
        agen = async_steps(out)
        assert await agen.__anext__() == 1
        with pytest.raises(RuntimeError, match="boom"):
            await agen.__anext__()

    with kc.mode("strict"):
        asyncio.run(drive())
    assert torch.equal(out, torch.zeros(3))


@kc.contract
def transpose_then_fail(x: Annotated[Float[Tensor, "N N"], kc.Spec(mutated=True)]) -> None:
    x.t_()
    x.mul_(2)
    raise RuntimeError("boom")


def test_a_rollback_restores_strides_as_well_as_values():
    x = torch.arange(4.0).reshape(2, 2)
    with kc.mode("strict"), pytest.raises(RuntimeError, match="boom"):
        transpose_then_fail(x)
    assert x.stride() == (2, 1) and torch.equal(x, torch.arange(4.0).reshape(2, 2))


@kc.contract
def grow_then_fail(out: Written) -> None:
    out.resize_(8).fill_(7)
    raise RuntimeError("boom")


def test_a_rollback_restores_a_resized_tensor():
    out = torch.arange(3.0)
    with kc.mode("strict"), pytest.raises(RuntimeError, match="boom"):
        grow_then_fail(out)
    assert out.shape == (3,) and torch.equal(out, torch.arange(3.0))


# -- ops: what a rejected result says of the writes before it -----------------------------------------
@kc.op
def fill(x: Float[Tensor, "N"], out: Written) -> Float[Tensor, "N"]:
    """Copy x into out and return it."""
    out.copy_(x)
    return out


@fill.backend("short", devices=("cpu",), priority=50)
def _fill_short(x, out):
    out.copy_(x)
    return out[:-1]  # the wrong shape


@pytest.mark.kda_contracts("check")
def test_a_check_mode_op_whose_result_is_rejected_says_which_arguments_hold_writes():
    x, out = torch.ones(4), torch.zeros(4)
    with pytest.raises(kc.ShapeError, match=r"check mode keeps no copy: out may hold partial writes"):
        fill(x, out)
    assert torch.equal(out, x)  # (written: what the message says)


def test_a_strict_mode_op_whose_result_is_rejected_is_rolled_back():
    x, out = torch.ones(4), torch.zeros(4)
    with kc.mode("strict"), pytest.raises(kc.ShapeError, match=r"strict mode rolled the call back"):
        fill(x, out)
    assert torch.equal(out, torch.zeros(4))


@fill.backend("boom", devices=("cpu",), priority=1)
def _fill_boom(x, out):
    out.copy_(x)
    raise RuntimeError("kernel failed")


@pytest.mark.kda_contracts("check")
def test_a_check_mode_backend_that_raises_names_what_may_hold_writes():
    with pytest.raises(kc.BackendError, match=r"out may hold partial writes"):
        fill(torch.ones(4), torch.zeros(4), backend="boom")


@kc.op
def double_into(x: Float[Tensor, "N"], out: Written) -> None:
    out.copy_(x * 2)


@double_into.backend("out_of_place", devices=("cpu",), priority=5)
def _double_out_of_place(x, out):
    out[0] = -1.0  # a partial write, then a result of its own that a -> None op would drop
    return x * 2


@double_into.backend("in_place", devices=("cpu",), priority=1)
def _double_in_place(x, out):
    out.copy_(x * 2)
    return out, None  # (an in-place kernel returning its outputs, as fla's do)


LOST = ("double_into(): 1 contract violation\n"
        "  [1] backend: BackendError\n"
        "      expected backend 'out_of_place' to write its results into the op's arguments (double_into is annotated "
        "-> None, so it returns None)\n"
        "      got      it returned a tensor of shape [3] that is none of the call's tensors, and would be lost\n")


@pytest.mark.kda_contracts("check")
def test_a_none_op_whose_backend_returns_a_result_of_its_own_is_refused_not_silently_dropped():
    out = torch.zeros(3)
    with pytest.raises(kc.BackendError) as caught:
        double_into(torch.ones(3), out)
    assert str(caught.value).startswith(LOST)
    assert str(caught.value).endswith("fix: write the result in place (into the argument the op declares "
                                      "kc.Spec(mutated=True)), or annotate the op's return and return it; check mode "
                                      "keeps no copy: out may hold partial writes (strict mode rolls such a call back)")
    with kc.mode("strict"), pytest.raises(kc.BackendError, match="strict mode rolled the call back"):
        double_into(torch.ones(3), out := torch.zeros(3))
    assert torch.equal(out, torch.zeros(3))
    assert double_into(torch.ones(3), out, backend="in_place") is None and torch.equal(out, torch.full((3,), 2.0))
    with kc.mode("strict"):
        assert double_into(torch.ones(3), out, backend="in_place") is None


@double_into.backend("sparse", devices=("cpu", "meta"), priority=0)
def _double_sparse(x, out):
    out.copy_(x * 2)
    return (x * 2).to_sparse() if x.device.type == "cpu" else x * 2  # (a meta tensor of its own: address 0 too)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_none_ops_own_result_is_refused_also_when_it_is_sparse_or_on_meta(device):
    for mode in ("check", "strict"):
        out = torch.zeros(3, device=device)
        with kc.mode(mode), pytest.raises(kc.BackendError, match="would be lost"):
            double_into(torch.ones(3, device=device), out, backend="sparse")
        if device == "cpu" and mode == "strict":
            assert torch.equal(out, torch.zeros(3))  # rolled back


@kc.contract
def bad_result(x: Float[Tensor, "N"], out: Written) -> Float[Tensor, "N"]:
    out.copy_(x)
    return x[:-1]


@pytest.mark.kda_contracts("check")
def test_a_check_mode_contract_whose_result_is_rejected_says_which_arguments_hold_writes():
    with pytest.raises(kc.ShapeError, match=r"check mode keeps no copy: out may hold partial writes"):
        bad_result(torch.ones(4), torch.zeros(4))


# -- the one-device rule, wherever a tensor stands ----------------------------------------------------
class Pair(NamedTuple):
    a: Float[Tensor, "N"]
    b: Float[Tensor, "N"]


@dataclasses.dataclass
class Box:
    t: Float[Tensor, "N"]


class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    t: Float[Tensor, "N"]


def _meta(n: int = 3) -> torch.Tensor:
    return torch.empty(n, device="meta")


@kc.contract
def in_list(x: Float[Tensor, "N"], ys: list[Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_fixed_tuple(x: Float[Tensor, "N"], ys: tuple[Float[Tensor, "N"], Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_tuple(x: Float[Tensor, "N"], ys: tuple[Float[Tensor, "N"], ...]) -> None: ...
@kc.contract
def in_dict(x: Float[Tensor, "N"], ys: dict[str, Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_sequence(x: Float[Tensor, "N"], ys: Sequence[Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_mapping(x: Float[Tensor, "N"], ys: Mapping[str, Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_optional_list(x: Float[Tensor, "N"], ys: list[Float[Tensor, "N"]] | None) -> None: ...
@kc.contract
def in_union(x: Float[Tensor, "N"], ys: Float[Tensor, "N"] | list[Float[Tensor, "N"]]) -> None: ...
@kc.contract
def in_dataclass(x: Float[Tensor, "N"], box: Box) -> None: ...
@kc.contract
def in_namedtuple(x: Float[Tensor, "N"], pair: Pair) -> None: ...
@kc.contract
def in_pydantic(x: Float[Tensor, "N"], m: Model) -> None: ...
@kc.contract
def in_star_args(x: Float[Tensor, "N"], *ys: Float[Tensor, "N"]) -> None: ...
@kc.contract
def in_star_kwargs(x: Float[Tensor, "N"], **ys: Float[Tensor, "N"]) -> None: ...
@kc.contract
def optional_arg(x: Float[Tensor, "N"], y: Float[Tensor, "N"] | None) -> None: ...
@kc.contract
def returned(x: Float[Tensor, "N"]) -> Float[Tensor, "N"]:
    return _meta()
@kc.contract
def returned_in_tuple(x: Float[Tensor, "N"]) -> tuple[Float[Tensor, "N"], Float[Tensor, "N"]]:
    return x, _meta()
@kc.contract
def only_containers(xs: list[Float[Tensor, "N"]], ys: dict[str, Float[Tensor, "N"]]) -> None: ...


ELSEWHERE = {
    "list item": (in_list, lambda x: (x, [x, _meta()]), r"ys\[1\]"),
    "fixed tuple item": (in_fixed_tuple, lambda x: (x, (x, _meta())), r"ys\[1\]"),
    "variadic tuple item": (in_tuple, lambda x: (x, (x, _meta())), r"ys\[1\]"),
    "dict value": (in_dict, lambda x: (x, {"a": x, "b": _meta()}), r"ys\['b'\]"),
    "Sequence item": (in_sequence, lambda x: (x, [_meta()]), r"ys\[0\]"),
    "Mapping value": (in_mapping, lambda x: (x, {"a": _meta()}), r"ys\['a'\]"),
    "Optional container item": (in_optional_list, lambda x: (x, [_meta()]), r"ys\[0\]"),
    "union member": (in_union, lambda x: (x, [_meta()]), r"ys"),
    "dataclass field": (in_dataclass, lambda x: (x, Box(_meta())), r"box\.t"),
    "NamedTuple field": (in_namedtuple, lambda x: (x, Pair(x, _meta())), r"pair\[1\]|pair\.b"),
    "pydantic field": (in_pydantic, lambda x: (x, Model(t=_meta())), r"m\.t"),
    "*args": (in_star_args, lambda x: (x, x, _meta()), r"ys\[1\]"),
    "**kwargs": (in_star_kwargs, lambda x: (x, {"b": _meta()}), r"ys\['b'\]"),
    "optional argument": (optional_arg, lambda x: (x, _meta()), r"y"),
    "return": (returned, lambda x: (x,), r"return"),
    "return tuple item": (returned_in_tuple, lambda x: (x,), r"return\[1\]"),
    "containers only": (only_containers, lambda x: ([x], {"b": _meta()}), r"ys\['b'\]"),
}


@pytest.mark.parametrize("place", list(ELSEWHERE))
@pytest.mark.parametrize("mode", ["check", "strict"])
def test_every_tensor_is_on_the_calls_device(place, mode):
    fn, args, where = ELSEWHERE[place]
    x = torch.zeros(3)
    call = args(x)
    if place == "**kwargs":
        call = (x,)
        kwargs = args(x)[1]
    else:
        kwargs = {}
    with kc.mode(mode), pytest.raises(kc.DeviceError, match=where):
        fn(*call, **kwargs)


@pytest.mark.parametrize("place", list(ELSEWHERE))
def test_the_same_calls_on_one_device_pass(place):
    fn, args, _ = ELSEWHERE[place]
    if place.startswith("return"):
        return  # (these return a meta tensor on purpose)
    x = torch.empty(3, device="meta")
    call = args(x)
    kwargs = {}
    if place == "**kwargs":
        call, kwargs = (x,), call[1]
    fn(*call, **kwargs)


# -- results: the same binding and the same rules as arguments ----------------------------------------
@kc.contract
def widened(xs: list[Float[Tensor, "*batch"]], y: Float[Tensor, "#*batch"]) -> Float[Tensor, "*batch"]:
    return torch.zeros(7, 2)


def test_a_result_matches_a_variadic_dim_a_container_item_fixed():
    with pytest.raises(kc.ShapeError, match=r"expected \[\*batch\] = \[2\]\n\s+got      \[7, 2\]"):
        widened([torch.zeros(2)], torch.zeros(2))


def test_a_result_may_widen_a_variadic_dim_only_broadcastable_arguments_carry():
    assert widened([], torch.zeros(2)).shape == (7, 2)


@kc.contract
def split_rows(x: Float[Tensor, "B"], K: int) -> Float[Tensor, "B//K"]:
    return x[:3]


def test_a_result_dim_that_divides_by_zero_is_a_shape_error_not_a_crash():
    with pytest.raises(kc.ShapeError, match=r"a dim of \[B//K\] divides by zero with B=6, K=0"):
        split_rows(torch.zeros(6), 0)
    assert split_rows(torch.zeros(6), 2).shape == (3,)


@kc.contract
def causal_mask(T: int) -> Float[Tensor, "T T"]:
    return torch.ones(T, T).tril()


def test_an_int_argument_binds_a_dim_only_the_result_uses():
    assert causal_mask(4).shape == (4, 4)
    with pytest.raises(kc.ShapeError):
        bad_mask(3)


@kc.contract
def bad_mask(T: int) -> Float[Tensor, "T T"]:
    return torch.ones(T, T + 1)


@kc.contract
def contiguous_result(x: Float[Tensor, "N M"]) -> Annotated[Float[Tensor, "M N"], kc.Spec(contiguous=True)]:
    return x.t()


def test_a_result_may_declare_a_layout():
    with pytest.raises(kc.LayoutError, match=r"return: LayoutError"):
        contiguous_result(torch.zeros(2, 3))


# -- torch.compile: a graph is guarded on the mode it was traced in ----------------------------------
def _scaled():
    @kc.contract(register=False)
    def scaled(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B D"]:
        return x * w.sum()

    return scaled


def test_a_graph_traced_in_mode_off_is_not_reused_in_check_mode():
    torch._dynamo.reset()
    f = _scaled()
    bad = (torch.zeros(2, 3), torch.zeros(4, 5))
    with kc.mode("off"):
        torch.compile(f, backend="eager", fullgraph=True)(*bad)
    with kc.mode("check"), pytest.raises(kc.ShapeError, match=r"w: ShapeError"):
        torch.compile(f, backend="eager", fullgraph=True)(*bad)


def test_switching_modes_back_and_forth_compiles_one_graph_per_mode():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    f = _scaled()
    cf = torch.compile(f, backend="eager", fullgraph=True)
    w = torch.zeros(3, 5)
    for i in range(30):
        with kc.mode(("off", "check", "strict")[i % 3]):
            cf(torch.zeros(4, 3), w)
    assert counters["stats"]["unique_graphs"] == 3


_THREADS_PROBE = r"""
import threading, warnings, torch
import kda_contracts as kc
from kda_contracts import Float, Tensor

@kc.contract
def f(x: Float[Tensor, "B"]) -> None: ...

torch.compile(f, backend="eager")(torch.zeros(2))
inside, done = threading.Event(), threading.Event()

def other():
    with kc.mode("off"):
        inside.set()
        done.wait()

t = threading.Thread(target=other)
t.start()
inside.wait()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with kc.mode("strict"):
        pass
done.set()
t.join()
print([str(w.message)[:62] for w in caught])
"""


def test_modes_that_differ_across_threads_after_a_compile_are_said_out_loud():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _THREADS_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "kc.mode: different modes are in force in several threads" in out.stdout


# -- one way to register a packed op's kernels ----------------------------------------------------
def test_every_packed_op_registers_its_kernels_one_way():
    from kda_contracts.ops._packed.backends import InterfaceBackend

    for op in (kc.packed_decode, kc.gdn_packed_decode):
        shipped = [b for b in op.backends() if b.name != "torch"]
        assert {b.name for b in shipped} == {"triton", "helion", "fla"}
        assert all(isinstance(b, InterfaceBackend) and b.op == op.name for b in shipped)
        assert all(isinstance(b.kernel, str) and b.kernel.startswith("kda_kernels.") for b in shipped)
