"""Kernels under abuse, on the CPU (Triton and Helion run under the Triton interpreter).

Every backend of ``kda_kernels`` is called directly (no contract in front of it) with the index
abuse that serving engines have shipped: indices past the pool (``N``, ``N + 7``, the largest
int32 / ``2**62``), huge negative padding, duplicate slots, all-padding batches and ``B == 0``;
the pool is a strided slice of a bigger buffer, so bytes between slots exist. For every case:

- no byte of the pool's whole storage changes outside the slots of valid indices;
- no byte of any input changes; every ``out`` row is written, and rows of invalid indices are 0;
- rows with a valid index of their own match the independent oracle (``kda_oracle``), as do their
  slots; a duplicated slot ends finite (which request wins is unspecified).

And on fuzzed calls the contract accepts (no duplicates; padding and out-of-range rows included)
every backend matches the oracle on the whole ``out`` and pool.

Budget: the interpreter costs a few ms per Triton program and far more per Helion program, and
each new Helion specialisation compiles for seconds; so grids are tiny, the compiled Helion
kernel is fuzzed on one specialisation (dims, dtypes, gate fixed; batch, pool, indices, strides,
layout and values drawn), and examples are few. ``HYPOTHESIS_PROFILE=long`` runs more.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch
from fuzz_stats import report_counters
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kda_kernels import helion_decode, reference, triton_decode
from kda_oracle import (
    DecodeCase,
    assert_close_to_oracle,
    assert_pool_untouched_except,
    make_decode_case,
    run_kernel,
    run_oracle,
    valid_slots,
)


# -- budget (see tests/test_fuzz_packed_decode.py) --------------------------------------------------
def budget(examples_in_ci: int) -> settings:
    """``examples_in_ci`` examples under the dev and ci profiles (200), proportionally more under long."""
    return settings(max_examples=max(5, settings.default.max_examples * examples_in_ci // 200), deadline=None,
                    print_blob=True)


STATS: Counter[str] = Counter()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int32": torch.int32,
          "int64": torch.int64}


@dataclass(frozen=True)
class Call:
    """A packed-decode call as plain values (so failures print readably and ``@example`` works)."""

    H: int
    HV: int
    K: int
    V: int
    N: int
    indices: tuple[int, ...]
    act: str = "float32"
    state: str = "float32"
    index: str = "int64"
    layout: str = "VK"
    lower_bound: float | None = None
    l2norm: bool = True
    row_pad: int = 0
    slot_pad: int = 0  # -1: one whole slot between slots (every other slot of a buffer twice the size)
    seed: int = 0

    def case(self) -> DecodeCase:
        return make_decode_case(
            batch=len(self.indices), num_heads=self.H, num_v_heads=self.HV, head_k_dim=self.K, head_v_dim=self.V,
            num_slots=self.N, indices=self.indices, act_dtype=DTYPES[self.act], state_dtype=DTYPES[self.state],
            index_dtype=DTYPES[self.index], state_layout=self.layout, lower_bound=self.lower_bound,
            use_qk_l2norm=self.l2norm, row_pad=self.row_pad,
            slot_pad=self.HV * self.K * self.V if self.slot_pad < 0 else self.slot_pad, seed=self.seed)


# -- backends ----------------------------------------------------------------------------------------
def _helion_compiled() -> Callable[..., None]:
    import helion

    # An explicit config: the compiled path never autotunes (see tests/test_helion_decode.py).
    kernel = helion_decode.decode_kernel(helion.Config(block_sizes=[4], num_warps=1))
    return functools.partial(helion_decode.launch, kernel=kernel)


def _helion_eager() -> Callable[..., None]:
    return functools.partial(helion_decode.launch, kernel=helion_decode.decode_kernel(eager=True))


@dataclass(frozen=True)
class Backend:
    module: ModuleType
    kernel: Callable[[], Callable[..., None]]
    dims: dict[str, object]  # what the fuzzer may draw for it
    examples: int  # per test, under the dev and ci profiles


# The fixed specialisation the compiled Helion kernel is fuzzed on (each new one compiles for seconds).
HELION_FIXED = dict(H=(1,), HV=(2,), K=(8,), V=(4,), act=("float32",), state=("float32",), index=("int64",),
                    gate=(None,), l2norm=(True,), max_batch=3)
FREE = dict(H=(1, 2, 3), HV=(1, 2, 3), K=tuple(range(1, 17)), V=tuple(range(1, 17)), act=("float32", "bfloat16",
            "float16"), state=("float32", "bfloat16", "float16"), index=("int32", "int64"), gate=(None, -5.0),
            l2norm=(True, False), max_batch=6)
SMALL = dict(FREE, H=(1, 2), HV=(1, 2), K=tuple(range(1, 9)), V=tuple(range(1, 9)), max_batch=3)

BACKENDS = {
    "reference": Backend(reference, lambda: reference.packed_decode, FREE, 60),
    "triton": Backend(triton_decode, lambda: triton_decode.packed_decode, SMALL, 25),
    "helion": Backend(helion_decode, _helion_compiled, HELION_FIXED, 12),
    "helion-eager": Backend(helion_decode, _helion_eager, SMALL, 25),
}


def _backend(name: str) -> Backend:
    be = BACKENDS[name]
    ok, why = getattr(be.module, "is_available", lambda: (True, ""))()
    if not ok:
        pytest.skip(f"{name} backend unavailable: {why}")
    return be


# -- strategies --------------------------------------------------------------------------------------
@st.composite
def calls(draw: st.DrawFn, dims: dict[str, object], duplicates: bool) -> Call:
    H = draw(st.sampled_from(dims["H"]))
    HV = draw(st.sampled_from([hv for hv in dims["HV"] if hv % H == 0] or [H]))
    K, V = draw(st.sampled_from(dims["K"])), draw(st.sampled_from(dims["V"]))
    B, N = draw(st.integers(1, dims["max_batch"])), draw(st.integers(1, 6))  # B == 0: in the examples
    index = draw(st.sampled_from(dims["index"]))
    top, low = (2 ** 31 - 1, -(2 ** 31)) if index == "int32" else (2 ** 62, -(2 ** 62))
    perm, used, idx = draw(st.permutations(range(N))), 0, []
    for _ in range(B):
        kind = draw(st.sampled_from(("valid", "padding", "valid", "out of range", "valid")))
        if kind == "valid" and used < N:
            idx.append(perm[used])
            used += 1
        elif kind == "out of range":
            idx.append(draw(st.sampled_from((N, N + 1, N + 7, top))))
        else:
            idx.append(draw(st.sampled_from((-1, -2, low))))
    live = [i for i, s in enumerate(idx) if 0 <= s < N]
    if duplicates and live and B >= 2 and draw(st.booleans()):
        src = draw(st.sampled_from(live))
        dst = draw(st.sampled_from([i for i in range(B) if i != src]))
        idx[dst] = idx[src]
    return Call(
        H=H, HV=HV, K=K, V=V, N=N, indices=tuple(idx), act=draw(st.sampled_from(dims["act"])),
        state=draw(st.sampled_from(dims["state"])), index=index, layout=draw(st.sampled_from(("VK", "KV"))),
        lower_bound=draw(st.sampled_from(dims["gate"])), l2norm=draw(st.sampled_from(dims["l2norm"])),
        row_pad=draw(st.sampled_from((0, 3))), slot_pad=draw(st.sampled_from((0, 5, -1))),
        seed=draw(st.integers(0, 2 ** 16)))


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(s, 0, (s.nbytes(),)).clone()


def _inputs(case: DecodeCase) -> dict[str, torch.Tensor]:
    return {"mixed_qkv": case.mixed_qkv, "a": case.a, "b": case.b, "A_log": case.A_log, "dt_bias": case.dt_bias,
            "indices": case.indices}


# The abuse the contract's strict mode would refuse, forced into every run (dims of HELION_FIXED).
ABUSE = dict(H=1, HV=2, K=8, V=4, N=5)
ABUSE_EXAMPLES = [
    Call(**ABUSE, indices=()),  # B == 0
    Call(**ABUSE, indices=(-1, -(2 ** 62), -2)),  # all padding
    Call(**ABUSE, indices=(5, 2 ** 62, 12), slot_pad=-1),  # all out of range, gaps between slots
    Call(**ABUSE, indices=(3, 3, 1), slot_pad=5),  # a duplicate slot
    Call(**ABUSE, indices=(4, 2 ** 62, -1), layout="KV", row_pad=3),
]


# -- the properties ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_abused_indices_never_change_a_byte_outside_the_slots_of_valid_indices(backend: str) -> None:
    be = _backend(backend)
    kernel = be.kernel()

    @budget(be.examples)
    @_examples(ABUSE_EXAMPLES)
    @given(call=calls(be.dims, duplicates=True))
    def check(call: Call) -> None:
        case = call.case()
        _count(backend, "abuse", call)
        inputs_before = {k: _storage_bytes(v) for k, v in _inputs(case).items()}
        out, state = run_kernel(kernel, case)
        assert_pool_untouched_except(case.state, state, valid_slots(case.indices, call.N))
        for k, v in _inputs(case).items():
            assert torch.equal(_storage_bytes(v), inputs_before[k]), f"the kernel wrote into {k}"
        ref_out, ref_state = run_oracle(case)
        counts: dict[int, int] = {}
        for s in call.indices:
            counts[s] = counts.get(s, 0) + 1
        for row, s in enumerate(call.indices):
            if not 0 <= s < call.N:
                assert out[row].eq(0).all(), f"row {row} (index {s}) is not zero"
            elif counts[s] == 1:
                assert_close_to_oracle(out[row], ref_out[row])
                assert_close_to_oracle(state[s], ref_state[s])
            else:  # duplicates race; whichever request wins, nothing overflows
                assert out[row].isfinite().all() and state[s].isfinite().all()

    check()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_matches_the_oracle_on_fuzzed_calls_the_contract_accepts(backend: str) -> None:
    be = _backend(backend)
    kernel = be.kernel()

    @budget(be.examples)
    @_examples(ABUSE_EXAMPLES[:3] + ABUSE_EXAMPLES[4:])  # all but the duplicate
    @given(call=calls(be.dims, duplicates=False))
    def check(call: Call) -> None:
        case = call.case()
        _count(backend, "agreement", call)
        out, state = run_kernel(kernel, case)
        ref_out, ref_state = run_oracle(case)
        assert_close_to_oracle(out, ref_out)
        # the pool as a dense tensor: the oracle returns it so
        assert_close_to_oracle(state.contiguous(), ref_state)
        assert_pool_untouched_except(case.state, state, valid_slots(case.indices, call.N))

    check()


def _examples(calls_: list[Call]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        for c in reversed(calls_):
            fn = example(call=c)(fn)
        return fn

    return wrap


def _count(backend: str, test: str, call: Call) -> None:
    STATS[f"{backend} {test} cases"] += 1
    live = [s for s in call.indices if 0 <= s < call.N]
    STATS[f"{backend} {test} rows"] += len(call.indices)
    STATS[f"{backend} {test} out-of-range rows"] += sum(s >= call.N for s in call.indices)
    STATS[f"{backend} {test} padding rows"] += sum(s < 0 for s in call.indices)
    STATS[f"{backend} {test} duplicate-slot cases"] += len(live) != len(set(live))
    STATS[f"{backend} {test} empty batches"] += not call.indices
    STATS[f"{backend} {test} all-invalid batches"] += bool(call.indices) and not live


@pytest.fixture(scope="module", autouse=True)
def _report_counters(request: pytest.FixtureRequest):
    yield
    report_counters(request, STATS, "kernels_under_abuse")
