"""One engine, one path (issue 28): every tensor the contract can see meets the same rules, and
strict mode's transaction is one object for plain functions, generators, async functions and ops.
Each test here failed before the change that made it pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

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


@kc.contract
def bad_result(x: Float[Tensor, "N"], out: Written) -> Float[Tensor, "N"]:
    out.copy_(x)
    return x[:-1]


@pytest.mark.kda_contracts("check")
def test_a_check_mode_contract_whose_result_is_rejected_says_which_arguments_hold_writes():
    with pytest.raises(kc.ShapeError, match=r"check mode keeps no copy: out may hold partial writes"):
        bad_result(torch.ones(4), torch.zeros(4))
