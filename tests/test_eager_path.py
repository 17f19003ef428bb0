"""The eager path of packed decode (issue 15, item 4): strict mode reads the device once before the
kernel and once after, whatever the batch; the aliasing check decides from metadata when the
arguments lie apart and falls back to the exact test otherwise; the op hands the dims its
contract bound to our kernels; the Triton launch is planned once per call shape."""

import os
import random

import pytest
import torch
from kda_kernels.interface import DecodeArgs, DecodeBackend
from torch.utils._python_dispatch import TorchDispatchMode

import kda_contracts as kc
from kda_contracts._engine.rules.aliasing import _apart, alias_violations
from kda_contracts.ops._packed.checks import slots_finite
from kda_contracts.testing import make_decode_call, make_gdn_decode_call

CFG = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, use_qk_l2norm=True)
GCFG = kc.GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, use_qk_l2norm=True)
# aten ops that read a device value back to the host (each a sync on CUDA)
SYNCING = {"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select",
           "equal", "is_nonzero"}


class Syncs(TorchDispatchMode):
    """Records the aten ops that would sync on CUDA, and counts ``Tensor.tolist`` (which reads back
    without an aten op on the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.tolists = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name in SYNCING and not PAUSED[0]:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "Syncs":
        original = torch.Tensor.tolist

        def tolist(t: torch.Tensor):  # type: ignore[no-untyped-def]
            self.tolists += 0 if PAUSED[0] else 1
            return original(t)

        self._original = original
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.tolist = self._original  # type: ignore[method-assign]
        super().__exit__(*exc)


def decode_call(op: str, batch: int, pool: int, layout: str = "VK", seed: int = 0) -> dict:
    """A valid call by name (sglang order), a shuffled slot per row, the second row padding."""
    cfg = (CFG if op == "kda" else GCFG).model_copy(update={"state_layout": layout})
    call = (make_decode_call if op == "kda" else make_gdn_decode_call)(cfg, batch, pool, seed=seed)
    idx = list(range(pool))
    random.Random(seed).shuffle(idx)
    idx = idx[:batch]
    if batch > 2:
        idx[1] = -1  # padding
    call["ssm_state_indices"] = torch.tensor(idx, dtype=torch.int32)
    return call


def run(op: str, call: dict, layout: str) -> None:
    fn = kc.packed_decode if op == "kda" else kc.gdn_packed_decode
    fn(**call, state_layout=layout, backend="torch")


PAUSED = [0]  # > 0: Syncs records nothing (host-side work)


@pytest.fixture
def host_aliasing(monkeypatch: pytest.MonkeyPatch) -> list:
    """Strict mode's aliasing check, watched: the rows it is given must be a host copy, so it reads
    nothing from the device; its host-side work is left out of the count of syncs."""
    seen: list = []
    for op in (kc.packed_decode, kc.gdn_packed_decode):
        original = type(op).alias_violations

        def watched(self, ctx, parts=None, _original=original):  # type: ignore[no-untyped-def]
            assert parts is not None and all(r is None or r.device.type == "cpu" for r in parts.values())
            seen.append(parts)
            PAUSED[0] += 1
            try:
                return _original(self, ctx, parts)
            finally:
                PAUSED[0] -= 1

        monkeypatch.setattr(type(op), "alias_violations", watched)
    return seen


# -- strict mode: one read before the kernel, one after --------------------------------------------
@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
@pytest.mark.parametrize("batch,pool", [(1, 8), (5, 8), (8, 8), (12, 6)])
def test_strict_mode_reads_the_device_twice_per_call(op: str, layout: str, batch: int, pool: int,
                                                    host_aliasing: list) -> None:
    call = decode_call(op, batch, pool, layout)
    if batch > pool:  # more requests than slots: most are padding
        call["ssm_state_indices"] = torch.tensor([-1] * (batch - pool) + list(range(pool)), dtype=torch.int32)
    with kc.mode("strict"), Syncs() as seen:
        for _ in range(3):
            run(op, call, layout)
    assert seen.ops == [] and seen.tolists == 2 * 3
    assert len(host_aliasing) == 3


def test_a_rejected_index_reads_the_device_once_and_reports_as_before(host_aliasing: list) -> None:
    call = decode_call("kda", 4, 8)
    call["ssm_state_indices"] = torch.tensor([3, 9, 3, -1], dtype=torch.int32)
    before = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}
    with kc.mode("strict"), Syncs() as seen, pytest.raises(kc.ValueRangeError) as err:
        run("kda", call, "VK")
    assert seen.ops == [] and seen.tolists == 1
    text = str(err.value)
    assert "1 value(s) >= N=8 (max 9)" in text and "1 duplicate value(s)" in text
    for k, v in before.items():
        assert torch.equal(call[k], v), k


@pytest.mark.parametrize("batch,pool", [(3, 8), (8, 4), (6, 6)])
def test_slots_finite_reads_only_the_slots_valid_indices_name(batch: int, pool: int) -> None:
    state = torch.zeros(pool, 2, 3)
    idx = torch.full((batch,), -1, dtype=torch.int64)
    used = list(range(0, pool, 2))[:batch]
    idx[: len(used)] = torch.tensor(used)
    if batch > len(used):
        idx[len(used)] = pool + 3  # out of range: ignored here (the range check reports it)
    assert bool(slots_finite(state, idx, pool))
    unused = next(s for s in range(pool) if s not in used)
    state[unused, 1, 2] = float("nan")
    assert bool(slots_finite(state, idx, pool)), "a NaN in a slot no index names is not this call's"
    state[used[-1], 0, 0] = float("inf")
    assert not bool(slots_finite(state, idx, pool))
    assert bool(slots_finite(state, idx[:0], pool)) and bool(slots_finite(state[:0], idx, 0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="sync detection needs a CUDA device")
def test_on_cuda_strict_packed_decode_syncs_twice() -> None:
    import warnings

    call = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in decode_call("kda", 5, 16).items()}
    run("kda", call, "VK")  # warm up (first-call caches may sync)
    torch.cuda.synchronize()
    with kc.mode("strict"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run("kda", call, "VK")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "called a synchronizing CUDA operation" in str(w.message)]
    assert len(syncs) == 2, [str(w.message)[:120] for w in syncs]


# -- the aliasing check: apart by metadata, else exact ---------------------------------------------
def _random_view(buf: torch.Tensor, rng: random.Random) -> torch.Tensor:
    n = buf.numel()
    dims = rng.randint(1, 3)
    shape = [rng.randint(1, 4) for _ in range(dims)]
    kind = rng.random()
    if kind < 0.15:  # overlapping or broadcast layouts
        strides = [rng.choice([0, 1, 2]) for _ in range(dims)]
    else:
        strides, step = [], rng.choice([1, 1, 2])
        for s in reversed(shape):
            strides.insert(0, step)
            step *= s + rng.choice([0, 0, 1])
        if rng.random() < 0.2:
            strides.reverse()
    extent = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides, strict=True))
    offset = rng.randint(0, max(0, n - extent))
    return buf.as_strided(shape, strides, offset) if extent <= n else buf[:1]


def test_apart_never_clears_a_call_the_exact_check_rejects() -> None:
    rng = random.Random(15)
    cleared = decided = 0
    for _ in range(600):
        buf = torch.zeros(64)
        other = torch.zeros(64)
        tensors = {f"t{i}": _random_view(rng.choice([buf, buf, other]), rng) for i in range(rng.randint(2, 4))}
        written: dict[str, torch.Tensor | None] = {}
        for name, t in tensors.items():
            if rng.random() < 0.5:
                rows = None
                if t.dim() and rng.random() < 0.5:
                    rows = torch.tensor(rng.sample(range(-1, t.shape[0] + 1), k=min(2, t.shape[0] + 2)))
                written[name] = rows
        if not written:
            continue
        exact = alias_violations(tensors, written)
        if _apart(tensors, written):
            cleared += 1
            assert exact == [], (tensors, written)
        decided += 1
    assert decided > 400 and cleared > 50  # both paths taken, many times


def test_a_pool_view_beside_an_input_goes_to_the_exact_check() -> None:
    buf = torch.zeros(10, 4)
    pool, x = buf[:8], buf[8:]
    rows = torch.tensor([1, 6])
    assert _apart({"pool": pool, "x": torch.zeros(3)}, {"pool": rows})
    assert _apart({"pool": pool, "x": x}, {"pool": rows})  # x lies past the pool's written rows
    assert not _apart({"pool": pool, "x": buf[3]}, {"pool": rows})  # inside the rows' span: exact
    assert alias_violations({"pool": pool, "x": buf[3]}, {"pool": rows}) == []  # row 3 is not written
    assert alias_violations({"pool": pool, "x": buf[6]}, {"pool": rows}) != []


# -- the op hands the bound dims to our kernels -----------------------------------------------------
@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_the_op_hands_its_bound_dims_to_a_decode_backend(layout: str) -> None:
    seen: list[DecodeArgs] = []

    @DecodeBackend
    def record(call: DecodeArgs) -> None:
        seen.append(call)

    record_call = DecodeBackend.__call__

    def no_interface_call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the interface call was used, not launch()")

    DecodeBackend.__call__ = no_interface_call  # type: ignore[method-assign]
    kc.packed_decode.register_backend(kc.adapters.Adapter(name="dims-probe", kernel=record, devices=("cpu",),
                                                          priority=1000))
    try:
        call = decode_call("kda", 5, 8, layout)
        dims = kc.validate_packed_decode(**call, state_layout=layout)
        kc.packed_decode(**call, state_layout=layout)
    finally:
        DecodeBackend.__call__ = record_call  # type: ignore[method-assign]
        kc.packed_decode.unregister_backend("dims-probe")
    (got,) = seen
    assert tuple(got.dims) == tuple(dims[s] for s in ("B", "H", "HV", "K", "V", "N"))
    assert got.num_heads == dims["H"] and got.state_layout == layout and got.use_qk_l2norm is True


def test_launch_with_no_rows_runs_nothing() -> None:
    @DecodeBackend
    def never(call: DecodeArgs) -> None:
        raise AssertionError("B == 0 must not reach the backend")

    never.launch((0, 1, 1, 4, 3, 8), *([None] * 9), True, None, "VK")


# -- the Triton launch is planned once per call shape -----------------------------------------------
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="CPU tensors need the Triton interpreter")
def test_the_triton_launch_is_planned_once_per_call_shape() -> None:
    pytest.importorskip("triton")
    from kda_kernels import triton_decode as T

    call = decode_call("kda", 2, 4)
    args = list(call.values())[:9]  # bf16 activations, fp32 state
    T._plans.clear()
    for _ in range(3):
        T.packed_decode(*args, num_heads=2, use_qk_l2norm=True, lower_bound=None)
    assert len(T._plans) == 1
    T.packed_decode(*args, num_heads=2, use_qk_l2norm=False, lower_bound=None)
    T.packed_decode(*args, num_heads=2, use_qk_l2norm=True, lower_bound=None,
                    config=T.DecodeConfig(block_v=8, num_warps=1))
    assert len(T._plans) == 3
    ((grid, constexprs, options, _, kernel),) = [p for k, p in T._plans.items() if k[-2] is not None]
    assert grid == (2 * 4 * 2, 1, 1) and constexprs[9] == 8 and options == {"num_warps": 1} and kernel is None


# -- the probes: a NaN or an infinity anywhere is found, on the CPU and on CUDA ---------------------
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_strict_mode_finds_one_bad_value_anywhere(device: str, state_dtype: torch.dtype, bad: float) -> None:
    rng = random.Random(f"{device}{state_dtype}{bad}")
    for where in ("mixed_qkv", "a", "dt_bias", "initial_state"):
        call = make_decode_call(CFG, 5, 8, state_dtype=state_dtype, device=device, seed=rng.randrange(99))
        target = call[where]
        if where == "initial_state":  # a slot the call uses
            target = target[int(call["ssm_state_indices"][rng.randrange(5)])]
        flat = target.view(-1)
        flat[rng.randrange(flat.numel())] = bad
        with kc.mode("strict"), pytest.raises(kc.ValueRangeError) as err:
            kc.packed_decode(**call, backend="torch")
        assert f"{where}: " in str(err.value) or f"{where} " in str(err.value), str(err.value)
    call = make_decode_call(CFG, 5, 8, state_dtype=state_dtype, device=device)
    call["ssm_state_indices"][0] = -1
    unused = next(s for s in range(8) if s not in call["ssm_state_indices"].tolist())
    call["initial_state"][unused].fill_(bad)  # a slot the call does not use: not this call's business
    with kc.mode("strict"):
        kc.packed_decode(**call, backend="torch")


def test_a_large_batch_is_checked_on_host_tensors_with_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    from kda_contracts.ops._packed import checks

    monkeypatch.setattr(checks, "_HOST_LIST_MAX", 8)  # every read of this test comes back as tensors
    for small in (False, True):
        if small:
            monkeypatch.setattr(checks, "_HOST_LIST_MAX", 1 << 16)
        call = decode_call("kda", 6, 8)
        with kc.mode("strict"):
            kc.packed_decode(**call, backend="torch")  # valid: padding row 1
        call["ssm_state_indices"] = torch.tensor([3, 9, 3, -1, 5, 7], dtype=torch.int32)
        with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=r"1 value\(s\) >= N=8 \(max 9\)(.|\n)*"
                                                                          r"1 duplicate value\(s\)"):
            kc.packed_decode(**call, backend="torch")
        call["ssm_state_indices"] = torch.tensor([3, -1, 2, 0, 5, 7], dtype=torch.int32)
        call["initial_state"][5, 0, 0, 0] = float("nan")
        with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match="NaN or Inf in a used row"):
            kc.packed_decode(**call, backend="torch")
        call["initial_state"][5, 0, 0, 0] = 0.0
        with kc.mode("strict"):
            kc.packed_decode(**call, backend="torch")
        assert call["out"][1].eq(0).all()


@pytest.mark.parametrize("host_list_max", [8, 1 << 16])  # host tensors, host lists
@pytest.mark.parametrize("damage", ["padding", "nan_out", "inf_slot"])
def test_the_checks_after_the_kernel_see_each_broken_promise(monkeypatch: pytest.MonkeyPatch, host_list_max: int,
                                                             damage: str) -> None:
    from kda_contracts.ops._packed import checks

    monkeypatch.setattr(checks, "_HOST_LIST_MAX", host_list_max)

    def kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,  # type: ignore[no-untyped-def]
               use_qk_l2norm_in_kernel=False, lower_bound=None, *, config=None, state_layout=None):
        out.zero_()
        if damage == "padding":
            out[1, 0, 0, 0] = 1e-30  # the padding row, barely non-zero
        elif damage == "nan_out":
            out[4, 0, 3, 2] = float("nan")
        else:
            initial_state[int(ssm_state_indices[2])][1, 2, 3] = float("inf")

    kc.packed_decode.register_backend(kc.Backend(name="broken", kernel=kernel, devices=("cpu",), priority=-1))
    try:
        call = decode_call("kda", 6, 8)
        call["out"] = call["out"].float()
        call["mixed_qkv"], call["a"], call["b"] = (call[k].float() for k in ("mixed_qkv", "a", "b"))
        before = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}
        want = {"padding": "zero rows for padding", "nan_out": "finite values after the kernel",
                "inf_slot": "finite updated slots"}[damage]
        with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=want):
            kc.packed_decode(**call, backend="broken")
        for k, v in before.items():
            assert torch.equal(call[k], v) or (k == "out" and torch.equal(call[k].nan_to_num(), v)), k
    finally:
        kc.packed_decode.unregister_backend("broken")


def test_gdn_strict_warnings_name_gdn() -> None:
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    from kda_contracts._engine.rules.memory import ValueChecksSkipped

    call = decode_call("gdn", 3, 8)
    with FakeTensorMode() as fake_mode:
        fake = {k: (fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in call.items()}
        with kc.mode("strict"), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            kc.gdn_packed_decode(**fake, backend="torch")
    messages = [str(w.message) for w in seen if issubclass(w.category, ValueChecksSkipped)]
    assert [m.split(": strict")[0] for m in messages] == [
        "kda_contracts: gdn_packed_decode", "kda_contracts: gdn_packed_decode (after backend 'torch')"]


# -- found in review --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_off_mode_launches_one_request_per_index_not_per_activation_row(op: str) -> None:
    seen: list[tuple[int, ...]] = []

    @DecodeBackend
    def record(call: DecodeArgs) -> None:
        seen.append(tuple(call.dims))

    target = kc.packed_decode if op == "kda" else kc.gdn_packed_decode
    backend = kc.adapters.Adapter(name="b-probe", kernel=record, devices=("cpu",), priority=1000) if op == "kda" \
        else None
    call = decode_call(op, 4, 8)
    call["mixed_qkv"] = torch.cat([call["mixed_qkv"], call["mixed_qkv"].new_zeros(12, call["mixed_qkv"].shape[1])])
    if op == "kda":
        target.register_backend(backend)
        try:
            with kc.mode("off"):
                target(**call)
        finally:
            target.unregister_backend("b-probe")
        assert [d[0] for d in seen] == [4]
    from kda_contracts.ops._packed.calls import dims_on_trust

    args = [call[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
                              "ssm_state_indices")]
    assert dims_on_trust("VK", *args)[0] == 4


@pytest.mark.parametrize("batch,pool", [(32766, 32776), (32768, 32778), (40000, 25533)])
def test_strict_reads_either_side_of_the_list_limit_agree(batch: int, pool: int) -> None:
    """Before the kernel 5 + P + B values come back, after it P + B: one read may be a list and
    the other a tensor."""
    cfg = kc.KDAConfig(num_heads=1, num_v_heads=1, head_k_dim=1, head_v_dim=1)
    call = make_decode_call(cfg, batch, pool, state_dtype=torch.float32)
    g = torch.Generator().manual_seed(batch)
    call["ssm_state_indices"] = torch.randperm(pool, generator=g)[:batch].int() if batch <= pool else \
        torch.cat([torch.randperm(pool, generator=g), torch.full((batch - pool,), -1)]).int()
    with kc.mode("strict"):
        kc.packed_decode(**call, backend="torch")


def test_a_huge_int64_index_is_out_of_range_in_a_large_read() -> None:
    cfg = kc.KDAConfig(num_heads=1, num_v_heads=1, head_k_dim=1, head_v_dim=1)
    call = make_decode_call(cfg, 70000, 70010, index_dtype=torch.int64)
    call["ssm_state_indices"][0] = 2 ** 63 - 1
    want = r"1 value\(s\) >= N=70010 \(max 9223372036854775807\)"  # exact: the indices come back as int64
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=want):
        kc.packed_decode(**call, backend="torch")


def test_a_functional_wrapper_of_a_fake_tensor_holds_no_data() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kda_contracts._engine.rules.memory import has_addresses

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(3))
        assert not has_addresses(torch._to_functional_tensor(fake))
    assert has_addresses(torch.zeros(3))
