"""Watch mode on a CUDA device (skipped on the CPU; written to run on a GPU machine): the flag,
the pinned copy and the event, the report at a later call, CUDA-graph capture and replay read with
``kc.raise_pending()``, and no host sync at all in watch mode (``torch.cuda.set_sync_debug_mode``)."""

from __future__ import annotations

import pytest
import torch

import kda_contracts as kc
from kda_contracts._engine.contract import watch
from kda_contracts.testing import make_decode_call

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="watch mode's device schedule needs CUDA")

CFG = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)


def call(batch=4, pool=8):
    return make_decode_call(CFG, batch, pool, device="cuda")


@pytest.fixture(autouse=True)
def _clean():
    watch.WATCHERS.clear()
    yield
    torch.cuda.synchronize()
    watch.WATCHERS.clear()


def test_watch_mode_syncs_nothing_and_reports_a_bad_slot_at_a_later_call():
    good, bad = call(), call()
    bad["ssm_state_indices"][1] = 99
    with kc.mode("watch"):
        kc.packed_decode(**good, config=CFG, backend="torch")  # warm-up: the flag and pinned buffers
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            kc.packed_decode(**bad, config=CFG, backend="torch")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()  # the copy has arrived: the next watched call reports
        with pytest.raises(kc.ValueRangeError) as info:
            kc.packed_decode(**good, config=CFG, backend="torch")
    text = str(info.value)
    assert "packed_decode (watch, call #" in text and "ssm_state_indices[1] = 99" in text
    assert "that call may have written initial_state, out" in text
    kc.raise_pending()


def test_raise_pending_waits_for_the_flag():
    bad = call()
    bad["mixed_qkv"][0, 0] = float("nan")
    with kc.mode("watch"):
        kc.packed_decode(**bad, config=CFG, backend="torch")
        with pytest.raises(kc.ValueRangeError, match=r"mixed_qkv\[0, 0\] = nan"):
            kc.raise_pending()


def test_the_block_exit_raises_what_is_pending():
    bad = call()
    bad["ssm_state_indices"][2] = bad["ssm_state_indices"][0]
    with pytest.raises(kc.ValueRangeError, match="duplicate value"), kc.mode("watch"):
        kc.packed_decode(**bad, config=CFG, backend="torch")


def test_a_captured_call_records_into_the_flag_on_replay():
    c = call()
    with kc.mode("watch"):
        kc.packed_decode(**c, config=CFG, backend="torch")  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kc.packed_decode(**c, config=CFG, backend="torch")
        graph.replay()
        kc.raise_pending()  # valid
        c["a"][1, 0] = float("inf")  # the same buffers, a bad value, replayed
        graph.replay()
        with pytest.raises(kc.ValueRangeError, match=r"a\[1, 0\] = inf"):
            kc.raise_pending()


def test_the_fused_kernel_checks_every_rule_of_the_op_in_one_launch():
    from kda_contracts._engine.rules import fused

    c = call()
    with kc.mode("watch"):
        kc.packed_decode(**c, config=CFG, backend="torch")
        torch.cuda.synchronize()
        assert fused.usable() and fused._launch_cache, "the kernel ran, and its launches go the fast way"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            kc.packed_decode(**c, config=CFG, backend="torch")
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("watch_check_kernel" in n for n in names) == 1, names


def test_two_streams_each_report_their_own_call():
    bad = call()
    bad["ssm_state_indices"][0] = 50
    good = call()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with kc.mode("watch"):
        kc.packed_decode(**good, config=CFG, backend="torch")
        torch.cuda.synchronize()
        for _ in range(20):
            with torch.cuda.stream(s1):
                kc.packed_decode(**good, config=CFG, backend="torch")
            with torch.cuda.stream(s2):
                kc.packed_decode(**good, config=CFG, backend="torch")
        kc.raise_pending()  # nothing: the streams' scratch rows never mixed
        with torch.cuda.stream(s2):
            kc.packed_decode(**bad, config=CFG, backend="torch")
        with pytest.raises(kc.ValueRangeError, match=r"ssm_state_indices\[0\] = 50"):
            kc.raise_pending()


def test_the_triton_kernel_checks_the_rules_itself_with_no_sync_and_no_check_kernel():
    """The Triton backend's kernel makes the op's checks itself: one kernel per call, no check
    kernel, no sync, and a bad slot reported (here at raise_pending)."""
    good, bad = call(), call()
    bad["ssm_state_indices"][2] = 77
    with kc.mode("watch"):
        kc.packed_decode(**good, config=CFG, backend="triton")  # warm-up: compiles, makes the buffers
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.cuda.set_sync_debug_mode("error")
            try:
                kc.packed_decode(**good, config=CFG, backend="triton")
                kc.packed_decode(**bad, config=CFG, backend="triton")
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        with pytest.raises(kc.ValueRangeError, match=r"ssm_state_indices\[2\] = 77"):
            kc.raise_pending()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not any("watch_check_kernel" in n for n in names), names
    assert sum("packed_decode_kernel" in n for n in names) == 2, names


def test_a_captured_triton_call_checks_on_each_replay():
    c = call()
    with kc.mode("watch"):
        kc.packed_decode(**c, config=CFG, backend="triton")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kc.packed_decode(**c, config=CFG, backend="triton")
        for _ in range(3):
            graph.replay()
        kc.raise_pending()  # valid
        c["initial_state"][int(c["ssm_state_indices"][1])].view(-1)[100] = float("nan")
        graph.replay()
        with pytest.raises(kc.ValueRangeError, match=r"NaN or Inf in a used row: 1 row\(s\)"):
            kc.raise_pending()
        graph.replay()  # (the state row is NaN still, and now so is the row the replay wrote)
        with pytest.raises(kc.ValueRangeError, match="used row"):
            kc.raise_pending()
