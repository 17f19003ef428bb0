"""Packed (varlen) prefill, KDA and GDN: the chunked reference equals the token loop (the decode
reference, one token at a time), prefill composes with itself and with decode, and nothing outside
the used slots changes. The fla backend runs on CUDA, and on the CPU under the Triton interpreter at
tiny sizes (fp32 and fp16: the interpreter's ``tl.dot`` on bf16 operands returns garbage)."""

from __future__ import annotations

import os

import pytest
import torch
from kda_kernels.chunk_delta import chunk_gated_delta
from kda_kernels.prefill_reference import (
    gdn_packed_prefill,
    gdn_packed_prefill_loop,
    packed_prefill,
    packed_prefill_loop,
)

import kda_contracts as kc

H, HV, K, V, N = 2, 4, 16, 8, 10
LENGTHS = (1, 37, 64, 150, 0, 5)  # one token, < chunk, = chunk, > two chunks, empty, a padding sequence's
SLOTS = (3, 0, 7, 5, 9, -1)
HAS_INIT = (True, False, True, True, False, True)


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _call(gdn, layout="VK", lengths=LENGTHS, slots=SLOTS, has_init=HAS_INIT, dtype=torch.float32, seed=0,
          dims=(H, HV, K, V)):
    H, HV, K, V = dims
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    shape = (N, HV, V, K) if layout == "VK" else (N, HV, K, V)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(
        mixed_qkv=rnd(T, 2 * H * K + HV * V).to(dtype), a=rnd(T, HV if gdn else HV * K).to(dtype),
        b=rnd(T, HV).to(dtype), A_log=0.5 * rnd(HV), dt_bias=rnd(HV if gdn else HV * K), scale=K ** -0.5,
        initial_state=0.1 * rnd(*shape), out=torch.full((T, HV, V), 7.0, dtype=dtype), cu_seqlens=_cu(lengths),
        ssm_state_indices=torch.tensor(slots, dtype=torch.int32), has_initial_state=torch.tensor(has_init),
        use_qk_l2norm_in_kernel=True, **({} if gdn else {"lower_bound": None}))


def _run(fn, call, layout, **kw):
    c = {**call, "out": call["out"].clone(), "initial_state": call["initial_state"].clone()}
    extra = {k: c.pop(k) for k in ("use_qk_l2norm_in_kernel", "lower_bound") if k in c}
    opts = {"use_qk_l2norm": extra["use_qk_l2norm_in_kernel"], "state_layout": layout}
    if "lower_bound" in extra:
        opts["lower_bound"] = extra["lower_bound"]
    fn(*c.values(), num_heads=H, **opts, **kw)
    return c["out"], c["initial_state"]


KERNELS = {False: (packed_prefill, packed_prefill_loop), True: (gdn_packed_prefill, gdn_packed_prefill_loop)}


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_the_chunked_reference_equals_the_token_loop(gdn, layout, chunk_size):
    call = _call(gdn, layout)
    chunked, loop = KERNELS[gdn]
    o1, s1 = _run(chunked, call, layout, chunk_size=chunk_size)
    o2, s2 = _run(loop, call, layout)
    torch.testing.assert_close(o1, o2, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=5e-6, rtol=1e-5)
    untouched = [s for s in range(N) if s not in [x for x in SLOTS if x >= 0]]
    assert torch.equal(s1[untouched], call["initial_state"][untouched])  # bit-identical
    pad = slice(sum(LENGTHS[:5]), sum(LENGTHS))  # the padding sequence's tokens
    assert o1[pad].eq(0).all() and o2[pad].eq(0).all()
    assert torch.equal(s1[9], torch.zeros_like(s1[9]))  # an empty sequence that starts from zero


def test_the_bounded_gate_and_bf16_activations():
    call = {**_call(False, dtype=torch.bfloat16), "lower_bound": -5.0}
    o1, s1 = _run(packed_prefill, call, "VK")
    o2, s2 = _run(packed_prefill_loop, call, "VK")
    torch.testing.assert_close(o1.float(), o2.float(), atol=2e-3, rtol=1e-2)  # both rounded once to bf16
    torch.testing.assert_close(s1, s2, atol=5e-6, rtol=1e-5)


def _naive(q, k, v, g, beta, h0, cu):
    o, hs = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=h0.dtype), []
    for i in range(len(cu) - 1):
        S = h0[i].clone()
        for t in range(cu[i], cu[i + 1]):
            S = S * (g[t].exp().unsqueeze(-2) if g.dim() == 3 else g[t].exp().view(-1, 1, 1))
            u = beta[t].unsqueeze(-1) * (v[t] - (S @ k[t].unsqueeze(-1)).squeeze(-1))
            S = S + u.unsqueeze(-1) * k[t].unsqueeze(-2)
            o[t] = (S @ q[t].unsqueeze(-1)).squeeze(-1)
        hs.append(S)
    return o, torch.stack(hs)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda-gate", "gdn-gate"])
def test_the_chunked_form_in_fp64_equals_the_recurrence_to_rounding(per_channel):
    torch.manual_seed(1)
    cu = [0, 1, 17, 33, 90, 90, 95]
    T, B, dt = cu[-1], len(cu) - 1, torch.float64
    q, v = torch.randn(T, HV, K, dtype=dt), torch.randn(T, HV, V, dtype=dt)
    k = torch.nn.functional.normalize(torch.randn(T, HV, K, dtype=dt), dim=-1)
    g = -3 * torch.rand(T, HV, K, dtype=dt) if per_channel else -3 * torch.rand(T, HV, dtype=dt)
    beta, h0 = torch.rand(T, HV, dtype=dt), torch.randn(B, HV, V, K, dtype=dt)
    o, ht = chunk_gated_delta(q, k, v, g, beta, h0, torch.tensor(cu), chunk_size=16)
    o2, ht2 = _naive(q, k, v, g, beta, h0, cu)
    torch.testing.assert_close(o, o2, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ht, ht2, atol=1e-12, rtol=1e-12)


def test_a_strong_decay_neither_overflows_nor_underflows_to_nan():
    T, dt = 128, torch.float32
    q, k, v = torch.randn(T, 1, 4, dtype=dt), torch.randn(T, 1, 4, dtype=dt), torch.randn(T, 1, 3, dtype=dt)
    g = torch.full((T, 1, 4), -60.0)  # exp(-60 * 64) underflows; exp(+60 * 64) would overflow
    o, ht = chunk_gated_delta(q, k, v, g, torch.rand(T, 1), torch.zeros(1, 1, 3, 4), torch.tensor([0, T]))
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()


OPS = {False: kc.packed_prefill, True: kc.gdn_packed_prefill}
DECODE = {False: kc.packed_decode, True: kc.gdn_packed_decode}


def _op(gdn, call, **kw):
    c = {**call, "out": call["out"].clone(), "initial_state": call["initial_state"].clone()}
    return OPS[gdn](**c, **kw)


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_the_op_runs_the_chunked_reference_and_the_loop_backend_agrees(gdn, layout):
    call = _call(gdn, layout)
    o1, s1 = _op(gdn, call, state_layout=layout)
    o2, s2 = _op(gdn, call, state_layout=layout, backend="loop")
    torch.testing.assert_close(o1, o2, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=5e-6, rtol=1e-5)
    with kc.mode("strict"):  # the value checks and the checks after the kernel pass on a valid call
        o3, s3 = _op(gdn, call, state_layout=layout)
    assert torch.equal(o3, o1) and torch.equal(s3, s1)


def _split(gdn, call, cut):
    """The call's sequences cut in two: the first `cut[i]` tokens of each, then the rest."""
    cu = call["cu_seqlens"].tolist()
    per_token = ("mixed_qkv", "a", "b", "out")
    parts = []
    for first in (True, False):
        rows = [r for i in range(len(cu) - 1)
                for r in (range(cu[i], cu[i] + cut[i]) if first else range(cu[i] + cut[i], cu[i + 1]))]
        lens = [cut[i] if first else cu[i + 1] - cu[i] - cut[i] for i in range(len(cu) - 1)]
        part = {**call, **{n: call[n][rows] for n in per_token}, "cu_seqlens": _cu(lens)}
        if not first:
            part["has_initial_state"] = torch.ones_like(call["has_initial_state"])
        parts.append((part, rows))
    return parts


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_two_prefills_with_has_initial_state_equal_one(gdn):
    call = _call(gdn)
    cut = (0, 20, 64, 70, 0, 2)
    whole_out, whole_state = _op(gdn, call)
    (first, rows1), (second, rows2) = _split(gdn, call, cut)
    o1, state = _op(gdn, first)
    o2, state = OPS[gdn](**{**second, "initial_state": state, "out": second["out"].clone()})
    torch.testing.assert_close(o1, whole_out[rows1], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(o2, whole_out[rows2], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state, whole_state, atol=5e-6, rtol=1e-5)


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_prefill_then_decode_equals_decoding_every_token(gdn):
    lengths, slots = (9, 4, 70), (6, 1, 3)
    call = _call(gdn, lengths=lengths, slots=slots, has_init=(True, False, True))
    cu = call["cu_seqlens"].tolist()
    decode_keys = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale")
    flags = {"use_qk_l2norm_in_kernel": True, **({} if gdn else {"lower_bound": None})}
    idx = torch.tensor(slots, dtype=torch.int32)

    def decode_steps(state, start):  # token i of every sequence that has one, from token start[s] on
        outs = {}
        for i in range(max(lengths)):
            live = [s for s in range(len(lengths)) if start[s] <= i < lengths[s]]
            rows = [cu[s] + i for s in live]
            args = {n: call[n][rows] if n in ("mixed_qkv", "a", "b") else call[n] for n in decode_keys}
            out, state = DECODE[gdn](**args, initial_state=state, out=torch.empty(len(live), 1, HV, V),
                                     ssm_state_indices=idx[live], **flags)
            outs.update(zip(rows, out[:, 0], strict=True))
        return outs, state

    fresh = call["initial_state"].clone()
    fresh[1] = 0  # sequence 1 starts from zero (has_initial_state False)
    by_token, decoded = decode_steps(fresh, (0, 0, 0))
    cut = (3, 4, 65)  # sequence 1 is all prefill, sequence 2 crosses a chunk boundary
    (first, rows1), _ = _split(gdn, call, cut)
    o1, state = _op(gdn, first)
    rest, state = decode_steps(state, cut)
    assert sorted([*rows1, *rest]) == list(range(sum(lengths)))
    for r, o in [*zip(rows1, o1, strict=True), *rest.items()]:
        torch.testing.assert_close(o, by_token[r], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state, decoded, atol=5e-6, rtol=1e-5)


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_mode_off_takes_the_dims_on_trust(gdn):
    call = _call(gdn)
    with kc.mode("off"):
        o, s = _op(gdn, call)
    o2, s2 = _op(gdn, call)
    assert torch.equal(o, o2) and torch.equal(s, s2)


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_fla_is_registered_for_cuda_and_says_why_not_here(gdn):
    op = OPS[gdn]
    assert [b.name for b in op.backends()] == ["fla", "torch", "loop"]
    if not torch.cuda.is_available():
        ok, why = op.available()["fla"]
        interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        assert ok == interpreted and (interpreted or "CUDA" in why)  # by name only on the CPU
        assert "fla: not chosen: runs on cuda, not cpu" in op.explain_backends(**_call(gdn))


INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and not torch.cuda.is_available()


def _strided(call):
    """``mixed_qkv``, ``a`` and ``b`` as row slices of wider buffers (a row stride past the width)."""
    def wide(x):
        return torch.cat([x, torch.full((x.shape[0], 3), float("nan"), dtype=x.dtype)], 1)[:, : x.shape[1]]

    return {**call, **{n: wide(call[n]) for n in ("mixed_qkv", "a", "b")}}


def _fla_equals_loop(gdn, layout, dtype, lower_bound=None, strided=False):
    pytest.importorskip("fla.ops.kda")
    # GVA (HV = 2H), one token, one sequence across fla's 64-token chunk, an empty one starting from
    # zero, a padding one; has_initial_state mixed
    lengths, slots, has_init = (1, 66, 0, 3), (3, 0, 7, -1), (True, False, False, True)
    call = _call(gdn, layout, lengths, slots, has_init, dtype=dtype, dims=(1, 2, 16, 16))
    if not gdn:
        call["lower_bound"] = lower_bound
    if strided:
        call = _strided(call)
    o1, s1 = _op(gdn, call, state_layout=layout, backend="fla")
    o2, s2 = _op(gdn, call, state_layout=layout, backend="loop")
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(o1.float(), o2.float(), **tol)
    torch.testing.assert_close(s1, s2, atol=1e-5 if dtype == torch.float32 else 2e-3, rtol=1e-5)
    untouched = [s for s in range(N) if s not in (3, 0, 7)]
    assert torch.equal(s1[untouched], call["initial_state"][untouched])  # bit-identical
    assert o1[-3:].eq(0).all() and torch.equal(s1[7], torch.zeros_like(s1[7]))


@pytest.mark.skipif(not INTERPRETED, reason="the CPU run of fla needs TRITON_INTERPRET=1 and no CUDA device")
@pytest.mark.parametrize(("gdn", "layout", "dtype", "lower_bound", "strided"), [
    (False, "VK", torch.float32, None, False), (False, "KV", torch.float16, None, False),
    (False, "VK", torch.float32, -5.0, True), (True, "VK", torch.float32, None, False),
    (True, "KV", torch.float32, None, True), (True, "VK", torch.float16, None, False)],
    ids=["kda-VK-fp32", "kda-KV-fp16", "kda-bounded-VK-fp32-strided", "gdn-VK-fp32", "gdn-KV-fp32-strided",
         "gdn-VK-fp16"])  # KDA's ~10 s a case
def test_the_fla_backend_equals_the_token_loop_on_the_cpu_under_the_interpreter(gdn, layout, dtype, lower_bound,
                                                                                 strided):
    # fla computes the gate (KDA: softplus, or bounded with lower_bound; GDN: per head) and KDA's beta
    # in its kernels; strided: q/k/v, the gate logits and beta are views of row-padded buffers
    _fla_equals_loop(gdn, layout, dtype, lower_bound, strided)


@pytest.mark.skipif(not INTERPRETED, reason="the CPU run of fla needs TRITON_INTERPRET=1 and no CUDA device")
def test_gdn_on_fla_with_the_torch_gate_where_flashqla_may_take_the_call(monkeypatch):
    import kda_kernels.fla_prefill as fla_prefill

    monkeypatch.setattr(fla_prefill, "gdn_gate_in_kernel", lambda device: False)
    _fla_equals_loop(True, "VK", torch.float32)


@pytest.mark.skipif(not INTERPRETED, reason="the CPU run of fla needs TRITON_INTERPRET=1 and no CUDA device")
def test_fla_slots_a_strided_bf16_pool_and_an_out_of_range_slot_on_the_cpu_under_the_interpreter():
    # the pool every other row of a larger one (row stride twice the row), bf16 (gathered to fp32,
    # rounded back once); slot 12 >= N is padding in check mode: zero outputs, no byte written
    pytest.importorskip("fla.ops.kda")
    lengths, slots, has_init = (5, 66, 3), (3, 12, 8), (True, False, True)
    call = _call(True, "VK", lengths, slots, has_init, dims=(1, 2, 16, 16))
    big = torch.zeros(2 * N, *call["initial_state"].shape[1:], dtype=torch.bfloat16)
    big[::2] = call["initial_state"].to(torch.bfloat16)
    call["initial_state"] = big[::2]
    with kc.mode("check"):
        o1, s1 = _op(True, call, backend="fla")
        o2, s2 = _op(True, call, backend="loop")
    torch.testing.assert_close(o1, o2, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(s1.float(), s2.float(), atol=2e-3, rtol=1e-2)  # each rounded once to bf16
    untouched = [s for s in range(N) if s not in (3, 8)]
    assert torch.equal(s1[untouched], call["initial_state"][untouched])
    assert o1[5:71].eq(0).all() and not o1[:5].eq(0).all()


@pytest.mark.skipif(not (INTERPRETED or torch.cuda.is_available()),
                    reason="the slot kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1")
def test_the_two_slot_launches_copy_qkv_gather_write_out_and_scatter_as_torch_does():
    # the launches around fla's call on their own: 70 sequences (more than one step of the token's
    # sequence search and of the chunk plan's), q/k/v from a row-padded buffer with H != HV and
    # K != V, a bf16 pool every other row of a larger one, padding (-1) and out-of-range (N) slots,
    # has_initial_state mixed
    from kda_kernels.interface import split_qkv
    from kda_kernels.prefill_slots import chunk_plan, finish, prepare

    g = torch.Generator().manual_seed(3)
    Hq, Hv, Kd, Vd, n, B = 2, 3, 16, 8, 90, 70
    lengths = torch.randint(0, 4, (B,), generator=g)
    lengths[5], lengths[66] = 130, 65  # sequences of three and two chunks, one past the plan's first 64
    T = int(lengths.sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    width = 2 * Hq * Kd + Hv * Vd
    x = torch.randn(T, width + 5, generator=g).to(torch.float16)[:, :width]
    slots = torch.randperm(n, generator=g)[:B].int()
    slots[::7], slots[3::11] = -1, n
    has = torch.rand(B, generator=g) < 0.5
    big = torch.randn(2 * n, Hv, Vd, Kd, generator=g).to(torch.bfloat16)
    pool = big[::2]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b = torch.randn(Hv, T + 3, generator=g).to(torch.bfloat16)[:, 2:-1].t()  # [T, Hv], strides (1, T + 3)
    got = prepare(x.to(dev), Hq, Hv, Kd, Vd, pool.to(dev), slots.to(dev), has.to(dev), cu.int().to(dev), plan=True,
                  beta_logits=b.to(dev))
    q, k, v, h0, cu64, plan, beta = (t.cpu() for t in got)
    # fla's use_beta_sigmoid_in_kernel bit for bit: sigmoid in fp32, Triton's (a few ulp from torch's on CUDA)
    from fla.ops.common.gate import fused_beta_sigmoid

    assert beta.dtype == torch.float32 and beta.shape == (1, T, Hv)
    assert torch.equal(beta[0], fused_beta_sigmoid(b.to(dev)).cpu())
    torch.testing.assert_close(beta[0], torch.sigmoid(b.float()), rtol=5e-7, atol=0)
    assert cu64.dtype == torch.long and torch.equal(cu64, cu)
    assert torch.equal(plan, chunk_plan(cu.to(dev), T).cpu()) and plan.shape == (-(-T // 64) + B - 1, 2)
    real = [[n, c] for n, n_tokens in enumerate(lengths.tolist()) for c in range(-(-n_tokens // 64))]
    assert plan[: len(real)].tolist() == real and (plan[len(real):, 0] == 0).all() and (plan[len(real):, 1] >= 3).all()
    for copy, want in zip((q, k, v), split_qkv(x, Hq, Hv, Kd, Vd), strict=True):
        assert copy.is_contiguous() and torch.equal(copy[0], want)
    # with the l2 norm: each q and k head x / sqrt(sum(x^2) + 1e-6) in fp32, rounded once (one step of the
    # half's rounding at most: the sum's order is the kernel's); v as is
    assert got.beta is not None and prepare(x[:0].to(dev), Hq, Hv, Kd, Vd, pool.to(dev), slots.to(dev), has.to(dev),
                                            cu.int().to(dev) * 0, l2norm=True).beta is None
    normed = prepare(x.to(dev), Hq, Hv, Kd, Vd, pool.to(dev), slots.to(dev), has.to(dev), cu.int().to(dev),
                     l2norm=True)
    for copy, want in zip(normed[:2], split_qkv(x, Hq, Hv, Kd, Vd)[:2], strict=True):
        w = want.float()
        w = (w / torch.sqrt(w.square().sum(-1, keepdim=True) + 1e-6)).half()
        torch.testing.assert_close(copy[0].cpu(), w, rtol=2 ** -10, atol=0)
        assert copy[0].float().square().sum(-1).sub(1).abs().max() < 1e-2
    assert torch.equal(normed.v.cpu(), v) and normed.chunk_indices is None
    with pytest.raises(ValueError, match="l2 norm of heads of 24 channels"):
        prepare(torch.zeros(T, 2 * Hq * 24 + Hv * Vd, device=dev), Hq, Hv, 24, Vd, pool.to(dev), slots.to(dev),
                has.to(dev), cu.int().to(dev), l2norm=True)
    # one token whose channels are every other element of a wider row: copied as split_qkv reads it
    one = torch.randn(1, 2 * width, generator=g).to(torch.float16)[:, ::2]
    got_one = prepare(one.to(dev), Hq, Hv, Kd, Vd, pool.to(dev), slots[:1].to(dev), has[:1].to(dev),
                      torch.tensor([0, 1], dtype=torch.int32, device=dev))
    for t, want in zip(got_one[:3], split_qkv(one, Hq, Hv, Kd, Vd), strict=True):
        assert torch.equal(t[0].cpu(), want)
    valid = (slots >= 0) & (slots < n)
    want_h0 = torch.where((valid & has).view(-1, 1, 1, 1), pool[slots.long().clamp(0, n - 1)].float(), 0.0)
    assert h0.dtype == torch.float32 and torch.equal(h0, want_h0)

    o = torch.randn(1, T, Hv, Vd, generator=g)
    ht = torch.randn(B, Hv, Vd, Kd, generator=g)
    out = torch.full((T, Hv, Vd), 7.0, dtype=torch.float16)
    before, gaps = pool.clone(), big[1::2].clone()
    if dev == "cuda":
        big = big.to(dev)
        pool, out = big[::2], out.to(dev)
        finish(out, o.to(dev), ht.to(dev), cu.to(dev), pool, slots.to(dev))
        big = big.cpu()
        pool, out = big[::2], out.cpu()
    else:
        finish(out, o, ht, cu, pool, slots)
    live = valid.repeat_interleave(lengths)
    assert torch.equal(out, torch.where(live.view(-1, 1, 1), o[0].half(), 0.0))
    written = slots[valid].long()
    kept = [i for i in range(n) if i not in written.tolist()]
    assert torch.equal(pool[kept], before[kept]) and torch.equal(big[1::2], gaps)  # bit-identical
    # (rounded once to bf16: the interpreter's conversion may round toward zero, at most one bf16 step off)
    torch.testing.assert_close(pool[written].float(), ht[valid], rtol=2 ** -7, atol=0)


@pytest.mark.skipif(not INTERPRETED, reason="the CPU run of fla needs TRITON_INTERPRET=1 and no CUDA device")
@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_fla_without_tokens_keeps_or_zeroes_the_slots(gdn):
    pytest.importorskip("fla.ops.kda")
    call = _call(gdn, "VK", (0, 0, 0), (3, 5, -1), (True, False, True), dims=(1, 2, 16, 16))
    with kc.mode("check"):
        o, s = _op(gdn, call, backend="fla")
    assert o.shape[0] == 0 and torch.equal(s[3], call["initial_state"][3]) and s[5].eq(0).all()
    assert torch.equal(s[[i for i in range(N) if i != 5]], call["initial_state"][[i for i in range(N) if i != 5]])


def test_gdn_hands_fla_the_raw_gate_unless_flashqla_may_take_the_call(monkeypatch):
    backends = pytest.importorskip("fla.ops.gated_delta_rule.backends.flash_qla")
    from kda_kernels.fla_prefill import _flash_qla_absent, gdn_gate_in_kernel

    cuda = torch.device("cuda")  # (only its type is read)
    _flash_qla_absent.cache_clear()  # (asked once per device and setting)
    monkeypatch.setattr(backends.FlashQLABackend, "is_available", classmethod(lambda cls: True))
    monkeypatch.delenv("FLA_FLASH_QLA", raising=False)
    monkeypatch.delenv("FLA_DISABLE_BACKEND_DISPATCH", raising=False)
    assert not gdn_gate_in_kernel(cuda) and gdn_gate_in_kernel(torch.device("cpu"))
    monkeypatch.setenv("FLA_FLASH_QLA", "0")
    assert gdn_gate_in_kernel(cuda)
    monkeypatch.delenv("FLA_FLASH_QLA")
    monkeypatch.setattr(backends.FlashQLABackend, "is_available", classmethod(lambda cls: False))
    assert not gdn_gate_in_kernel(cuda)  # (the answer kept for this device and setting)
    _flash_qla_absent.cache_clear()
    assert gdn_gate_in_kernel(cuda)
    _flash_qla_absent.cache_clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's chunk kernels need a CUDA device")
@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_the_fla_backend_matches_the_reference_on_cuda(gdn, layout):
    cpu = _call(gdn, layout, dtype=torch.bfloat16)
    call = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cpu.items()}
    o1, s1 = _op(gdn, call, state_layout=layout, backend="fla")
    o2, s2 = _op(gdn, call, state_layout=layout, backend="torch")
    torch.testing.assert_close(o1.float(), o2.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(s1, s2, atol=2e-2, rtol=2e-2)
    untouched = [s for s in range(N) if s not in [x for x in SLOTS if x >= 0]]
    assert torch.equal(s1[untouched], call["initial_state"][untouched])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled launcher needs a CUDA device")
def test_the_slot_kernels_fast_launch_writes_what_the_normal_launch_wrote():
    from kda_kernels import prefill_slots

    cpu = _call(False, "VK", dtype=torch.bfloat16)
    runs = []
    for _ in range(3):  # the first launch of each kernel through kernel[grid], the others through the launcher
        call = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cpu.items()}
        o, s = _op(False, call, state_layout="VK", backend="fla")
        runs.append((o.clone(), s.clone()))
    assert all(k.cache for k in (prefill_slots._PREPARE, prefill_slots._FINISH))
    for o, s in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(s, runs[0][1])


def test_the_device_chunk_plan_lists_every_chunk_in_order_then_rows_past_every_sequence():
    # every split of up to 4 sequences over lengths around fla's 64-token chunk, empty ones included:
    # the real chunks first, each (sequence, chunk) once and in order, then spare rows no kernel runs
    import itertools

    from kda_kernels.fla_prefill import chunk_plan
    from kda_kernels.prefill_slots import CHUNK

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    seen = 0
    for B in range(1, 5):
        for lengths in itertools.product((0, 1, 63, 64, 65, 129), repeat=B):
            T = sum(lengths)
            plan = chunk_plan(_cu(lengths).long().to(dev), T).tolist()
            real = [[n, c] for n, n_tokens in enumerate(lengths) for c in range(-(-n_tokens // CHUNK))]
            assert len(plan) == -(-T // CHUNK) + B - 1  # from the shapes alone
            assert plan[:len(real)] == real
            assert all(n == 0 and c * CHUNK >= max(lengths) for n, c in plan[len(real):])
            seen += 1
    assert seen == 6 + 36 + 216 + 1296


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's chunk kernels need a CUDA device")
@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_the_fla_backend_never_syncs_with_the_host(gdn):
    # fla's own chunk plan reads cu_seqlens on the host; the backend's plan is made on the device, so a
    # call in check mode (after a first one has compiled and autotuned) never waits for the device
    cpu = _call(gdn, "VK", dtype=torch.bfloat16)
    call = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cpu.items()}
    expected = _op(gdn, call, backend="fla")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with kc.mode("check"):
            got = _op(gdn, call, backend="fla")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_gdn_hands_fla_the_device_plan_only_where_its_triton_kernels_take_the_call(monkeypatch):
    # FlashQLA plans for itself; fla's intra-card context parallelism (FLA_INTRACARD_CP) splits long
    # sequences with a plan sized from the real chunks, past which a spare row would read: fla's own plan
    import kda_kernels.fla_prefill as fla_prefill

    cu, cpu = _cu((64, 64)).long(), torch.device("cpu")
    monkeypatch.delenv("FLA_INTRACARD_CP", raising=False)
    monkeypatch.delenv("FLA_DISABLE_BACKEND_DISPATCH", raising=False)
    assert fla_prefill.gdn_plan_taken(cpu)
    assert fla_prefill.gdn_plan(cu, 128, 2)["chunk_indices"].tolist() == [[0, 0], [1, 0], [0, 3]]
    monkeypatch.setenv("FLA_INTRACARD_CP", "1")
    assert not fla_prefill.gdn_plan_taken(cpu) and fla_prefill.gdn_plan(cu, 128, 2) == {}
    monkeypatch.setenv("FLA_DISABLE_BACKEND_DISPATCH", "1")  # (no backend of fla's runs: its Triton kernels do)
    assert fla_prefill.gdn_plan_taken(cpu)
    monkeypatch.delenv("FLA_DISABLE_BACKEND_DISPATCH")
    monkeypatch.setenv("FLA_INTRACARD_CP", "0")
    monkeypatch.setattr(fla_prefill, "gdn_gate_in_kernel", lambda device: False)  # FlashQLA may take it
    assert fla_prefill.gdn_plan(cu, 128, 2) == {}
    assert fla_prefill.kda_plan(cu, 128, 2) == {"use_graph": True, "max_num_seqs": 2}
