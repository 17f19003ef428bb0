"""benchmarks/overhead.py: its baselines must check what they claim (nothing is timed here)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import kda_contracts as kc
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
        assert kc.contract(register=False)(sig) is sig
    fresh = ob.FreshShapes(call, capacity=40, max_pool=4)
    calls = fresh.take(40)
    shapes = {(c[0].shape[0], c[6].shape[0]) for c in calls}
    assert len(shapes) == 40 and (1, 6) not in shapes  # all new, and not the base call's (B, N)
    with kc.mode("check"):  # indices are not in range for every pool: check mode reads no values
        for args in calls:
            kc.packed_decode_contract("VK").enforce((*args, None), None, kc.modes.CHECK)
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
