"""Modes: one ``kc.mode`` object shared by threads and tasks.

- A mode object keeps no per-entry state: any number of threads and asyncio tasks can be inside
  the same ``with STRICT:`` at once, exiting in any order, and one thread can re-enter it.
"""

# No `from __future__ import annotations`: with it, ruff's UP037 fix unquotes one-name dim strings
# such as "B" in Float[Tensor, "B"] as if they were forward references.
import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts.spec import CallContext

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
