"""The paged-attention worked example (examples/paged_attention.py, docs/guide-paged-attention.md):
its torch reference against a naive per-token loop, its Triton kernel against the reference under
the interpreter, the message of every typical mistake, rejected calls that change nothing, and
the op under torch.compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

import kda_contracts as kc
from examples.paged_attention import paged_attention

ROOT = Path(__file__).resolve().parents[1]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


needs_triton = pytest.mark.skipif(not triton_importable(), reason="triton is not installed")


def make_call(S=3, NH=4, NKV=2, D=64, BS=16, NB=None, MB=4, dtype=torch.float32, seed=0, lens=None):
    """A valid call: distinct random blocks per sequence (NB: two more than they use), random
    lengths (or ``lens``)."""
    g = torch.Generator().manual_seed(seed)
    NB = S * MB + 2 if NB is None else NB
    x = 16 // dtype.itemsize
    if lens is None:
        lens = torch.randint(0, MB * BS + 1, (S,), generator=g).tolist()
    tables = torch.randperm(NB, generator=g)[: S * MB].view(S, MB)
    return {
        "query": torch.randn(S, NH, D, generator=g).to(dtype),
        "key_cache": torch.randn(NB, NKV, D // x, BS, x, generator=g).to(dtype),
        "value_cache": torch.randn(NB, NKV, D, BS, generator=g).to(dtype),
        "block_tables": tables.to(torch.int32),
        "seq_lens": torch.tensor(lens, dtype=torch.int32),
        "scale": D ** -0.5,
        "out": torch.full((S, NH, D), -7.0, dtype=dtype),  # a sentinel: every element must be written
    }


def clone(call):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}


def naive(query, key_cache, value_cache, block_tables, seq_lens, scale):
    """Token by token, in float64: the definition, written independently of the op's body."""
    S, NH, D = query.shape
    NKV, BS = key_cache.shape[1], key_cache.shape[3]
    out = torch.zeros(S, NH, D, dtype=torch.float64)
    for s in range(S):
        L = int(seq_lens[s])
        if L == 0:
            continue
        for h in range(NH):
            kv = h // (NH // NKV)
            keys, values = [], []
            for t in range(L):
                block, offset = int(block_tables[s, t // BS]), t % BS
                keys.append(key_cache[block, kv, :, offset, :].reshape(D))
                values.append(value_cache[block, kv, :, offset])
            k, v = torch.stack(keys).double(), torch.stack(values).double()
            p = torch.softmax(k @ query[s, h].double() * scale, dim=0)
            out[s, h] = p @ v
    return out


# -- the reference against the definition ----------------------------------------------------------
CASES = [  # (NH, NKV, D, BS, dtype): MHA, GQA and MQA; head sizes that are and are not powers of two
    (4, 4, 64, 16, torch.float32), (4, 2, 80, 8, torch.float32), (6, 1, 32, 32, torch.float32),
    (8, 2, 128, 16, torch.float16), (4, 2, 96, 8, torch.bfloat16), (2, 2, 256, 8, torch.float32),
]


@pytest.mark.parametrize(("NH", "NKV", "D", "BS", "dtype"), CASES)
def test_the_reference_matches_a_naive_token_loop(NH, NKV, D, BS, dtype):
    for seed in range(3):
        call = make_call(S=4, NH=NH, NKV=NKV, D=D, BS=BS, dtype=dtype, seed=seed)
        want = naive(*(call[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "scale")))
        got = paged_attention(**call, backend="torch")
        assert got is call["out"]
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_lengths_on_block_edges_and_empty_sequences():
    call = make_call(S=5, BS=8, MB=4, NB=20, lens=[0, 1, 8, 9, 32])
    want = naive(*(call[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "scale")))
    got = paged_attention(**call, backend="torch")
    torch.testing.assert_close(got.double(), want, **TOL[torch.float32])
    assert torch.equal(got[0], torch.zeros_like(got[0]))  # nothing to attend to: zeros, not NaN


def test_tokens_past_the_length_and_unused_blocks_are_never_read():
    call = make_call(S=2, BS=8, MB=4, NB=8, lens=[9, 16])
    ref = paged_attention(**clone(call), backend="torch").clone()
    used = {int(b) for b in call["block_tables"][0, :2]} | {int(b) for b in call["block_tables"][1, :2]}
    for b in set(range(8)) - used:  # garbage in blocks no sequence uses
        call["key_cache"][b] = float("nan")
        call["value_cache"][b] = float("nan")
    call["key_cache"][call["block_tables"][0, 1], :, :, 1:] = float("nan")  # past token 9 of sequence 0
    call["block_tables"][:, 2:] = -1  # table entries past each length: don't care
    torch.testing.assert_close(paged_attention(**call, backend="torch"), ref)


# -- the Triton kernel against the reference (interpreter on the CPU) -----------------------------
@needs_triton
@pytest.mark.parametrize(("NH", "NKV", "D", "BS", "dtype"), CASES[:5])
def test_the_triton_kernel_matches_the_reference(NH, NKV, D, BS, dtype, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    call = make_call(S=3, NH=NH, NKV=NKV, D=D, BS=BS, MB=3, NB=10, dtype=dtype, seed=1)
    ref = paged_attention(**clone(call), backend="torch")
    got = paged_attention(**call, backend="triton")
    torch.testing.assert_close(got, ref, **TOL[dtype])


@needs_triton
def test_the_triton_kernel_reads_strided_queries_and_writes_strided_outputs(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    call = make_call(S=3, NH=4, NKV=2, D=64, BS=8, MB=3, NB=10, lens=[0, 8, 17])
    wide_q, wide_out = torch.randn(3, 7, 64), torch.zeros(3, 9, 64)
    wide_q[:, 2:6] = call["query"]
    ref = paged_attention(**clone(call), backend="torch")
    paged_attention(**dict(call, query=wide_q[:, 2:6], out=wide_out[:, 1:5]), backend="triton")
    torch.testing.assert_close(wide_out[:, 1:5], ref, **TOL[torch.float32])
    assert wide_out[:, 0].eq(0).all() and wide_out[:, 5:].eq(0).all()  # nothing written outside the view


@needs_triton
@pytest.mark.kda_contracts("check")  # strict mode would reject these calls before the kernel
def test_out_of_range_blocks_and_lengths_read_as_masked_in_both_backends(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    call = make_call(S=3, NH=4, NKV=2, D=64, BS=8, MB=3, NB=10, lens=[30, 20, 9])  # 30 > MB*BS = 24
    call["block_tables"][1, 1] = 10_000_000  # far outside the cache
    call["block_tables"][2, 0] = -5
    ref = paged_attention(**clone(call), backend="torch")
    got = paged_attention(**call, backend="triton")
    torch.testing.assert_close(got, ref, **TOL[torch.float32])
    clean = make_call(S=3, NH=4, NKV=2, D=64, BS=8, MB=3, NB=10, lens=[24, 8, 9])  # what is left unmasked
    torch.testing.assert_close(ref[0], paged_attention(**clean, backend="torch")[0])


# -- what the op shows ----------------------------------------------------------------------------
def test_the_op_is_listed_with_its_backends():
    assert kc.ops()["paged_attention"] is paged_attention
    assert [b.name for b in paged_attention.backends()] == ["triton", "torch"]
    assert repr(paged_attention) == "<kda_contracts op paged_attention (backends: triton, torch)>"


def test_explain_backends_on_a_cpu_call():
    assert paged_attention.explain_backends(**make_call()) == (
        "  triton: not chosen: runs on cuda, not cpu\n"
        "   torch: chosen (priority 0, the highest that supports this call)")


def test_without_the_interpreter_triton_is_imported_only_when_asked_for_and_refuses_the_cpu():
    code = """
import sys, torch, kda_contracts as kc
from examples.paged_attention import make_call, paged_attention
def triton_modules():
    return [n for n in sys.modules if n.split(".")[0] == "triton"]
paged_attention(**make_call())
print(paged_attention.explain_backends(**make_call()))
print("imported:", triton_modules())
try:
    paged_attention(**make_call(), backend="triton")
except kc.BackendError as err:
    print(str(err).splitlines()[3])
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KDA_CONTRACTS_MODE")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "  triton: not chosen: runs on cuda, not cpu",
        "   torch: chosen (priority 0, the highest that supports this call)",
        "imported: []",
        "      got      'triton': runs on cuda, not cpu",
    ]


def test_its_custom_op_passes_opcheck_and_its_fake_is_the_contract():
    call = make_call()
    assert str(paged_attention.torch_op._opoverload._schema) == (
        "kda_contracts_ops::paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale, Tensor(a6!) out, str backend=\"auto\") -> ()")
    assert set(torch.library.opcheck(paged_attention.torch_op, tuple(call.values())).values()) == {"SUCCESS"}
    bad = make_call()
    key_cache_packed_for_fp16(bad)
    with FakeTensorMode() as fake, pytest.raises(kc.ShapeError, match=r"expected x == 16 // itemsize\(key_cache\)"):
        paged_attention.torch_op(*(fake.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in bad.values()))


def test_the_bound_dims_say_where_x_comes_from():
    dims = paged_attention.validate(**make_call(dtype=torch.bfloat16))
    assert (dims.x, dims.D, dims.BS, dims.NKV) == (8, 64, 16, 2)
    assert dims.provenance["x"] == "from key_cache.shape[4]"


# -- typical mistakes: the exact messages -----------------------------------------------------------
DIMS = ("  dims: S=3 from query.shape[0]; NH=4 from query.shape[1]; D=64 from query.shape[2]; NB=14 from "
        "key_cache.shape[0]; NKV=2 from key_cache.shape[1]; x=4 from key_cache.shape[4]; BS=16 from "
        "key_cache.shape[3]; MB=4 from block_tables.shape[1]")


def key_cache_packed_for_fp16(call):
    call["key_cache"] = call["key_cache"].reshape(14, 2, 8, 16, 8)  # x = 8: right for fp16, not fp32


def more_query_heads_than_a_multiple(call):
    call["query"], call["out"] = torch.randn(3, 5, 64), torch.zeros(3, 5, 64)


def int64_block_tables(call):
    call["block_tables"] = call["block_tables"].long()


def head_size_not_built(call):
    call["query"], call["out"] = torch.randn(3, 4, 72), torch.zeros(3, 4, 72)
    call["key_cache"], call["value_cache"] = torch.randn(14, 2, 18, 16, 4), torch.randn(14, 2, 72, 16)


def flash_attention_key_cache(call):
    call["key_cache"] = call["key_cache"].permute(0, 3, 1, 2, 4).reshape(14, 16, 2, 64)


def sequence_longer_than_its_table(call):
    call["seq_lens"] = torch.tensor([5, 70, 3], dtype=torch.int32)


def block_id_past_the_cache(call):
    call["seq_lens"] = torch.tensor([5, 40, 3], dtype=torch.int32)
    call["block_tables"][1, 2] = 14


MISTAKES = {
    key_cache_packed_for_fp16: [
        "paged_attention(): 1 contract violation",
        "  [1] dims: ShapeError",
        "      expected x == 16 // itemsize(key_cache)",
        "      got      x=8, itemsize(key_cache)=4",
        "      x from key_cache.shape[4]",
        "      itemsize(key_cache) from key_cache.dtype (float32)",
        "      fix: a float32 cache packs x = 16 // 4 = 4 elements: allocate key_cache as [NB, NKV, D//x, BS, x] = "
        "[14, 2, 16, 16, 4]; this one is packed with x = 8, as for a 2-byte dtype",
        DIMS.replace("x=4", "x=8"),
    ],
    more_query_heads_than_a_multiple: [
        "paged_attention(): 1 contract violation",
        "  [1] dims: ShapeError",
        "      expected NH % NKV == 0",
        "      got      NH=5, NKV=2",
        "      NH from query.shape[1]",
        "      NKV from key_cache.shape[1]",
        "      fix: each KV head serves NH // NKV query heads: NH must be a multiple of NKV (check num_kv_heads, "
        "and that both are divided by the same tensor-parallel size)",
        DIMS.replace("NH=4", "NH=5"),
    ],
    int64_block_tables: [
        "paged_attention(): 1 contract violation",
        "  [1] block_tables: DtypeError",
        "      expected int32",
        "      got      int64",
        "      fix: cast it: block_tables.to(torch.int32)",
        DIMS,
    ],
    head_size_not_built: [
        "paged_attention(): 1 contract violation",
        "  [1] dims: ShapeError",
        "      expected D in (32, 64, 80, 96, 112, 120, 128, 192, 256)",
        "      got      D=72",
        "      D from query.shape[2]",
        "      fix: the head size must be one the kernel is built for",
        DIMS.replace("D=64", "D=72"),
    ],
    flash_attention_key_cache: [
        "paged_attention(): 1 contract violation",
        "  [1] key_cache: ShapeError",
        "      expected [NB, NKV, D//x, BS, x] (rank 5)",
        "      got      [14, 16, 2, 64] (rank 4)",
        "      fix: key_cache looks like the flash-attention layout [NB, BS, NKV, D]; this op takes vLLM's paged "
        "layout [NB, NKV, D//x, BS, x] = [14, 2, 16, 16, 4]: key_cache.view(NB, BS, NKV, D // x, x)"
        ".permute(0, 2, 3, 1, 4).contiguous()",
        "  dims: S=3 from query.shape[0]; NH=4 from query.shape[1]; D=64 from query.shape[2]; NB=14 from "
        "value_cache.shape[0]; NKV=2 from value_cache.shape[1]; BS=16 from value_cache.shape[3]; MB=4 from "
        "block_tables.shape[1]",
    ],
    sequence_longer_than_its_table: [
        "paged_attention(): 1 contract violation",
        "  [1] seq_lens: ValueRangeError",
        "      expected 0 <= seq_lens <= MB*BS = 64",
        "      got      1 length(s) outside, e.g. seq_lens[1] = 70",
        "      fix: a sequence longer than its block table would read blocks it does not own; grow block_tables "
        "(MB) or check the lengths",
        DIMS,
    ],
    block_id_past_the_cache: [
        "paged_attention(): 1 contract violation",
        "  [1] block_tables: ValueRangeError",
        "      expected block ids in [0, NB=14) for every block a sequence uses",
        "      got      1 id(s) outside, e.g. block_tables[1, 2] = 14 (sequence 1 has 40 tokens)",
        "      fix: an id past the cache reads another allocation's memory; check the block allocator and that "
        "the tables belong to this cache",
        DIMS,
    ],
}
VALUE_MISTAKES = (sequence_longer_than_its_table, block_id_past_the_cache)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda f: f.__name__)
def test_each_typical_mistake_has_its_exact_message(mistake):
    call = make_call()
    mistake(call)
    with kc.mode("strict"), pytest.raises(kc.ContractError) as err:
        paged_attention(**call)
    assert str(err.value).splitlines() == MISTAKES[mistake]


@pytest.mark.parametrize("mistake", VALUE_MISTAKES, ids=lambda f: f.__name__)
def test_value_mistakes_are_strict_mode_checks(mistake):
    call = make_call()
    mistake(call)
    with kc.mode("check"):
        paged_attention(**call)  # metadata is fine: check mode runs it (masked, never out of bounds)


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda f: f.__name__)
def test_a_rejected_call_changes_no_tensor(mistake, backend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    call = make_call()
    mistake(call)
    before = clone(call)
    with kc.mode("strict"), pytest.raises(kc.ContractError):
        paged_attention(**call, backend=backend)
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(call[name], value), name


# -- under torch.compile ------------------------------------------------------------------------------
def decode_step(call):
    return paged_attention(**call) * 2


@pytest.mark.kda_contracts("check")
def test_the_op_compiles_once_per_shape_class_over_dozens_of_calls():
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(decode_step, fullgraph=True, backend="eager")
    for i in range(30):
        S = 2 + i % 7
        got = step(make_call(S=S, NB=40, seed=i))
        torch.testing.assert_close(got, decode_step(make_call(S=S, NB=40, seed=i)))
    assert counters["stats"]["unique_graphs"] == 2  # a static first size, then one dynamic in S
    with pytest.raises(kc.DtypeError, match=r"fix: cast it: block_tables.to\(torch.int32\)"):
        bad = make_call(S=5, NB=40)
        int64_block_tables(bad)
        step(bad)
    torch._dynamo.reset()
