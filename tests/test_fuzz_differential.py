"""Differential tests: our contracts against jaxtyping + beartype on the same calls.

jaxtyping checks dims argument by argument, so it can only decide a packed-decode call when the
arguments that bind the dims come first ("binder-first") and when ``H``, which no tensor carries
as a plain dim, is given to it by a binder argument (``heads: Shaped[Tensor, "H"]``). On such
calls, with shape and dtype mutations only (no strides, devices or values, which jaxtyping does
not check), the verdicts must agree:

- same annotations, two engines: ``@kc.contract`` and ``@jaxtyped(typechecker=beartype)`` on one
  binder-first function reach the same accept/reject verdict on every case;
- the real packed-decode contract (with a ``KDAConfig`` giving it H, as the binder gives it to
  jaxtyping) agrees with jaxtyping except where docs/reliability.md says they legitimately
  differ: our dtype sets are narrower than jaxtyping's ``Float``, ``out`` must have
  ``mixed_qkv``'s dtype, and the pool may not be empty;
- in sglang's argument order jaxtyping cannot decide at all (it raises on the annotation), while
  we accept every valid call.
"""

# No `from __future__ import annotations`: the binder-first annotations below are built from a local
# (the layout's dim string) and must be evaluated when the function is defined.
from collections import Counter
from typing import Any

import jaxtyping
import pytest
import torch
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation
from fuzz_stats import report_counters
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Float, Int, Shaped, jaxtyped
from torch import Tensor

import kda_contracts as kc


# -- budget (see tests/test_fuzz_packed_decode.py) --------------------------------------------------
def budget(fraction: float) -> settings:
    return settings(max_examples=max(10, int(settings.default.max_examples * fraction)), deadline=None,
                    print_blob=True)


STATS: Counter[str] = Counter()

ACT = (torch.bfloat16, torch.float16, torch.float32)
STATE = (torch.float32, torch.bfloat16, torch.float16)
INDEX = (torch.int32, torch.int64)
ALLOWED = {"mixed_qkv": ACT, "a": ACT, "b": ACT, "A_log": (torch.float32,), "dt_bias": (torch.float32,),
           "initial_state": STATE, "out": ACT, "ssm_state_indices": INDEX}
JAXTYPING_FLOAT = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                   torch.float8_e5m2}
# Dtypes a mutation may pick: in and out of jaxtyping's Float and Int categories.
ANY_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
TENSORS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")


# -- one binder-first function per layout, for both engines -----------------------------------------
def _binder_first(layout: str) -> Any:
    state_dims = "N HV V K" if layout == "VK" else "N HV K V"

    def packed_decode_binder_first(
        initial_state: Float[Tensor, state_dims],  # binds N, HV, V, K
        heads: Shaped[Tensor, "H"],  # binds H: no argument of the real call carries it as a plain dim
        mixed_qkv: Float[Tensor, "B 2*H*K+HV*V"],
        a: Float[Tensor, "B HV*K"],
        b: Float[Tensor, "B HV"],
        A_log: Float[Tensor, "HV"],
        dt_bias: Float[Tensor, "HV*K"],
        out: Float[Tensor, "B 1 HV V"],
        ssm_state_indices: Int[Tensor, "B"],
    ) -> None:
        return None

    return packed_decode_binder_first


JT = {layout: jaxtyped(typechecker=beartype)(_binder_first(layout)) for layout in ("VK", "KV")}
OURS = {layout: kc.contract(register=False, mode="check")(_binder_first(layout)) for layout in ("VK", "KV")}


@jaxtyped(typechecker=beartype)
def jt_sglang_order(
    mixed_qkv: Float[Tensor, "B 2*H*K+HV*V"], a: Float[Tensor, "B HV*K"], b: Float[Tensor, "B HV"],
    A_log: Float[Tensor, "HV"], dt_bias: Float[Tensor, "HV*K"], scale: float,
    initial_state: Float[Tensor, "N HV V K"], out: Float[Tensor, "B 1 HV V"], ssm_state_indices: Int[Tensor, "B"],
) -> None:
    return None


# -- cases: valid shapes, then shape/dtype mutations only -------------------------------------------
@st.composite
def shape_cases(draw: st.DrawFn, max_mutations: int = 2) -> dict[str, Any]:
    H = draw(st.integers(1, 3))
    HV = H * draw(st.integers(1, 3))
    K = draw(st.integers(1, 12))
    V = K if draw(st.booleans()) else draw(st.integers(1, 12))
    B, N = draw(st.integers(0, 5)), draw(st.integers(1, 6))
    act, sdt, idt = draw(st.sampled_from(ACT)), draw(st.sampled_from(STATE)), draw(st.sampled_from(INDEX))
    layout = draw(st.sampled_from(("VK", "KV")))
    inner = (V, K) if layout == "VK" else (K, V)
    t = {
        "mixed_qkv": torch.zeros(B, 2 * H * K + HV * V, dtype=act), "a": torch.zeros(B, HV * K, dtype=act),
        "b": torch.zeros(B, HV, dtype=act), "A_log": torch.zeros(HV), "dt_bias": torch.zeros(HV * K),
        "initial_state": torch.zeros(N, HV, *inner, dtype=sdt), "out": torch.zeros(B, 1, HV, V, dtype=act),
        "ssm_state_indices": torch.full((B,), -1, dtype=idt),  # values never matter here
    }
    mutations = []
    touched: set[str] = set()
    for _ in range(draw(st.integers(0, max_mutations))):
        name = draw(st.sampled_from([n for n in TENSORS if n not in touched]))
        x = t[name]
        how = draw(st.sampled_from(("rank", "dim", "dtype")))
        if how == "rank":
            x = x.unsqueeze(draw(st.integers(0, x.dim()))) if x.dim() < 2 or not x.shape[0] or draw(
                st.booleans()) else x[0]
        elif how == "dim":
            axis = draw(st.integers(0, x.dim() - 1))
            shape = list(x.shape)
            shape[axis] = draw(st.integers(0, shape[axis] + 3).filter(lambda s, old=shape[axis]: s != old))
            x = torch.zeros(shape, dtype=x.dtype)
        else:
            x = x.to(draw(st.sampled_from([d for d in ANY_DTYPES if d != x.dtype])))
        t[name] = x
        touched.add(name)
        mutations.append(f"{how}:{name}:{list(x.shape)}:{x.dtype}")
    cfg = kc.KDAConfig(num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, state_layout=layout,
                       use_qk_l2norm=True)
    return dict(t=t, H=H, layout=layout, config=cfg, mutations=mutations)


def _jaxtyping_rejects(fn: Any, *args: Any) -> bool:
    try:
        fn(*args)
    except (jaxtyping.TypeCheckError, BeartypeCallHintViolation):
        return True
    return False


def _ours_rejects(fn: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        fn(*args, **kwargs)
    except kc.ContractError:
        return True
    return False


def _binder_args(case: dict[str, Any]) -> tuple[Tensor, ...]:
    t = case["t"]
    return (t["initial_state"], torch.zeros(case["H"]), t["mixed_qkv"], t["a"], t["b"], t["A_log"], t["dt_bias"],
            t["out"], t["ssm_state_indices"])


def _count(prefix: str, jt: bool, ours: bool) -> None:
    STATS["cases"] += 1
    STATS[f"{prefix}: both {'reject' if jt else 'accept'}" if jt == ours else
          f"{prefix}: {'ours' if ours else 'jaxtyping'} alone rejects"] += 1


# -- the properties ----------------------------------------------------------------------------------
@budget(1.0)
@given(case=shape_cases())
def test_on_the_same_binder_first_annotations_both_engines_reach_the_same_verdict(case: dict[str, Any]) -> None:
    args = _binder_args(case)
    jt = _jaxtyping_rejects(JT[case["layout"]], *args)
    ours = _ours_rejects(OURS[case["layout"]], *args)
    _count("same annotations", jt, ours)
    assert jt == ours, (f"jaxtyping {'rejects' if jt else 'accepts'}, kc.contract {'rejects' if ours else 'accepts'}"
                        f": {case['mutations']}")


@budget(1.0)
@given(case=shape_cases())
def test_the_packed_decode_contract_agrees_with_jaxtyping_except_where_documented(case: dict[str, Any]) -> None:
    t, cfg = case["t"], case["config"]
    jt = _jaxtyping_rejects(JT[case["layout"]], *_binder_args(case))
    ours = _ours_rejects(kc.validate_packed_decode, t["mixed_qkv"], t["a"], t["b"], t["A_log"], t["dt_bias"],
                         cfg.scale, t["initial_state"], t["out"], t["ssm_state_indices"], True, config=cfg)
    # The documented differences (docs/reliability.md): narrower dtype sets, out's dtype tied to
    # mixed_qkv's, and no empty pool.
    narrowed = [n for n in TENSORS if t[n].dtype not in ALLOWED[n]
                and t[n].dtype in (JAXTYPING_FLOAT if n != "ssm_state_indices" else {torch.int8, torch.int16})]
    if t["out"].dtype != t["mixed_qkv"].dtype:
        narrowed.append("out same dtype as mixed_qkv")
    empty_pool = t["initial_state"].dim() == 4 and t["initial_state"].shape[0] == 0
    _count("packed_decode", jt, ours)
    if ours and not jt:
        STATS["packed_decode: legit difference: " + ("dtype narrowing" if narrowed else "empty pool")] += 1
    assert ours == (jt or bool(narrowed) or empty_pool), (
        f"jaxtyping {'rejects' if jt else 'accepts'}, we {'reject' if ours else 'accept'} "
        f"(narrowed dtypes: {narrowed}, empty pool: {empty_pool}): {case['mutations']}")


@budget(0.15)
@given(case=shape_cases(max_mutations=0))
def test_in_sglang_order_jaxtyping_cannot_decide_a_valid_call_and_we_accept_it(case: dict[str, Any]) -> None:
    t = case["t"]
    args = (t["mixed_qkv"], t["a"], t["b"], t["A_log"], t["dt_bias"], 0.5, t["initial_state"], t["out"],
            t["ssm_state_indices"])
    with pytest.raises(jaxtyping.AnnotationError, match="Cannot process symbolic axis"):
        jt_sglang_order(*args)
    kc.validate_packed_decode(*args, state_layout=case["layout"])
    STATS["sglang order: jaxtyping cannot decide, we accept"] += 1
    STATS["cases"] += 1


# -- what jaxtyping does not check: fixed examples of each documented difference ---------------------
def _valid_call() -> dict[str, Any]:
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    return make_decode_call(cfg, 3, 6)


DIFFERENCES = {
    "strides (a transposed pool, same shape when K == V)":
        (lambda c: dict(c, initial_state=c["initial_state"].transpose(-1, -2)), kc.LayoutError, False),
    "devices (one tensor on meta)": (lambda c: dict(c, b=c["b"].to("meta")), kc.DeviceError, False),
    "values (strict: a duplicate slot)":
        (lambda c: dict(c, ssm_state_indices=torch.tensor([1, 1, 2], dtype=torch.int32)), kc.ValueRangeError, True),
    "values (strict: NaN in a)": (lambda c: dict(c, a=c["a"].clone().fill_(float("nan"))), kc.ValueRangeError, True),
    "dtype narrowing (float64 dt_bias)": (lambda c: dict(c, dt_bias=c["dt_bias"].double()), kc.DtypeError, False),
}


@pytest.mark.parametrize("difference", sorted(DIFFERENCES))
def test_jaxtyping_accepts_what_we_reject_beyond_shapes(difference: str) -> None:
    mutate, kind, strict = DIFFERENCES[difference]
    call = mutate(_valid_call())
    args = (call["initial_state"], torch.zeros(2), call["mixed_qkv"], call["a"], call["b"], call["A_log"],
            call["dt_bias"], call["out"], call["ssm_state_indices"])
    JT["VK"](*args)  # jaxtyping + beartype: accepted
    with pytest.raises(kind):
        kc.validate_packed_decode(**call, strict=strict)


@pytest.fixture(scope="module", autouse=True)
def _report_counters(request: pytest.FixtureRequest):
    yield
    report_counters(request, STATS, "differential")
