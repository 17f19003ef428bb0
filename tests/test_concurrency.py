"""Concurrency: many threads calling contracts at once, each in its own mode, with many configs.

- The mode is a ContextVar: a thread's ``with kc.mode(...)`` governs that thread only, so eight
  threads in off/check/strict calling the same decorated functions with different shapes each
  get exactly their mode's verdict on every call.
- The per-contract cache of config views (``ConfigViews`` in kda_contracts/_engine/codegen/config_views.py, keyed by
  ``id`` and bounded to 64) is hammered with more configs than it holds, from many threads: no
  call gets another config's verdict, every cached view matches its config, the cache never
  holds more than its bound, and dropped configs are not kept alive beyond it.
"""

# No `from __future__ import annotations`: with it, ruff's UP037 fix unquotes one-name dim strings
# such as "D" in Float[Tensor, "D"] as if they were forward references.
import asyncio
import contextvars
import gc
import random
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.codegen.config_views import ConfigViews
from kda_contracts._engine.model.markers import CONFIG_LACKS, config_dims, config_dtypes
from kda_contracts._engine.model.spec import CallContext
from kda_contracts.testing import make_decode_call

THREADS = 8
CALLS = 200


@pytest.fixture(autouse=True)
def _fast_thread_switching() -> Iterator[None]:
    # Switch threads every few microseconds instead of every 5 ms, so calls really interleave.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _no_negative_rows(ctx: CallContext) -> list[kc.Violation]:
    x = ctx.values["x"]
    if x.numel() and bool((x < 0).any()):
        return [kc.Violation(kc.ValueRangeError, "x", "non-negative values", "a negative value")]
    return []


@kc.contract(value_checks=_no_negative_rows, register=False)
def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
    return x  # the body never fails: in mode off, a bad call must reach it and return


@kc.contract(where=["HV % H == 0"], register=False)
def grouped_heads(q: Float[Tensor, "B H*K"], v: Float[Tensor, "B HV K"]) -> Float[Tensor, "B HV"]:
    return v.sum(-1)


def _run_threads(work: Callable[[int], Any], n: int = THREADS) -> list[Any]:
    """Run ``work(i)`` on ``n`` threads released together; re-raise the first failure."""
    start = threading.Barrier(n)

    def run(i: int) -> Any:
        start.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run, i) for i in range(n)]
        return [f.result() for f in futures]


MODES = ("off", "check", "strict")


def _one_call(rng: random.Random, mode: str) -> str:
    """A random call of one of the decorated functions; assert this mode's verdict. Returns its kind."""
    B, D = rng.randint(0, 5), rng.randint(1, 6)
    kind = rng.choice(("valid", "shape", "value", "heads-valid", "heads-shape"))
    if kind.startswith("heads"):
        H, group, K = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4)
        q, v = torch.ones(B, H * K), torch.ones(B, H * group, K)
        if kind == "heads-shape":
            v = torch.ones(B + 1, H * group, K)  # a batch that disagrees
        call: Callable[[], Any] = lambda: grouped_heads(q, v)  # noqa: E731
        expect = kc.ShapeError if kind == "heads-shape" and mode != "off" else None
    else:
        x, w = torch.ones(B, D), torch.ones(D + (kind == "shape"))
        if kind == "value" and B:
            x[rng.randrange(B), 0] = -1.0
        call = lambda: scale_rows(x, w)  # noqa: E731
        expect = {"shape": kc.ShapeError if mode != "off" else None,
                  "value": kc.ValueRangeError if mode == "strict" and B else None}.get(kind)
    assert kc.get_mode() == mode, f"this thread's mode leaked: {kc.get_mode()} instead of {mode}"
    if expect is None:
        call()
    else:
        with pytest.raises(expect):
            call()
    return kind


def test_each_thread_gets_its_own_modes_verdict_while_all_call_the_same_contracts() -> None:
    def work(i: int) -> int:
        rng, mode = random.Random(i), MODES[i % len(MODES)]
        with kc.mode(mode):
            for _ in range(CALLS):
                _one_call(rng, mode)
        return CALLS

    assert sum(_run_threads(work)) == THREADS * CALLS


def test_a_thread_that_sets_no_mode_sees_the_default_whatever_other_threads_set() -> None:
    default = contextvars.Context().run(kc.get_mode)  # what a context with no kc.mode of its own sees
    seen: list[str] = []

    def work(i: int) -> None:
        if i % 2:
            with kc.mode(MODES[i % 3]):
                for _ in range(CALLS):
                    assert kc.get_mode() == MODES[i % 3]
        else:
            for _ in range(CALLS):
                seen.append(kc.get_mode())

    with kc.mode("off" if default != "off" else "check"):  # the starting thread's mode is its own too
        _run_threads(work)
    assert set(seen) == {default}


def test_each_asyncio_task_keeps_its_own_mode() -> None:
    async def task(i: int) -> None:
        mode = MODES[i % 3]
        with kc.mode(mode):
            rng = random.Random(100 + i)
            for _ in range(50):
                _one_call(rng, mode)
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(9)))

    asyncio.run(main())


# -- the config-view cache ---------------------------------------------------------------------------
MARKER = 97_531  # hidden_size of every config made here, to find them among live objects


def _configs(n: int) -> list[kc.KDAConfig]:
    """``n`` configs with pairwise different per-rank dims (H, HV, K, V)."""
    out, seen = [], set()
    rng = random.Random(0)
    while len(out) < n:
        H, group, K, V = rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 6), rng.randint(1, 6)
        if (H, H * group, K, V) in seen:
            continue
        seen.add((H, H * group, K, V))
        out.append(kc.KDAConfig(num_heads=H, num_v_heads=H * group, head_k_dim=K, head_v_dim=V,
                                hidden_size=MARKER))
    return out


def _views() -> ConfigViews:
    return kc.packed_decode_contract("VK").views


def _assert_view_matches_its_config(key: int, view: tuple[Any, ...], views: ConfigViews) -> None:
    cfg = view[0]()  # any config other tests left in the cache too: KDAConfig or a plain pydantic model
    if cfg is None:
        return  # collected: the view refers to it weakly, and a lookup under this id rebuilds it
    assert id(cfg) == key, "a view is filed under another object's id"
    assert view[1] == tuple(config_dims(cfg).get(s) for s in views.spec.symbols)
    assert view[2] == tuple(config_dtypes(cfg).get(r) for r in views.roles)
    assert view[3] == tuple(getattr(cfg, views.spec.scalars[n].match.attr, CONFIG_LACKS) for n in views.matches)


def test_many_threads_and_more_configs_than_the_cache_holds_get_no_wrong_verdict() -> None:
    configs = _configs(3 * ConfigViews.MAX)
    calls = [make_decode_call(cfg, 2, 3, seed=i) for i, cfg in enumerate(configs)]
    views = _views()
    stop = threading.Event()
    largest = [0]
    checked = [0]
    broken: list[BaseException] = []

    def monitor() -> None:
        try:
            while not stop.is_set():
                items = list(views._views.items())  # one C-level copy: consistent under the GIL
                largest[0] = max(largest[0], len(items))
                for key, view in items:
                    _assert_view_matches_its_config(key, view, views)
                checked[0] += len(items)
        except BaseException as exc:  # reported by the test thread below
            broken.append(exc)

    def work(i: int) -> int:
        rng = random.Random(1000 + i)
        for _ in range(CALLS):
            a, b = rng.randrange(len(configs)), rng.randrange(len(configs))
            dims = kc.validate_packed_decode(**calls[a], config=configs[a])
            assert (dims.H, dims.HV, dims.K, dims.V) == tuple(configs[a].contract_dims()[s]
                                                              for s in ("H", "HV", "K", "V"))
            if b != a:  # another config's dims: never this call's verdict
                with pytest.raises(kc.ShapeError):
                    kc.validate_packed_decode(**calls[a], config=configs[b])
        return CALLS

    watcher = threading.Thread(target=monitor)
    watcher.start()
    try:
        assert sum(_run_threads(work)) == THREADS * CALLS
    finally:
        stop.set()
        watcher.join()
    assert not broken, f"a cached view did not match its config: {broken[0]!r}"
    assert checked[0] > 0
    assert largest[0] <= ConfigViews.MAX, f"the config-view cache grew to {largest[0]} > {ConfigViews.MAX}"
    for key, view in list(views._views.items()):
        _assert_view_matches_its_config(key, view, views)


def test_the_cache_keeps_at_most_its_bound_of_dropped_configs_alive() -> None:
    def hammer() -> None:
        configs = _configs(3 * ConfigViews.MAX)
        calls = [make_decode_call(cfg, 1, 2, seed=i) for i, cfg in enumerate(configs)]

        def work(i: int) -> None:
            for j in range(i, len(configs), THREADS):
                kc.validate_packed_decode(**calls[j], config=configs[j])

        _run_threads(work)

    hammer()  # every config and call made in there is dropped on return
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is kc.KDAConfig and o.hidden_size == MARKER)
    assert alive <= ConfigViews.MAX, f"{alive} dropped configs are still alive"
    assert len(_views()._views) <= ConfigViews.MAX


def test_a_recycled_id_never_serves_a_stale_view() -> None:
    # A view refers to its config (weakly), and the checker compares that referent with the config
    # it was given, so a view left under a recycled id, or even a forged one, is rebuilt.
    views = _views()
    small, big = _configs(2)
    call = make_decode_call(small, 2, 3)
    kc.validate_packed_decode(**call, config=small)
    views._views[id(small)] = views.make(big)  # forge: small's id, big's view
    dims = kc.validate_packed_decode(**call, config=small)  # a repeat: answered by the check cache
    assert dims.K == small.head_k
    dims = kc.validate_packed_decode(**make_decode_call(small, 3, 4), config=small)  # new shapes: the checker
    assert dims.K == small.head_k
    _assert_view_matches_its_config(id(small), views._views[id(small)], views)


def test_a_cached_view_does_not_keep_its_config_alive() -> None:
    import gc
    import weakref

    cfg = _configs(1)[0]
    kc.validate_packed_decode(**make_decode_call(cfg, 2, 3), config=cfg)
    ref = weakref.ref(cfg)
    del cfg
    gc.collect()
    assert ref() is None
