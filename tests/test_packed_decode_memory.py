"""Packed decode's strict checks against memory: aliasing decided by the bytes each argument's
elements cover (across storages: numpy, DLPack), the pool judged by the slots the call writes;
value checks that cost what the tensors occupy (stride-0 activations read once, a 24 MiB dump of
8 GiB logical activations validated in bounded memory); tensors without data skip the value
checks with a warning instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kda_contracts as kc
from kda_contracts._engine.rules.memory import ValueChecksSkipped
from kda_contracts.ops.packed_decode.dump import check_dump, load_dump, save_dump
from kda_contracts.testing import make_decode_call

CFG = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)  # W = 2*2*8 + 4*16 = 96
W = 96


def call(B=3, N=8, seed=0):
    return make_decode_call(CFG, B, N, seed=seed)


def slots(c):
    used = sorted(int(i) for i in c["ssm_state_indices"] if i >= 0)
    unused = [s for s in range(c["initial_state"].shape[0]) if s not in used]
    return used, unused


def snapshot(c):
    return {k: v.clone() for k, v in c.items() if isinstance(v, torch.Tensor)}


def assert_unchanged(c, before):
    for k, v in before.items():
        assert torch.equal(c[k].view(torch.uint8) if c[k].dtype == torch.bfloat16 else c[k], v.view(torch.uint8)
                           if v.dtype == torch.bfloat16 else v), k


def rejected_by_strict(c, match):
    before = snapshot(c)
    with pytest.raises(kc.ValueRangeError, match=match):
        kc.validate_packed_decode(**c, strict=True)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=match):
        kc.packed_decode(**c, backend="torch")
    assert_unchanged(c, before)


def reference_run(c):
    """The torch backend on private copies of every tensor: what the call must compute."""
    private = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    kc.packed_decode(**private, backend="torch")
    return private


# -- aliasing across storages -----------------------------------------------------------------------
def test_a_numpy_alias_of_a_used_pool_slot_is_rejected():
    c = call()
    used, _ = slots(c)
    c["dt_bias"] = torch.from_numpy(c["initial_state"].numpy()[used[0]].reshape(-1)[:32])
    assert c["dt_bias"].untyped_storage().data_ptr() != c["initial_state"].untyped_storage().data_ptr()
    rejected_by_strict(c, r"initial_state: ValueRangeError\n +expected memory of its own where it is written "
                          r"\(no byte shared with dt_bias\)\n +got +the rows this call writes overlap dt_bias")


def test_a_dlpack_alias_of_a_used_pool_slot_as_out_is_rejected():
    c = call()
    used, _ = slots(c)
    slot = c["initial_state"][used[1]].reshape(-1)
    c["out"] = torch.from_dlpack(slot[:96].view(torch.bfloat16).view(3, 1, 4, 16))
    rejected_by_strict(c, r"out: ValueRangeError\n +expected memory of its own \(out is written: no byte shared "
                          r"with initial_state\)\n +got +overlaps initial_state\n +fix: allocate out separately "
                          r"from initial_state \(a view, a numpy array or a DLPack capsule of the same memory is "
                          r"the same memory\)")


def test_out_in_an_unused_pool_slot_is_rejected_since_writing_it_changes_the_pool():
    c = call()
    _, unused = slots(c)
    c["out"] = c["initial_state"][unused[0]].reshape(-1)[:96].view(torch.bfloat16).view(3, 1, 4, 16)
    rejected_by_strict(c, "got +overlaps initial_state")


def test_an_input_overlapping_a_written_slot_is_rejected():
    c = call()
    used, _ = slots(c)
    c["A_log"] = c["initial_state"][used[2], 1, 3, 4:8]  # same storage, inside a slot the call updates
    rejected_by_strict(c, "got +the rows this call writes overlap A_log")


def test_an_input_in_an_unused_slot_is_accepted_and_read_as_it_is():
    c = call()
    _, unused = slots(c)
    c["dt_bias"] = c["initial_state"][unused[0]].reshape(-1)[:32]
    c["A_log"] = torch.from_numpy(c["initial_state"].numpy()[unused[-1], 0, 0, :4])
    want = reference_run(c)
    with kc.mode("strict"):
        kc.packed_decode(**c, backend="torch")
    assert torch.equal(c["out"], want["out"]) and torch.equal(c["initial_state"], want["initial_state"])


def test_out_in_the_padding_between_the_rows_of_mixed_qkv_is_accepted():
    B = 2
    buf = torch.randn(B, W + B * 64 + 8).to(torch.bfloat16)
    c = call(B)
    c["mixed_qkv"] = buf[:, :W]                                     # rows W+136 apart
    c["out"] = buf[0, W:W + B * 64].view(B, 1, 4, 16)              # in the gap after row 0
    want = reference_run(c)
    kc.validate_packed_decode(**c, strict=True)
    with kc.mode("strict"):
        kc.packed_decode(**c, backend="torch")
    assert torch.equal(c["out"], want["out"]) and torch.equal(c["mixed_qkv"], want["mixed_qkv"])
    c["out"] = buf[0, W - 1:W - 1 + B * 64].view(B, 1, 4, 16)      # one element into row 0: shared
    rejected_by_strict(c, "got +overlaps mixed_qkv")


def test_padding_and_indices_past_the_pool_write_no_slot():
    c = call(B=4)
    c["ssm_state_indices"] = torch.tensor([0, -1, 2, -1], dtype=torch.int32)
    c["a"] = c["initial_state"][5].view(torch.bfloat16).reshape(-1)[:32].expand(4, 32)  # slot 5: no request
    kc.validate_packed_decode(**c, strict=True)
    c["ssm_state_indices"] = torch.tensor([0, 13, 2, -1], dtype=torch.int32)  # 13 >= N: reported once, as such
    with pytest.raises(kc.ValueRangeError) as err:
        kc.validate_packed_decode(**c, strict=True)
    assert [(v.argument, v.got) for v in err.value.violations] == [
        ("ssm_state_indices", "1 value(s) >= N=8 (max 13); the first: ssm_state_indices[1] = 13")]


# -- bounded work ------------------------------------------------------------------------------------
def test_expanded_activations_are_read_once_and_a_nan_in_them_is_still_found():
    c = call(B=3)
    row = torch.randn(1, W).to(torch.bfloat16)
    c["mixed_qkv"] = row.expand(3, W)
    kc.validate_packed_decode(**c, strict=True)
    row[0, 7] = float("nan")
    with pytest.raises(kc.ValueRangeError, match=r"mixed_qkv: ValueRangeError\n +expected finite values"):
        kc.validate_packed_decode(**c, strict=True)


BOUNDED = textwrap.dedent("""
    import resource, sys, time
    from kda_contracts.__main__ import main
    def vm():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    main(["validate", sys.argv[1], "--mode", "check"])  # warm: imports and first-call work
    limit = vm() + (768 << 20)  # a check that materialised the activations would need 8 GiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    t = time.perf_counter()
    code = main(["validate", sys.argv[1]])
    print("exit", code, "seconds", round(time.perf_counter() - t, 2))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_validate_of_a_dump_with_8_gib_of_expanded_activations_runs_in_bounded_memory(tmp_path):
    B, K, V, N = 2 ** 20, 2047, 2, 1024  # H = HV = 1: mixed_qkv is [2**20, 4096] bf16, 8 GiB logical
    idx = torch.full((B,), -1, dtype=torch.int32)
    idx[:N] = torch.randperm(N, generator=torch.Generator().manual_seed(0)).int()
    dump = dict(mixed_qkv=torch.randn(1, 2 * K + V).bfloat16().expand(B, 2 * K + V),
                a=torch.randn(1, K).bfloat16().expand(B, K), b=torch.randn(1, 1).bfloat16().expand(B, 1),
                A_log=torch.randn(1), dt_bias=torch.randn(K), scale=K ** -0.5,
                initial_state=torch.zeros(N, 1, V, K), out=torch.zeros(B, 1, 1, V, dtype=torch.bfloat16),
                ssm_state_indices=idx)
    path = tmp_path / "expanded.pt"
    save_dump(path, dump)
    assert path.stat().st_size < 32 << 20
    assert check_dump(load_dump(path)).ok
    run = subprocess.run([sys.executable, "-c", BOUNDED, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "VALID: the call meets the contract" in run.stdout
    exit_code, seconds = run.stdout.split("exit ")[1].split(" seconds ")
    assert exit_code == "0" and float(seconds) < 20


# -- tensors without data ----------------------------------------------------------------------------
SKIPPED = (r"^kda_contracts: packed_decode: strict mode's value checks skipped: no data in mixed_qkv, a, b, "
           r"A_log, dt_bias, initial_state, ssm_state_indices \(meta or fake tensors, e.g. under "
           r"FakeTensorMode\); only the metadata checks ran$")


def test_strict_checks_under_fake_tensor_mode_skip_with_a_warning():
    c = call()
    with FakeTensorMode() as fake_mode:
        fake = {k: (fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
        with pytest.warns(ValueChecksSkipped, match=SKIPPED):
            dims = kc.validate_packed_decode(**fake, strict=True)
        assert (dims.B, dims.N) == (3, 8)
        with kc.mode("strict"), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            kc.packed_decode(**fake, backend="torch")
    assert [type(w.message) for w in seen] == [ValueChecksSkipped, ValueChecksSkipped]
    assert str(seen[0].message).startswith("kda_contracts: packed_decode: strict mode's value checks skipped")
    assert str(seen[1].message).startswith("kda_contracts: packed_decode (after backend 'torch'): strict mode's "
                                           "value checks skipped: no data in out, initial_state, ssm_state_indices")


def test_strict_checks_of_meta_tensors_skip_with_a_warning_and_the_metadata_is_still_checked():
    c = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in call().items()}
    with pytest.warns(ValueChecksSkipped, match=SKIPPED):
        kc.validate_packed_decode(**c, strict=True)
    c["a"] = c["a"][:, :-1]
    with pytest.raises(kc.ShapeError), warnings.catch_warnings():
        warnings.simplefilter("error")
        kc.validate_packed_decode(**c, strict=True)


def test_validate_of_a_dump_of_meta_tensors_notes_that_the_value_checks_were_skipped(tmp_path, capsys):
    from kda_contracts.__main__ import main

    path = tmp_path / "meta.pt"
    save_dump(path, {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in call().items()})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["validate", str(path)]) == 0
    assert ("note:   strict mode's value checks skipped: no data in mixed_qkv, a, b, A_log, dt_bias, initial_state, "
            "out, ssm_state_indices (meta tensors); only the metadata was checked\n") in capsys.readouterr().out


# -- on a GPU ---------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_on_cuda_aliasing_is_decided_by_device_addresses():
    from kda_contracts._engine.rules.memory import overlap

    x = torch.zeros(64, 128, device="cuda")
    assert not overlap(x[:, ::2], x[:, 1::2]) and overlap(torch.from_dlpack(x[3]), x.t())
    assert not overlap(x, x.cpu())
    c = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in call().items()}
    used, unused = slots(c)
    c["dt_bias"] = c["initial_state"][unused[0]].reshape(-1)[:32]
    kc.validate_packed_decode(**c, strict=True)
    c["dt_bias"] = torch.from_dlpack(c["initial_state"][used[0]].reshape(-1)[:32])
    with pytest.raises(kc.ValueRangeError, match=r"got +the rows this call writes overlap dt_bias"):
        kc.validate_packed_decode(**c, strict=True)


@cuda
def test_on_cuda_expanded_activations_allocate_nothing_of_their_logical_size():
    c = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in call(B=4096, N=4096).items()}
    c["mixed_qkv"] = torch.randn(1, W, device="cuda").bfloat16().expand(4096, W)
    c["a"] = torch.randn(1, 32, device="cuda").bfloat16().expand(4096, 32)
    kc.validate_packed_decode(**c, strict=True)  # warm
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kc.validate_packed_decode(**c, strict=True)
    assert torch.cuda.max_memory_allocated() - base < 1 << 20  # the logical activations: 0.9 MiB bf16 + bools
    big = torch.zeros(1, 4096, device="cuda", dtype=torch.bfloat16).expand(2 ** 20, 4096)
    from kda_contracts._engine.rules.memory import all_finite

    torch.cuda.reset_peak_memory_stats()
    assert all_finite(big) and torch.cuda.max_memory_allocated() - base < 1 << 20


@cuda
def test_strict_mode_under_cuda_graph_capture_checks_out_aliasing_without_a_sync():
    from kda_kernels.triton_decode import is_available

    if not is_available()[0]:
        pytest.skip(is_available()[1])
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the Triton interpreter copies to the host: it cannot be captured (run with TRITON_INTERPRET=0)")
    c = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in call().items()}
    want = reference_run(c)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), kc.mode("strict"):
        kc.packed_decode(**reference_run(c), backend="triton")  # warm: compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with kc.mode("strict"), torch.cuda.graph(graph):
        kc.packed_decode(**c, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(c["out"].float(), want["out"].float(), atol=2e-2)
