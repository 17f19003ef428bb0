"""Watch mode's checks made by the Triton decode kernel itself (``kda_kernels.interface.WATCH_CHECKS``):
the packed decode ops hand their value rules to the kernel they run, which checks what it reads
anyway and records a finding in the watcher's scratch; no check kernel is launched. Every report
is compared with the one the fused check kernel gives for the same call (the torch backend, which
checks nothing itself). On a GPU for real; on the CPU under ``TRITON_INTERPRET=1``, with watch
mode's device schedule stood in for (every tensor taken as a CUDA one)."""

from __future__ import annotations

import re

import pytest
import torch

import kda_contracts as kc
from kda_contracts._engine.contract import watch
from kda_contracts._engine.rules import fused
from kda_contracts.testing import make_decode_call, make_gdn_decode_call

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (NaN in the interpreter)

KDA = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
KDA_KV = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, state_layout="KV")
GDN = kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
H, HV, K, V = 2, 4, 8, 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
QK = 2 * H * K  # where v starts in a row of mixed_qkv


class Channel:
    """Watch mode's CUDA channel, stood in for on the CPU: copies arrive at once."""

    def send(self, flag):
        pass

    def arrived(self, flag):
        return flag.tolist()

    def wait(self, flag):
        return flag.tolist()

    def reset(self):
        pass


def _kernel_runs_here() -> bool:
    """Whether the watched decode kernel runs in this process: on a GPU, or under an interpreter
    that takes its loops (Triton 3.6's cannot with NumPy 2.4, as for the check kernel: CI's torch
    2.11 step; Triton 3.9's, CI's main step, and the compiled kernel on a GPU run it)."""
    from kda_kernels import triton_decode
    from kda_kernels.interface import WatchArgs

    if DEVICE == "cuda":
        return True
    try:
        c = make_decode_call(KDA, 2, 4)
        scratch = fused.FusedState(torch.device("cpu"), torch.zeros(7, dtype=torch.float64), None)
        triton_decode.packed_decode(c["mixed_qkv"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["scale"],
                                    c["initial_state"], c["out"], c["ssm_state_indices"], num_heads=2,
                                    use_qk_l2norm=True, lower_bound=None,
                                    watch=WatchArgs(scratch.own, scratch.doorbell, 1))
        return True
    except Exception:
        return False


pytestmark = [pytestmark, pytest.mark.skipif(not _kernel_runs_here(), reason=(
    "the watched decode kernel does not run in this Triton's interpreter (Triton 3.6 with NumPy 2.4); the "
    "compiled kernel on a GPU and Triton 3.9's interpreter run it"))]


@pytest.fixture(autouse=True)
def device_schedule(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setattr(watch, "_on_cuda", lambda values, rule: True)
        monkeypatch.setattr(watch, "channel_for", lambda device: Channel())
    watch.WATCHERS.clear()
    if not fused.usable():
        pytest.skip("watch mode's check kernel is off in this process")
    yield
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    watch.WATCHERS.clear()


@pytest.fixture
def launches(monkeypatch):
    """How many times the fused check kernel is launched."""
    count = [0]
    real = fused.launch

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fused, "launch", counted)
    return count


def _set(t: torch.Tensor, at: tuple, value: float) -> None:
    t[at] = value


def breaks(idx: list[int]) -> dict[str, list]:
    """Per case, the edits that break it (argument, index, value); ``idx`` is the call's slots."""
    return {
        "in_range": [("ssm_state_indices", (1,), 99), ("ssm_state_indices", (3,), 50)],
        "distinct": [("ssm_state_indices", (2,), idx[0]), ("ssm_state_indices", (3,), idx[0])],
        "finite_rows": [("initial_state", (idx[1], 2, 3, 4), float("nan")),
                        ("initial_state", (idx[3], 0, 0, 0), float("inf")),
                        ("initial_state", (idx[3], 3, 7, 1), float("inf"))],
        "finite_rows_inf": [("initial_state", (idx[2], 1, 5, 1), float("-inf"))],
        "unused_row": [("initial_state", (7, 1, 1, 1), float("nan"))],  # (no index names slot 7)
        "q": [("mixed_qkv", (2, 3), float("nan")), ("mixed_qkv", (3, 1), float("nan"))],
        "k": [("mixed_qkv", (1, H * K + 5), float("inf"))],
        "v_of_padding": [("ssm_state_indices", (0,), -1), ("mixed_qkv", (0, QK + 17), float("nan")),
                         ("mixed_qkv", (3, QK + 63), float("-inf"))],
        "a": [("a", (1, 1), float("inf"))],
        "b": [("b", (2, 3), float("nan"))],
        "A_log": [("A_log", (2,), float("nan"))],
        "dt_bias": [("dt_bias", (1,), float("inf")), ("dt_bias", (3,), float("inf"))],
        "two_rules": [("a", (0, 0), float("nan")), ("ssm_state_indices", (2,), 77)],  # (InRange is declared first)
    }


def make(op: str, seed: int = 0, state_dtype: torch.dtype = torch.float32) -> dict:
    if op == "gdn":
        c = make_gdn_decode_call(GDN, 4, 8, seed=seed, state_dtype=state_dtype, device=DEVICE)
    else:
        c = make_decode_call(KDA_KV if op == "kda_kv" else KDA, 4, 8, seed=seed, state_dtype=state_dtype,
                             device=DEVICE)
    c["ssm_state_indices"] = torch.tensor([5, 0, 3, 6], dtype=torch.int32, device=DEVICE)
    return c


def run(op: str, call: dict, backend: str) -> str | None:
    """The report watch mode gives for ``call`` run by ``backend`` (None: nothing found)."""
    fn = kc.gdn_packed_decode if op == "gdn" else kc.packed_decode
    cfg = GDN if op == "gdn" else KDA_KV if op == "kda_kv" else KDA
    with kc.mode("watch"):
        fn(**call, config=cfg, backend=backend)
        try:
            kc.raise_pending()
        except kc.ValueRangeError as exc:
            return str(exc)
    return None


def both(op: str, case: str, state_dtype: torch.dtype = torch.float32) -> tuple[str | None, str | None, dict]:
    """(the Triton kernel's own report, the fused check kernel's) for one broken call."""
    reports = []
    for backend in ("triton", "torch"):
        call = make(op, state_dtype=state_dtype)
        for arg, at, value in breaks(call["ssm_state_indices"].tolist())[case]:
            if arg == "initial_state" and op == "kda_kv":  # (KV: the last two dims swapped)
                at = (at[0], at[1], at[3], at[2])
            if arg in ("a", "dt_bias") and op == "gdn":  # (GDN: one gate per value head)
                at = (*at[:-1], at[-1] % HV)
            _set(call[arg], at, value)
        reports.append(run(op, call, backend))
    return reports[0], reports[1], call


CASES = list(breaks([0, 1, 2, 3]))


def same(report: str) -> str:
    """A report without its call's serial (the two backends' calls have their own)."""
    return re.sub(r"call #\d+", "call #N", report)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_the_kernels_own_checks_report_as_the_check_kernel_does(launches, op, case):
    own, checked, _ = both(op, case)
    if case == "unused_row":
        assert own is None and checked is None
        return
    assert checked is not None and own is not None and same(own) == same(checked)
    assert launches[0] == 1  # (the torch backend's call only: the Triton kernel's needed no check kernel)


@pytest.mark.parametrize("case", ["in_range", "finite_rows", "v_of_padding", "dt_bias"])
def test_kv_layout_and_16_bit_state(launches, case):
    own, checked, _ = both("kda_kv", case, torch.bfloat16)
    assert checked is not None and own is not None and same(own) == same(checked)


def test_a_clean_call_writes_nothing_and_computes_what_it_does_outside_watch_mode():
    for op in ("kda", "gdn"):
        fn = kc.gdn_packed_decode if op == "gdn" else kc.packed_decode
        cfg = GDN if op == "gdn" else KDA
        plain, watched = make(op), make(op)
        fn(**plain, config=cfg, backend="triton")
        with kc.mode("watch"):
            fn(**watched, config=cfg, backend="triton")
            w = next(iter(watch.WATCHERS.values()))
            assert torch.equal(w.fused.own.cpu(), fused._fresh_own()) and not w.fused.doorbell[0]
            kc.raise_pending()
        for name in ("out", "initial_state"):
            assert torch.equal(plain[name], watched[name]), name


def test_a_later_calls_findings_never_join_the_recorded_ones(monkeypatch):
    """The first call that finds anything claims the record: a later call's findings (before the
    report is read) neither replace nor add to it."""
    monkeypatch.setattr(watch, "poll", lambda: None)  # (nothing is read before raise_pending: both calls run)
    first, later = make("kda"), make("kda")
    first["ssm_state_indices"][1] = 40
    later["ssm_state_indices"][0] = 30
    later["ssm_state_indices"][2] = 31
    with kc.mode("watch"):
        kc.packed_decode(**first, config=KDA, backend="triton")
        kc.packed_decode(**later, config=KDA, backend="triton")
        with pytest.raises(kc.ValueRangeError) as info:
            kc.raise_pending()
        kc.raise_pending()  # (read and cleared: nothing more)
    assert "1 value(s) >= N=8 (max 40); the first: ssm_state_indices[1] = 40" in str(info.value)


def test_repeated_calls_hand_their_rules_to_the_kernel_too(launches):
    """A call the check cache answers from the entry of the last one takes the repeat path, and its
    rules still go to the kernel (no check kernel launched), with its own serial."""
    good = make("kda")
    with kc.mode("watch"):
        for _ in range(5):
            kc.packed_decode(**good, config=KDA, backend="triton")
        kc.raise_pending()
        bad = make("kda")
        bad["b"][3, 1] = float("nan")
        kc.packed_decode(**bad, config=KDA, backend="triton")
        with pytest.raises(kc.ValueRangeError, match=r"b\[3, 1\] = nan") as info:
            kc.raise_pending()
    assert launches[0] == 0
    assert "call #" in str(info.value)


def test_the_op_value_rules_are_the_kernel_checks_in_order():
    from kda_kernels.interface import WATCH_CHECKS

    from kda_contracts.ops._packed import backends, checks

    assert backends.WATCH_CHECKS == WATCH_CHECKS
    assert [type(r).__name__ for r in checks.VALUE_RULES] == ["InRange", "Distinct", "FiniteRows"] + ["Finite"] * 5
    assert [r.args[0] for r in checks.VALUE_RULES[3:]] == [c.removeprefix("finite_") for c in WATCH_CHECKS[3:]]


def test_the_scratch_layout_is_the_kernels():
    from kda_kernels import interface as i

    assert (i.WATCH_CLAIM, i.WATCH_LOCK, i.WATCH_FIRST, i.WATCH_COUNT, i.WATCH_WORST, i.WATCH_VALUE, i.WATCH_EXTRA,
            i.WATCH_BITMAP, i.WATCH_ROWS_MAX, i.WATCH_WORDS, i.WATCH_BIG) == (
        fused.OWN_CLAIM, fused.OWN_LOCK, fused.OWN_FIRST, fused.OWN_COUNT, fused.OWN_WORST, fused.OWN_VALUE,
        fused.OWN_EXTRA, fused.OWN_BITMAP, fused.OWN_ROWS_MAX, fused.OWN_WORDS, fused.BIG)
    assert len(i.WATCH_CHECKS) == fused.CHECKS


def own_findings(call: dict, cfg, *, op: str = "kda", **config) -> list[float] | None:
    """The kernel's own record of one call run directly with a launch shape (``config``), as a flag row."""
    from kda_kernels import triton_decode
    from kda_kernels.interface import WatchArgs
    from kda_kernels.triton_configs import DecodeConfig

    host = torch.zeros(7, dtype=torch.float64, pin_memory=True) if DEVICE == "cuda" else None  # (the doorbell)
    state = fused.FusedState(torch.device(DEVICE), torch.zeros(7, dtype=torch.float64, device=DEVICE), host)
    kernel = triton_decode.gdn_packed_decode if op == "gdn" else triton_decode.packed_decode
    kernel(call["mixed_qkv"], call["a"], call["b"], call["A_log"], call["dt_bias"], call["scale"],
           call["initial_state"], call["out"], call["ssm_state_indices"], num_heads=cfg.local_num_heads,
           use_qk_l2norm=True, lower_bound=None, config=DecodeConfig(**config) if config else None,
           watch=WatchArgs(state.own, state.doorbell, 9))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    row = state.own_row(lambda serial: range(fused.CHECKS))
    assert bool(state.doorbell[0]) == (row is not None)
    return row


def probe_finding(call: dict, dims: dict) -> list[float] | None:
    """What the op's rules' torch probes find first, as the same flag row."""
    from kda_contracts._engine.rules.reading import probes
    from kda_contracts.ops._packed.checks import VALUE_RULES

    for i, p in probes(VALUE_RULES, call, dims):
        if p[0] >= 0:
            return [1.0, 9.0, float(i), *p.tolist()]
    return None


def same_row(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and len(a) == len(b) and all(
        x == y or (x != x and y != y) for x, y in zip(a, b, strict=True)))


SHAPES = [dict(block_v=8, num_warps=1, tiles=2), dict(block_v=16, num_warps=1, guard="mask"),
          dict(block_v=8, num_warps=1, early_load=True), dict(block_v=4, num_warps=1, tiles=4, guard="mask")]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("case", ["in_range", "finite_rows", "v_of_padding", "q", "b", "clean"])
def test_every_launch_shape_finds_what_the_probes_find(shape, case):
    call = make("kda", seed=shape)
    if case != "clean":
        for arg, at, value in breaks(call["ssm_state_indices"].tolist())[case]:
            _set(call[arg], at, value)
    dims = {"B": 4, "H": H, "HV": HV, "K": K, "V": V, "N": 8}
    expected = probe_finding(call, dims)
    assert same_row(own_findings(call, KDA, **SHAPES[shape]), expected), (own_findings(call, KDA, **SHAPES[shape]),
                                                                           expected)


def test_distinct_past_the_first_block_of_64_indices():
    """Requests past 64 compare their slot with every earlier one (the first block is read early,
    the rest at the end)."""
    call = make_decode_call(KDA, 70, 80, device=DEVICE)
    idx = torch.randperm(80, generator=torch.Generator().manual_seed(3))[:70].to(torch.int32)
    idx[69] = idx[3]  # (a later block against the first)
    idx[66] = idx[65]  # (within the second block)
    call["ssm_state_indices"] = idx.to(DEVICE)
    dims = {"B": 70, "H": H, "HV": HV, "K": K, "V": V, "N": 80}
    row = own_findings(call, KDA)
    assert same_row(row, probe_finding(call, dims)) and row[:6] == [1.0, 9.0, 1.0, 66.0, float(idx[65]), 2.0]


def test_one_request_hands_its_rules_to_the_kernel_too(launches):
    """B = 1: Distinct has nothing to compare (no slot of its own in the check kernel), and the
    rules still go to the decode kernel."""
    call = make_decode_call(KDA, 1, 4, device=DEVICE)
    call["A_log"][1] = float("-inf")
    with kc.mode("watch"):
        kc.packed_decode(**call, config=KDA, backend="triton")
        with pytest.raises(kc.ValueRangeError, match=r"A_log\[1\] = -inf"):
            kc.raise_pending()
    assert launches[0] == 0
