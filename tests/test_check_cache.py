"""The eager cache in front of the generated checker (kda_contracts/_engine/codegen/check_cache.py): a repeat call
skips the checker, and the cache never answers differently from the checker.

- differential: on hundreds of calls, valid ones of several shapes and every kind of mutation
  (dtype, shape, strides, device, requires_grad, inference tensors, subclasses, scalar types and
  values, configs), each asked three times so that the last may come from the cache (a key is
  remembered from its second accepted call), the cached checker's answer is the checker's;
- a repeat call runs the checker twice, not per call; calls that never repeat remember nothing;
  the entries are bounded and hold no tensor;
- what it must not remember (mutable configs, non-plain scalars, subclasses) is checked every call;
- torch.compile traces the checker, not the cache: one graph over dozens of calls;
- ``KDA_CONTRACTS_CHECK_CACHE=0`` or a contract over containers: the plain checker.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import subprocess
import sys
import warnings
import weakref
from collections import Counter
from typing import Annotated

import annotated_types as at
import pytest
import torch
from torch._dynamo.utils import counters

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.codegen.check_cache import MAX_ENTRIES, cached_checker, guards_available
from kda_contracts.testing import make_decode_call

pytestmark = pytest.mark.skipif(not guards_available(), reason="torch's TensorGuards is not usable here")

STATS: Counter[str] = Counter()


class Sub(torch.Tensor):
    pass


def decode_args(B, cfg, *, seed=0):
    call = make_decode_call(cfg, B, max(2 * B, 4), seed=seed)
    c = kc.packed_decode_contract(cfg.state_layout)
    return c, [call.get(p) for p in c._param_names]


def _swap(args, i, v):
    return [*args[:i], v, *args[i + 1:]]


def mutations(args):
    """(name, args) for every kind of change to a valid packed-decode call (positions as in the
    contract's signature: 0 mixed_qkv … 8 indices, 5 scale, 9 l2norm flag, 10 lower_bound)."""
    tensors = [0, 1, 2, 3, 4, 6, 7, 8]
    for i in tensors:
        t = args[i]
        for dt in (torch.float64, torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int32):
            if dt != t.dtype:
                yield f"a{i} {dt}", _swap(args, i, t.to(dt))
        yield f"a{i} extra dim", _swap(args, i, t[None])
        yield f"a{i} one more", _swap(args, i, torch.cat([t, t[:1]]) if t.shape[0] else t)
        if t.dim() >= 1 and t.shape[-1] > 1:
            yield f"a{i} last axis strided", _swap(args, i, torch.cat([t, t], -1)[..., ::2])
        if t.dim() >= 2:
            yield f"a{i} transposed copy", _swap(args, i, t.transpose(-1, -2).contiguous().transpose(-1, -2))
            yield f"a{i} rows padded", _swap(args, i, torch.cat([t, t], 0)[::2])
        yield f"a{i} expanded", _swap(args, i, t[:1].expand(t.shape) if t.shape[0] else t)
        yield f"a{i} meta", _swap(args, i, torch.empty_like(t, device="meta"))
        yield f"a{i} same metadata", _swap(args, i, t.clone())
        yield f"a{i} subclass", _swap(args, i, t.as_subclass(Sub))
        yield f"a{i} list", _swap(args, i, t.tolist())
        yield f"a{i} None", _swap(args, i, None)
        if t.is_floating_point():
            yield f"a{i} requires_grad", _swap(args, i, t.clone().requires_grad_())
        with torch.inference_mode():
            inf = t.clone()
        yield f"a{i} inference tensor", _swap(args, i, inf)
    for v in (True, 1, 0.5, 2, -1.0, 0.0, -0.0, math.nan, math.inf, "0.1", None, torch.tensor(0.1)):
        yield f"scale {v!r}", _swap(args, 5, v)
    for v in (True, False, 1, 0, "yes", None, 1.0):
        yield f"l2norm {v!r}", _swap(args, 9, v)
    for v in (None, -1.0, -5, 0.0, 1.0, True, math.nan, -math.inf, "x"):
        yield f"lower_bound {v!r}", _swap(args, 10, v)
    for v in ("VK", "KV", None, "vk", 3):
        yield f"state_layout {v!r}", _swap(args, 12, v)


def _same_answer(c, args, cfg, name):
    want = c._check_uncached(*args, cfg)
    for _ in range(3):  # the third call may be answered by the cache
        got = c._check(*args, cfg)
        assert got == want, f"{name}: cache {got} != checker {want}"
    STATS["accepted" if want is not None else "rejected"] += 1
    return want


@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_the_cached_checker_answers_as_the_checker_on_every_mutation(layout):
    small = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, state_layout=layout)
    other = kc.KDAConfig(num_heads=1, num_v_heads=1, head_k_dim=8, head_v_dim=8, state_layout=layout)
    n = 0
    for B in (1, 3):
        c, args = decode_args(B, small, seed=B)
        for cfg in (None, small, other):
            assert (_same_answer(c, args, cfg, "valid") is None) == (cfg is other)
            for name, mutated in mutations(args):
                _same_answer(c, mutated, cfg, name)
                n += 1
                # the valid call again, now that the cache may hold the mutated one
                _same_answer(c, args, cfg, "valid again")
    assert n > 1000
    assert STATS["accepted"] > 100 and STATS["rejected"] > 300


def test_inference_tensors_are_judged_by_the_mode_they_are_passed_in():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, args = decode_args(2, cfg)
    with torch.inference_mode():
        out = args[7].clone()
        args = _swap(args, 7, out)
        for _ in range(3):  # remembered inside inference mode
            assert c._check(*args, None) is not None
        assert len(c._check.__kda_entries__) >= 1
    assert c._check_uncached(*args, None) is None  # written in place outside inference mode: refused
    assert c._check(*args, None) is None
    with pytest.raises(kc.ContractError, match="inference"):
        kc.validate_packed_decode(*args[:11])


def _counting(c):
    calls = Counter()

    def check(*a):
        calls["checker"] += 1
        return c._check_uncached(*a)

    return cached_checker(c.spec, check, c.checker_source, c._check_uncached.__globals__), calls


def test_a_repeat_call_runs_the_checker_twice_and_a_new_one_builds_nothing():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, _ = decode_args(1, cfg)
    check, calls = _counting(c)
    for step in range(50):  # fresh tensors every step, as in a decode loop, at three batch sizes
        _, args = decode_args(1 + step % 3, cfg, seed=step)
        assert check(*args, cfg) == c._check_uncached(*args, cfg)
    assert calls["checker"] == 6  # each size: the first call (seen), the second (remembered)
    assert len(check.__kda_entries__) == 3
    for B in range(4, 40):  # calls that never repeat: no guard is built for them
        _, args = decode_args(B, cfg, seed=B)
        assert check(*args, cfg) is not None
    assert len(check.__kda_entries__) == 3


def test_the_entries_are_bounded_and_hold_no_tensor():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, _ = decode_args(1, cfg)
    check, calls = _counting(c)
    refs = []
    for B in range(1, MAX_ENTRIES + 40):
        _, args = decode_args(B, cfg, seed=B)
        for _ in range(3):  # seen, remembered, answered
            assert check(*args, cfg) is not None
        refs += [weakref.ref(t) for t in args if isinstance(t, torch.Tensor)]
    assert len(check.__kda_entries__) == MAX_ENTRIES
    del args
    gc.collect()
    assert all(r() is None for r in refs)
    _, args = decode_args(MAX_ENTRIES + 39, cfg, seed=1)  # the newest entry is still there
    before = calls["checker"]
    check(*args, cfg)
    assert calls["checker"] == before


@dataclasses.dataclass
class MutableDims:
    B: int


@dataclasses.dataclass(frozen=True)
class FrozenDims:
    B: int


def _scaled(x: Float[Tensor, "B D"], y: Float[Tensor, "B D"], alpha: float, config: object = None) -> None:
    pass


def test_a_mutable_config_is_read_afresh_and_a_frozen_one_remembered():
    fn = kc.contract(mode="check", register=False, config_arg="config")(_scaled)
    c = fn.__kda_contract__
    x = torch.randn(4, 3)
    m = MutableDims(B=4)
    assert c._check(x, x, 1.0, m, m) is not None
    assert c._check(x, x, 1.0, m, m) is not None
    assert not c._check.__kda_entries__  # never remembered
    m.B = 5
    assert c._check(x, x, 1.0, m, m) is None  # the change is seen
    f = FrozenDims(B=4)
    assert c._check(x, x, 1.0, f, f) is not None
    assert c._check(x, x, 1.0, f, f) is not None
    assert len(c._check.__kda_entries__) == 1
    assert c._check(x, x, 1.0, FrozenDims(B=5), FrozenDims(B=5)) is None  # another object: the checker
    with pytest.raises(kc.ContractError):
        fn(x, x, 1.0, FrozenDims(B=5))


def test_non_plain_scalars_and_subclasses_are_checked_on_every_call():
    fn = kc.contract(mode="check", register=False)(_scaled)
    c = fn.__kda_contract__
    x = torch.randn(4, 3)
    alpha = torch.tensor(1.0)
    for _ in range(3):
        c._check(x, x, alpha, None, None)
        c._check(x.as_subclass(Sub), x, 1.0, None, None)
    assert not c._check.__kda_entries__
    c._check(x, x, 1.0, None, None)
    c._check(x, x, 1.0, None, None)
    assert len(c._check.__kda_entries__) == 1


def _nested(xs: list[Float[Tensor, "B D"]], w: Float[Tensor, "D E"]) -> None:
    pass


def _optional(x: Float[Tensor, "B D"], bias: Float[Tensor, "D"] | None = None) -> None:
    pass


def test_tensors_inside_containers_always_go_through_the_checker():
    c = kc.contract(mode="check", register=False)(_nested).__kda_contract__
    assert c._check is c._check_uncached


def test_an_optional_tensor_passed_as_none_or_not_is_told_apart():
    fn = kc.contract(mode="check", register=False)(_optional)
    c = fn.__kda_contract__
    x = torch.randn(4, 3)
    for _ in range(3):
        assert c._check(x, None, None) == c._check_uncached(x, None, None) is not None
        assert c._check(x, torch.randn(3), None) is not None
        assert c._check(x, torch.randn(4), None) is None
        assert c._check(x, torch.empty(0), None) is None  # the stand-in for None is never taken for it
    with pytest.raises(kc.ContractError):
        fn(x, torch.randn(4))


def _indexed(x: Float[Tensor, "B D"], idx: Int[Tensor, "B"]) -> None:
    pass


def test_a_compiled_function_traces_the_checker_not_the_cache():
    torch._dynamo.reset()
    counters.clear()
    fn = kc.contract(mode="check", register=False)(_indexed)

    def step(x, idx):
        fn(x, idx)
        return x * 2

    cf = torch.compile(step, fullgraph=True, backend="eager", dynamic=True)
    for i in range(30):
        B = 2 + i % 5
        x, idx = torch.randn(B, 3), torch.arange(B)
        fn(x, idx)  # eager calls fill the cache meanwhile
        assert torch.equal(cf(x, idx), x * 2)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    with pytest.raises(kc.ContractError):
        cf(torch.randn(3, 3), torch.arange(4))
    torch._dynamo.reset()


def test_the_op_rejects_after_warm_up_with_the_same_words():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    call = make_decode_call(cfg, 2, 4)
    bad = dict(call, ssm_state_indices=call["ssm_state_indices"].to(torch.float32))
    with kc.mode("check"):
        with pytest.raises(kc.ContractError) as cold:
            kc.packed_decode(**bad, backend="torch")
        for _ in range(20):
            kc.packed_decode(**call, backend="torch")
        with pytest.raises(kc.ContractError) as warm:
            kc.packed_decode(**bad, backend="torch")
    assert str(warm.value) == str(cold.value)


def test_the_cache_can_be_turned_off():
    code = ("import kda_contracts as kc; c = kc.packed_decode_contract('VK'); "
            "print(c._check is c._check_uncached)")
    env = dict(os.environ, KDA_CONTRACTS_CHECK_CACHE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert kc.packed_decode_contract("VK")._check is not kc.packed_decode_contract("VK")._check_uncached


def test_a_key_whose_other_tensors_keep_changing_stops_building_guards(monkeypatch):
    from kda_contracts._engine.codegen import check_cache

    real = check_cache._guards()
    built = Counter()

    def counting(*tensors, **kw):
        built["guards"] += 1
        return real(*tensors, **kw)

    monkeypatch.setattr(check_cache, "_guards", lambda: counting)
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, _ = decode_args(1, cfg)
    check, calls = _counting(c)
    for pool in range(4, 64):  # the same B (the key), a new pool size every call
        call = make_decode_call(cfg, 2, pool, seed=pool)
        args = [call.get(p) for p in c._param_names]
        assert check(*args, cfg) == c._check_uncached(*args, cfg) is not None
    assert calls["checker"] == 60  # every call is new: the checker answers each
    assert built["guards"] == check_cache.MAX_REBUILDS  # then the key's entry is left as it is


def test_calls_alternating_between_configs_are_each_answered_by_the_cache():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, args = decode_args(2, cfg)
    check, calls = _counting(c)
    for _ in range(40):
        for config in (None, cfg):
            assert check(*args, config) == c._check_uncached(*args, config) is not None
    assert calls["checker"] == 4  # two per config, then the cache


# -- found in review: inside a custom op's kernel, odd values, user predicates, the probe -------------


def _writes(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
    pass


def test_inside_a_custom_ops_kernel_an_inference_tensor_to_write_is_still_refused():
    # Custom-op kernels run with the autograd keys excluded: the dispatch keys of an inference
    # tensor and of a normal one then look alike, so the key asks is_inference() itself.
    fn = kc.contract(mode="check", register=False)(_writes)
    c = fn.__kda_contract__
    x = torch.randn(2, 3)
    with torch.inference_mode():
        inference_out = torch.empty(2, 3)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        for _ in range(3):
            assert c._check(x, torch.empty(2, 3), None) is not None
        assert c._check_uncached(x, inference_out, None) is None
        assert c._check(x, inference_out, None) is None


def test_the_packed_decode_custom_op_refuses_an_inference_state_after_warm_up():
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    call = make_decode_call(cfg, 2, 4)
    with kc.mode("check"):
        for _ in range(3):
            kc.packed_decode.torch_op(**dict(call, initial_state=call["initial_state"].clone()))
        with torch.inference_mode():
            state = call["initial_state"].clone()
        with pytest.raises(kc.ContractError, match="inference"):
            kc.packed_decode.torch_op(**dict(call, initial_state=state))


class _RaisingEq:
    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise RuntimeError("no ==")


def _with_predicate(x: Float[Tensor, "B D"], s: Annotated[float, at.Predicate(lambda v: math.copysign(1.0, v) > 0)]
                    ) -> None:
    pass


def test_a_contract_with_a_user_predicate_is_never_cached():
    fn = kc.contract(mode="check", register=False)(_with_predicate)
    c = fn.__kda_contract__
    assert c._check is c._check_uncached
    x = torch.zeros(2, 3)
    fn(x, 0.0)
    fn(x, 0.0)
    with pytest.raises(kc.ContractError):
        fn(x, -0.0)


def _scaled_any(x: Float[Tensor, "B D"], y: Float[Tensor, "B D"], alpha: float) -> None:
    pass


def test_odd_scalar_values_neither_escape_nor_are_kept_alive():
    c = kc.contract(mode="check", register=False)(_scaled_any).__kda_contract__
    x = torch.zeros(2, 3)
    big = torch.zeros(10**6)
    ref = weakref.ref(big)
    for v in (_RaisingEq(), _RaisingEq(), big, big):  # values the checker does not refuse here
        assert c._check(x, x, v, None) == c._check_uncached(x, x, v, None)
    del big, v
    gc.collect()
    assert ref() is None
    assert not c._check.__kda_entries__


def test_the_probe_answers_whatever_the_callers_defaults():
    code = ("import torch; torch.set_default_device('meta')\n"
            "with torch.inference_mode():\n"
            "    import kda_contracts as kc\n"
            "    from kda_contracts._engine.codegen.check_cache import guards_available\n"
            "    print(guards_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_after_a_run_of_calls_it_never_answers_the_cache_stands_aside_then_comes_back():
    from kda_contracts._engine.codegen.check_cache import BYPASS_AFTER, BYPASS_FOR

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    c, _ = decode_args(1, cfg)
    check, calls = _counting(c)
    for B in range(1, BYPASS_AFTER + 11):  # every call new: no key is ever answered
        _, args = decode_args(B, cfg, seed=B)
        assert check(*args, cfg) is not None
    assert check.__kda_state__[0] >= BYPASS_AFTER  # standing aside
    _, args = decode_args(2, cfg)
    for _ in range(BYPASS_FOR + 10):  # the checker alone, then the cache again
        assert check(*args, cfg) == c._check_uncached(*args, cfg)
    before = calls["checker"]
    for _ in range(20):
        assert check(*args, cfg) is not None
    assert calls["checker"] == before and check.__kda_state__[0] == 0


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "coo"])
def test_sparse_tensors_are_never_cached_and_a_repeat_call_survives(layout):
    # a guard reads strides: building one for a sparse compressed tensor aborted the process on the
    # second accepted call (a C++ error, uncatchable)
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> None: ...

    dense = torch.eye(4)[:2]
    x = {"csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc, "bsr": lambda: dense.to_sparse_bsr((1, 1)),
         "coo": dense.to_sparse}[layout]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (sparse support in beta)
        for _ in range(5):
            f(x, torch.ones(4))
        with pytest.raises(kc.ShapeError, match=r"w: ShapeError"):
            f(x, torch.ones(3))
    assert not f.__kda_contract__._check.__kda_entries__


def test_a_frozen_config_holding_a_mutable_model_is_read_afresh():
    # frozen=True is shallow: cfg.heads.D could change under a cached view, which then accepted the
    # old width
    import pydantic

    class Heads(pydantic.BaseModel):
        D: int

    class Cfg(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(frozen=True)
        heads: Heads

        def contract_dims(self):
            return {"D": self.heads.D}

    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], cfg: object) -> None: ...

    x, cfg = torch.zeros(2, 4), Cfg(heads=Heads(D=4))
    for _ in range(3):
        f(x, cfg)
    cfg.heads.D = 5
    with pytest.raises(kc.ShapeError, match=r"x: ShapeError"):
        f(x, cfg)

    class Frozen(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(frozen=True, arbitrary_types_allowed=True)
        D: int
        names: tuple[str, ...] = ("a",)
        dtype: torch.dtype = torch.float32

    from kda_contracts._engine.model.markers import config_is_frozen

    assert config_is_frozen(Frozen(D=3)) and not config_is_frozen(cfg)
    assert config_is_frozen(kc.KDAConfig.preset("kimi-linear-48b-a3b"))

    class Plain(pydantic.BaseModel):  # no contract_dims(): only its top-level ints bind, frozen keeps them
        model_config = pydantic.ConfigDict(frozen=True)
        D: int
        layer_types: list[str] = ["a"]

    assert config_is_frozen(Plain(D=3))


def test_every_shipped_op_is_behind_the_cache():
    # GDN's config predicate (a KDA layer's config is refused) once kept both GDN ops off the cache:
    # 2.2x their host cost per call; a predicate marked pure is cached
    for op in (kc.packed_decode, kc.gdn_packed_decode, kc.packed_prefill, kc.gdn_packed_prefill):
        for key, c in op.contracts.items():
            assert c._check is not c._check_uncached, f"{op.name}[{key}] runs its checker on every call"
