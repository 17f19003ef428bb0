"""GDN packed decode's kernels (Triton, Helion, fla) on the CPU under the interpreters, called
through the op (``backend=name``) and directly: every one against the torch reference on both
layouts, fp32/bf16/fp16 state, int32/int64 indices, GVA, padding and out-of-range indices, with
unused slots and the bytes around the pool bit-identical. Grids are tiny (the Triton interpreter
runs one program at a time).

Beta rounding (``sigmoid(b)`` to ``b``'s dtype) is not pinned here: the Triton interpreter truncates
fp32 -> bf16 where the GPU rounds to nearest, so with bf16 activations the interpreted kernels differ
from the reference by one bf16 step of beta. The H200 runs of ``benchmarks/decode.py --op gdn``
check it (fp32 state, bf16 activations, 1e-4/1e-5 tolerances)."""

import functools
import os

import pytest
import torch

import kda_contracts as kc

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")

TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}
BACKENDS = ["triton", "helion", "fla"]


def _case(B=4, H=1, HV=2, K=8, V=8, N=6, layout="VK", state_dtype=torch.float32, idx_dtype=torch.int32,
          indices=(4, -1, 9, 1), seed=0):
    """A call whose pool is a view into a larger buffer: the bytes around it are a canary."""
    g = torch.Generator().manual_seed(seed)
    act = torch.float32 if state_dtype == torch.float32 else torch.bfloat16
    r = lambda *s, dt=act: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    shape = (N, HV, V, K) if layout == "VK" else (N, HV, K, V)
    buf = (r(N + 2, *shape[1:], dt=torch.float32) * 0.1).to(state_dtype)
    idx = torch.tensor(indices, dtype=idx_dtype)
    B = len(indices)
    return buf, dict(mixed_qkv=r(B, 2 * H * K + HV * V), a=r(B, HV), b=r(B, HV), A_log=r(HV, dt=torch.float32),
                     dt_bias=r(HV, dt=torch.float32), scale=K ** -0.5, initial_state=buf[1:-1],
                     out=torch.full((B, 1, HV, V), 7.0, dtype=act), ssm_state_indices=idx)


def _run(backend, buf, call, layout):
    buf = buf.clone()
    c = dict(call, initial_state=buf[1:-1], out=call["out"].clone())
    with kc.mode("check"):  # strict mode would refuse the out-of-range indices these tests pass on purpose
        kc.gdn_packed_decode(*c.values(), True, state_layout=layout, backend=backend)
    return buf, c["out"]


def _assert_matches(backend, buf, call, layout, state_dtype):
    ref_buf, ref_out = _run("torch", buf, call, layout)
    got_buf, got_out = _run(backend, buf, call, layout)
    atol, rtol = TOL[state_dtype]
    torch.testing.assert_close(got_out.float(), ref_out.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(got_buf.float(), ref_buf.float(), atol=atol, rtol=rtol)
    N = call["initial_state"].shape[0]
    used = {int(i) for i in call["ssm_state_indices"] if 0 <= int(i) < N}
    for s in range(N + 2):  # unused slots and the canary slots around the pool: bit-identical
        if s - 1 not in used:
            assert torch.equal(got_buf[s], buf[s]), f"{backend}: slot {s - 1} changed"
    bad = [i for i, x in enumerate(call["ssm_state_indices"].tolist()) if not 0 <= x < N]
    assert got_out[bad].eq(0).all(), f"{backend}: padding/out-of-range rows are not zero"


@pytest.fixture(autouse=True)
def _needs_triton():
    pytest.importorskip("triton")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["VK", "KV"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_backend_matches_reference(backend, layout, state_dtype):
    if backend == "helion":
        pytest.importorskip("helion")
    idx_dtype = torch.int64 if state_dtype == torch.bfloat16 else torch.int32
    buf, call = _case(layout=layout, state_dtype=state_dtype, idx_dtype=idx_dtype)
    _assert_matches(backend, buf, call, layout, state_dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gva_uneven_dims_and_all_padding(backend):
    """H=2, HV=4 (GVA), K=12 and V=10 (not powers of two), then a batch of only padding."""
    if backend == "helion":
        pytest.importorskip("helion")
    buf, call = _case(H=2, HV=4, K=12, V=10, N=5, indices=(2, 0, -3, 7, 4), idx_dtype=torch.int64)
    _assert_matches(backend, buf, call, "VK", torch.float32)
    buf, call = _case(indices=(-1, 6, -2))
    _assert_matches(backend, buf, call, "KV", torch.float32)


def test_triton_launch_shapes():
    """The GDN gate through every Triton code path: tiles, mask guard, grids, the KV two-pass chunks."""
    from kda_kernels.gdn_reference import gdn_packed_decode as reference
    from kda_kernels.triton_decode import DecodeConfig, gdn_packed_decode

    configs = [("VK", DecodeConfig(block_v=4, num_warps=1, tiles=2, num_stages=2)),
               ("VK", DecodeConfig(block_v=4, num_warps=1, guard="mask", grid="v_fastest")),
               ("KV", DecodeConfig(block_v=8, num_warps=1, kv_chunk=4)),
               ("KV", DecodeConfig(block_v=4, num_warps=1, kv_chunk=4, guard="mask"))]
    for layout, cfg in configs:
        buf, call = _case(H=1, HV=2, K=8, V=8, layout=layout, indices=(3, -1, 8, 0))
        args = list(call.values())
        ref, got = buf.clone(), buf.clone()
        out_ref, out_got = call["out"].clone(), call["out"].clone()
        reference(*args[:6], ref[1:-1], out_ref, args[8], num_heads=1, use_qk_l2norm=True, state_layout=layout)
        gdn_packed_decode(*args[:6], got[1:-1], out_got, args[8], num_heads=1, use_qk_l2norm=True,
                          lower_bound=None, state_layout=layout, config=cfg)
        torch.testing.assert_close(out_got, out_ref, atol=1e-4, rtol=1e-5, msg=f"{layout} {cfg}")
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5, msg=f"{layout} {cfg}")


def test_helion_compiles_with_explicit_config():
    """Helion generates Triton for an explicit config and the interpreter runs it (bf16 state, GVA)."""
    helion = pytest.importorskip("helion")
    from kda_kernels import helion_decode

    kernel = functools.partial(helion_decode.launch, gdn=True,
                               kernel=helion_decode.decode_kernel(helion.Config(block_sizes=[4], num_warps=1)))
    buf, call = _case(H=1, HV=2, K=8, V=8, state_dtype=torch.bfloat16, indices=(5, -1, 2))
    args = list(call.values())
    got = buf.clone()
    out = call["out"].clone()
    kernel(*args[:6], got[1:-1], out, args[8], num_heads=1, use_qk_l2norm=True, lower_bound=None)
    ref_buf, ref_out = _run("torch", buf, call, "VK")
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.float(), ref_buf.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("module", ["triton_decode", "helion_decode", "fla_decode"])
def test_kernels_refuse_a_bounded_gate(module):
    """GDN has no lower_bound: a kernel called with one says so instead of computing KDA's gate."""
    import importlib

    mod = importlib.import_module(f"kda_kernels.{module}")
    _, call = _case()
    args = list(call.values())
    with pytest.raises(ValueError, match="GDN has no bounded gate"):
        mod.gdn_packed_decode(*args, num_heads=1, use_qk_l2norm=True, lower_bound=-5.0)


def test_backends_are_declared_and_lazy():
    """The shipped backends are registered by name and priority; none is chosen for a CPU call."""
    names = [b.name for b in kc.gdn_packed_decode.backends()]
    assert names == ["triton", "helion", "fla", "torch"]
    _, call = _case()
    text = kc.gdn_packed_decode.explain_backends(*call.values(), True)
    assert "torch: chosen" in text
    assert "triton: not chosen: runs on cuda, not cpu" in text


@pytest.mark.parametrize("backend", ["torch", *BACKENDS])
def test_empty_batch_is_a_no_op(backend):
    """B == 0: nothing is written, nothing raises (the reference used to fail on an empty argmax)."""
    if backend == "helion":
        pytest.importorskip("helion")
    buf, call = _case(indices=())
    got, out = _run(backend, buf, call, "VK")
    assert out.shape[0] == 0 and torch.equal(got, buf)


def test_kda_gets_the_narrow_index_hint_too():
    """The int16/float index hint lives in KDA's shared hints, so KDA calls get it as well (pinned)."""
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=2, head_k_dim=8)
    call = make_decode_call(cfg, 3, 8)
    call["ssm_state_indices"] = call["ssm_state_indices"].to(torch.int16)
    with pytest.raises(kc.DtypeError) as err:
        kc.validate_packed_decode(**call, config=cfg)
    assert ("fix: slot indices must be int32 or int64 (kernels turn them into slot offsets), not int16: build them "
            "with dtype=torch.int32, or cast once when you build the batch metadata: "
            "ssm_state_indices.to(torch.int32)") in str(err.value)
