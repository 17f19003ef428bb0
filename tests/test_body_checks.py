"""Checks inside a contracted body: ``kc.check``, ``kc.dims`` and ``isinstance`` against the call's
dims; async functions stay coroutine functions with their awaited result checked."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.contract.wrapping import build_wrapper


@kc.contract
def attend(q: Float[Tensor, "B H D"], k: Float[Tensor, "B H D"], bad: bool = False) -> Float[Tensor, "B H D"]:
    scores = q @ k.transpose(-1, -2)
    kc.check(scores[:, :, :1] if bad else scores, "B H H", name="scores")
    return scores @ k


def test_kc_check_in_a_body_uses_the_calls_dims() -> None:
    for b in range(1, 12):
        attend(torch.zeros(b, 2, 3), torch.zeros(b, 2, 3))
    with pytest.raises(kc.ShapeError) as info:
        attend(torch.zeros(4, 2, 3), torch.zeros(4, 2, 3), True)
    text = str(info.value)
    assert "scores: ShapeError" in text and "dim 2 (H): expected 2, got 1" in text and text.startswith("attend")


def test_kc_check_binds_new_dims_for_the_rest_of_the_body() -> None:
    seen = []

    @kc.contract
    def f(x: Float[Tensor, "B D"]) -> None:
        kc.check(x.reshape(-1, 2, x.shape[1] // 2), "B G P")
        seen.append((kc.dims()["G"], kc.dims()["P"]))
        kc.check(torch.zeros(3, 5), "G _", name="y")  # G is 2 now: 3 is wrong

    with pytest.raises(kc.ShapeError, match=r"dim 0 \(G\): expected 2, got 3"):
        f(torch.zeros(3, 8))
    assert seen == [(2, 4)]


def test_kc_dims_gives_the_calls_dims_and_nothing_outside_a_call() -> None:
    @kc.contract
    def f(x: Float[Tensor, "*batch D"]) -> dict:
        return kc.dims()

    assert f(torch.zeros(2, 3, 4)) == {"D": 4, "*batch": (2, 3)}
    assert kc.dims() == {}


def test_isinstance_in_a_body_uses_the_calls_dims() -> None:
    @kc.contract
    def f(x: Float[Tensor, "B D"], y: object = None) -> bool:
        return isinstance(y, Float[Tensor, "B D"])

    assert f(torch.zeros(2, 3), torch.zeros(2, 3))
    assert not f(torch.zeros(2, 3), torch.zeros(3, 2))  # standalone isinstance would say True
    assert isinstance(torch.zeros(3, 2), Float[Tensor, "B D"])  # outside a call: standalone


def test_kc_check_outside_a_contract_checks_standalone() -> None:
    kc.check(torch.zeros(2, 2), "N N")
    with pytest.raises(kc.ShapeError):
        kc.check(torch.zeros(2, 3), "N N", name="square")
    with pytest.raises(kc.DtypeError):
        kc.check(torch.zeros(2, dtype=torch.int64), Float[Tensor, "N"])


def test_each_thread_sees_its_own_calls_dims() -> None:
    errors = []

    @kc.contract
    def f(x: Float[Tensor, "B"]) -> None:
        for _ in range(50):
            if kc.dims()["B"] != x.shape[0]:
                errors.append(x.shape[0])

    threads = [threading.Thread(target=lambda b=b: [f(torch.zeros(b)) for _ in range(20)]) for b in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_an_async_contract_stays_a_coroutine_function_and_checks_its_result() -> None:
    @kc.contract
    async def f(x: Float[Tensor, "B D"], wrong: bool = False) -> Float[Tensor, "B D"]:
        await asyncio.sleep(0)
        assert kc.dims()["B"] == x.shape[0]
        return x[:1] if wrong else x

    assert inspect.iscoroutinefunction(f)

    async def main() -> None:
        outs = await asyncio.gather(*(f(torch.zeros(b, 2)) for b in range(1, 30)))
        assert [o.shape[0] for o in outs] == list(range(1, 30))
        with pytest.raises(kc.ShapeError, match="returned a tensor of the wrong shape"):
            await f(torch.zeros(3, 2), True)
        with pytest.raises(kc.ShapeError):
            await f(torch.zeros(3))

    asyncio.run(main())


def test_a_body_that_mentions_no_check_runs_without_the_context() -> None:
    @kc.contract
    def f(x: Float[Tensor, "B"]) -> Float[Tensor, "B"]:
        return x + 1

    assert "_kc_body" not in build_wrapper(f.__kda_contract__, None).__code__.co_names
