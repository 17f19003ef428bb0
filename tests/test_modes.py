"""Modes: one ``kc.mode`` object shared by threads and tasks, ``@kc.mode`` on coroutines and
generators, and the process default read from ``$KDA_CONTRACTS_MODE``.

- A mode object keeps no per-entry state: any number of threads and asyncio tasks can be inside
  the same ``with STRICT:`` at once, exiting in any order, and one thread can re-enter it.
- ``@kc.mode(...)`` on an async function, a generator function or an async generator function
  holds while the body runs, at every resumption; the caller's mode is back whenever the body is
  suspended, and a ``with kc.mode`` inside the body spans its ``yield``s without leaking.
- ``$KDA_CONTRACTS_MODE``: empty means unset (``check``); a value naming no mode leaves
  ``import kda_contracts`` working and makes the first read of the process default raise a
  AnnotationError naming the variable and the allowed values. These run in fresh interpreters.
"""

# No `from __future__ import annotations`: with it, ruff's UP037 fix unquotes one-name dim strings
# such as "B" in Float[Tensor, "B"] as if they were forward references.
import asyncio
import inspect
import json
import os
import random
import subprocess
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine import modes
from kda_contracts._engine.model.spec import CallContext

# Module-level mode objects, shared by every thread and task below (the usage that used to raise).
OFF, CHECK, STRICT = kc.mode("off"), kc.mode("check"), kc.mode("strict")
BY_NAME = {"off": OFF, "check": CHECK, "strict": STRICT}
THREADS, TASKS, STEPS = 8, 50, 40


@pytest.fixture(autouse=True)
def _fast_thread_switching() -> Iterator[None]:
    # Switch threads every few microseconds instead of every 5 ms, so threads really interleave.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run_threads(work: Callable[[int], Any], n: int = THREADS) -> list[Any]:
    """Run ``work(i)`` on ``n`` threads released together; re-raise the first failure."""
    start = threading.Barrier(n)

    def run(i: int) -> Any:
        start.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return [f.result() for f in [pool.submit(run, i) for i in range(n)]]


def _no_negatives(ctx: CallContext) -> list[kc.Violation]:
    if bool((ctx.values["x"] < 0).any()):
        return [kc.Violation(kc.ValueRangeError, "x", ">= 0 everywhere", "a negative value")]
    return []


@kc.contract(value_checks=_no_negatives, register=False)
def nonneg(x: Float[Tensor, "B"]) -> Float[Tensor, "B"]:
    return x


# -- one mode object, many users ----------------------------------------------------------------------
def test_one_mode_object_can_be_re_entered_and_nested_with_others() -> None:
    with CHECK:
        with STRICT:
            with STRICT:
                with OFF:
                    with STRICT:
                        assert kc.get_mode() == "strict"
                    assert kc.get_mode() == "off"
                assert kc.get_mode() == "strict"
            assert kc.get_mode() == "strict"
        assert kc.get_mode() == "check"


def test_one_mode_object_is_shared_by_eight_threads_nesting_at_random() -> None:
    def work(i: int) -> int:
        rng, stack = random.Random(i), [kc.get_mode()]  # this thread's own view of what is in force
        open_blocks: list[kc.mode] = []
        for _ in range(400):
            if open_blocks and (len(open_blocks) > 6 or rng.random() < 0.45):
                open_blocks.pop().__exit__(None, None, None)
                stack.pop()
            else:
                name = rng.choice(list(BY_NAME))
                open_blocks.append(BY_NAME[name].__enter__())
                stack.append(name)
            time.sleep(0)  # let another thread enter or exit the same object here
            assert kc.get_mode() == stack[-1]
        while open_blocks:
            open_blocks.pop().__exit__(None, None, None)
            stack.pop()
        assert kc.get_mode() == stack[0]
        return 400

    assert sum(_run_threads(work)) == THREADS * 400


def test_eight_threads_inside_one_mode_object_at_once_exit_in_any_order() -> None:
    rounds = 25
    inside = threading.Barrier(THREADS, timeout=60)  # a failing thread breaks it for the others
    turn = threading.Condition()
    orders = [random.Random(r).sample(range(THREADS), THREADS) for r in range(rounds)]
    done: list[int] = []

    def work(i: int) -> list[str]:
        own = ("off", "check")[i % 2]
        seen = []
        with BY_NAME[own]:
            for order in orders:
                STRICT.__enter__()
                inside.wait()  # all eight threads are inside STRICT now
                seen.append(kc.get_mode())
                with turn:  # exit in this round's order
                    turn.wait_for(lambda o=order: inside.broken or len(done) % THREADS == o.index(i), timeout=60)
                    try:
                        assert not inside.broken, "another thread failed"
                        STRICT.__exit__(None, None, None)
                    except BaseException:
                        inside.abort()
                        turn.notify_all()
                        raise
                    seen.append(kc.get_mode())
                    done.append(i)
                    turn.notify_all()
                inside.wait()
        return seen

    for i, seen in enumerate(_run_threads(work)):
        assert seen == ["strict", ("off", "check")[i % 2]] * rounds


def test_one_mode_object_is_shared_by_fifty_asyncio_tasks_exiting_in_any_order() -> None:
    async def task(i: int) -> tuple[str, str]:
        rng = random.Random(i)
        start = kc.get_mode()
        with STRICT:
            for _ in range(5):
                await asyncio.sleep(rng.random() / 1000)  # the 50 blocks close in a shuffled order
                assert kc.get_mode() == "strict"
            with OFF:
                await asyncio.sleep(rng.random() / 1000)
                assert kc.get_mode() == "off"
            assert kc.get_mode() == "strict"
        return start, kc.get_mode()

    async def main() -> list[tuple[str, str]]:
        with CHECK:  # the tasks start in check; half of them inside a block of the same STRICT
            tasks = [asyncio.create_task(task(i)) for i in range(TASKS // 2)]
            with STRICT:
                tasks += [asyncio.create_task(task(i)) for i in range(TASKS // 2, TASKS)]
                results = await asyncio.gather(*tasks)
                assert kc.get_mode() == "strict"
            assert kc.get_mode() == "check"
            return results

    results = asyncio.run(main())
    assert results == [("check", "check")] * (TASKS // 2) + [("strict", "strict")] * (TASKS // 2)


def test_a_contract_sees_the_shared_objects_mode_in_every_thread() -> None:
    bad = -torch.ones(3)

    def work(i: int) -> int:
        rejected = 0
        for k in range(50):
            with (STRICT if (i + k) % 2 else CHECK):
                try:
                    nonneg(bad)
                except kc.ValueRangeError:
                    rejected += 1
                    assert kc.get_mode() == "strict"
        return rejected

    assert _run_threads(work) == [25] * THREADS


def test_exiting_a_mode_never_entered_here_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"kc\.mode\('strict'\): exited without a matching enter"):
        _run_threads(lambda i: STRICT.__exit__(None, None, None), n=1)


# -- @kc.mode on generators ---------------------------------------------------------------------------
@kc.mode("strict")
def strict_modes(n: int) -> Iterator[str]:
    for _ in range(n):
        yield kc.get_mode()


@kc.mode("off")
def off_modes(n: int) -> Iterator[str]:
    for _ in range(n):
        yield kc.get_mode()


def test_a_generator_body_sees_its_mode_at_every_resumption_and_the_consumer_keeps_its_own() -> None:
    inside, outside = [], []
    with CHECK:
        for seen in strict_modes(STEPS):
            inside.append(seen)
            outside.append(kc.get_mode())
    assert inside == ["strict"] * STEPS
    assert outside == ["check"] * STEPS


def test_interleaved_generators_in_different_modes_each_keep_their_own() -> None:
    rng = random.Random(0)
    gens = {"strict": strict_modes(STEPS), "off": off_modes(STEPS)}
    counts = {"strict": 0, "off": 0}
    for _ in range(2 * STEPS):
        name = rng.choice([n for n in gens if counts[n] < STEPS])
        consumer = rng.choice(list(BY_NAME))
        with BY_NAME[consumer]:  # the consumer switches modes between steps
            assert next(gens[name]) == name
            assert kc.get_mode() == consumer
        counts[name] += 1
    assert counts == {"strict": STEPS, "off": STEPS}


def test_a_with_block_in_a_generator_body_spans_its_yields_without_leaking() -> None:
    @kc.mode("strict")
    def body() -> Iterator[str]:
        with OFF:
            for _ in range(3):
                yield kc.get_mode()
        yield kc.get_mode()

    g = body()
    with CHECK:
        assert next(g) == "off"
        assert kc.get_mode() == "check"
        with STRICT:
            assert next(g) == "off"
            assert kc.get_mode() == "strict"
        assert next(g) == "off"
        assert next(g) == "strict"
        assert kc.get_mode() == "check"


def test_a_generator_resumed_by_eight_threads_in_turn_keeps_its_mode() -> None:
    g, lock = strict_modes(THREADS * STEPS), threading.Lock()

    def work(i: int) -> list[str]:
        seen = []
        with BY_NAME[("off", "check")[i % 2]]:
            for _ in range(STEPS):
                with lock:
                    seen.append(next(g))
                assert kc.get_mode() == ("off", "check")[i % 2]
        return seen

    assert [m for seen in _run_threads(work) for m in seen] == ["strict"] * THREADS * STEPS


def test_send_and_the_return_value_pass_through_a_decorated_generator() -> None:
    @kc.mode("strict")
    def echo() -> Any:
        got = yield "ready"
        while got is not None:
            got = yield (got, kc.get_mode())
        return "done"

    def outer() -> Any:
        return (yield from echo())

    with OFF:
        g = outer()
        assert next(g) == "ready"
        assert [g.send(k) for k in range(5)] == [(k, "strict") for k in range(5)]
        with pytest.raises(StopIteration) as stop:
            g.send(None)
    assert stop.value.value == "done"


def test_an_exception_thrown_into_a_decorated_generator_is_handled_in_its_mode() -> None:
    @kc.mode("strict")
    def recovering() -> Iterator[str]:
        while True:
            try:
                yield "waiting"
            except KeyError:
                yield f"recovered in {kc.get_mode()}"

    g = recovering()
    with OFF:
        next(g)
        assert g.throw(KeyError("x")) == "recovered in strict"
        assert kc.get_mode() == "off"
        with pytest.raises(ValueError, match="not handled"):
            g.throw(ValueError("not handled"))
        assert kc.get_mode() == "off"


def test_closing_a_decorated_generator_runs_its_finally_in_its_mode() -> None:
    seen = []

    @kc.mode("strict")
    def cleanup() -> Iterator[int]:
        try:
            yield 1
        finally:
            seen.append(kc.get_mode())

    with OFF:
        g = cleanup()
        next(g)
        g.close()
        assert kc.get_mode() == "off"
    assert seen == ["strict"]


# -- @kc.mode on coroutines and async generators -----------------------------------------------------
@types.coroutine
def _suspend() -> Iterator[None]:
    """Suspend the awaiting coroutine once (what an event loop would see as a bare yield)."""
    yield


@kc.mode("strict")
async def strict_after_awaits(rng: random.Random) -> list[str]:
    seen = []
    for _ in range(5):
        await asyncio.sleep(rng.random() / 1000)
        seen.append(kc.get_mode())
    return seen


@kc.mode("off")
async def off_after_awaits(rng: random.Random) -> list[str]:
    seen = []
    for _ in range(5):
        await asyncio.sleep(rng.random() / 1000)
        seen.append(kc.get_mode())
    return seen


def test_fifty_concurrent_decorated_coroutines_see_their_mode_after_every_await() -> None:
    async def task(i: int) -> tuple[list[str], str]:
        with CHECK:
            seen = await (strict_after_awaits if i % 2 else off_after_awaits)(random.Random(i))
            return seen, kc.get_mode()

    async def main() -> list[tuple[list[str], str]]:
        return await asyncio.gather(*(task(i) for i in range(TASKS)))

    for i, (seen, after) in enumerate(asyncio.run(main())):
        assert seen == ["strict" if i % 2 else "off"] * 5
        assert after == "check"


def test_a_decorated_coroutine_driven_by_hand_does_not_leak_its_mode_between_sends() -> None:
    @kc.mode("strict")
    async def body() -> list[str]:
        seen = []
        for _ in range(STEPS):
            seen.append(kc.get_mode())
            await _suspend()
        return seen

    coro = body()
    with OFF:
        for _ in range(STEPS):
            coro.send(None)
            assert kc.get_mode() == "off"
        with pytest.raises(StopIteration) as stop:
            coro.send(None)
    assert stop.value.value == ["strict"] * STEPS


def test_a_contract_called_in_a_decorated_coroutine_uses_its_mode() -> None:
    @kc.mode("strict")
    async def strict_call(x: torch.Tensor) -> torch.Tensor:
        await asyncio.sleep(0)
        return nonneg(x)

    @kc.mode("check")
    async def check_call(x: torch.Tensor) -> torch.Tensor:
        await asyncio.sleep(0)
        return nonneg(x)

    async def main() -> list[Any]:
        with OFF:
            calls = [(strict_call if i % 2 else check_call)(-torch.ones(2)) for i in range(TASKS)]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, kc.ValueRangeError) for r in results[1::2])
    assert all(isinstance(r, torch.Tensor) for r in results[0::2])


def test_a_cancelled_decorated_coroutine_handles_the_cancellation_in_its_mode() -> None:
    seen = []

    @kc.mode("strict")
    async def long_running() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append(kc.get_mode())
            raise

    async def main() -> str:
        with OFF:
            task = asyncio.create_task(long_running())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return kc.get_mode()

    assert asyncio.run(main()) == "off"
    assert seen == ["strict"]


@kc.mode("strict")
async def strict_stream(n: int) -> AsyncIterator[str]:
    for _ in range(n):
        await asyncio.sleep(0)
        yield kc.get_mode()


@kc.mode("off")
async def off_stream(n: int) -> AsyncIterator[str]:
    for _ in range(n):
        await asyncio.sleep(0)
        yield kc.get_mode()


def test_fifty_tasks_iterate_decorated_async_generators_each_in_its_mode() -> None:
    async def task(i: int) -> tuple[list[str], list[str]]:
        inside, outside = [], []
        with CHECK:
            async for seen in (strict_stream if i % 2 else off_stream)(10):
                inside.append(seen)
                outside.append(kc.get_mode())
                await asyncio.sleep(0)
        return inside, outside

    async def main() -> list[tuple[list[str], list[str]]]:
        return await asyncio.gather(*(task(i) for i in range(TASKS)))

    for i, (inside, outside) in enumerate(asyncio.run(main())):
        assert inside == ["strict" if i % 2 else "off"] * 10
        assert outside == ["check"] * 10


def test_athrow_and_aclose_reach_a_decorated_async_generator_in_its_mode() -> None:
    seen = []

    @kc.mode("strict")
    async def stream() -> AsyncIterator[str]:
        try:
            while True:
                try:
                    yield "item"
                except KeyError:
                    await asyncio.sleep(0)
                    yield f"recovered in {kc.get_mode()}"
        finally:
            await asyncio.sleep(0)
            seen.append(kc.get_mode())

    async def main() -> None:
        with OFF:
            agen = stream()
            assert await agen.__anext__() == "item"
            assert await agen.athrow(KeyError("x")) == "recovered in strict"
            assert kc.get_mode() == "off"
            await agen.aclose()
            assert kc.get_mode() == "off"

    asyncio.run(main())
    assert seen == ["strict"]


@pytest.mark.parametrize(("fn", "kind"), [
    (strict_modes, inspect.isgeneratorfunction),
    (strict_after_awaits, inspect.iscoroutinefunction),
    (strict_stream, inspect.isasyncgenfunction),
], ids=["generator", "coroutine", "async-generator"])
def test_decorating_keeps_the_kind_and_the_name_of_the_function(fn: Any, kind: Callable[[Any], bool]) -> None:
    assert kind(fn)
    assert fn.__wrapped__ is not fn
    assert fn.__name__ == fn.__wrapped__.__name__


# -- $KDA_CONTRACTS_MODE ------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "expected"), [
    (None, modes.CHECK), ("", modes.CHECK), ("  \t", modes.CHECK), ("off", modes.OFF), (" Strict ", modes.STRICT),
])
def test_the_environment_value_ignores_case_and_blanks_and_empty_means_unset(raw: str | None, expected: int) -> None:
    assert modes.default_from_environment(raw) == (expected, "")


def test_the_default_cannot_be_emptied_where_the_environment_names_a_mode() -> None:
    with pytest.raises(ValueError, match=r"replace_default\(None\): only a process whose"):
        modes.replace_default(None)
    assert modes.current_mode.__name__ == "current_mode"  # the one-read version, no check


BAD_ENV_MESSAGE = ("KDA_CONTRACTS_MODE: unknown mode 'loud'; expected one of 'off', 'check', 'strict', 'watch' "
                   "(empty or unset means 'check'). Set it to one of those or unset it, or choose the mode in code "
                   "with kc.set_default_mode(...) or `with kc.mode(...)`")

# Run in a fresh interpreter: what each step did, as JSON (the error text, or the mode).
PROBE = r"""
import json, sys
import kda_contracts as kc
from kda_contracts import Float, Tensor
import torch
from kda_contracts._engine import modes

def attempt(step):
    try:
        return step()
    except kc.AnnotationError as err:
        return "AnnotationError: " + str(err)

def f(x: Float[Tensor, "B"]) -> None: ...

def decorate():
    return kc.contract(f).__name__          # reads the mode: `off` would return f itself

with kc.mode("check"):
    g = kc.contract(f)                      # decorated where a mode is chosen

def call():
    return g(torch.ones(2))

def in_block():
    with kc.mode("strict"):
        g(torch.ones(2))
        return kc.get_mode()

def decorated_while_a_default_was_chosen():   # as in an in-process pytest session
    previous = modes.replace_default(modes.CHECK)
    h = kc.contract(f)
    modes.replace_default(previous)
    return h(torch.ones(2))

out = {"imported": True, "get_mode": attempt(kc.get_mode), "decorate": attempt(decorate),
       "call": attempt(call), "in_block": attempt(in_block),
       "restored": attempt(decorated_while_a_default_was_chosen)}
kc.set_default_mode("off")
out["after_set_default_mode"] = attempt(kc.get_mode)
print(json.dumps(out))
"""


def _probe(value: str) -> dict[str, Any]:
    env = {**os.environ, "KDA_CONTRACTS_MODE": value}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def with_bad_env() -> dict[str, Any]:
    return _probe("loud")


def test_an_empty_environment_value_means_unset_so_import_works_in_check_mode() -> None:
    out = _probe("")
    assert out["imported"] is True
    assert out["get_mode"] == "check"


def test_a_bad_environment_value_leaves_import_working(with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["imported"] is True


def test_a_bad_environment_value_makes_the_first_mode_read_name_the_variable_and_the_modes(
        with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["get_mode"] == "AnnotationError: " + BAD_ENV_MESSAGE


def test_a_bad_environment_value_is_reported_by_a_contract_decorated_without_a_mode(
        with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["decorate"] == "AnnotationError: " + BAD_ENV_MESSAGE


def test_a_bad_environment_value_is_reported_by_a_contracted_call(with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["call"] == "AnnotationError: " + BAD_ENV_MESSAGE


def test_a_bad_environment_value_is_reported_again_once_a_chosen_default_is_given_back(
        with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["restored"] == "AnnotationError: " + BAD_ENV_MESSAGE


def test_a_bad_environment_value_does_not_affect_a_with_block(with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["in_block"] == "strict"


def test_set_default_mode_replaces_a_bad_environment_value(with_bad_env: dict[str, Any]) -> None:
    assert with_bad_env["after_set_default_mode"] == "off"
