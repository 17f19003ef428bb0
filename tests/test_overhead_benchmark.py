"""benchmarks/overhead.py: its baselines must check what they claim (nothing is timed here)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import kda_contracts as kc
from kda_contracts._engine import modes
from kda_contracts.testing import make_decode_call

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "overhead.py"


def _load():
    spec = importlib.util.spec_from_file_location("kda_benchmarks_overhead", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ob = _load()
CFG = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8, index_dtype="int32")  # H = HV = 4, K = V = 128


@pytest.fixture
def call():
    return make_decode_call(CFG, batch=3, pool=6)


def _hand(call):
    return ob.hand_written_validator(*ob.sglang_args(call))


def _contract_rejects(call):
    with pytest.raises(kc.ContractError):
        kc.validate_packed_decode(*ob.sglang_args(call))


def test_valid_call_passes_every_path(call):
    assert _hand(call) is None
    assert ob.no_check(*ob.sglang_args(call)) is None
    ob.jaxtyping_decode(*ob.jaxtyping_args(call))
    kc.validate_packed_decode(*ob.sglang_args(call))


def _bad_calls(call):
    B, HV, K, V = 3, CFG.local_num_v_heads, CFG.head_k, CFG.head_v
    H = CFG.local_num_heads
    yield "a unflattened [B, HV, K]", dict(call, a=call["a"].view(B, HV, K))
    yield "mixed_qkv rank 3", dict(call, mixed_qkv=call["mixed_qkv"].unsqueeze(1))
    yield "width gives no integer H", dict(call, mixed_qkv=call["mixed_qkv"][:, :-1])
    # width for H = 3 with HV = 4: H is an integer but HV % H != 0
    yield "HV % H != 0", dict(call, mixed_qkv=torch.zeros(B, 2 * 3 * K + HV * V, dtype=call["mixed_qkv"].dtype))
    yield "batch mismatch in b", dict(call, b=call["b"][:2])
    yield "indices batch mismatch", dict(call, ssm_state_indices=call["ssm_state_indices"][:1])
    yield "out [B, 2, HV, V]", dict(call, out=torch.zeros(B, 2, HV, V, dtype=call["out"].dtype))
    yield "out wrong V", dict(call, out=torch.zeros(B, 1, HV, V + 1, dtype=call["out"].dtype))
    yield "dt_bias [HV, K]", dict(call, dt_bias=call["dt_bias"].view(HV, K))
    yield "dt_bias wrong length", dict(call, dt_bias=call["dt_bias"][:-1])
    yield "A_log wrong length", dict(call, A_log=torch.zeros(HV + 1))
    yield "A_log bf16", dict(call, A_log=call["A_log"].to(torch.bfloat16))
    yield "dt_bias fp16", dict(call, dt_bias=call["dt_bias"].half())
    yield "float indices", dict(call, ssm_state_indices=call["ssm_state_indices"].float())
    yield "a non-contiguous last dim", dict(call, a=torch.zeros(B, HV * K * 2, dtype=call["a"].dtype)[:, ::2])
    yield "state last dim strided", dict(call, initial_state=torch.zeros(6, HV, V, K * 2)[..., ::2])
    yield "b wrong width", dict(call, b=torch.zeros(B, HV + 1, dtype=call["b"].dtype))
    assert H == 4  # the HV % H case above relies on it differing from 3


@pytest.mark.parametrize("case", [name for name, _ in _bad_calls(make_decode_call(CFG, 3, 6))])
def test_hand_written_rejects_what_the_contract_rejects(call, case):
    bad = dict(_bad_calls(call))[case]
    with pytest.raises(ValueError):
        _hand(bad)
    _contract_rejects(bad)  # the two agree: the hand-written baseline is a real validator


def test_hand_written_docstring_counts_its_checks():
    doc = ob.hand_written_validator.__doc__
    assert f"{ob.HAND_WRITTEN_CHECKS} checks" in doc
    assert "24-27." in doc


def test_jaxtyping_variant_rejects_unflattened_a(call):
    bad = dict(call, a=call["a"].view(3, CFG.local_num_v_heads, CFG.head_k))
    with pytest.raises(Exception):  # noqa: B017 (jaxtyping raises its own TypeCheckError)
        ob.jaxtyping_decode(*ob.jaxtyping_args(bad))


def test_off_identity_and_fresh_shapes(call):
    contract = kc.packed_decode_contract("VK")
    sig = ob.signature_function(contract)
    with kc.mode("off"):
        assert kc.contract(register=False, config=CFG)(sig) is sig
    fresh = ob.FreshShapes(call, capacity=40, max_pool=4)
    calls = fresh.take(40)
    shapes = {(c[0].shape[0], c[6].shape[0]) for c in calls}
    assert len(shapes) == 40 and (1, 6) not in shapes  # all new, and not the base call's (B, N)
    with kc.mode("check"):  # indices are not in range for every pool: check mode reads no values
        for args in calls:
            kc.packed_decode_contract("VK").enforce((*args, None, None), None, modes.CHECK)
            ob.hand_written_validator(*args)
    with pytest.raises(RuntimeError):
        fresh.take(1)


def test_replace_section_keeps_other_sections(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Packed decode kernels\n\nGPU table\n", encoding="utf-8")
    ob.replace_section(doc, ob.SECTION + "\n\nfirst\n")
    ob.replace_section(doc, ob.SECTION + "\n\nsecond\n")
    text = doc.read_text(encoding="utf-8")
    assert "GPU table" in text and "second" in text and "first" not in text
    assert text.count(ob.SECTION) == 1
    # a section in the middle is replaced without touching what follows
    doc.write_text(f"# B\n\n{ob.SECTION}\n\nold\n\n## Later\n\nkeep\n", encoding="utf-8")
    ob.replace_section(doc, ob.SECTION + "\n\nnew\n")
    assert doc.read_text(encoding="utf-8") == f"# B\n\n{ob.SECTION}\n\nnew\n\n## Later\n\nkeep\n"


# -- user functions (2 and 6 tensors, with and without *batch) -------------------------------------------
def _user(key):
    fn, hand = next((f, h) for k, _, f, h in ob.USER_CASES if k == key)
    with kc.mode("check"):
        checked = kc.contract(register=False)(fn)
    return checked, hand, ob.jaxtyped(typechecker=ob.beartype)(fn)


def test_float_dtypes_are_the_contracts():
    checked, _, _ = _user("lin2")
    sets = [v for k, v in checked.__kda_contract__._check_uncached.__globals__.items()
            if k.startswith("_kc_k") and isinstance(v, frozenset)]
    assert sets and all(s == ob.FLOAT_DTYPES for s in sets)


@pytest.mark.parametrize("key", [k for k, *_ in ob.USER_CASES])
def test_user_valid_call_passes_every_path(key):
    checked, hand, jax = _user(key)
    args = ob.user_calls()[key]
    with kc.mode("check"):
        checked(*args)
    hand(*args)
    jax(*args)


def _swap(args, i, t):
    return (*args[:i], t, *args[i + 1:])


def _user_bad_calls(key, args):
    """(case, args, jaxtyping also rejects it)."""
    meta = torch.empty(args[1].shape, dtype=args[1].dtype, device="meta")
    yield "second tensor on meta", _swap(args, 1, meta), False
    yield "not a tensor", _swap(args, 0, args[0].tolist()), True
    yield "first tensor int", _swap(args, 0, args[0].to(torch.int32)), True
    yield "first tensor rank 0", _swap(args, 0, torch.zeros(())), True
    yield "float8_e8m0fnu is not Float", _swap(args, 0, args[0].to(torch.float8_e8m0fnu)), True
    if key.startswith("lin2"):
        x, w = args
        yield "w rank 3", (x, w.unsqueeze(0)), True
        yield "w wrong D", (x, w[1:]), True
        yield "w bf16 -> bool", (x, w.bool()), True
        return
    _q, k, v, mask, bias, out = args
    yield "k wrong D", _swap(args, 1, k[..., 1:]), True
    yield "v wrong T", _swap(args, 2, v[..., 1:, :]), True
    yield "v rank 5", _swap(args, 2, v.unsqueeze(0)), True
    yield "mask float", _swap(args, 3, mask.float()), True
    yield "mask middle dim 2", _swap(args, 3, mask.expand(*mask.shape[:-3], 2, *mask.shape[-2:])), True
    yield "bias wrong H", _swap(args, 4, bias[1:]), True
    yield "out H*D wrong", _swap(args, 5, out[..., 1:]), True
    yield "out on meta", _swap(args, 5, torch.empty(out.shape, dtype=out.dtype, device="meta")), False
    yield "k batch differs", _swap(args, 1, k[:1]), True
    if key == "attn6_batch":
        yield "out without the batch", _swap(args, 5, out[0]), True
        yield "mask with an extra batch dim", _swap(args, 3, mask.unsqueeze(0)), True


@pytest.mark.parametrize("key", [k for k, *_ in ob.USER_CASES])
def test_user_hand_written_makes_the_same_checks(key):
    checked, hand, jax = _user(key)
    args = ob.user_calls()[key]
    for case, bad, jax_rejects in _user_bad_calls(key, args):
        with pytest.raises(ValueError):
            hand(*bad)
            pytest.fail(f"hand-written accepted: {case}")
        with kc.mode("check"), pytest.raises(kc.ContractError):
            checked(*bad)
            pytest.fail(f"kda-contracts accepted: {case}")
        if jax_rejects:
            with pytest.raises(Exception):  # noqa: B017 (jaxtyping/beartype raise their own errors)
                jax(*bad)


# -- where the time goes ----------------------------------------------------------------------------------
def test_source_lines_cover_both_validators():
    contract = kc.packed_decode_contract("VK")
    gen = ob.source_lines(contract.checker_source, [f"_kc_a{i}" for i in range(12)] + ["_kc_cfg"])
    hand = ob.source_lines(ob.inspect.getsource(ob.hand_written_validator),
                           list(ob.inspect.signature(ob.hand_written_validator).parameters))
    assert len(gen) > 40 and len(hand) == 32
    kinds = {ob.line_kind(line) for line, _, _ in gen}
    assert {"device: read + compare", "isinstance (Tensor-ness, scalar types)"} <= kinds
    assert gen[-1][0].startswith("return (")


def test_quick_run_writes_every_table(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Packed decode kernels (GPU)\n\nGPU table\n", encoding="utf-8")
    assert ob.main(["--quick", "--out", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "GPU table" in text and text.count(ob.SECTION) == 1
    for _, label, _, _ in ob.USER_CASES:
        assert f"| {label} |" in text
    assert "### Where the time goes, statement by statement" in text
    assert "| `t.device` (a new torch.device) |" in text


# -- the hand-written validator making every check the contract makes -----------------------------------
def _full_cases(call):
    args = ob.sglang_args(call)
    yield "valid", args
    for name, bad in _bad_calls(call):
        yield name, ob.sglang_args(bad)

    def swap(i, v):
        return (*args[:i], v, *args[i + 1:])

    for i, name in enumerate(ob.ARG_ORDER[:9]):
        t = args[i]
        if not isinstance(t, torch.Tensor):
            continue
        yield f"{name} on meta", swap(i, torch.empty(t.shape, dtype=t.dtype, device="meta"))
        yield f"{name} int64", swap(i, t.to(torch.int64))
        yield f"{name} float64", swap(i, t.double())
        yield f"{name} not a tensor", swap(i, 1.0)
        yield f"{name} unsqueezed", swap(i, t.unsqueeze(0))
        strided = t.flip(0) if t.dim() == 1 else t.transpose(-1, -2).contiguous().transpose(-1, -2)
        yield f"{name} strided", swap(i, strided)
    meta = tuple(torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
                 for a in args)
    state = args[6]
    yield "everything on meta", meta
    yield "scale 0", swap(5, 0.0)
    yield "scale nan", swap(5, float("nan"))
    yield "scale a string", swap(5, "1")
    yield "flag an int", swap(9, 1)
    yield "lower_bound 0", swap(10, 0.0)
    yield "lower_bound -1", swap(10, -1.0)
    yield "out fp32 (mixed_qkv bf16)", swap(7, args[7].float())
    yield "state slots interleaved", swap(6, torch.zeros(state.shape[0], 2 * state.shape[1], *state.shape[2:])[:, ::2])
    yield "state slots overlapping", swap(6, state.as_strided(state.shape, (1, *state.stride()[1:])))
    yield "state a single slot", swap(6, state[:1])


def test_hand_written_full_has_the_contracts_verdict(call):
    check = kc.packed_decode_contract("VK")._check
    cases = list(_full_cases(call))
    assert len(cases) > 60
    rejected = 0
    for name, args in cases:
        accepts = check(*args, None, None) is not None
        try:
            ob.hand_written_full(*args)
            hand_accepts = True
        except ValueError:
            hand_accepts = False
        assert hand_accepts == accepts, name
        rejected += not accepts
    assert 0 < rejected < len(cases)


def test_hand_written_full_docstring_counts_its_checks():
    assert "52 checks" in ob.hand_written_full.__doc__ and ob.HAND_WRITTEN_FULL_CHECKS == 52
